// ParallelConfig: how a model is laid out over tp x pp ranks.
//
// A world of ranks is split into `pp` pipeline stages; stage s has
// TpOfStage(s) tensor-parallel ranks. Usually every stage has the same `tp`
// (world size tp * pp); a mixed fleet may give stages different tp (a host
// of 8 GPUs at tp=8 feeding a host of 4 at tp=4: tp_per_stage = [8, 4]).
// Stage s runs the contiguous decoder layers [FirstLayer(s), EndLayer(s));
// inside a stage the layers' matmuls are split over the stage's tp ranks
// (see common/model/shard_spec.h and docs/shard_spec.md).
//
// Rank numbering: pp outermost, then tp, as TensorRT-LLM's WorldConfig does;
// the formula lives in common/model/parallel_rank.h:
//
//   rank = (TpOfStage(0) + ... + TpOfStage(stage - 1)) + tp_rank
//        = stage * tp + tp_rank                         (uniform tp)
//
// So the tp ranks of one stage are consecutive (they share a host's fast
// links). Between stages the hidden state is replicated on every tp rank, so
// stages of different tp pair their ranks as common/model/stage_handoff.h says.
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

#include "common/base/status.h"
#include "common/format/model_config.h"

namespace tessera {

struct ParallelConfig {
  // Tensor-parallel ranks of every stage when all stages have the same tp;
  // 0 when they differ (then tp_per_stage holds them). Code that must handle
  // both reads TpOfStage(s).
  int tp = 1;
  int pp = 1;  // pipeline stages
  // Empty when every stage has `tp` ranks (the uniform layout). Otherwise pp
  // entries, the tp of each stage in stage order, not all equal, with
  // tp == 0: one representation per layout (MakePerStage normalises).
  std::vector<int> tp_per_stage;
  // Decoder layers of each stage, in stage order; size pp, sums to
  // num_hidden_layers. Uneven splits are allowed.
  std::vector<int> layers_per_stage;
  // How a stage's tp ranks split the routed experts of an MoE layer
  // (docs/architecture.md "The MoE layer"): false = every rank holds a 1/tp
  // column/row slice of every expert (as the dense MLP is split); true = every
  // rank holds whole experts, ExpertRange(tp, tp_rank) of them, routes every
  // token and runs only its own. Either way the group's all-reduce sums the
  // layer's output. Ignored for dense models.
  bool expert_parallel = false;

  // Builds and validates a layout of `model` over tp * pp ranks.
  // `layers_per_stage` empty => even split: every stage gets
  // num_hidden_layers / pp layers and the first num_hidden_layers % pp stages
  // get one more (32 layers, pp=3 -> [11, 11, 10]).
  // Errors (kInvalidArgument, the message names the numbers): see Validate.
  // `expert_parallel`: see the field.
  static StatusOr<ParallelConfig> Make(const ModelConfig& model, int tp, int pp,
                                       std::vector<int> layers_per_stage = {},
                                       bool expert_parallel = false);

  // Builds and validates a layout with tp_per_stage[s] ranks in stage s
  // (pp = tp_per_stage.size()); `layers_per_stage` as in Make. When every
  // entry is equal this is Make(model, tp_per_stage[0], pp, ...), so the
  // result has the uniform representation (tp set, tp_per_stage empty).
  // Errors (kInvalidArgument): tp_per_stage empty; see Validate.
  static StatusOr<ParallelConfig> MakePerStage(const ModelConfig& model,
                                               std::vector<int> tp_per_stage,
                                               std::vector<int> layers_per_stage = {},
                                               bool expert_parallel = false);

  // Checks this layout against `model`. Errors (kInvalidArgument):
  //  - tp < 1 (uniform) or pp < 1;
  //  - tp_per_stage set but: not pp entries, all entries equal (use tp), or
  //    tp != 0; the message names the list;
  //  - num_attention_heads, num_key_value_heads, num_hidden_layers or
  //    intermediate_size not positive, or num_attention_heads not a multiple
  //    of num_key_value_heads;
  //  - for each stage's tp (the message starts "stage s: " for a per-stage
  //    layout): tp < 1; tp does not divide num_attention_heads (each rank
  //    holds whole query heads); tp neither divides num_key_value_heads nor
  //    is a multiple of it (each rank holds whole KV heads, replicated when
  //    num_key_value_heads < tp); tp does not divide intermediate_size
  //    (gate/up/down are split evenly); for an MoE model without
  //    expert_parallel, tp does not divide moe_intermediate_size; tp does not
  //    divide shared_expert_intermediate_size;
  //  - pp > num_hidden_layers;
  //  - layers_per_stage does not have pp entries, an entry is < 1 (every stage
  //    needs at least one layer), or the entries do not sum to
  //    num_hidden_layers.
  //  Every message begins with the parameter at fault ("tp=", "stage s: tp=",
  //  "tp_per_stage=", "pp=", "layers_per_stage=") or with "model config:";
  //  LayoutParamOfError reads it back.
  Status Validate(const ModelConfig& model) const;

  // True when every stage has the same tp (tp_per_stage is empty).
  bool uniform_tp() const { return tp_per_stage.empty(); }
  // Tensor-parallel ranks of `stage`. Precondition: 0 <= stage < pp.
  int TpOfStage(int stage) const;
  // TpOfStage(s) for every stage: pp entries (also for a uniform layout).
  std::vector<int> TpPerStage() const;
  // The largest TpOfStage(s).
  int max_tp() const;

  // Sum of TpOfStage(s) over the stages; tp * pp when uniform.
  int world_size() const;

  // The rank of (stage, tp_rank), by common/model/parallel_rank.h.
  // Preconditions: 0 <= stage < pp, 0 <= tp_rank < TpOfStage(stage).
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

  // "ParallelConfig{tp=2, pp=3, world_size=6, layers_per_stage=[11, 11, 10]}";
  // per-stage: "ParallelConfig{tp=[4, 2], pp=2, world_size=6, ...}".
  std::string ToString() const;
  // The tp part alone: "2", or "[4, 2]" for a per-stage layout.
  std::string TpString() const;
};

// The experts [begin, end) tp rank `tp_rank` of a stage with `tp` ranks holds
// under expert parallelism: contiguous blocks, the first num_experts % tp
// ranks one more (10 experts over tp 4: [0,3) [3,6) [6,8) [8,10); a rank may
// hold none when tp > num_experts).
struct ExpertRange {
  int64_t begin = 0, end = 0;
};
ExpertRange ExpertsOfRank(int64_t num_experts, int tp, int tp_rank);

// The layout parameter an error of Make, MakePerStage or Validate is about,
// so a caller can name the config key or flag to fix (parallel.pp rather than
// parallel.tp for "pp=3 exceeds num_hidden_layers=2").
enum class LayoutParam {
  kTp,              // tp, a per-stage tp list, or one stage's tp
  kPp,              // pp
  kLayersPerStage,  // layers_per_stage
  kModel,           // the model's own sizes (config.json)
};
// Precondition: `error` came from Make, MakePerStage or Validate.
LayoutParam LayoutParamOfError(const Status& error);

}  // namespace tessera
