// The fp8 KV cache's per-layer scales (common/format/kv_cache_dtype.h) from a
// checkpoint, for the decoder layers a stage holds.
//
// Names, as vLLM reads them (one fp32 value each, shape [] or [1], any float
// dtype the checkpoint reader converts):
//   model.layers.{i}.self_attn.k_scale and .v_scale  (compressed-tensors /
//     llm-compressor kv_cache_scheme, quark, modelopt exports);
//   model.layers.{i}.self_attn.kv_scale              (older AutoFP8 exports:
//     one scale for both K and V).
// A layer with neither gets 1.0 for both (vLLM's default; e4m3 covers
// +-448). A layer may have k_scale without v_scale (or the reverse): the
// missing one is 1.0.
//
// Thread-safety: reads only; safe to call concurrently (Checkpoint is).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/base/status.h"
#include "common/format/checkpoint.h"
#include "kernels/backend.h"
#include "worker/model/kv_cache.h"
#include "worker/model/stage_weights.h"

namespace tessera {

// Scales of layers [first_layer, end_layer), index 0 = first_layer.
// Errors: kInvalidArgument naming the tensor and its file when a scale tensor
// holds more than one value or is not finite and > 0; the reader's errors.
StatusOr<std::vector<KvLayerScales>> ReadKvCacheScales(const Checkpoint& checkpoint,
                                                       int first_layer, int end_layer);

// The KV cache of a stage's layers on `backend`: in the compute dtype for
// kAuto; for kFp8 in e4m3 with the scales ReadKvCacheScales finds in the
// checkpoint at `model_dir` (logged when any differs from 1.0).
// Errors: those of Checkpoint::Open, ReadKvCacheScales and KvCache::Create.
StatusOr<std::unique_ptr<KvCache>> MakeStageKvCache(kernels::Backend& backend,
                                                    const std::string& model_dir,
                                                    const StageLayout& layout, int64_t num_blocks,
                                                    int64_t block_size, int64_t head_dim,
                                                    KvCacheDType kv_dtype);

}  // namespace tessera
