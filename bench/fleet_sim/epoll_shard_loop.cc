#include "bench/fleet_sim/epoll_shard_loop.h"

#include <pthread.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <exception>
#include <limits>
#include <utility>

#include "common/base/logging.h"

namespace tessera::fleet_sim {

namespace {

// epoll_event.data of the wake eventfd; a socket's is its index.
constexpr uint64_t kWakeId = std::numeric_limits<uint64_t>::max();
// The longest wait without a timer: a bound on how late Stop is seen if a
// wake-up were lost.
constexpr auto kMaxWait = std::chrono::milliseconds(100);

std::string Errno(const char* call) { return std::string(call) + ": " + std::strerror(errno); }

}  // namespace

EpollShardLoop::EpollShardLoop(std::string thread_name) : name_(std::move(thread_name)) {}

EpollShardLoop::~EpollShardLoop() {
  Stop();
  if (epoll_fd_ >= 0) ::close(epoll_fd_);
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

Status EpollShardLoop::Start(Hooks hooks) {
  if (started_) return FailedPrecondition(name_ + ": the shard loop starts once");
  if (!hooks.on_readable || !hooks.next_due || !hooks.run_due)
    return InvalidArgument(name_ + ": the shard loop needs on_readable, next_due and run_due");
  for (size_t i = 0; i < hooks.sockets.size(); ++i)
    if (hooks.sockets[i] == nullptr)
      return InvalidArgument(name_ + ": socket " + std::to_string(i) + " is null");
  epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
  if (epoll_fd_ < 0) return IoError(name_ + ": " + Errno("epoll_create1"));
  wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) return IoError(name_ + ": " + Errno("eventfd"));
  epoll_event wake{};
  wake.events = EPOLLIN;  // level-triggered: read once per wake-up
  wake.data.u64 = kWakeId;
  if (::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &wake) != 0)
    return IoError(name_ + ": " + Errno("epoll_ctl(eventfd)"));
  for (size_t i = 0; i < hooks.sockets.size(); ++i) {
    int fd = -1;
    try {
      fd = hooks.sockets[i]->get(zmq::sockopt::fd);
    } catch (const zmq::error_t& e) {
      return IoError(name_ + ": ZMQ_FD of socket " + std::to_string(i) + ": " + e.what());
    }
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLET;  // ZMQ_FD signals edges (see the header)
    ev.data.u64 = i;
    if (::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0)
      return IoError(name_ + ": " + Errno("epoll_ctl(ZMQ_FD)") + " (socket " + std::to_string(i) +
                     ")");
  }
  hooks_ = std::move(hooks);
  // Every socket is checked once first: input may have come before its fd
  // was registered.
  listed_.assign(hooks_.sockets.size(), 1);
  to_check_.resize(hooks_.sockets.size());
  for (size_t i = 0; i < to_check_.size(); ++i) to_check_[i] = i;
  {
    std::lock_guard<std::mutex> lock(mu_);
    accepting_ = true;
  }
  started_ = true;
  thread_ = std::thread([this] { Run(); });
  return Status::Ok();
}

bool EpollShardLoop::Post(std::function<void()> task) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!accepting_) return false;
  tasks_.push_back(std::move(task));
  if (!wake_pending_) {
    wake_pending_ = true;
    const uint64_t one = 1;
    // Cannot fail short of a counter at 2^64 - 1; the tasks also run each turn.
    (void)!::write(wake_fd_, &one, sizeof(one));
  }
  return true;
}

void EpollShardLoop::Touched(size_t i) {
  // A send inside socket i's own handler is covered by its final EAGAIN.
  if (i == reading_ || i >= listed_.size() || listed_[i]) return;
  listed_[i] = 1;
  to_check_.push_back(i);
}

void EpollShardLoop::Stop() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_requested_ = true;
    accepting_ = false;
    const uint64_t one = 1;
    (void)!::write(wake_fd_, &one, sizeof(one));
  }
  thread_.join();
}

void EpollShardLoop::Run() {
  pthread_setname_np(pthread_self(), name_.substr(0, 15).c_str());
  while (!stop_requested_.load()) {
    try {
      Turn();
    } catch (const zmq::error_t& e) {
      if (e.num() == ETERM) break;
      TESSERA_LOG_ERROR(name_, "loop: ZeroMQ error: {}", e.what());
      std::this_thread::sleep_for(std::chrono::milliseconds(10));  // no busy error loop
    } catch (const std::exception& e) {
      TESSERA_LOG_ERROR(name_, "loop: {}", e.what());
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  RunTasks();  // what was posted before Stop still runs
  try {
    if (hooks_.on_exit) hooks_.on_exit();
  } catch (const std::exception& e) {
    TESSERA_LOG_ERROR(name_, "closing: {}", e.what());
  }
}

int EpollShardLoop::WaitMs() const {
  if (!to_check_.empty()) return 0;
  const Clock::time_point now = Clock::now();
  const Clock::time_point due = std::min(hooks_.next_due(), now + kMaxWait);
  if (due <= now) return 0;
  // Rounded up: a timer is never run early (a wake before it is a wasted turn).
  return static_cast<int>(std::chrono::ceil<std::chrono::milliseconds>(due - now).count());
}

void EpollShardLoop::Turn() {
  epoll_event events[512];
  const int n = ::epoll_wait(epoll_fd_, events, 512, WaitMs());
  if (n < 0 && errno != EINTR) {
    TESSERA_LOG_ERROR(name_, "{}", Errno("epoll_wait"));
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  for (int k = 0; k < n; ++k) {
    const uint64_t id = events[k].data.u64;
    if (id == kWakeId) {
      uint64_t count = 0;
      (void)!::read(wake_fd_, &count, sizeof(count));
      continue;
    }
    Touched(static_cast<size_t>(id));
  }
  // The sockets listed now; those listed while checking them (sent on by
  // another's handler, or stopped at a cap) wait for the next turn, which
  // then does not sleep.
  checking_.clear();
  checking_.swap(to_check_);  // both keep their capacity from turn to turn
  for (size_t i : checking_) listed_[i] = 0;
  for (size_t i : checking_) Check(i);
  try {
    hooks_.run_due();
  } catch (const std::exception& e) {
    TESSERA_LOG_ERROR(name_, "timers: {}", e.what());
  }
  RunTasks();
}

void EpollShardLoop::Check(size_t i) {
  bool drained = true;
  try {
    if (hooks_.sockets[i]->get(zmq::sockopt::events) & ZMQ_POLLIN) {
      reading_ = i;
      drained = hooks_.on_readable(i);
    }
  } catch (const zmq::error_t& e) {
    if (e.num() == ETERM) throw;
    TESSERA_LOG_ERROR(name_, "socket {}: {}", i, e.what());
    drained = false;
  } catch (const std::exception& e) {
    TESSERA_LOG_ERROR(name_, "socket {}: {}", i, e.what());
    drained = false;
  }
  reading_ = kNone;
  // Not read to EAGAIN: its edge may be gone, so look again next turn.
  if (!drained) Touched(i);
}

void EpollShardLoop::RunTasks() {
  std::deque<std::function<void()>> batch;
  {
    std::lock_guard<std::mutex> lock(mu_);
    batch.swap(tasks_);
    wake_pending_ = false;
  }
  for (std::function<void()>& task : batch) {
    try {
      task();
    } catch (const std::exception& e) {
      TESSERA_LOG_ERROR(name_, "posted task threw: {}", e.what());
    }
  }
}

}  // namespace tessera::fleet_sim
