#include "coordinator/placement/plan_change.h"

#include <algorithm>

#include "common/model/shard_spec.h"

namespace tessera {

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

void FillReuse(RankPlacement& p, int pp, const std::map<std::string, HeldSlice>& held) {
  const auto h = held.find(p.worker_id);
  Reuse(p, pp, h == held.end() ? nullptr : &h->second);
}

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

PlanChange DescribePlanChange(const ParallelConfig* from, const ParallelConfig& to,
                              const std::vector<RankPlacement>& ranks,
                              const std::vector<std::string>& from_workers, uint64_t next_version) {
  PlanChange out;
  if (from) out.from = *from;
  out.to = to;
  out.plan_version = next_version;
  out.ranks = ranks;
  for (const RankPlacement& p : ranks) {
    out.layers_reused += p.reused_end - p.reused_first;
    out.layers_loaded += p.loaded_layers();
  }
  for (const std::string& w : from_workers)
    if (std::none_of(ranks.begin(), ranks.end(),
                     [&](const RankPlacement& p) { return p.worker_id == w; }))
      out.workers_released.push_back(w);
  return out;
}

}  // namespace tessera
