// WorkPool: a fixed set of threads running queued tasks, with a bounded
// queue. The coordinator prepares requests on one (JSON parsing, chat
// template rendering, tokenization: CPU work that grows with the prompt), so
// a client's huge prompt never runs on the HTTP server's I/O threads, where
// it would stall every other client's stream and /healthz (issue #31).
//
// The threads may run at a lower scheduling priority than the rest of the
// process (`nice`, Linux per-thread nice): on a host with few cores, request
// preparation then yields to serving (the decode loop, the control plane).
//
// Thread-safety: TrySubmit from any thread; the destructor (or Stop) from
// one thread that is not a pool thread. Tasks must not throw.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace tessera {

class WorkPool {
 public:
  // `threads` >= 1 threads named `name` (at most 15 characters are kept),
  // at most `max_queued` tasks waiting (>= 1), each thread at nice `nice`
  // (0 = the process's; higher runs later; a failure to set it is ignored).
  WorkPool(std::string name, int threads, size_t max_queued, int nice = 0);
  ~WorkPool();  // Stop()
  WorkPool(const WorkPool&) = delete;
  WorkPool& operator=(const WorkPool&) = delete;

  // Queues `task`; false (and `task` is dropped unrun) when max_queued tasks
  // already wait or the pool stopped.
  bool TrySubmit(std::function<void()> task);
  // Runs the queued tasks, then joins the threads; later TrySubmit calls
  // return false. Idempotent.
  void Stop();

  size_t queued() const;
  int threads() const { return static_cast<int>(threads_.size()); }

 private:
  void Run(int nice);

  const std::string name_;
  const size_t max_queued_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;  // guarded by mu_
  bool stopping_ = false;                    // guarded by mu_
  std::vector<std::thread> threads_;
};

}  // namespace tessera
