#include "worker/model/kv_cache_scales.h"

#include <string>

#include "common/base/logging.h"
#include "kernels/kv_quant.h"

namespace tessera {

namespace {

// The one value of scale tensor `name`, or `fallback` when the checkpoint
// lacks it.
StatusOr<float> ReadScale(const Checkpoint& checkpoint, const std::string& name, float fallback) {
  if (!checkpoint.Has(name)) return fallback;
  TESSERA_ASSIGN_OR_RETURN(TensorInfo info, checkpoint.Find(name));
  if (info.NumElements() != 1)
    return InvalidArgument("KV cache scale '" + name + "' in " + info.file + " has shape " +
                           info.ShapeString() + ", not one value (per-tensor)");
  float value = 0.0f;
  TESSERA_RETURN_IF_ERROR(checkpoint.ReadAll(name, DType::kF32, &value));
  TESSERA_RETURN_IF_ERROR(kernels::CheckKvScale(value, "tensor '" + name + "' in " + info.file));
  return value;
}

}  // namespace

StatusOr<std::vector<KvLayerScales>> ReadKvCacheScales(const Checkpoint& checkpoint,
                                                       int first_layer, int end_layer) {
  std::vector<KvLayerScales> out;
  for (int i = first_layer; i < end_layer; ++i) {
    const std::string base = "model.layers." + std::to_string(i) + ".self_attn.";
    TESSERA_ASSIGN_OR_RETURN(float kv, ReadScale(checkpoint, base + "kv_scale", 1.0f));
    KvLayerScales s;
    TESSERA_ASSIGN_OR_RETURN(s.k, ReadScale(checkpoint, base + "k_scale", kv));
    TESSERA_ASSIGN_OR_RETURN(s.v, ReadScale(checkpoint, base + "v_scale", kv));
    out.push_back(s);
  }
  return out;
}

StatusOr<std::unique_ptr<KvCache>> MakeStageKvCache(kernels::Backend& backend,
                                                    const std::string& model_dir,
                                                    const StageLayout& layout, int64_t num_blocks,
                                                    int64_t block_size, int64_t head_dim,
                                                    KvCacheDType kv_dtype) {
  std::vector<KvLayerScales> scales;
  if (kv_dtype == KvCacheDType::kFp8) {
    TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> checkpoint, Checkpoint::Open(model_dir));
    TESSERA_ASSIGN_OR_RETURN(scales,
                             ReadKvCacheScales(*checkpoint, layout.first_layer, layout.end_layer));
    int from_checkpoint = 0;
    for (const KvLayerScales& s : scales) from_checkpoint += s.k != 1.0f || s.v != 1.0f;
    TESSERA_LOG_INFO("kv_cache",
                     "fp8 KV cache for layers [{}, {}): {} of them with K/V scales from the "
                     "checkpoint, the rest 1.0",
                     layout.first_layer, layout.end_layer, from_checkpoint);
  }
  return KvCache::Create(backend, layout.num_layers(), num_blocks, block_size,
                         layout.kv_heads_local, head_dim, kv_dtype, scales);
}

}  // namespace tessera
