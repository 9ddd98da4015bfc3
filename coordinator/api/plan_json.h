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

#include "common/base/status.h"
#include "common/model/parallel_config.h"
#include "coordinator/placement/plan_change.h"
#include "coordinator/serving/plan_control.h"
#include "coordinator/serving/plan_report.h"

namespace tessera {

// Parses a POST /admin/plan body (the forms of PlanRequest). Errors (the
// message names the field): kInvalidArgument when the body is not a JSON
// object, has an unknown field, tp / pp are not integers >= 1, tp is an
// empty list or has an entry that is not an integer >= 1, pp differs from
// the length of a tp list, layers_per_stage is not a list of integers, auto
// is mixed with tp / pp, objective is unknown, or replica is not an integer
// >= 0.
StatusOr<PlanRequest> ParsePlanRequest(const std::string& body);

// The request field an error of ParsePlanRequest names, for the error body's "param": the text
// before its first ": " ("tp", "tp[1]", "layers_per_stage[0]", "replica", ...), or the unknown
// field of "request body: unknown field 'X' ..."; nullopt for an error of the body as a whole
// (not JSON, not an object) or a message of another form.
std::optional<std::string> PlanRequestErrorParam(const Status& error);

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
