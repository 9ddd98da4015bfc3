#include "common/model/shard_spec.h"

#include <fmt/format.h>

#include <algorithm>
#include <set>
#include <tuple>
#include <utility>

namespace tessera {

const char* SplitKindName(SplitKind kind) {
  switch (kind) {
    case SplitKind::kReplicated:
      return "replicated";
    case SplitKind::kColumnParallel:
      return "column-parallel";
    case SplitKind::kRowParallel:
      return "row-parallel";
    case SplitKind::kVocabParallel:
      return "vocab-parallel";
  }
  return "?";
}

int64_t TensorShard::local_numel() const {
  int64_t n = 1;
  for (int64_t d : local_shape) n *= d;
  return n;
}

namespace {

TensorShard Replicated(std::string name, std::vector<int64_t> shape) {
  TensorShard t;
  t.role = name;
  t.name = std::move(name);
  t.kind = SplitKind::kReplicated;
  t.local_shape = shape;
  t.full_shape = std::move(shape);
  return t;
}

// A bias of a row-parallel layer: held whole, added after the all-reduce.
TensorShard RowParallelBias(std::string name, int64_t hidden) {
  TensorShard t = Replicated(std::move(name), {hidden});
  t.add_after_all_reduce = true;
  return t;
}

// Rows [begin, end) of dim 0 (a weight [out, in] or a bias [out]).
TensorShard ColumnParallel(std::string name, std::vector<int64_t> shape, int64_t begin,
                           int64_t end) {
  TensorShard t;
  t.role = name;
  t.name = std::move(name);
  t.kind = SplitKind::kColumnParallel;
  t.split_dim = 0;
  t.begin = begin;
  t.end = end;
  t.local_shape = shape;
  t.local_shape[0] = end - begin;
  t.full_shape = std::move(shape);
  return t;
}

// Columns [begin, end) of dim 1 of a weight [out, in].
TensorShard RowParallel(std::string name, std::vector<int64_t> shape, int64_t begin, int64_t end) {
  TensorShard t;
  t.role = name;
  t.name = std::move(name);
  t.kind = SplitKind::kRowParallel;
  t.split_dim = 1;
  t.begin = begin;
  t.end = end;
  t.local_shape = shape;
  t.local_shape[1] = end - begin;
  t.full_shape = std::move(shape);
  return t;
}

// Padded vocab rows [padded_begin, padded_end) of a [vocab, hidden] table;
// the checkpoint read is clipped to [0, vocab).
TensorShard VocabParallel(std::string name, std::string role, int64_t vocab, int64_t hidden,
                          int64_t padded_begin, int64_t padded_end) {
  TensorShard t;
  t.name = std::move(name);
  t.role = std::move(role);
  t.kind = SplitKind::kVocabParallel;
  t.full_shape = {vocab, hidden};
  t.split_dim = 0;
  t.begin = std::min(padded_begin, vocab);
  t.end = std::min(padded_end, vocab);
  t.local_shape = {padded_end - padded_begin, hidden};
  return t;
}

}  // namespace

StatusOr<ShardSpec> ShardSpec::Make(const ModelConfig& model, const ParallelConfig& parallel,
                                    int rank) {
  TESSERA_RETURN_IF_ERROR_CTX(parallel.Validate(model), parallel.ToString());
  if (rank < 0 || rank >= parallel.world_size()) {
    return InvalidArgument(fmt::format("rank {} is outside [0, {}) for {}", rank,
                                       parallel.world_size(), parallel.ToString()));
  }
  if (model.hidden_size < 1 || model.head_dim < 1 || model.vocab_size < 1) {
    return InvalidArgument(
        fmt::format("model config: hidden_size={}, head_dim={} and vocab_size={} must all be >= 1",
                    model.hidden_size, model.head_dim, model.vocab_size));
  }

  const int64_t tp = parallel.TpOfStage(parallel.StageOf(rank));  // this rank's stage's tp
  const int64_t hidden = model.hidden_size;
  const int64_t head_dim = model.head_dim;
  const int64_t heads = model.num_attention_heads;
  const int64_t kv_heads = model.num_key_value_heads;
  const int64_t inter = model.intermediate_size;
  const int64_t vocab = model.vocab_size;

  ShardSpec spec;
  spec.rank_ = rank;
  spec.stage_ = parallel.StageOf(rank);
  spec.tp_rank_ = parallel.TpRankOf(rank);
  spec.is_first_stage_ = spec.stage_ == 0;
  spec.is_last_stage_ = spec.stage_ == parallel.pp - 1;
  spec.first_layer_ = parallel.FirstLayer(spec.stage_);
  spec.end_layer_ = parallel.EndLayer(spec.stage_);
  const int64_t r = spec.tp_rank_;

  spec.local_heads_ = heads / tp;
  spec.kv_replicated_ = kv_heads < tp;
  if (spec.kv_replicated_) {
    // tp is a multiple of kv_heads (Validate), so group = heads / kv_heads is
    // a multiple of local_heads and all of this rank's query heads
    // [r*local_heads, (r+1)*local_heads) map to one KV head.
    spec.local_kv_heads_ = 1;
    spec.kv_head_begin_ = (r * spec.local_heads_) / (heads / kv_heads);
  } else {
    spec.local_kv_heads_ = kv_heads / tp;
    spec.kv_head_begin_ = r * spec.local_kv_heads_;
  }
  spec.local_intermediate_ = inter / tp;

  spec.vocab_padded_ = (vocab + tp - 1) / tp * tp;
  const int64_t vocab_local = spec.vocab_padded_ / tp;
  spec.vocab_begin_ = r * vocab_local;
  spec.vocab_end_ = (r + 1) * vocab_local;
  spec.vocab_valid_rows_ = std::clamp<int64_t>(vocab - spec.vocab_begin_, 0, vocab_local);

  // Biases, as in transformers' modeling code: Llama has q/k/v/o biases when
  // attention_bias and gate/up/down biases when mlp_bias; Qwen2 has q/k/v
  // biases only (attention_bias is true for it); Mistral has none.
  const bool qkv_bias = model.attention_bias && model.architecture != Architecture::kMistral;
  const bool o_bias = model.attention_bias && model.architecture == Architecture::kLlama;
  const bool mlp_bias = model.mlp_bias && model.architecture == Architecture::kLlama;

  std::vector<TensorShard>& out = spec.tensors_;
  const std::string kEmbed = "model.embed_tokens.weight";
  if (spec.is_first_stage_) {
    out.push_back(VocabParallel(kEmbed, kEmbed, vocab, hidden, spec.vocab_begin_, spec.vocab_end_));
  }

  const int64_t q_begin = r * spec.local_heads_ * head_dim;
  const int64_t q_end = q_begin + spec.local_heads_ * head_dim;
  const int64_t kv_begin = spec.kv_head_begin_ * head_dim;
  const int64_t kv_end = kv_begin + spec.local_kv_heads_ * head_dim;
  const int64_t i_begin = r * spec.local_intermediate_;
  const int64_t i_end = i_begin + spec.local_intermediate_;
  for (int layer = spec.first_layer_; layer < spec.end_layer_; ++layer) {
    const std::string p = fmt::format("model.layers.{}.", layer);
    out.push_back(Replicated(p + "input_layernorm.weight", {hidden}));
    for (const char* proj : {"q_proj", "k_proj", "v_proj"}) {
      const bool is_q = proj[0] == 'q';
      const int64_t rows = (is_q ? heads : kv_heads) * head_dim;
      const int64_t b = is_q ? q_begin : kv_begin;
      const int64_t e = is_q ? q_end : kv_end;
      const std::string base = p + "self_attn." + proj;
      out.push_back(ColumnParallel(base + ".weight", {rows, hidden}, b, e));
      if (qkv_bias) out.push_back(ColumnParallel(base + ".bias", {rows}, b, e));
    }
    out.push_back(
        RowParallel(p + "self_attn.o_proj.weight", {hidden, heads * head_dim}, q_begin, q_end));
    if (o_bias) out.push_back(RowParallelBias(p + "self_attn.o_proj.bias", hidden));
    out.push_back(Replicated(p + "post_attention_layernorm.weight", {hidden}));
    for (const char* proj : {"gate_proj", "up_proj"}) {
      const std::string base = p + "mlp." + proj;
      out.push_back(ColumnParallel(base + ".weight", {inter, hidden}, i_begin, i_end));
      if (mlp_bias) out.push_back(ColumnParallel(base + ".bias", {inter}, i_begin, i_end));
    }
    out.push_back(RowParallel(p + "mlp.down_proj.weight", {hidden, inter}, i_begin, i_end));
    if (mlp_bias) out.push_back(RowParallelBias(p + "mlp.down_proj.bias", hidden));
  }

  if (spec.is_last_stage_) {
    out.push_back(Replicated("model.norm.weight", {hidden}));
    out.push_back(VocabParallel(model.tie_word_embeddings ? kEmbed : "lm_head.weight",
                                "lm_head.weight", vocab, hidden, spec.vocab_begin_,
                                spec.vocab_end_));
  }

  for (size_t i = 0; i < out.size(); ++i) {
    const bool inserted = spec.by_role_.emplace(out[i].role, i).second;
    TESSERA_CHECK(inserted);  // roles are unique by construction
  }
  return spec;
}

StatusOr<const TensorShard*> ShardSpec::Find(std::string_view role) const {
  auto it = by_role_.find(role);
  if (it == by_role_.end()) {
    return NotFound(fmt::format(
        "tensor '{}' is not held by rank {} (stage {}, tp_rank {}, layers [{}, {}){}{})", role,
        rank_, stage_, tp_rank_, first_layer_, end_layer_, is_first_stage_ ? ", first stage" : "",
        is_last_stage_ ? ", last stage" : ""));
  }
  return &tensors_[it->second];
}

int64_t ShardSpec::WeightBytes(DType dtype) const {
  std::set<std::tuple<std::string_view, int64_t, int64_t>> seen;
  int64_t bytes = 0;
  for (const TensorShard& t : tensors_) {
    if (!seen.emplace(t.name, t.begin, t.end).second) continue;
    bytes += t.local_numel() * static_cast<int64_t>(DTypeSize(dtype));
  }
  return bytes;
}

std::string ShardSpec::ToString() const {
  return fmt::format(
      "rank {} (stage {}, tp_rank {}): layers [{}, {}), {} tensors, heads {}, kv_heads {} from {}"
      "{}, vocab rows [{}, {})",
      rank_, stage_, tp_rank_, first_layer_, end_layer_, tensors_.size(), local_heads_,
      local_kv_heads_, kv_head_begin_, kv_replicated_ ? " (replicated)" : "", vocab_begin_,
      vocab_end_);
}

}  // namespace tessera
