#include "common/base/work_pool.h"

#include <pthread.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <utility>

namespace tessera {

WorkPool::WorkPool(std::string name, int threads, size_t max_queued, int nice)
    : name_(std::move(name)), max_queued_(std::max<size_t>(1, max_queued)) {
  for (int i = 0; i < std::max(1, threads); ++i) threads_.emplace_back([this, nice] { Run(nice); });
}

WorkPool::~WorkPool() { Stop(); }

bool WorkPool::TrySubmit(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ || queue_.size() >= max_queued_) return false;
    queue_.push_back(std::move(task));
  }
  cv_.notify_one();
  return true;
}

void WorkPool::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : threads_)
    if (t.joinable()) t.join();
}

size_t WorkPool::queued() const {
  std::lock_guard<std::mutex> lock(mu_);
  return queue_.size();
}

void WorkPool::Run(int nice) {
  pthread_setname_np(pthread_self(), name_.substr(0, 15).c_str());
  // Linux: a thread's nice value is its own (setpriority on its tid).
  if (nice != 0)
    setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), nice);  // best effort
  while (true) {
    std::function<void()> task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, nothing left
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();
  }
}

}  // namespace tessera
