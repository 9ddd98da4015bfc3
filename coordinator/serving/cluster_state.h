// ClusterState: what the coordinator knows of its cluster and running plan,
// shared by the plan runner (coordinator/serving/plan_runner.h), the control
// events (worker_events.h), the status views (cluster_view.h) and the
// metrics (cluster_metrics.h).
//
// Every field names the mutex that guards it (GUARDED_BY, checked by clang:
// scripts/thread-safety). `cv` is notified whenever something a waiter
// waits for changes: a worker registered or was lost, a Loaded or an Error
// while loading, a placement failure, serving started, stopping.
//
// Thread-safety: take `mu` (MutexLock) for the guarded fields, `exec_mu` for
// the executor; never `mu` inside `exec_mu`.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
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

struct ClusterState {
  mutable Mutex mu;
  std::condition_variable_any cv;  // see the header comment; wait with `mu`

  ParallelConfig parallel GUARDED_BY(mu);  // the running plan's layout
  // The layout asked for: the config's or the planner's first choice, then
  // POST /admin/plan's.
  ParallelConfig wanted GUARDED_BY(mu);
  int64_t kv_blocks GUARDED_BY(mu) = 0;  // KV blocks per rank
  uint64_t plan_version GUARDED_BY(mu) = 0;
  std::vector<Assignment> assignments GUARDED_BY(mu);
  std::vector<std::string> failed_workers GUARDED_BY(mu);  // lost, not re-registered
  // Lost workers that registered again while a re-plan was pending or
  // running (a stopped worker resumed): still in failed_workers, so that
  // re-plan does not place them; usable once the re-plans end.
  std::vector<std::string> returning_workers GUARDED_BY(mu);
  std::vector<std::string> drained_workers GUARDED_BY(mu);  // out of placement by the admin
  Status placement_status GUARDED_BY(mu);                   // the initial placement's failure
  std::string degraded GUARDED_BY(mu);                      // why no plan runs ("" = none)
  std::string load_error GUARDED_BY(mu);                    // an Error while loading
  bool stopping GUARDED_BY(mu) = false;
  bool serving GUARDED_BY(mu) = false;                              // the serving loop runs
  nlohmann::json history GUARDED_BY(mu) = nlohmann::json::array();  // plan changes, last 32
  int64_t reconfigurations GUARDED_BY(mu) = 0;
  int64_t faults GUARDED_BY(mu) = 0;
  int64_t requeued_total GUARDED_BY(mu) = 0;
  std::optional<PlanResult> plan_result GUARDED_BY(mu);  // the planner's, when it placed the plan
  std::map<std::string, control::WorkerState> states GUARDED_BY(mu);  // from heartbeats
  StoreServerCore::Stats store_seen GUARDED_BY(mu);  // the store's counters at the last scrape
  // A plan is loaded and the loop serves it (/readyz).
  std::atomic<bool> ready{false};

  // The running plan's executor (StepResults go to it); swapped by the plan
  // runner.
  mutable Mutex exec_mu;
  std::shared_ptr<RemoteExecutor> executor GUARDED_BY(exec_mu);

  std::shared_ptr<RemoteExecutor> Executor() const EXCLUDES(exec_mu);
  // Whether `worker_id` has a rank of the running plan / was lost / drained.
  bool InPlan(const std::string& worker_id) const REQUIRES(mu);
  // A worker declared lost (`why`): marks it failed (once) and fails the
  // running executor's steps that wait on it. Returns whether it held a rank
  // of the plan while serving. The caller wakes the serving loop.
  bool MarkFailed(const std::string& worker_id, const Status& why) EXCLUDES(mu, exec_mu);
  bool IsFailed(const std::string& worker_id) const REQUIRES(mu);
  bool IsDrained(const std::string& worker_id) const REQUIRES(mu);
  // The workers a plan may use: of `workers`, alive, not lost, not
  // drained, in registration order.
  std::vector<std::string> UsableWorkers(const std::vector<ControlWorkerInfo>& workers) const
      EXCLUDES(mu);
};

}  // namespace tessera
