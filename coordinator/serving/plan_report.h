// PlanChangeReport: what one applied plan of a replica did, as typed
// values. The plan runner (coordinator/serving/plan_runner.h) fills it when
// a plan serves; the replica keeps the last 32 (ReplicaPlan::history, GET
// /admin/plan's "history") and POST /admin/plan answers with the change's
// (coordinator/api/admin_api.cc).
//
// Thread-safety: a value type. coordinator/api/plan_json.h renders it as
// JSON (PlanChangeReportJson).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/model/parallel_config.h"

namespace tessera {

// The re-plan's own figures, present when the plan replaced a running one
// (the first placement has none).
struct ReplanFigures {
  double drain_seconds = 0;  // pausing the serving loop (in-flight deadline)
  // From the fault's first sign to its culprit being known; faults only.
  std::optional<double> detect_seconds;
  int requeued_requests = 0;    // in-flight sequences re-queued by the drain
  int handed_off_requests = 0;  // queued requests moved to the other replicas
  double total_seconds = 0;     // the whole re-plan, drain to serving
};

struct PlanChangeReport {
  uint64_t plan_version = 0;
  std::string reason;  // why the plan was applied (the first placement, POST /admin/plan, ...)
  int replica = 0;
  ParallelConfig layout;             // the plan's layout (with expert_parallel)
  std::vector<std::string> workers;  // one per world rank, in rank order
  double load_seconds = 0;           // AssignShard to the last Loaded
  int64_t weight_bytes = 0;          // loaded weights, summed over the ranks
  int64_t reused_weight_bytes = 0;   // of which kept from the previous plan
  int64_t unix_time = 0;             // seconds since the Unix epoch, when it served
  std::optional<ReplanFigures> replan;
};

}  // namespace tessera
