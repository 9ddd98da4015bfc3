// ShardSpec: exactly which slice of which checkpoint tensor one rank loads,
// for tensor (tp) + pipeline (pp) parallel Llama-family models (Llama,
// Mistral, Qwen2, Qwen3, Phi-3, Gemma 2, Gemma 3 text).
//
// Which tensors a family has, their HF names, shapes and split kinds come from
// its table in common/model/tensor_roles.h; ShardSpec turns a table into one
// rank's ranges. The rules (Megatron-LM style tensor parallelism;
// docs/shard_spec.md has the diagrams):
//  - Column-parallel (split output dim 0): q_proj, k_proj, v_proj, gate_proj,
//    up_proj. A column-parallel bias follows its weight's split.
//  - Row-parallel (split input dim 1): o_proj, down_proj. Their partial
//    outputs are summed by an all-reduce (one after o_proj, one after
//    down_proj). A row-parallel bias is not split: every rank holds it whole
//    and adds it once, after the all-reduce (add_after_all_reduce).
//  - Vocab-parallel (split vocab dim 0): model.embed_tokens and lm_head. The
//    vocab is padded up to vocab_padded, a multiple of tp; rank r holds padded
//    rows [r*vocab_padded/tp, (r+1)*vocab_padded/tp) and reads the part below
//    vocab_size from the checkpoint. Padding rows are zero; the embedding
//    lookup never hits them (token ids < vocab_size) and their logits are
//    masked to -inf before sampling / dropped after the all-gather.
//  - Biases, as the family tables have them (from transformers' modeling
//    code): Llama q/k/v/o_proj.bias when attention_bias, gate/up/down_proj.bias
//    when mlp_bias; Qwen2 q/k/v_proj.bias when attention_bias (no o_proj bias);
//    Qwen3 and Gemma q/k/v/o_proj.bias when attention_bias; Mistral none.
//  - Replicated: the RMSNorm weights (input_layernorm,
//    post_attention_layernorm, Gemma's pre_/post_feedforward_layernorm,
//    model.norm, Qwen3's and Gemma 3's per-head q_norm/k_norm).
//  - Fused checkpoint tensors (Phi-3 qkv_proj, gate_up_proj): each role
//    (q, k, v; gate, up) is its own shard, split as above within its part of
//    the fused tensor, so a rank reads its q rows, its k rows and its v rows.
//  - KV heads: with num_key_value_heads >= tp, rank r holds KV heads
//    [r*kv/tp, (r+1)*kv/tp). With num_key_value_heads < tp (tp a multiple of
//    it) KV heads are replicated: rank r holds the one KV head its query heads
//    [r*local_heads, (r+1)*local_heads) use,
//        kv_head = (r * local_heads) / (num_attention_heads / num_key_value_heads),
//    (GQA maps query head h to KV head h / group), so tp / kv ranks read the
//    same k_proj / v_proj rows.
//  - Mixture of experts (Mixtral, Qwen2-MoE, Qwen3-MoE), per sparse layer:
//    the router (and Qwen2-MoE's shared_expert_gate) replicated; the shared
//    expert split as the dense MLP; the routed experts, with
//    ParallelConfig::expert_parallel off, each split as the dense MLP
//    (gate/up column-parallel, down row-parallel over moe_intermediate_size);
//    with it on, whole (split_dim -1) and only the rank's own experts
//    [expert_begin, expert_end) (ExpertsOfRank). A dense layer of a Qwen MoE
//    model (mlp_only_layers, decoder_sparse_step) holds the dense MLP.
//  - "tp" above is the tp of the rank's own stage (ParallelConfig::TpOfStage):
//    with a per-stage layout (tp = [4, 2]) stage 0's ranks split by 4 and
//    stage 1's by 2; the hidden state between stages is whole on every rank.
//  - Stages: a rank holds only its stage's decoder layers; the first stage
//    also holds model.embed_tokens, the last stage model.norm and lm_head.
//    With tie_word_embeddings there is no lm_head.weight in the checkpoint: the
//    last stage reads its vocab slice of model.embed_tokens.weight and binds it
//    as the lm_head (role kLmHead, name "model.embed_tokens.weight",
//    role_name "lm_head.weight").
//    A tied model with pp > 1 thus holds the embedding on the first stage and
//    again on the last; with pp == 1 the two entries read the same slice and
//    are held once (WeightBytes counts them once).
//
// Thread-safety: immutable after Make; const methods may be called
// concurrently.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "common/base/dtype.h"
#include "common/base/status.h"
#include "common/format/model_config.h"
#include "common/model/parallel_config.h"
#include "common/model/tensor_roles.h"

namespace tessera {

// One tensor a rank loads: which weight of the model it is (role, layer),
// which checkpoint tensor and which range of it is read, and the shape it is
// held in.
struct TensorShard {
  // The weight this shard is bound to in the model (the loader binds it by
  // this), and for per-layer roles the global decoder layer (-1 for
  // embed_tokens, the final norm and lm_head).
  TensorRole role = TensorRole::kEmbedTokens;
  int layer = -1;
  // The routed expert of a per-expert role (kExpertGateProj, ...), else -1.
  int expert = -1;
  // The checkpoint (HF safetensors) tensor to read, e.g.
  // "model.layers.3.self_attn.q_proj.weight".
  std::string name;
  // The role's own HF name (RoleTensorName): equal to `name`, except for a
  // tied lm_head, where name is "model.embed_tokens.weight" and role_name is
  // "lm_head.weight", and for a role fused in the checkpoint (Phi-3), where
  // name is "...qkv_proj.weight" and role_name the unfused name
  // "...k_proj.weight" (RolePartName). Unique on a rank; ShardSpec::Find(string)
  // looks it up.
  std::string role_name;
  SplitKind kind = SplitKind::kReplicated;
  // Shape of the whole checkpoint tensor, e.g. [heads*head_dim, hidden]; for
  // a role fused into one tensor (Phi-3) the fused tensor's, e.g. qkv_proj
  // [(heads + 2*kv_heads) * head_dim, hidden].
  std::vector<int64_t> full_shape;
  // Dimension this rank reads a range of: 0 (column-/vocab-parallel),
  // 1 (row-parallel) or -1 (replicated: the whole tensor is read).
  int split_dim = -1;
  // Range [begin, end) along split_dim read from the checkpoint (for a fused
  // role, rows of the fused tensor: k_proj of qkv_proj at tp rank r reads
  // [heads*head_dim + kv_begin, ...), never a fraction of the whole). For
  // vocab-parallel shards it is clipped to [0, vocab_size), so it may be
  // shorter than local_shape[0] (or empty). 0, 0 when split_dim is -1.
  int64_t begin = 0;
  int64_t end = 0;
  // Shape this rank holds. For vocab-parallel shards local_shape[0] is
  // vocab_padded / tp: rows past end - begin are zero padding.
  std::vector<int64_t> local_shape;
  // The form transformers 5 writes, read when the checkpoint lacks `name`
  // (AltForm in tensor_roles.h): kNone; kRenamed: the same tensor named
  // alt_name; kStackedGateUp / kStackedDown: `expert`'s matrix of the 3-D
  // tensor alt_name (alt_shape), rows shifted by alt_row_offset (the up part
  // of gate_up_proj starts at moe_intermediate_size), the range along
  // split_dim (or the whole matrix) read from that matrix.
  AltForm alt = AltForm::kNone;
  std::string alt_name;
  std::vector<int64_t> alt_shape;
  int64_t alt_row_offset = 0;
  // Row-parallel bias: held whole and added once, after the all-reduce of the
  // layer's partial outputs, on every rank (adding it before would add it tp
  // times).
  bool add_after_all_reduce = false;

  // Elements held: the product of local_shape.
  int64_t local_numel() const;
};

class ShardSpec {
 public:
  // The shards rank `rank` of `parallel` loads for `model`.
  // Errors (kInvalidArgument): `parallel` fails ParallelConfig::Validate;
  // rank outside [0, world_size); hidden_size, head_dim or vocab_size < 1.
  static StatusOr<ShardSpec> Make(const ModelConfig& model, const ParallelConfig& parallel,
                                  int rank);

  // Exactly the tensors this rank must load, in model order: embed_tokens
  // (first stage), then per layer input_layernorm, q/k/v/o_proj (+ biases),
  // post_attention_layernorm, gate/up/down_proj (+ biases), then model.norm
  // and lm_head (last stage). Entries that read the same (name, begin, end)
  // (the tied embedding with pp == 1) are one buffer bound to two roles.
  const std::vector<TensorShard>& tensors() const { return tensors_; }

  // The shard bound to `role` of decoder layer `layer` (-1 for the roles that
  // are not per-layer). Errors: kNotFound naming the role, the layer, the
  // rank, its stage and its layer range.
  // `expert`: the routed expert of a per-expert role (-1 otherwise).
  StatusOr<const TensorShard*> Find(TensorRole role, int layer = -1, int expert = -1) const;
  // The shard whose role_name is `role_name` (an HF tensor name, or
  // "lm_head.weight" for the output projection, tied or not). Errors:
  // kNotFound naming the name, the rank, its stage and its layer range.
  StatusOr<const TensorShard*> Find(std::string_view role_name) const;

  // Bytes this rank holds when weights are stored as `dtype`: the sum of
  // local_numel() * DTypeSize(dtype) over distinct (name, begin, end), padding
  // rows included.
  int64_t WeightBytes(DType dtype) const;

  // "rank 3 (stage 1, tp_rank 1): layers [11, 22), 99 tensors, heads 16, kv_heads 4 from 4,
  //  vocab rows [64128, 128256)".
  std::string ToString() const;

  int rank() const { return rank_; }
  int stage() const { return stage_; }
  int tp_rank() const { return tp_rank_; }
  bool is_first_stage() const { return is_first_stage_; }
  bool is_last_stage() const { return is_last_stage_; }
  // Decoder layers [first_layer, end_layer) of this rank's stage.
  int first_layer() const { return first_layer_; }
  int end_layer() const { return end_layer_; }

  // Query heads this rank computes: num_attention_heads / tp, the heads
  // [tp_rank * local_heads, (tp_rank + 1) * local_heads).
  int64_t local_heads() const { return local_heads_; }
  // KV heads this rank holds: num_key_value_heads / tp, or 1 when
  // num_key_value_heads < tp.
  int64_t local_kv_heads() const { return local_kv_heads_; }
  // First KV head this rank holds: tp_rank * local_kv_heads, or with
  // num_key_value_heads < tp (tp_rank * local_heads) / (heads / kv_heads).
  int64_t kv_head_begin() const { return kv_head_begin_; }
  // True when num_key_value_heads < tp and tp / kv ranks share each KV head.
  bool kv_replicated() const { return kv_replicated_; }
  // Columns of gate/up (rows of down's input) this rank holds:
  // intermediate_size / tp.
  int64_t local_intermediate() const { return local_intermediate_; }
  // MoE models: the routed experts [expert_begin, expert_end) this rank holds
  // (every expert without expert parallelism), the columns of each expert's
  // gate/up it holds (moe_intermediate_size / tp, or all of them with expert
  // parallelism) and of the shared expert's (shared_expert_intermediate_size / tp).
  int64_t expert_begin() const { return expert_begin_; }
  int64_t expert_end() const { return expert_end_; }
  bool expert_parallel() const { return expert_parallel_; }
  int64_t local_moe_intermediate() const { return local_moe_intermediate_; }
  int64_t local_shared_intermediate() const { return local_shared_intermediate_; }

  // vocab_size rounded up to a multiple of tp.
  int64_t vocab_padded() const { return vocab_padded_; }
  // Padded vocab rows [vocab_begin, vocab_end) this rank holds in
  // embed_tokens / lm_head (vocab_end - vocab_begin = vocab_padded / tp).
  // Token id t is looked up on this rank iff vocab_begin <= t < vocab_end, at
  // local row t - vocab_begin.
  int64_t vocab_begin() const { return vocab_begin_; }
  int64_t vocab_end() const { return vocab_end_; }
  // Local rows that are real vocabulary entries (the rest are padding whose
  // logits must be masked): clamp(vocab_size - vocab_begin, 0, vocab_end - vocab_begin).
  int64_t vocab_valid_rows() const { return vocab_valid_rows_; }

 private:
  ShardSpec() = default;
  // "tensor <what> is not held by rank 3 (stage 1, ...)".
  std::string NotHeld(const std::string& what) const;

  std::vector<TensorShard> tensors_;
  std::map<std::string, size_t, std::less<>> by_role_name_;
  std::map<std::tuple<TensorRole, int, int>, size_t> by_role_;  // (role, layer, expert)
  int rank_ = 0;
  int stage_ = 0;
  int tp_rank_ = 0;
  bool is_first_stage_ = false;
  bool is_last_stage_ = false;
  int first_layer_ = 0;
  int end_layer_ = 0;
  int64_t local_heads_ = 0;
  int64_t local_kv_heads_ = 0;
  int64_t kv_head_begin_ = 0;
  bool kv_replicated_ = false;
  int64_t local_intermediate_ = 0;
  int64_t expert_begin_ = 0;
  int64_t expert_end_ = 0;
  bool expert_parallel_ = false;
  int64_t local_moe_intermediate_ = 0;
  int64_t local_shared_intermediate_ = 0;
  int64_t vocab_padded_ = 0;
  int64_t vocab_begin_ = 0;
  int64_t vocab_end_ = 0;
  int64_t vocab_valid_rows_ = 0;
};

}  // namespace tessera
