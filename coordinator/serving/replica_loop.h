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
#include <variant>
#include <vector>

#include "common/base/status.h"
#include "common/engine/scheduler.h"
#include "common/engine/step_executor.h"
#include "coordinator/serving/request_sink.h"

namespace tessera {

// A request held by a LeaderLoop, not at any leader (its replica paused):
// what it needs to resume on another replica's leader.
struct HeldRequest {
  int64_t id = 0;  // unique over the replicas (their shared OutputProcessor)
  GenerationRequest request;
  std::shared_ptr<const RequestCallbacks> callbacks;
  // The output delivered so far: its tokens are the resume_tokens the next
  // leader recomputes from and replays through the request's detokenizer.
  GenerationResult result;
};

// A waiting request moving between replicas (ReplicaSet::HandOff): a
// ServingLoop's scheduler's (Scheduler::Migrant) or a LeaderLoop's
// (HeldRequest). A loop adopts only its own kind; every replica of a
// coordinator schedules in the same place ([scheduler] runs_on).
using ReplicaMigrant = std::variant<Scheduler::Migrant, HeldRequest>;

inline int64_t MigrantId(const ReplicaMigrant& m) {
  if (const auto* s = std::get_if<Scheduler::Migrant>(&m)) return s->id();
  return std::get<HeldRequest>(m).id;
}

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
  // Moving queued requests between replicas (ReplicaSet::HandOff):
  // TakeWaiting removes the requests that wait here and at no worker (a
  // ServingLoop: its scheduler's waiting ones; a LeaderLoop: those it holds
  // while paused); Adopt queues them at the front, all or none (an error
  // leaves `migrants` as they were: kFailedPrecondition for the other
  // kind's migrants, kUnavailable when not started or stopped).
  virtual std::vector<ReplicaMigrant> TakeWaiting() = 0;
  virtual Status Adopt(std::vector<ReplicaMigrant>* migrants) = 0;
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
