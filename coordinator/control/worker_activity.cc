#include "coordinator/control/worker_activity.h"

namespace tessera {

uint64_t WorkerActivity::generation() const {
  MutexLock lock(&mu_);
  return generation_;
}

void WorkerActivity::Notify() {
  {
    MutexLock lock(&mu_);
    ++generation_;
  }
  cv_.notify_all();
}

uint64_t WorkerActivity::WaitChange(uint64_t seen, std::chrono::steady_clock::time_point deadline) {
  MutexLock lock(&mu_);
  cv_.wait_until(mu_, deadline, [&]() REQUIRES(mu_) { return generation_ != seen; });
  return generation_;
}

uint64_t WorkerActivity::WaitChange(uint64_t seen) {
  MutexLock lock(&mu_);
  cv_.wait(mu_, [&]() REQUIRES(mu_) { return generation_ != seen; });
  return generation_;
}

}  // namespace tessera
