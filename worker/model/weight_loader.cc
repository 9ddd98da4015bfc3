#include "worker/model/weight_loader.h"

#include <cstring>
#include <map>
#include <string>
#include <tuple>

namespace tessera {

namespace {

// The field of StageWeights a shard fills, by its role (and, per-layer roles,
// its layer). Errors: kInternal when the layer is outside the stage.
StatusOr<Tensor*> Slot(StageWeights& w, const TensorShard& t) {
  switch (t.role) {
    case TensorRole::kEmbedTokens:
      return &w.embed_tokens;
    case TensorRole::kFinalNorm:
      return &w.final_norm;
    case TensorRole::kLmHead:
      return &w.lm_head;
    default:
      break;
  }
  const int local = t.layer - w.layout.first_layer;
  if (local < 0 || local >= w.layout.num_layers()) {
    return Internal("weight loader: shard '" + t.role_name + "' (role " + TensorRoleName(t.role) +
                    ", layer " + std::to_string(t.layer) + ") is outside the stage's layers [" +
                    std::to_string(w.layout.first_layer) + ", " +
                    std::to_string(w.layout.end_layer) + ")");
  }
  LayerWeights& l = w.layers[static_cast<size_t>(local)];
  switch (t.role) {
    case TensorRole::kInputNorm:
      return &l.input_norm;
    case TensorRole::kQProj:
      return &l.q_proj;
    case TensorRole::kQBias:
      return &l.q_bias;
    case TensorRole::kKProj:
      return &l.k_proj;
    case TensorRole::kKBias:
      return &l.k_bias;
    case TensorRole::kVProj:
      return &l.v_proj;
    case TensorRole::kVBias:
      return &l.v_bias;
    case TensorRole::kQNorm:
      return &l.q_norm;
    case TensorRole::kKNorm:
      return &l.k_norm;
    case TensorRole::kOProj:
      return &l.o_proj;
    case TensorRole::kOBias:
      return &l.o_bias;
    case TensorRole::kPostAttentionNorm:
      return &l.post_norm;
    case TensorRole::kPreFeedforwardNorm:
      return &l.pre_ff_norm;
    case TensorRole::kGateProj:
      return &l.gate_proj;
    case TensorRole::kGateBias:
      return &l.gate_bias;
    case TensorRole::kUpProj:
      return &l.up_proj;
    case TensorRole::kUpBias:
      return &l.up_bias;
    case TensorRole::kDownProj:
      return &l.down_proj;
    case TensorRole::kDownBias:
      return &l.down_bias;
    case TensorRole::kPostFeedforwardNorm:
      return &l.post_ff_norm;
    case TensorRole::kEmbedTokens:
    case TensorRole::kFinalNorm:
    case TensorRole::kLmHead:
      break;
  }
  return Internal("weight loader: no slot for shard role " + std::string(TensorRoleName(t.role)));
}

}  // namespace

StatusOr<StageWeights> LoadStageWeights(const Checkpoint& checkpoint, const ModelConfig& config,
                                        const ParallelConfig& parallel, const ShardSpec& spec,
                                        const LoadProgressFn& progress,
                                        kernels::Backend* backend_ptr, const HeldWeights* held) {
  kernels::Backend& backend = backend_ptr ? *backend_ptr : kernels::CpuBackend();
  const DType dtype = backend.compute_dtype();
  StageWeights w;
  StageLayout& lay = w.layout;
  lay.first_layer = spec.first_layer();
  lay.end_layer = spec.end_layer();
  lay.is_first = spec.is_first_stage();
  lay.is_last = spec.is_last_stage();
  lay.tp = parallel.TpOfStage(spec.stage());
  lay.tp_rank = spec.tp_rank();
  lay.heads_local = spec.local_heads();
  lay.kv_heads_local = spec.local_kv_heads();
  lay.inter_local = spec.local_intermediate();
  lay.vocab_begin = spec.vocab_begin();
  lay.vocab_local = spec.vocab_end() - spec.vocab_begin();
  lay.vocab_size = config.vocab_size;
  w.layers.resize(static_cast<size_t>(lay.num_layers()));

  int64_t total = 0;
  for (const TensorShard& t : spec.tensors())
    total += t.local_numel() * static_cast<int64_t>(DTypeSize(dtype));
  int64_t loaded = 0;
  // The tied embedding on a single stage is one buffer with two roles.
  std::map<std::tuple<std::string, int64_t, int64_t>, Tensor> read;
  for (const TensorShard& t : spec.tensors()) {
    TESSERA_ASSIGN_OR_RETURN(Tensor * slot, Slot(w, t));
    const auto key = std::make_tuple(t.name, t.begin, t.end);
    auto it = read.find(key);
    if (it != read.end()) {
      *slot = it->second;
      continue;
    }
    if (held) {
      auto h = held->find(key);
      // Only a slice of this shape, in this backend's dtype and on its device.
      if (h != held->end() && h->second.shape() == t.local_shape && h->second.dtype() == dtype &&
          h->second.device() == backend.device()) {
        *slot = h->second;
        read.emplace(key, h->second);
        w.weight_bytes += static_cast<int64_t>(h->second.nbytes());
        w.reused_bytes += static_cast<int64_t>(h->second.nbytes());
        ++w.reused_tensors;
        loaded += static_cast<int64_t>(h->second.nbytes());
        if (progress) progress(loaded, total);
        continue;
      }
    }
    TESSERA_ASSIGN_OR_RETURN(TensorInfo info, checkpoint.Find(t.name));
    if (info.shape != t.full_shape) {
      std::string want, got;
      for (int64_t d : t.full_shape) want += (want.empty() ? "" : ", ") + std::to_string(d);
      for (int64_t d : info.shape) got += (got.empty() ? "" : ", ") + std::to_string(d);
      return InvalidArgument("tensor '" + t.name + "' in " + info.file + " has shape [" + got +
                             "] but config.json implies [" + want + "]");
    }
    // Read raw when the checkpoint has the compute dtype, else through fp32.
    // Only the vocab padding rows past the slice need zeroing.
    const DType read_dtype = info.dtype == dtype ? dtype : DType::kF32;
    Tensor host = Tensor::Empty(t.local_shape, read_dtype);
    const int64_t filled_rows =
        t.split_dim == 0 ? t.end - t.begin : (t.local_shape.empty() ? 0 : t.local_shape[0]);
    if (t.split_dim == 0 && !t.local_shape.empty() && filled_rows < t.local_shape[0]) {
      const size_t row_bytes = host.nbytes() / static_cast<size_t>(t.local_shape[0]);
      std::memset(static_cast<char*>(host.raw()) + static_cast<size_t>(filled_rows) * row_bytes, 0,
                  static_cast<size_t>(t.local_shape[0] - filled_rows) * row_bytes);
    }
    if (t.split_dim < 0) {
      TESSERA_RETURN_IF_ERROR(checkpoint.ReadAll(t.name, read_dtype, host.raw()));
    } else if (t.end > t.begin) {
      TESSERA_RETURN_IF_ERROR(
          checkpoint.ReadSlice(t.name, t.split_dim, t.begin, t.end, read_dtype, host.raw()));
    }
    if (read_dtype != dtype) {
      Tensor converted = Tensor::Empty(t.local_shape, dtype);
      ConvertFromF32(dtype, host.data<float>(), converted.raw(), static_cast<size_t>(host.numel()));
      host = converted;
    }
    Tensor dst = host;
    if (backend.device() != Device::kCPU) {
      auto up = backend.Upload(host);
      if (!up.ok()) return up.status().WithContext("loading tensor '" + t.name + "'");
      dst = std::move(*up);
    }
    *slot = dst;
    read.emplace(key, dst);
    w.weight_bytes += static_cast<int64_t>(dst.nbytes());
    loaded += static_cast<int64_t>(dst.nbytes());
    if (progress) progress(loaded, total);
  }
  return w;
}

StatusOr<HeldWeights> HoldWeights(const StageWeights& weights, const ShardSpec& spec) {
  HeldWeights out;
  // Slot only reads the layout and hands out addresses; nothing is modified.
  StageWeights& w = const_cast<StageWeights&>(weights);
  for (const TensorShard& t : spec.tensors()) {
    TESSERA_ASSIGN_OR_RETURN(Tensor * slot, Slot(w, t));
    if (slot->defined()) out.emplace(std::make_tuple(t.name, t.begin, t.end), *slot);
  }
  return out;
}

}  // namespace tessera
