#include "common/parallel_config.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <numeric>

#include "common/parallel_rank.h"

namespace tessera {

StatusOr<ParallelConfig> ParallelConfig::Make(const ModelConfig& model, int tp, int pp,
                                              std::vector<int> layers_per_stage) {
  ParallelConfig config;
  config.tp = tp;
  config.pp = pp;
  if (layers_per_stage.empty() && pp >= 1 && pp <= model.num_hidden_layers) {
    const int layers = static_cast<int>(model.num_hidden_layers);
    for (int s = 0; s < pp; ++s)
      layers_per_stage.push_back(layers / pp + (s < layers % pp ? 1 : 0));
  }
  config.layers_per_stage = std::move(layers_per_stage);
  TESSERA_RETURN_IF_ERROR(config.Validate(model));
  return config;
}

Status ParallelConfig::Validate(const ModelConfig& model) const {
  if (tp < 1) return InvalidArgument(fmt::format("tp must be >= 1, got tp={}", tp));
  if (pp < 1) return InvalidArgument(fmt::format("pp must be >= 1, got pp={}", pp));

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
  if (heads % tp != 0) {
    return InvalidArgument(fmt::format(
        "tp={} does not divide num_attention_heads={}: each tp rank must hold whole query heads",
        tp, heads));
  }
  if (kv_heads % tp != 0 && tp % kv_heads != 0) {
    return InvalidArgument(fmt::format(
        "tp={} neither divides num_key_value_heads={} nor is a multiple of it: each tp rank "
        "must hold whole KV heads (replicated when num_key_value_heads < tp)",
        tp, kv_heads));
  }
  if (model.intermediate_size % tp != 0) {
    return InvalidArgument(fmt::format(
        "tp={} does not divide intermediate_size={}: gate_proj/up_proj/down_proj are split "
        "evenly over the tp ranks",
        tp, model.intermediate_size));
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

int ParallelConfig::WorldRank(int stage, int tp_rank) const {
  TESSERA_CHECK(stage >= 0 && stage < pp);
  TESSERA_CHECK(tp_rank >= 0 && tp_rank < tp);
  return ::tessera::WorldRank(stage, tp_rank, tp);  // the formula lives in parallel_rank.h
}

int ParallelConfig::StageOf(int rank) const {
  TESSERA_CHECK(rank >= 0 && rank < world_size());
  return ::tessera::StageOf(rank, tp);
}

int ParallelConfig::TpRankOf(int rank) const {
  TESSERA_CHECK(rank >= 0 && rank < world_size());
  return ::tessera::TpRankOf(rank, tp);
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

std::string ParallelConfig::ToString() const {
  return fmt::format("ParallelConfig{{tp={}, pp={}, world_size={}, layers_per_stage=[{}]}}", tp, pp,
                     world_size(), fmt::join(layers_per_stage, ", "));
}

}  // namespace tessera
