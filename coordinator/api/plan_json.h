// The JSON of plan changes, the edge of the admin API's plan endpoints
// (docs/operations.md, "Admin API"): POST /admin/plan's body in
// (ParsePlanRequest) and its answers out (the dry run, the applied change's
// report, which is also GET /admin/plan's "history" entry). The serving
// and placement layers hand over typed values (PlanRequest, PlanDryRun,
// PlanChangeReport); only this layer knows their JSON.
//
// Thread-safety: pure functions.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>

#include "common/base/status.h"
#include "common/model/parallel_config.h"
#include "coordinator/placement/plan_change.h"
#include "coordinator/serving/plan_control.h"
#include "coordinator/serving/plan_report.h"

namespace tessera {

// Why ParsePlanRequest refused a body: the error and, typed, the request
// field it is about, which POST /admin/plan's error body carries as "param".
struct PlanRequestError {
  Status status;  // kInvalidArgument; the message names the field and what is wrong with it
  // The field at fault: "tp", "tp[1]", "pp", "layers_per_stage", "layers_per_stage[0]",
  // "auto", "objective", "replica", or an unknown field's name; nullopt when the body as a
  // whole is wrong (not JSON, not a JSON object).
  std::optional<std::string> param;
};

// A parsed PlanRequest or the PlanRequestError that explains why there is none: a
// StatusOr<PlanRequest> (its accessors and preconditions) that also keeps the field at fault.
class [[nodiscard]] PlanRequestOr : public StatusOr<PlanRequest> {
 public:
  PlanRequestOr(PlanRequest request)  // NOLINT: implicit
      : StatusOr<PlanRequest>(std::move(request)) {}
  PlanRequestOr(PlanRequestError error)  // NOLINT: implicit
      : StatusOr<PlanRequest>(std::move(error.status)), param_(std::move(error.param)) {}
  // Precondition: !ok().
  PlanRequestError error() const { return {status(), param_}; }

 private:
  std::optional<std::string> param_;
};

// Parses a POST /admin/plan body (the forms of PlanRequest). Errors
// (kInvalidArgument, the message naming the field, `param` the field):
// the body is not a JSON object (no param), has an unknown field (its
// name), tp / pp are not integers >= 1, tp is an empty list or has an entry
// that is not an integer >= 1 ("tp[i]"), pp differs from the length of a tp
// list, tp or pp is missing (the missing one), layers_per_stage is not a
// list of integers, auto is not a boolean or is mixed with tp / pp,
// objective is unknown or given without auto, or replica is not an integer
// >= 0.
PlanRequestOr ParsePlanRequest(const std::string& body);

// {"tp","tp_per_stage","pp","layers_per_stage"} of a layout: tp is 0 when
// the stages differ in tp; tp_per_stage lists every stage's tp.
nlohmann::json LayoutJson(const ParallelConfig& parallel);

// {"from": layout or null, "to": layout, "plan_version", "ranks":
// [{"worker", "world_rank", "stage", "tp", "tp_rank", "layers": [a, b),
// "reused_layers": [c, d), "reuses_embedding", "reuses_lm_head",
// "loads_layers"}], "workers_released", "layers_reused", "layers_loaded"}.
nlohmann::json PlanChangeJson(const PlanChange& change);

// The dry-run answer: PlanChangeJson plus "dry_run": true,
// "drain_timeout_seconds" and, for the planner's choice, "planner_text".
nlohmann::json PlanDryRunJson(const PlanDryRun& dry_run);

// {"plan_version", "reason", "replica", "layout" (LayoutJson), "workers",
// "load_seconds", "weight_bytes", "reused_weight_bytes", "unix_time"} and,
// with `replan`, "drain_seconds", "detect_seconds" (faults),
// "requeued_requests", "handed_off_requests", "total_seconds". The shape of
// POST /admin/plan's 200 body and of GET /admin/plan's "history" entries.
nlohmann::json PlanChangeReportJson(const PlanChangeReport& report);

}  // namespace tessera
