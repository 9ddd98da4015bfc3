// ReplicaLoop: what the coordinator's plan machinery (PlanRunner,
// coordinator/serving/plan_runner.h) and its router (ReplicaSet) see of one
// replica's serving loop, wherever its scheduler runs ([scheduler] runs_on):
//
//  - ServingLoop (coordinator/serving/serving_loop.h): the coordinator runs
//    the replica's Scheduler and sends every step to its workers;
//  - LeaderLoop (coordinator/serving/leader_loop.h): the replica's leader
//    worker runs it; the coordinator routes requests to the leader, relays
//    their progress and keeps each request's tokens so that it resumes on
//    the next plan.
//
// Commands (Pause, SwapExecutor, Resume) and the rest behave as
// ServingLoop's header describes for both.
//
// Thread-safety: as ServingLoop's (Submit, Cancel, waiting, running, Wake
// and the commands from any thread but the loop's own; Start and Stop from
// one thread).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "common/base/status.h"
#include "common/engine/scheduler.h"
#include "common/engine/step_executor.h"
#include "coordinator/serving/request_sink.h"

namespace tessera {

class ReplicaLoop : public RequestSink {
 public:
  // The executor's health: ok, or why its steps fail (RemoteExecutor::health).
  using Health = std::function<Status()>;

  // Starts serving plan `plan_version` on `executor` (the plan's
  // RemoteExecutor) with `kv_blocks` KV blocks per rank. Once.
  virtual void Start(std::shared_ptr<StepExecutor> executor, Health health, int64_t kv_blocks,
                     uint64_t plan_version) = 0;
  virtual bool started() const = 0;
  // Ends every request left with an error (kShuttingDownMessage). Idempotent.
  virtual void Stop() = 0;
  // The executor's health may have changed: a draining loop re-checks it.
  virtual void Wake() = 0;
  // Moving queued requests between replicas (ReplicaSet::HandOff).
  virtual std::vector<Scheduler::Migrant> TakeWaiting() = 0;
  virtual Status Adopt(std::vector<Scheduler::Migrant>* migrants) = 0;
  // KV blocks free (as last known) and the pool's size; 0 before Start.
  virtual int64_t free_kv_blocks() const = 0;
  virtual int64_t kv_blocks() const = 0;
  // Stop admitting, give running requests `drain_seconds` (none once the
  // executor is broken), then re-queue the unfinished ones (they resume
  // from prompt + generated tokens). Returns how many were re-queued since
  // the previous pause; nullopt when not started or stopped.
  virtual std::optional<int> Pause(double drain_seconds) = 0;
  // Paused: later work runs on plan `plan_version` (`executor`).
  virtual bool SwapExecutor(std::shared_ptr<StepExecutor> executor, Health health,
                            uint64_t plan_version) = 0;
  virtual bool Resume() = 0;
};

}  // namespace tessera
