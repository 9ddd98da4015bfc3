#include "coordinator/api/plan_json.h"

#include <algorithm>
#include <utility>

#include "common/base/json_parse.h"

namespace tessera {

using nlohmann::json;

namespace {
// The largest tp or pp a plan request may name (a bound on the input, far
// above any real layout; the planner then checks what the model allows).
constexpr int64_t kMaxLayoutDegree = 1 << 20;

// A refusal of the field `param` (nullopt: the body as a whole).
PlanRequestError Refuse(std::optional<std::string> param, std::string message) {
  return {InvalidArgument(std::move(message)), std::move(param)};
}
}  // namespace

PlanRequestOr ParsePlanRequest(const std::string& body) {
  json j;
  JsonParseError error;
  if (!ParseJsonBounded(body, kMaxRequestJsonDepth, &j, &error))
    return Refuse(std::nullopt, "request body: not valid JSON: " + error.message);
  if (!j.is_object()) return Refuse(std::nullopt, "request body: must be a JSON object");
  static const std::vector<std::string> kKnown = {"tp",   "pp",        "layers_per_stage",
                                                  "auto", "objective", "replica"};
  for (const auto& [key, value] : j.items())
    if (std::find(kKnown.begin(), kKnown.end(), key) == kKnown.end())
      return Refuse(key, "request body: unknown field '" + key +
                             "' (known: tp, pp, layers_per_stage, auto, objective, replica)");
  PlanRequest r;
  if (j.contains("replica")) {
    const json& v = j["replica"];
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > kMaxLayoutDegree)
      return Refuse("replica", "replica: must be an integer >= 0 (a replica's index), got " +
                                   ShowJsonValue(v));
    r.replica = v.get<int>();
  }
  if (j.contains("auto")) {
    if (!j["auto"].is_boolean()) return Refuse("auto", "auto: must be true or false");
    r.auto_plan = j["auto"].get<bool>();
  }
  if (j.contains("tp") && j["tp"].is_array()) {
    const json& v = j["tp"];
    if (v.empty()) return Refuse("tp", "tp: a list needs one entry per stage, got []");
    for (size_t i = 0; i < v.size(); ++i) {
      if (!v[i].is_number_integer() || v[i].get<int64_t>() < 1 ||
          v[i].get<int64_t>() > kMaxLayoutDegree) {
        const std::string field = "tp[" + std::to_string(i) + "]";
        return Refuse(field, field + ": must be an integer from 1 to " +
                                 std::to_string(kMaxLayoutDegree) + ", got " + ShowJsonValue(v[i]));
      }
      r.tp_per_stage.push_back(v[i].get<int>());
    }
  }
  // The refusal of `key` when it is given and not an integer from 1 to kMaxLayoutDegree.
  auto positive = [&](const char* key, int& out) -> std::optional<PlanRequestError> {
    if (!j.contains(key)) return std::nullopt;
    const json& v = j[key];
    if (!v.is_number_integer() || v.get<int64_t>() < 1 || v.get<int64_t>() > kMaxLayoutDegree)
      return Refuse(key, std::string(key) + ": must be an integer from 1 to " +
                             std::to_string(kMaxLayoutDegree) + ", got " + ShowJsonValue(v));
    out = v.get<int>();
    return std::nullopt;
  };
  if (r.tp_per_stage.empty()) {
    if (auto refused = positive("tp", r.tp)) return *std::move(refused);
  }
  if (auto refused = positive("pp", r.pp)) return *std::move(refused);
  if (j.contains("layers_per_stage")) {
    const json& v = j["layers_per_stage"];
    if (!v.is_array())
      return Refuse("layers_per_stage", "layers_per_stage: must be a list of integers");
    for (size_t i = 0; i < v.size(); ++i) {
      if (!v[i].is_number_integer()) {
        const std::string field = "layers_per_stage[" + std::to_string(i) + "]";
        return Refuse(field, field + ": must be an integer, got " + ShowJsonValue(v[i]));
      }
      r.layers_per_stage.push_back(v[i].get<int>());
    }
  }
  if (r.auto_plan) {
    if (r.tp || !r.tp_per_stage.empty() || r.pp || !r.layers_per_stage.empty())
      return Refuse("auto", "auto: give either \"auto\": true or tp / pp / layers_per_stage");
    if (j.contains("objective")) {
      if (!j["objective"].is_string())
        return Refuse("objective", "objective: must be \"latency\" or \"throughput\"");
      auto o = ParseObjective(j["objective"].get<std::string>());
      if (!o.ok()) return PlanRequestError{o.status(), "objective"};  // names value and choices
      r.objective = *o;
    }
    return r;
  }
  if (j.contains("objective")) return Refuse("objective", "objective: only with \"auto\": true");
  if (!r.tp_per_stage.empty()) {
    const int stages = static_cast<int>(r.tp_per_stage.size());
    if (r.pp && r.pp != stages)
      return Refuse("pp", "pp: " + std::to_string(r.pp) + " differs from the " +
                              std::to_string(stages) + " entries of the tp list");
    r.pp = stages;
    return r;
  }
  // Both are named in the message; param is the one missing (tp when both are).
  if (!r.tp || !r.pp)
    return Refuse(r.tp ? "pp" : "tp", "tp, pp: both are required (or \"auto\": true)");
  return r;
}

json LayoutJson(const ParallelConfig& p) {
  return {{"tp", p.tp},
          {"tp_per_stage", p.TpPerStage()},
          {"pp", p.pp},
          {"layers_per_stage", p.layers_per_stage}};
}

json PlanChangeJson(const PlanChange& c) {
  json ranks = json::array();
  for (const RankPlacement& p : c.ranks)
    ranks.push_back({{"worker", p.worker_id},
                     {"world_rank", p.world_rank},
                     {"stage", p.stage},
                     {"tp", p.tp},
                     {"tp_rank", p.tp_rank},
                     {"layers", {p.first_layer, p.end_layer}},
                     {"reused_layers", {p.reused_first, p.reused_end}},
                     {"reuses_embedding", p.reuses_embedding},
                     {"reuses_lm_head", p.reuses_lm_head},
                     {"loads_layers", p.loaded_layers()}});
  return {{"from", c.from ? LayoutJson(*c.from) : json(nullptr)},
          {"to", LayoutJson(c.to)},
          {"plan_version", c.plan_version},
          {"ranks", ranks},
          {"workers_released", c.workers_released},
          {"layers_reused", c.layers_reused},
          {"layers_loaded", c.layers_loaded}};
}

json PlanDryRunJson(const PlanDryRun& d) {
  json j = PlanChangeJson(d.change);
  j["dry_run"] = true;
  j["drain_timeout_seconds"] = d.drain_timeout_seconds;
  if (d.planned) j["planner_text"] = d.planned->ToText();  // why the planner chose it
  return j;
}

json PlanChangeReportJson(const PlanChangeReport& r) {
  json out = {{"plan_version", r.plan_version}, {"reason", r.reason},
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
