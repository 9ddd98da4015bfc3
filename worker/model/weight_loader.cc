#include "worker/model/weight_loader.h"

#include <charconv>
#include <cstring>
#include <map>
#include <string_view>
#include <tuple>

namespace tessera {

namespace {

// Binds a shard role ("model.layers.3.self_attn.q_proj.weight") to the field
// of StageWeights it fills. Names are parsed once, here.
StatusOr<Tensor*> Slot(StageWeights& w, const std::string& role) {
  if (role == "model.embed_tokens.weight") return &w.embed_tokens;
  if (role == "model.norm.weight") return &w.final_norm;
  if (role == "lm_head.weight") return &w.lm_head;
  constexpr std::string_view kLayers = "model.layers.";
  if (role.rfind(kLayers, 0) == 0) {
    std::string_view rest(role);
    rest.remove_prefix(kLayers.size());
    int layer = -1;
    auto [ptr, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), layer);
    if (ec == std::errc() && *ptr == '.') {
      const int local = layer - w.layout.first_layer;
      if (local >= 0 && local < w.layout.num_layers()) {
        LayerWeights& l = w.layers[static_cast<size_t>(local)];
        const std::string_view field(ptr + 1,
                                     static_cast<size_t>(rest.data() + rest.size() - (ptr + 1)));
        static const std::map<std::string_view, Tensor LayerWeights::*> kFields = {
            {"input_layernorm.weight", &LayerWeights::input_norm},
            {"self_attn.q_proj.weight", &LayerWeights::q_proj},
            {"self_attn.q_proj.bias", &LayerWeights::q_bias},
            {"self_attn.k_proj.weight", &LayerWeights::k_proj},
            {"self_attn.k_proj.bias", &LayerWeights::k_bias},
            {"self_attn.v_proj.weight", &LayerWeights::v_proj},
            {"self_attn.v_proj.bias", &LayerWeights::v_bias},
            {"self_attn.o_proj.weight", &LayerWeights::o_proj},
            {"self_attn.o_proj.bias", &LayerWeights::o_bias},
            {"post_attention_layernorm.weight", &LayerWeights::post_norm},
            {"mlp.gate_proj.weight", &LayerWeights::gate_proj},
            {"mlp.gate_proj.bias", &LayerWeights::gate_bias},
            {"mlp.up_proj.weight", &LayerWeights::up_proj},
            {"mlp.up_proj.bias", &LayerWeights::up_bias},
            {"mlp.down_proj.weight", &LayerWeights::down_proj},
            {"mlp.down_proj.bias", &LayerWeights::down_bias},
        };
        auto it = kFields.find(field);
        if (it != kFields.end()) return &(l.*(it->second));
      }
    }
  }
  return Internal("weight loader: no slot for shard role '" + role + "'");
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
    TESSERA_ASSIGN_OR_RETURN(Tensor * slot, Slot(w, t.role));
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
    TESSERA_ASSIGN_OR_RETURN(Tensor * slot, Slot(w, t.role));
    if (slot->defined()) out.emplace(std::make_tuple(t.name, t.begin, t.end), *slot);
  }
  return out;
}

}  // namespace tessera
