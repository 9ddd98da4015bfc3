// PlanControl and ClusterStatus: what the admin API (coordinator/api/
// admin_api.h) and the health endpoints see of the serving layer. The plan
// runner (coordinator/serving/plan_runner.h) and the replica set implement
// PlanControl, the cluster view (coordinator/serving/cluster_view.h)
// ClusterStatus. Results are typed (PlanApplyResult); only coordinator/api/
// maps them to HTTP status codes.
//
// Thread-safety: every method is safe from any thread (the HTTP threads).
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/base/status.h"
#include "common/model/parallel_config.h"
#include "coordinator/placement/plan_change.h"
#include "coordinator/placement/planner.h"
#include "coordinator/serving/plan_report.h"

namespace tessera {

// A layout and its placement, computed for POST /admin/plan.
struct PlanProposal {
  ParallelConfig parallel;
  std::vector<RankPlacement> ranks;
  // The planner's result for {"auto": true}; shared, never copied.
  std::shared_ptr<const PlanResult> planned;
  int replica = 0;  // the replica it changes
};

// How an applied plan change ended.
struct PlanApplyResult {
  enum class Outcome {
    kApplied,   // the new plan serves: `report` says what it did
    kFailed,    // it could not be loaded: `error` says why; the replica
                // re-plans its previous (wanted) layout on the usable workers
    kStopping,  // the coordinator stopped before the change ran
  };
  Outcome outcome = Outcome::kApplied;
  std::string error;        // kFailed: the failure's message
  PlanChangeReport report;  // kApplied
};
// Called once with the change's result, on the replica's plan thread.
using PlanApplyDone = std::function<void(const PlanApplyResult&)>;

class PlanControl {
 public:
  virtual ~PlanControl() = default;
  // Validates `request` and computes its layout and placement on the usable
  // workers. Errors: kInvalidArgument naming why the layout or the cluster
  // cannot take it.
  virtual StatusOr<PlanProposal> Propose(const PlanRequest& request) const = 0;
  // The dry-run answer: what applying `proposal` would change
  // (PlanChangeJson, "dry_run": true, the drain timeout, the planner's text).
  virtual std::string DryRunJson(const PlanProposal& proposal) const = 0;
  // Queues `proposal` for the plan runner; `done` gets the change's result
  // once it serves or fails (or the coordinator stops first). Errors:
  // kFailedPrecondition (a change is in progress, or the first placement
  // is) or kInvalidArgument (no such replica), and then `done` is dropped
  // uncalled.
  virtual Status Apply(PlanProposal proposal, PlanApplyDone done) = 0;

  struct DrainOutcome {
    bool known = false;    // the worker has registered
    bool changed = false;  // it was not already (un)drained
    bool replan = false;   // a re-plan was queued
  };
  // Takes worker `id` out of placement (drain) or puts it back, re-planning
  // when that moves ranks.
  virtual DrainOutcome SetDrained(const std::string& id, bool drain) = 0;
  // Drains replica `replica` (no new request goes to it; its queued ones
  // move to the others) or undrains it. Returns whether that changed it.
  // Errors: kNotFound for a replica that does not exist.
  virtual StatusOr<bool> SetReplicaDrained(int replica, bool drain) {
    (void)drain;
    return NotFound("no replica " + std::to_string(replica));
  }
};

// One page of GET /admin/cluster: the workers (in registration order) and
// the replicas (by index) numbered [page * page_size, (page + 1) *
// page_size); the document's "pages" says how many there are.
inline constexpr int64_t kDefaultClusterPageSize = 1024;
inline constexpr int64_t kMaxClusterPageSize = 4096;
struct ClusterPage {
  int64_t page = 0;                             // >= 0
  int64_t page_size = kDefaultClusterPageSize;  // 1..kMaxClusterPageSize
};

class ClusterStatus {
 public:
  virtual ~ClusterStatus() = default;
  // A plan is loaded and served.
  virtual bool ready() const = 0;
  // GET /readyz's 503 body when not ready: {"status","reason"}.
  virtual std::string NotReadyJson() const = 0;
  // GET /admin/cluster (one page of it) and GET /admin/plan.
  virtual std::string ClusterJson(const ClusterPage& page) const = 0;
  virtual std::string PlanJson() const = 0;
};

}  // namespace tessera
