// WorkerActivity: what the control server (control_server.h) saw of its
// workers, as an event a thread can wait for instead of polling the
// server's records: a worker registered, was declared lost, or its control
// connection closed, or a worker somebody watches (ControlServer::Watch)
// was heard from. Each event advances a generation, after the server's
// callbacks for it have run. A waiter reads the generation, then checks what
// it waits for (ControlServer::Workers, WorkersOf), then waits for the
// generation to move on; an event between the check and the wait is not
// missed, because the generation read before the check has moved:
//
//   uint64_t seen = activity.generation();
//   while (!Done() && Clock::now() < deadline) seen = activity.WaitChange(seen, deadline);
//
// Messages of workers nobody watches are no event: at fleet scale a step's
// messages must not wake anyone (docs/architecture.md, "Shared state").
// Anyone may Notify too: the coordinator does when it stops, so that its
// waiters look at its stop flag.
//
// Thread-safety: every method from any thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>

#include "common/base/mutex.h"
#include "common/base/thread_annotations.h"

namespace tessera {

class WorkerActivity {
 public:
  WorkerActivity() = default;
  WorkerActivity(const WorkerActivity&) = delete;
  WorkerActivity& operator=(const WorkerActivity&) = delete;

  // Events so far.
  uint64_t generation() const EXCLUDES(mu_);
  // One event: advances the generation and wakes every waiter.
  void Notify() EXCLUDES(mu_);
  // Blocks until the generation is no longer `seen`, or until `deadline`.
  // Returns the generation then (still `seen` when the deadline passed).
  uint64_t WaitChange(uint64_t seen, std::chrono::steady_clock::time_point deadline) EXCLUDES(mu_);
  // As above, with no deadline.
  uint64_t WaitChange(uint64_t seen) EXCLUDES(mu_);

 private:
  mutable Mutex mu_;
  std::condition_variable_any cv_;
  uint64_t generation_ GUARDED_BY(mu_) = 0;
};

}  // namespace tessera
