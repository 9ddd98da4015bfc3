// ClusterState: what the coordinator knows of its cluster and of each
// replica's running plan (ReplicaPlan), shared by the replica set
// (coordinator/serving/replica_set.h), the replicas' plan runners
// (plan_runner.h), the control events (worker_events.h), the status views
// (cluster_view.h) and the metrics (cluster_metrics.h).
//
// A worker belongs to at most one replica: the one whose plan assigns it a
// rank (ReplicaOf). Workers no replica holds are spares; a replica that
// re-plans may take a spare, never another replica's worker. Plan versions
// are unique over all replicas (NextPlanVersion), so a StepResult, a Loaded
// or an Error names its replica by its plan version.
//
// Every field names the mutex that guards it (GUARDED_BY, checked by clang:
// scripts/thread-safety). There is no fleet-wide condition variable that
// every replica waits on: each replica's plan runner waits on its own
// (ReplicaCv), woken only by what concerns it (NotifyReplica: a Loaded, a
// LoadProgress or an Error of its plan, a job queued for it) or by what may
// concern any replica (NotifyAll: a worker registered, lost or excluded,
// stopping). `cv` is the daemon's own: WaitReady waits on it for readiness,
// a placement failure or stopping (NotifyAll wakes it too). A 512-replica
// fleet loading its plans thus wakes one thread per load message, not 512.
//
// Thread-safety: take `mu` (MutexLock) for the guarded fields (the
// replicas' plans included), `exec_mu` for the executors; never `mu` inside
// `exec_mu`.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/base/mutex.h"
#include "common/base/status.h"
#include "common/base/thread_annotations.h"
#include "common/model/parallel_config.h"
#include "common/net/tcp_store.h"
#include "common/wire/control.pb.h"
#include "coordinator/control/control_server.h"
#include "coordinator/control/remote_executor.h"
#include "coordinator/placement/planner.h"
#include "coordinator/serving/plan_report.h"

namespace tessera {

// One rank of the running plan.
struct Assignment {
  std::string worker_id;
  std::string host;
  std::string data_address;  // the worker's Gloo address
  uint32_t device_index = 0;
  int world_rank = 0, stage = 0, tp_rank = 0;
  int64_t predicted_weight_bytes = 0;  // the planner's cost model
  int64_t shard_weight_bytes = 0;      // the shard's tensors (ShardSpec)
  int64_t predicted_kv_bytes = 0;      // kv_blocks x block bytes of this rank
  int64_t loaded_weight_bytes = -1;    // from Loaded
  int64_t reused_weight_bytes = 0;     // from Loaded
  int64_t kv_bytes = -1;
  double load_seconds = 0;
  int64_t load_bytes_done = 0, load_bytes_total = 0;  // from LoadProgress
};

struct ReplicaPlan {
  ParallelConfig parallel;  // the running plan's layout
  // The layout asked for: the config's or the planner's first choice, then
  // POST /admin/plan's.
  ParallelConfig wanted;
  int64_t kv_blocks = 0;  // KV blocks per rank
  uint64_t plan_version = 0;
  std::vector<Assignment> assignments;
  std::string degraded;    // why no plan runs ("" = none)
  std::string load_error;  // an Error while loading
  // Who sent it, and its exclusion kind (load_error, or loaded_mismatch
  // when the coordinator found a Loaded contradicting the registration).
  std::string load_error_worker, load_error_kind;
  bool serving = false;  // the serving loop runs
  // The plan is loaded and the loop serves it (false while re-planning
  // after a fault, degraded or not placed yet).
  bool ready = false;
  std::vector<PlanChangeReport> history;  // plan changes, oldest first, last 32
  int64_t reconfigurations = 0;
  int64_t faults = 0;
  int64_t requeued_total = 0;
  // The planner's result when it placed the plan. Shared: one planner run
  // places every replica, and a fleet has hundreds of them.
  std::shared_ptr<const PlanResult> plan_result;
  int plan_result_replica = 0;  // which of plan_result's replicas this one is

  bool InPlan(const std::string& worker_id) const;
  // It lacks workers: degraded (no plan runs: a failed re-fit, or a first
  // placement that failed), or serving a smaller layout than wanted. A
  // worker that becomes usable (registers, returns, or its exclusion ends)
  // re-plans such a replica.
  bool NeedsWorkers() const {
    return !degraded.empty() || (serving && parallel.world_size() < wanted.world_size());
  }
};

// A worker left out of placement for a while (see ClusterState::Exclude):
// it failed to load or to join its groups within heartbeat.
// load_timeout_seconds, its Loaded report contradicted its registration,
// or its step hung.
struct WorkerExclusion {
  std::string reason;  // names what it did, for /admin/cluster and the log
  std::string kind;    // the metric's label: load_timeout, load_error, loaded_mismatch, step_hung
  int count = 0;       // exclusions of this worker so far (the back-off doubles with each)
  std::chrono::steady_clock::time_point until;  // usable again from then
  // A replica claimed its end (ClaimEndedExclusions): it re-plans for it,
  // or found the worker unusable. Cleared by the next exclusion.
  bool end_claimed = false;
};

struct ClusterState {
  mutable Mutex mu;
  std::condition_variable_any cv;  // the daemon's (see the header comment); wait with `mu`

  // One per replica: sized once by the first placement (SizeReplicas; empty
  // before it), never resized after.
  std::vector<ReplicaPlan> replicas GUARDED_BY(mu);
  // replicas[r]'s condition variable (ReplicaCv), sized with `replicas`;
  // each one's address is stable.
  std::vector<std::unique_ptr<std::condition_variable_any>> replica_cvs GUARDED_BY(mu);
  // replicas[r].ready, readable without `mu` (ReplicaReady: the router reads
  // every replica's on each request, and must not queue behind the fleet's
  // heartbeats and plan changes for it). Allocated once by SizeReplicas,
  // before the replica set is published as placed; written with `mu` held
  // by SetReplicaReady, the one writer of ReplicaPlan::ready.
  std::unique_ptr<std::atomic<bool>[]> replica_ready;
  // ReplicaOf's index: worker id -> the replica whose plan gives it a rank.
  // Kept by SetAssignments, the one writer of ReplicaPlan::assignments' ids.
  std::unordered_map<std::string, int> replica_of_worker GUARDED_BY(mu);
  uint64_t last_plan_version GUARDED_BY(mu) = 0;           // the newest version handed out
  std::vector<std::string> failed_workers GUARDED_BY(mu);  // lost, not re-registered
  // Of failed workers declared lost by the control server: the loss's first
  // sign (ControlWorkerLoss::since), so a step that fails on the loss times
  // its detection from there too (the step's failure may be seen first).
  std::unordered_map<std::string, std::chrono::steady_clock::time_point> lost_since GUARDED_BY(mu);
  // Lost workers that registered again while a re-plan was pending or
  // running (a stopped worker resumed): still in failed_workers, so that
  // re-plan does not place them; usable once the re-plans end.
  std::vector<std::string> returning_workers GUARDED_BY(mu);
  std::vector<std::string> drained_workers GUARDED_BY(mu);  // out of placement by the admin
  // Workers left out of placement until their back-off ends (kept after,
  // for the count, until the worker is forgotten).
  std::map<std::string, WorkerExclusion> excluded_workers GUARDED_BY(mu);
  Status placement_status GUARDED_BY(mu);  // the initial placement's failure
  bool stopping GUARDED_BY(mu) = false;
  std::map<std::string, control::WorkerState> states GUARDED_BY(mu);  // from heartbeats
  // Heartbeat.step_compute_seconds of each worker's last heartbeat.
  std::unordered_map<std::string, double> step_compute_seconds GUARDED_BY(mu);
  StoreServerCore::Stats store_seen GUARDED_BY(mu);  // the store's counters at the last scrape
  // At least one replica serves (/readyz).
  std::atomic<bool> ready{false};
  // Every replica placed serves (WaitReady).
  std::atomic<bool> all_ready{false};

  // Each replica's running executor (StepResults go to it); swapped by its
  // plan runner. Sized with `replicas`.
  mutable Mutex exec_mu;
  std::vector<std::shared_ptr<RemoteExecutor>> executors GUARDED_BY(exec_mu);

  // Sizes `replicas` and their condition variables to `n` (once: the first
  // placement).
  void SizeReplicas(size_t n) REQUIRES(mu);
  // Replica `replica`'s condition variable: its plan runner waits on it with
  // `mu`.
  std::condition_variable_any& ReplicaCv(int replica) REQUIRES(mu) {
    return *replica_cvs[static_cast<size_t>(replica)];
  }
  // Wakes replica `replica`'s waiters (none when out of range).
  void NotifyReplica(int replica) REQUIRES(mu);
  // Sets replicas[replica].ready and its lock-free copy (ReplicaReady), then
  // `ready` and `all_ready` (UpdateReady).
  void SetReplicaReady(int replica, bool ready) REQUIRES(mu);
  // replicas[replica].ready without `mu`; false when out of range or before
  // SizeReplicas (call it once the replica set is placed).
  bool ReplicaReady(int replica, size_t replicas_placed) const {
    return replica >= 0 && static_cast<size_t>(replica) < replicas_placed &&
           replica_ready[static_cast<size_t>(replica)].load(std::memory_order_acquire);
  }
  // Wakes every waiter: the daemon's and every replica's.
  void NotifyAll() REQUIRES(mu);

  std::shared_ptr<RemoteExecutor> Executor(int replica) const EXCLUDES(exec_mu);
  // The executor of plan `plan_version` (null when no replica runs it).
  std::shared_ptr<RemoteExecutor> ExecutorOfPlan(uint64_t plan_version) const EXCLUDES(exec_mu);
  // A fresh plan version, unique over the replicas.
  uint64_t NextPlanVersion() REQUIRES(mu) { return ++last_plan_version; }
  // The replica whose plan gives `worker_id` a rank; -1: none (a spare).
  // O(1): every heartbeat asks.
  int ReplicaOf(const std::string& worker_id) const REQUIRES(mu);
  // Replaces replica `replica`'s assignments with `plan`, keeping the index.
  void SetAssignments(int replica, std::vector<Assignment> plan) REQUIRES(mu);
  // The replica running plan `plan_version`; -1: none.
  int ReplicaOfPlan(uint64_t plan_version) const REQUIRES(mu);
  // Whether `worker_id` has a rank of a running plan / was lost / drained.
  bool InPlan(const std::string& worker_id) const REQUIRES(mu) { return ReplicaOf(worker_id) >= 0; }
  // Sets `ready` and `all_ready` from the replicas' ready flags.
  void UpdateReady() REQUIRES(mu);
  // A worker declared lost (`why`): marks it failed (once) and fails the
  // steps of its replica's executor that wait on it. Returns the replica
  // whose serving plan it held a rank of, or -1. The caller wakes that
  // replica's serving loop. `since`: the loss's first sign, when known
  // (kept in lost_since).
  int MarkFailed(const std::string& worker_id, const Status& why,
                 std::optional<std::chrono::steady_clock::time_point> since = std::nullopt)
      EXCLUDES(mu, exec_mu);
  // The earliest lost_since of the failed workers among `assignments`
  // (nullopt: none of them was declared lost with a known first sign).
  std::optional<std::chrono::steady_clock::time_point> EarliestLoss(
      const std::vector<Assignment>& assignments) const REQUIRES(mu);
  bool IsFailed(const std::string& worker_id) const REQUIRES(mu);
  bool IsDrained(const std::string& worker_id) const REQUIRES(mu);
  // Whether `worker_id`'s exclusion back-off runs now.
  bool IsExcluded(const std::string& worker_id) const REQUIRES(mu);
  // Leaves `worker_id` out of placement for base_seconds x 2^(n-1) (n: its
  // n-th exclusion), at most kMaxExclusionSeconds; returns the exclusion.
  const WorkerExclusion& Exclude(const std::string& worker_id, const std::string& kind,
                                 const std::string& reason, double base_seconds) REQUIRES(mu);
  static constexpr double kMaxExclusionSeconds = 3600.0;
  // The exclusions replica `replica` may re-plan for when they end: of
  // workers that are its own or spares (ReplicaOf), not lost and not
  // drained, whose end no replica claimed yet and comes after `since` (the
  // start of the replica's last re-plan, which saw any earlier end).
  // NextExclusionEnd: the earliest such end (nullopt: none), past or not,
  // for the plan thread's timed wait. ClaimEndedExclusions: those that ended
  // by `now`, marked claimed (so no other replica, and no later call,
  // re-plans for them), as (worker id, exclusion), in worker id order.
  std::optional<std::chrono::steady_clock::time_point> NextExclusionEnd(
      int replica, std::chrono::steady_clock::time_point since) const REQUIRES(mu);
  std::vector<std::pair<std::string, WorkerExclusion>> ClaimEndedExclusions(
      int replica, std::chrono::steady_clock::time_point since,
      std::chrono::steady_clock::time_point now) REQUIRES(mu);
  // The workers a plan may use: of `workers`, alive, not lost, not
  // drained, not excluded, in registration order.
  std::vector<std::string> UsableWorkers(const std::vector<ControlWorkerInfo>& workers) const
      EXCLUDES(mu);
};

}  // namespace tessera
