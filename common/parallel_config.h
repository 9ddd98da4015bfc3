// ParallelConfig: how a model is laid out over tp x pp ranks.
//
// A world of `tp * pp` ranks is split into `pp` pipeline stages of `tp`
// tensor-parallel ranks each. Stage s runs the contiguous decoder layers
// [FirstLayer(s), EndLayer(s)); inside a stage the layers' matmuls are split
// over the stage's tp ranks (see common/shard_spec.h and docs/shard_spec.md).
//
// Rank numbering (the one place it is written down): pp outermost, then tp,
// as TensorRT-LLM's WorldConfig does:
//
//   rank = stage * tp + tp_rank,   stage = rank / tp,   tp_rank = rank % tp.
//
// So the tp ranks of one stage are consecutive (they share a host's fast
// links), and the ranks with tp_rank t form the pipeline t.
//
// Validation happens once, in Make / Validate; a ParallelConfig that passed
// it answers every accessor without failing. Accessors take indices that the
// caller got from this config, so an out-of-range index is a programming
// error and aborts (TESSERA_CHECK).
//
// Thread-safety: a plain value; const methods may be called concurrently.
#pragma once

#include <string>
#include <vector>

#include "common/model_config.h"
#include "common/status.h"

namespace tessera {

struct ParallelConfig {
  int tp = 1;  // tensor-parallel ranks per stage
  int pp = 1;  // pipeline stages
  // Decoder layers of each stage, in stage order; size pp, sums to
  // num_hidden_layers. Uneven splits are allowed.
  std::vector<int> layers_per_stage;

  // Builds and validates a layout of `model` over tp * pp ranks.
  // `layers_per_stage` empty => even split: every stage gets
  // num_hidden_layers / pp layers and the first num_hidden_layers % pp stages
  // get one more (32 layers, pp=3 -> [11, 11, 10]).
  // Errors (kInvalidArgument, the message names the numbers): see Validate.
  static StatusOr<ParallelConfig> Make(const ModelConfig& model, int tp, int pp,
                                       std::vector<int> layers_per_stage = {});

  // Checks this layout against `model`. Errors (kInvalidArgument):
  //  - tp < 1 or pp < 1;
  //  - num_attention_heads, num_key_value_heads, num_hidden_layers or
  //    intermediate_size not positive, or num_attention_heads not a multiple
  //    of num_key_value_heads;
  //  - tp does not divide num_attention_heads (each rank holds whole query
  //    heads);
  //  - tp neither divides num_key_value_heads nor is a multiple of it (each
  //    rank holds whole KV heads, replicated when num_key_value_heads < tp);
  //  - tp does not divide intermediate_size (gate/up/down are split evenly);
  //  - pp > num_hidden_layers;
  //  - layers_per_stage does not have pp entries, an entry is < 1 (every stage
  //    needs at least one layer), or the entries do not sum to
  //    num_hidden_layers.
  Status Validate(const ModelConfig& model) const;

  // tp * pp.
  int world_size() const { return tp * pp; }

  // The rank of (stage, tp_rank): stage * tp + tp_rank.
  // Preconditions: 0 <= stage < pp, 0 <= tp_rank < tp.
  int WorldRank(int stage, int tp_rank) const;
  // Inverses of WorldRank. Precondition: 0 <= rank < world_size().
  int StageOf(int rank) const;
  int TpRankOf(int rank) const;

  // Stage `stage` runs decoder layers [FirstLayer(stage), EndLayer(stage)).
  // Precondition: 0 <= stage < pp.
  int FirstLayer(int stage) const;
  int EndLayer(int stage) const;
  // The stage that runs decoder layer `layer`.
  // Precondition: 0 <= layer < sum(layers_per_stage).
  int StageOfLayer(int layer) const;
  // Total decoder layers: sum(layers_per_stage).
  int num_layers() const;

  // "ParallelConfig{tp=2, pp=3, world_size=6, layers_per_stage=[11, 11, 10]}".
  std::string ToString() const;
};

}  // namespace tessera
