#include "coordinator/serving/plan_report.h"

#include "coordinator/placement/plan_change.h"

namespace tessera {

nlohmann::json PlanChangeReportJson(const PlanChangeReport& r) {
  nlohmann::json out = {
      {"plan_version", r.plan_version}, {"reason", r.reason},
      {"replica", r.replica},           {"layout", LayoutJson(r.layout)},
      {"workers", r.workers},           {"load_seconds", r.load_seconds},
      {"weight_bytes", r.weight_bytes}, {"reused_weight_bytes", r.reused_weight_bytes},
      {"unix_time", r.unix_time}};
  if (r.replan) {
    out["drain_seconds"] = r.replan->drain_seconds;
    if (r.replan->detect_seconds) out["detect_seconds"] = *r.replan->detect_seconds;
    out["requeued_requests"] = r.replan->requeued_requests;
    out["handed_off_requests"] = r.replan->handed_off_requests;
    out["total_seconds"] = r.replan->total_seconds;
  }
  return out;
}

}  // namespace tessera
