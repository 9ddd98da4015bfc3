#include "coordinator/placement/plan_change.h"

#include <algorithm>

#include "common/base/json_parse.h"
#include "common/model/shard_spec.h"

namespace tessera {

using nlohmann::json;

namespace {
// The largest tp or pp a plan request may name (a bound on the input, far
// above any real layout; the planner then checks what the model allows).
constexpr int64_t kMaxLayoutDegree = 1 << 20;
}  // namespace

StatusOr<PlanRequest> ParsePlanRequest(const std::string& body) {
  json j;
  JsonParseError error;
  if (!ParseJsonBounded(body, kMaxRequestJsonDepth, &j, &error))
    return InvalidArgument("request body: not valid JSON: " + error.message);
  if (!j.is_object()) return InvalidArgument("request body: must be a JSON object");
  static const std::vector<std::string> kKnown = {"tp",   "pp",        "layers_per_stage",
                                                  "auto", "objective", "replica"};
  for (const auto& [key, value] : j.items())
    if (std::find(kKnown.begin(), kKnown.end(), key) == kKnown.end())
      return InvalidArgument("request body: unknown field '" + key +
                             "' (known: tp, pp, layers_per_stage, auto, objective, replica)");
  PlanRequest r;
  if (j.contains("replica")) {
    const json& v = j["replica"];
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > kMaxLayoutDegree)
      return InvalidArgument("replica: must be an integer >= 0 (a replica's index), got " +
                             ShowJsonValue(v));
    r.replica = v.get<int>();
  }
  if (j.contains("auto")) {
    if (!j["auto"].is_boolean()) return InvalidArgument("auto: must be true or false");
    r.auto_plan = j["auto"].get<bool>();
  }
  if (j.contains("tp") && j["tp"].is_array()) {
    const json& v = j["tp"];
    if (v.empty()) return InvalidArgument("tp: a list needs one entry per stage, got []");
    for (size_t i = 0; i < v.size(); ++i) {
      if (!v[i].is_number_integer() || v[i].get<int64_t>() < 1 ||
          v[i].get<int64_t>() > kMaxLayoutDegree)
        return InvalidArgument("tp[" + std::to_string(i) + "]: must be an integer from 1 to " +
                               std::to_string(kMaxLayoutDegree) + ", got " + ShowJsonValue(v[i]));
      r.tp_per_stage.push_back(v[i].get<int>());
    }
  }
  auto positive = [&](const char* key, int& out) -> Status {
    if (!j.contains(key)) return Status::Ok();
    const json& v = j[key];
    if (!v.is_number_integer() || v.get<int64_t>() < 1 || v.get<int64_t>() > kMaxLayoutDegree)
      return InvalidArgument(std::string(key) + ": must be an integer from 1 to " +
                             std::to_string(kMaxLayoutDegree) + ", got " + ShowJsonValue(v));
    out = v.get<int>();
    return Status::Ok();
  };
  if (r.tp_per_stage.empty()) TESSERA_RETURN_IF_ERROR(positive("tp", r.tp));
  TESSERA_RETURN_IF_ERROR(positive("pp", r.pp));
  if (j.contains("layers_per_stage")) {
    const json& v = j["layers_per_stage"];
    if (!v.is_array()) return InvalidArgument("layers_per_stage: must be a list of integers");
    for (size_t i = 0; i < v.size(); ++i) {
      if (!v[i].is_number_integer())
        return InvalidArgument("layers_per_stage[" + std::to_string(i) +
                               "]: must be an integer, got " + ShowJsonValue(v[i]));
      r.layers_per_stage.push_back(v[i].get<int>());
    }
  }
  if (r.auto_plan) {
    if (r.tp || !r.tp_per_stage.empty() || r.pp || !r.layers_per_stage.empty())
      return InvalidArgument("auto: give either \"auto\": true or tp / pp / layers_per_stage");
    if (j.contains("objective")) {
      if (!j["objective"].is_string())
        return InvalidArgument("objective: must be \"latency\" or \"throughput\"");
      auto o = ParseObjective(j["objective"].get<std::string>());
      if (!o.ok()) return o.status();  // names the value and the choices
      r.objective = *o;
    }
    return r;
  }
  if (j.contains("objective")) return InvalidArgument("objective: only with \"auto\": true");
  if (!r.tp_per_stage.empty()) {
    const int stages = static_cast<int>(r.tp_per_stage.size());
    if (r.pp && r.pp != stages)
      return InvalidArgument("pp: " + std::to_string(r.pp) + " differs from the " +
                             std::to_string(stages) + " entries of the tp list");
    r.pp = stages;
    return r;
  }
  if (!r.tp || !r.pp) return InvalidArgument("tp, pp: both are required (or \"auto\": true)");
  return r;
}

StatusOr<ParallelConfig> PlanRequest::Layout(const ModelConfig& model) const {
  if (!tp_per_stage.empty())
    return ParallelConfig::MakePerStage(model, tp_per_stage, layers_per_stage);
  return ParallelConfig::Make(model, tp, pp, layers_per_stage);
}

RankPlacement RankSlice(const ParallelConfig& parallel, int world_rank) {
  RankPlacement p;
  p.world_rank = world_rank;
  p.stage = parallel.StageOf(world_rank);
  p.tp = parallel.TpOfStage(p.stage);
  p.tp_rank = parallel.TpRankOf(world_rank);
  p.first_layer = parallel.FirstLayer(p.stage);
  p.end_layer = parallel.EndLayer(p.stage);
  return p;
}

namespace {

// Fills the reuse fields of `p` (of a layout with `pp` stages) from `held`.
void Reuse(RankPlacement& p, int pp, const HeldSlice* held) {
  p.reused_first = p.reused_end = 0;
  p.reuses_embedding = p.reuses_lm_head = false;
  if (!held || held->tp != p.tp || held->tp_rank != p.tp_rank) return;
  const int a = std::max(p.first_layer, held->first_layer);
  const int b = std::min(p.end_layer, held->end_layer);
  if (a < b) {
    p.reused_first = a;
    p.reused_end = b;
  }
  p.reuses_embedding = p.stage == 0 && held->embedding;
  p.reuses_lm_head = p.stage == pp - 1 && held->lm_head;
}

}  // namespace

StatusOr<std::vector<RankPlacement>> PlaceRanks(const ParallelConfig& parallel,
                                                const std::vector<std::string>& candidates,
                                                const std::map<std::string, HeldSlice>& held) {
  const int world = parallel.world_size();
  if (static_cast<int>(candidates.size()) < world)
    return FailedPrecondition("the layout needs " + std::to_string(world) + " workers, " +
                              std::to_string(candidates.size()) + " are usable");
  // Every (rank, candidate) pair with what the candidate would reuse.
  std::vector<std::vector<RankPlacement>> option(static_cast<size_t>(world));
  std::vector<std::vector<int>> score(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    for (const std::string& c : candidates) {
      RankPlacement p = RankSlice(parallel, r);
      p.worker_id = c;
      auto h = held.find(c);
      Reuse(p, parallel.pp, h == held.end() ? nullptr : &h->second);
      score[static_cast<size_t>(r)].push_back(4 * (p.reused_end - p.reused_first) +
                                              2 * p.reuses_embedding + 2 * p.reuses_lm_head);
      option[static_cast<size_t>(r)].push_back(p);
    }
  }
  // Greedy over all pairs, best reuse first (ties: lower rank, then earlier
  // candidate), so a rank that reuses nothing does not take the worker
  // another rank could reuse; the ranks left take the free candidates in order.
  std::vector<int> chosen(static_cast<size_t>(world), -1);
  std::vector<bool> used(candidates.size(), false);
  while (true) {
    int best = 0, br = -1, bc = -1;
    for (int r = 0; r < world; ++r) {
      if (chosen[static_cast<size_t>(r)] >= 0) continue;
      for (size_t c = 0; c < candidates.size(); ++c)
        if (!used[c] && score[static_cast<size_t>(r)][c] > best) {
          best = score[static_cast<size_t>(r)][c];
          br = r;
          bc = static_cast<int>(c);
        }
    }
    if (br < 0) break;
    chosen[static_cast<size_t>(br)] = bc;
    used[static_cast<size_t>(bc)] = true;
  }
  std::vector<RankPlacement> out;
  size_t next = 0;
  for (int r = 0; r < world; ++r) {
    if (chosen[static_cast<size_t>(r)] < 0) {
      while (used[next]) ++next;
      chosen[static_cast<size_t>(r)] = static_cast<int>(next);
      used[next] = true;
    }
    out.push_back(
        option[static_cast<size_t>(r)][static_cast<size_t>(chosen[static_cast<size_t>(r)])]);
  }
  return out;
}

namespace {

// Largest per-rank weight bytes of `p` (F32, the CPU compute dtype).
StatusOr<int64_t> MaxRankBytes(const ModelConfig& model, const ParallelConfig& p) {
  int64_t most = 0;
  for (int r = 0; r < p.world_size(); ++r) {
    TESSERA_ASSIGN_OR_RETURN(ShardSpec spec, ShardSpec::Make(model, p, r));
    most = std::max(most, spec.WeightBytes(DType::kF32));
  }
  return most;
}

Status Fits(const ModelConfig& model, const ParallelConfig& p, int64_t budget) {
  if (budget <= 0) return Status::Ok();
  TESSERA_ASSIGN_OR_RETURN(int64_t most, MaxRankBytes(model, p));
  if (most > budget)
    return ResourceExhausted(p.ToString() + " needs " + std::to_string(most) +
                             " weight bytes on a rank; the smallest worker has " +
                             std::to_string(budget));
  return Status::Ok();
}

}  // namespace

StatusOr<ParallelConfig> FitLayout(const ModelConfig& model, const ParallelConfig& wanted,
                                   int available, int64_t max_rank_weight_bytes) {
  Status last = FailedPrecondition("no worker is usable");
  if (wanted.world_size() <= available) {
    Status v = wanted.Validate(model);
    if (v.ok()) v = Fits(model, wanted, max_rank_weight_bytes);
    if (v.ok()) return wanted;
    last = v;
  }
  for (int world = std::min(available, wanted.world_size()); world >= 1; --world) {
    for (int tp = std::min(wanted.max_tp(), world); tp >= 1; --tp) {
      if (world % tp) continue;
      auto p = ParallelConfig::Make(model, tp, world / tp);
      if (!p.ok()) {
        last = p.status();
        continue;
      }
      Status f = Fits(model, *p, max_rank_weight_bytes);
      if (f.ok()) return *p;
      last = f;
    }
  }
  return FailedPrecondition("no layout of the model fits " + std::to_string(available) +
                            " usable worker(s) (last reason: " + last.message() + ")");
}

json LayoutJson(const ParallelConfig& p) {
  return {{"tp", p.tp},
          {"tp_per_stage", p.TpPerStage()},
          {"pp", p.pp},
          {"layers_per_stage", p.layers_per_stage}};
}

json PlanChangeJson(const ParallelConfig* from, const ParallelConfig& to,
                    const std::vector<RankPlacement>& ranks,
                    const std::vector<std::string>& from_workers, uint64_t next_version) {
  json rs = json::array();
  int reused = 0, loaded = 0;
  for (const RankPlacement& p : ranks) {
    reused += p.reused_end - p.reused_first;
    loaded += p.loaded_layers();
    rs.push_back({{"worker", p.worker_id},
                  {"world_rank", p.world_rank},
                  {"stage", p.stage},
                  {"tp", p.tp},
                  {"tp_rank", p.tp_rank},
                  {"layers", {p.first_layer, p.end_layer}},
                  {"reused_layers", {p.reused_first, p.reused_end}},
                  {"reuses_embedding", p.reuses_embedding},
                  {"reuses_lm_head", p.reuses_lm_head},
                  {"loads_layers", p.loaded_layers()}});
  }
  json released = json::array();
  for (const std::string& w : from_workers)
    if (std::none_of(ranks.begin(), ranks.end(),
                     [&](const RankPlacement& p) { return p.worker_id == w; }))
      released.push_back(w);
  return {{"from", from ? LayoutJson(*from) : json(nullptr)},
          {"to", LayoutJson(to)},
          {"plan_version", next_version},
          {"ranks", rs},
          {"workers_released", released},
          {"layers_reused", reused},
          {"layers_loaded", loaded}};
}

}  // namespace tessera
