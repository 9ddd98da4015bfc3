// PlanControl: what the admin API (coordinator/api/admin_api.h) sees of the
// serving layer's plans (ClusterStatus, coordinator/serving/cluster_status.h,
// is what it reads of the cluster). The plan runner
// (coordinator/serving/plan_runner.h) and the replica set implement it.
// Results are typed (PlanApplyResult, PlanDryRun); only coordinator/api/
// maps them to HTTP status codes and JSON (coordinator/api/plan_json.h).
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

// The dry-run answer of POST /admin/plan: what applying a proposal would
// change. A value type.
struct PlanDryRun {
  PlanChange change;
  double drain_timeout_seconds = 0;  // scheduler.drain_timeout_seconds, the pause's deadline
  // The planner's result for {"auto": true} (its text says why it chose
  // the layout); null for an explicit layout.
  std::shared_ptr<const PlanResult> planned;
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
  // The dry-run answer: what applying `proposal` would change over the
  // replica's running plan.
  virtual PlanDryRun DryRun(const PlanProposal& proposal) const = 0;
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

}  // namespace tessera
