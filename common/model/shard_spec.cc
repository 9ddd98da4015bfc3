#include "common/model/shard_spec.h"

#include <fmt/format.h>

#include <algorithm>
#include <set>
#include <tuple>
#include <utility>

namespace tessera {

int64_t TensorShard::local_numel() const {
  int64_t n = 1;
  for (int64_t d : local_shape) n *= d;
  return n;
}

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
  spec.expert_parallel_ = parallel.expert_parallel && model.is_moe();
  if (spec.expert_parallel_) {
    const ExpertRange er =
        ExpertsOfRank(model.num_experts, static_cast<int>(tp), static_cast<int>(spec.tp_rank_));
    spec.expert_begin_ = er.begin;
    spec.expert_end_ = er.end;
    spec.local_moe_intermediate_ = model.moe_intermediate_size;
  } else {
    spec.expert_begin_ = 0;
    spec.expert_end_ = model.num_experts;
    spec.local_moe_intermediate_ = model.moe_intermediate_size / tp;
  }
  spec.local_shared_intermediate_ = model.shared_expert_intermediate_size / tp;

  spec.vocab_padded_ = (vocab + tp - 1) / tp * tp;
  const int64_t vocab_local = spec.vocab_padded_ / tp;
  spec.vocab_begin_ = r * vocab_local;
  spec.vocab_end_ = (r + 1) * vocab_local;
  spec.vocab_valid_rows_ = std::clamp<int64_t>(vocab - spec.vocab_begin_, 0, vocab_local);

  // Ranges along each splittable dimension: query rows on this rank's query
  // heads, KV rows on its KV heads, the intermediate dimension evenly, the
  // vocab by padded rows (clipped to the checkpoint's vocab_size).
  struct Range {
    int64_t begin, end, local;  // read [begin, end); hold `local` rows/columns
  };
  const int64_t q_begin = r * spec.local_heads_ * head_dim;
  const int64_t kv_begin = spec.kv_head_begin_ * head_dim;
  const int64_t i_begin = r * spec.local_intermediate_;
  auto range_of = [&](RoleDim dim) -> Range {
    switch (dim) {
      case RoleDim::kQueryRows:
        return {q_begin, q_begin + spec.local_heads_ * head_dim, spec.local_heads_ * head_dim};
      case RoleDim::kKvRows:
        return {kv_begin, kv_begin + spec.local_kv_heads_ * head_dim,
                spec.local_kv_heads_ * head_dim};
      case RoleDim::kIntermediate:
        return {i_begin, i_begin + spec.local_intermediate_, spec.local_intermediate_};
      case RoleDim::kVocab:
        return {std::min(spec.vocab_begin_, vocab), std::min(spec.vocab_end_, vocab), vocab_local};
      case RoleDim::kMoeIntermediate: {
        const int64_t b = r * spec.local_moe_intermediate_;
        return {b, b + spec.local_moe_intermediate_, spec.local_moe_intermediate_};
      }
      case RoleDim::kSharedIntermediate: {
        const int64_t b = r * spec.local_shared_intermediate_;
        return {b, b + spec.local_shared_intermediate_, spec.local_shared_intermediate_};
      }
      case RoleDim::kHidden:
      case RoleDim::kHeadDim:
      case RoleDim::kExperts:
      case RoleDim::kOne:
        break;
    }
    TESSERA_CHECK(false);  // the tables never split the hidden or head dimension
    return {0, 0, 0};
  };

  const FamilyRoles& family = FamilyRolesOf(model.architecture);
  std::vector<TensorShard>& out = spec.tensors_;
  auto add = [&](const RoleSpec& rs, int layer, int expert) {
    if (!RolePresentInLayer(rs, model, layer)) return;
    TensorShard t;
    t.role = rs.role;
    t.layer = layer;
    t.expert = expert;
    t.name = RoleSourceName(rs, model, layer, expert);
    t.role_name = RolePartName(rs, layer, expert);
    // Under expert parallelism a rank holds its experts whole.
    t.kind = rs.per_expert && spec.expert_parallel_ ? SplitKind::kReplicated : rs.split;
    t.full_shape = RoleSourceShape(rs, model);
    t.local_shape = RoleShape(rs, model);
    t.add_after_all_reduce = rs.add_after_all_reduce;
    if (t.kind != SplitKind::kReplicated) {
      t.split_dim = rs.split == SplitKind::kRowParallel ? 1 : 0;
      const Range range = range_of(rs.shape[t.split_dim]);
      // A fused role (Phi-3 qkv_proj, gate_up_proj) reads its rows of its
      // part: the part's range, shifted by where the part starts.
      const int64_t offset = RoleFusedRowOffset(rs, model);
      t.begin = offset + range.begin;
      t.end = offset + range.end;
      t.local_shape[static_cast<size_t>(t.split_dim)] = range.local;
    }
    if (rs.alt != AltForm::kNone) {
      t.alt = rs.alt;
      t.alt_name = RoleAltName(rs, layer);
      t.alt_shape = RoleAltShape(rs, model);
      if (rs.role == TensorRole::kExpertUpProj) t.alt_row_offset = model.moe_intermediate_size;
    }
    out.push_back(std::move(t));
  };
  auto add_layer_role = [&](const RoleSpec& rs, int layer) {
    if (!rs.per_expert) return add(rs, layer, -1);
    for (int64_t e = spec.expert_begin_; e < spec.expert_end_; ++e)
      add(rs, layer, static_cast<int>(e));
  };
  auto add_place = [&](RolePlace place, int layer) {
    for (const RoleSpec& rs : family.roles) {
      if (rs.place == place) add_layer_role(rs, layer);
    }
  };
  if (spec.is_first_stage_) add_place(RolePlace::kFirstStage, -1);
  for (int layer = spec.first_layer_; layer < spec.end_layer_; ++layer) {
    add_place(RolePlace::kLayer, layer);
  }
  if (spec.is_last_stage_) add_place(RolePlace::kLastStage, -1);

  for (size_t i = 0; i < out.size(); ++i) {
    const bool inserted =
        spec.by_role_name_.emplace(out[i].role_name, i).second &&
        spec.by_role_.emplace(std::make_tuple(out[i].role, out[i].layer, out[i].expert), i).second;
    TESSERA_CHECK(inserted);  // roles are unique by construction
  }
  return spec;
}

std::string ShardSpec::NotHeld(const std::string& what) const {
  return fmt::format("tensor {} is not held by rank {} (stage {}, tp_rank {}, layers [{}, {}){}{})",
                     what, rank_, stage_, tp_rank_, first_layer_, end_layer_,
                     is_first_stage_ ? ", first stage" : "", is_last_stage_ ? ", last stage" : "");
}

StatusOr<const TensorShard*> ShardSpec::Find(TensorRole role, int layer, int expert) const {
  auto it = by_role_.find(std::make_tuple(role, layer, expert));
  if (it == by_role_.end()) {
    std::string what = layer < 0 ? fmt::format("'{}'", TensorRoleName(role))
                                 : fmt::format("'{}' of layer {}", TensorRoleName(role), layer);
    if (expert >= 0) what += fmt::format(", expert {}", expert);
    return NotFound(NotHeld(what));
  }
  return &tensors_[it->second];
}

StatusOr<const TensorShard*> ShardSpec::Find(std::string_view role_name) const {
  auto it = by_role_name_.find(role_name);
  if (it == by_role_name_.end()) return NotFound(NotHeld(fmt::format("'{}'", role_name)));
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
      "{}, vocab rows [{}, {}){}",
      rank_, stage_, tp_rank_, first_layer_, end_layer_, tensors_.size(), local_heads_,
      local_kv_heads_, kv_head_begin_, kv_replicated_ ? " (replicated)" : "", vocab_begin_,
      vocab_end_,
      expert_parallel_ ? fmt::format(", experts [{}, {})", expert_begin_, expert_end_) : "");
}

}  // namespace tessera
