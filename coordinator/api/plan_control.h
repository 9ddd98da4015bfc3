// PlanControl and ClusterStatus: what the admin API (coordinator/api/
// admin_api.h) and the health endpoints see of the coordinator. The plan
// runner (coordinator/serving/plan_runner.h) implements PlanControl, the
// cluster view (coordinator/serving/cluster_view.h) ClusterStatus.
//
// Thread-safety: every method is safe from any thread (the HTTP threads).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/base/status.h"
#include "common/model/parallel_config.h"
#include "common/net/http_server.h"
#include "coordinator/placement/plan_change.h"
#include "coordinator/placement/planner.h"

namespace tessera {

// A layout and its placement, computed for POST /admin/plan.
struct PlanProposal {
  ParallelConfig parallel;
  std::vector<RankPlacement> ranks;
  // The planner's result for {"auto": true}; shared, never copied.
  std::shared_ptr<const PlanResult> planned;
  int replica = 0;  // the replica it changes
};

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
  // Queues `proposal` for the plan runner; `res` gets the change's report
  // (200) or its failure (503) once applied. Errors: kFailedPrecondition
  // with the message of a 409 (a change is in progress, or the first
  // placement is), and then `res` is not kept.
  virtual Status Apply(PlanProposal proposal, std::shared_ptr<Responder> res) = 0;

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
