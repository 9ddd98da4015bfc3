#include "common/model/parallel_config.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <numeric>

#include "common/model/parallel_rank.h"

namespace tessera {

namespace {

// num_hidden_layers / pp per stage, the first num_hidden_layers % pp stages
// one more; empty when pp is out of range (Validate reports it).
std::vector<int> EvenSplit(const ModelConfig& model, int pp) {
  std::vector<int> out;
  if (pp < 1 || pp > model.num_hidden_layers) return out;
  const int layers = static_cast<int>(model.num_hidden_layers);
  for (int s = 0; s < pp; ++s) out.push_back(layers / pp + (s < layers % pp ? 1 : 0));
  return out;
}

// The per-stage tp checks of Validate; `where` is "" for a uniform layout or
// "stage s: " for a per-stage one.
Status ValidateTp(const ModelConfig& model, int tp, bool expert_parallel,
                  const std::string& where) {
  const int64_t heads = model.num_attention_heads;
  const int64_t kv_heads = model.num_key_value_heads;
  if (tp < 1) return InvalidArgument(fmt::format("{}tp must be >= 1, got tp={}", where, tp));
  if (heads % tp != 0) {
    return InvalidArgument(fmt::format(
        "{}tp={} does not divide num_attention_heads={}: each tp rank must hold whole query heads",
        where, tp, heads));
  }
  if (kv_heads % tp != 0 && tp % kv_heads != 0) {
    return InvalidArgument(fmt::format(
        "{}tp={} neither divides num_key_value_heads={} nor is a multiple of it: each tp rank "
        "must hold whole KV heads (replicated when num_key_value_heads < tp)",
        where, tp, kv_heads));
  }
  if (model.intermediate_size % tp != 0) {
    return InvalidArgument(fmt::format(
        "{}tp={} does not divide intermediate_size={}: gate_proj/up_proj/down_proj are split "
        "evenly over the tp ranks",
        where, tp, model.intermediate_size));
  }
  if (model.is_moe() && !expert_parallel && model.moe_intermediate_size % tp != 0) {
    return InvalidArgument(fmt::format(
        "{}tp={} does not divide moe_intermediate_size={}: without expert_parallel every expert's "
        "gate/up/down are split evenly over the tp ranks",
        where, tp, model.moe_intermediate_size));
  }
  if (model.shared_expert_intermediate_size % tp != 0) {
    return InvalidArgument(fmt::format(
        "{}tp={} does not divide shared_expert_intermediate_size={}: the shared expert is split "
        "evenly over the tp ranks",
        where, tp, model.shared_expert_intermediate_size));
  }
  return Status::Ok();
}

}  // namespace

StatusOr<ParallelConfig> ParallelConfig::Make(const ModelConfig& model, int tp, int pp,
                                              std::vector<int> layers_per_stage,
                                              bool expert_parallel) {
  ParallelConfig config;
  config.expert_parallel = expert_parallel;
  config.tp = tp;
  config.pp = pp;
  if (layers_per_stage.empty()) layers_per_stage = EvenSplit(model, pp);
  config.layers_per_stage = std::move(layers_per_stage);
  TESSERA_RETURN_IF_ERROR(config.Validate(model));
  return config;
}

StatusOr<ParallelConfig> ParallelConfig::MakePerStage(const ModelConfig& model,
                                                      std::vector<int> tp_per_stage,
                                                      std::vector<int> layers_per_stage,
                                                      bool expert_parallel) {
  if (tp_per_stage.empty()) return InvalidArgument("tp_per_stage=[] has no stages");
  const int pp = static_cast<int>(tp_per_stage.size());
  bool uniform = true;
  for (int t : tp_per_stage) uniform = uniform && t == tp_per_stage[0];
  if (uniform)
    return Make(model, tp_per_stage[0], pp, std::move(layers_per_stage), expert_parallel);
  ParallelConfig config;
  config.expert_parallel = expert_parallel;
  config.tp = 0;
  config.pp = pp;
  config.tp_per_stage = std::move(tp_per_stage);
  config.layers_per_stage = std::move(layers_per_stage);
  if (config.layers_per_stage.empty()) config.layers_per_stage = EvenSplit(model, pp);
  TESSERA_RETURN_IF_ERROR(config.Validate(model));
  return config;
}

Status ParallelConfig::Validate(const ModelConfig& model) const {
  if (uniform_tp() && tp < 1) return InvalidArgument(fmt::format("tp must be >= 1, got tp={}", tp));
  if (pp < 1) return InvalidArgument(fmt::format("pp must be >= 1, got pp={}", pp));
  {
    // world_size() is an int: bound the ranks before anything multiplies.
    constexpr int64_t kMaxRanks = int64_t{1} << 20;
    int64_t ranks = 0;
    if (uniform_tp()) {
      ranks = static_cast<int64_t>(tp) * pp;
    } else {
      for (int t : tp_per_stage) ranks += t;
    }
    if (ranks > kMaxRanks)
      return InvalidArgument(fmt::format("tp={} over pp={} stages gives {} ranks; at most {}",
                                         TpString(), pp, ranks, kMaxRanks));
  }
  if (!uniform_tp()) {
    const std::string list = fmt::format("tp_per_stage=[{}]", fmt::join(tp_per_stage, ", "));
    if (static_cast<int>(tp_per_stage.size()) != pp) {
      return InvalidArgument(
          fmt::format("{} has {} entries but pp={}", list, tp_per_stage.size(), pp));
    }
    if (tp != 0) {
      return InvalidArgument(fmt::format(
          "{} is set together with tp={}: tp must be 0 for a per-stage layout", list, tp));
    }
    bool all_equal = true;
    for (int t : tp_per_stage) all_equal = all_equal && t == tp_per_stage[0];
    if (all_equal) {
      return InvalidArgument(
          fmt::format("{} gives every stage the same tp: use tp={}", list, tp_per_stage[0]));
    }
  }

  const int64_t heads = model.num_attention_heads;
  const int64_t kv_heads = model.num_key_value_heads;
  const int64_t layers = model.num_hidden_layers;
  if (heads < 1 || kv_heads < 1 || layers < 1 || model.intermediate_size < 1) {
    return InvalidArgument(fmt::format(
        "model config: num_attention_heads={}, num_key_value_heads={}, num_hidden_layers={} and "
        "intermediate_size={} must all be >= 1",
        heads, kv_heads, layers, model.intermediate_size));
  }
  if (heads % kv_heads != 0) {
    return InvalidArgument(
        fmt::format("model config: num_attention_heads={} is not a multiple of "
                    "num_key_value_heads={}",
                    heads, kv_heads));
  }
  if (uniform_tp()) {
    TESSERA_RETURN_IF_ERROR(ValidateTp(model, tp, expert_parallel, ""));
  } else {
    for (int s = 0; s < pp; ++s)
      TESSERA_RETURN_IF_ERROR(
          ValidateTp(model, tp_per_stage[s], expert_parallel, fmt::format("stage {}: ", s)));
  }
  if (pp > layers) {
    return InvalidArgument(fmt::format(
        "pp={} exceeds num_hidden_layers={}: every stage needs at least one layer", pp, layers));
  }
  if (static_cast<int>(layers_per_stage.size()) != pp) {
    return InvalidArgument(fmt::format("layers_per_stage=[{}] has {} entries but pp={}",
                                       fmt::join(layers_per_stage, ", "), layers_per_stage.size(),
                                       pp));
  }
  for (int s = 0; s < pp; ++s) {
    if (layers_per_stage[s] < 1) {
      return InvalidArgument(fmt::format(
          "layers_per_stage=[{}] gives stage {} {} layers: every stage needs at least one layer",
          fmt::join(layers_per_stage, ", "), s, layers_per_stage[s]));
    }
  }
  const int64_t sum = std::accumulate(layers_per_stage.begin(), layers_per_stage.end(), int64_t{0});
  if (sum != layers) {
    return InvalidArgument(fmt::format("layers_per_stage=[{}] sums to {} but num_hidden_layers={}",
                                       fmt::join(layers_per_stage, ", "), sum, layers));
  }
  return Status::Ok();
}

int ParallelConfig::TpOfStage(int stage) const {
  TESSERA_CHECK(stage >= 0 && stage < pp);
  return uniform_tp() ? tp : tp_per_stage[static_cast<size_t>(stage)];
}

std::vector<int> ParallelConfig::TpPerStage() const {
  return uniform_tp() ? std::vector<int>(static_cast<size_t>(pp), tp) : tp_per_stage;
}

int ParallelConfig::max_tp() const {
  return uniform_tp() ? tp : *std::max_element(tp_per_stage.begin(), tp_per_stage.end());
}

int ParallelConfig::world_size() const {
  return uniform_tp() ? tp * pp : std::accumulate(tp_per_stage.begin(), tp_per_stage.end(), 0);
}

// The rank formula lives in parallel_rank.h; uniform layouts use its O(1) form.
int ParallelConfig::WorldRank(int stage, int tp_rank) const {
  TESSERA_CHECK(stage >= 0 && stage < pp);
  TESSERA_CHECK(tp_rank >= 0 && tp_rank < TpOfStage(stage));
  return uniform_tp() ? ::tessera::WorldRank(stage, tp_rank, tp)
                      : ::tessera::WorldRank(stage, tp_rank, tp_per_stage);
}

int ParallelConfig::StageOf(int rank) const {
  TESSERA_CHECK(rank >= 0 && rank < world_size());
  return uniform_tp() ? ::tessera::StageOf(rank, tp) : ::tessera::StageOf(rank, tp_per_stage);
}

int ParallelConfig::TpRankOf(int rank) const {
  TESSERA_CHECK(rank >= 0 && rank < world_size());
  return uniform_tp() ? ::tessera::TpRankOf(rank, tp) : ::tessera::TpRankOf(rank, tp_per_stage);
}

int ParallelConfig::FirstLayer(int stage) const {
  TESSERA_CHECK(stage >= 0 && stage < pp);
  TESSERA_CHECK(static_cast<int>(layers_per_stage.size()) == pp);
  return std::accumulate(layers_per_stage.begin(), layers_per_stage.begin() + stage, 0);
}

int ParallelConfig::EndLayer(int stage) const {
  return FirstLayer(stage) + layers_per_stage[stage];
}

int ParallelConfig::StageOfLayer(int layer) const {
  TESSERA_CHECK(layer >= 0);
  int end = 0;
  for (int s = 0; s < static_cast<int>(layers_per_stage.size()); ++s) {
    end += layers_per_stage[s];
    if (layer < end) return s;
  }
  TESSERA_CHECK(layer < end);  // out of range: aborts
  return -1;
}

int ParallelConfig::num_layers() const {
  return std::accumulate(layers_per_stage.begin(), layers_per_stage.end(), 0);
}

std::string ParallelConfig::TpString() const {
  return uniform_tp() ? std::to_string(tp) : fmt::format("[{}]", fmt::join(tp_per_stage, ", "));
}

ExpertRange ExpertsOfRank(int64_t num_experts, int tp, int tp_rank) {
  const int64_t base = num_experts / tp, extra = num_experts % tp;
  ExpertRange r;
  r.begin = tp_rank * base + std::min<int64_t>(tp_rank, extra);
  r.end = r.begin + base + (tp_rank < extra ? 1 : 0);
  return r;
}

std::string ParallelConfig::ToString() const {
  return fmt::format("ParallelConfig{{tp={}, pp={}, world_size={}, layers_per_stage=[{}]{}}}",
                     TpString(), pp, world_size(), fmt::join(layers_per_stage, ", "),
                     expert_parallel ? ", expert_parallel" : "");
}

LayoutParam LayoutParamOfError(const Status& error) {
  const std::string& m = error.message();
  auto starts = [&m](const char* prefix) { return m.rfind(prefix, 0) == 0; };
  if (starts("pp")) return LayoutParam::kPp;
  if (starts("layers_per_stage")) return LayoutParam::kLayersPerStage;
  if (starts("model config")) return LayoutParam::kModel;
  return LayoutParam::kTp;  // "tp...", "tp_per_stage=...", "stage s: tp=..."
}

}  // namespace tessera
