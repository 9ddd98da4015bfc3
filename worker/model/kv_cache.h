// KvCache: the paged K/V storage of one rank's layers. The free list of its
// blocks is common/engine/block_allocator.h.
//
// Every layer of the stage has K and V tensors of shape
// [num_blocks, block_size, kv_heads_local, head_dim], zero-filled, on the
// backend's device, in the backend's compute dtype (F32 on the CPU) or, for
// the fp8 KV cache (KvCacheDType::kFp8, common/format/kv_cache_dtype.h), in
// float8 e4m3fn with the layer's K and V scales (kernels/kv_quant.h). A block
// id indexes the same block in every layer, so one block table per sequence
// serves the whole stage. Block ids are handed out by BlockAllocator; the
// single-process engine owns one, and the scheduler owns the authoritative
// one in a deployment (every stage then receives the same block tables).
//
// Bytes: 2 * layers * num_blocks * block_size * kv_heads_local * head_dim *
// DTypeSize(storage dtype) (the scales are a few floats beside).
// Thread-safety: owned by the rank's owner thread; not thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "common/base/status.h"
#include "common/format/kv_cache_dtype.h"
#include "kernels/backend.h"
#include "kernels/paged_attention.h"

namespace tessera {

// One layer's fp8 KV cache scales (worker/model/kv_cache_scales.h reads them).
struct KvLayerScales {
  float k = 1.0f;
  float v = 1.0f;
};

class KvCache {
 public:
  // In host memory (the CPU backend): F32, or e4m3 for kFp8 with `scales`
  // (one per layer, or empty for 1.0 everywhere).
  // Precondition: scales is empty or has num_layers entries, each finite > 0.
  KvCache(int num_layers, int64_t num_blocks, int64_t block_size, int64_t kv_heads,
          int64_t head_dim, KvCacheDType kv_dtype = KvCacheDType::kAuto,
          const std::vector<KvLayerScales>& scales = {});
  // On `backend`, in its compute dtype or (kFp8) e4m3 with `scales` as above.
  // Errors: kResourceExhausted naming the bytes when the device cannot hold
  // the cache; kInvalidArgument for a scales list of the wrong length or a
  // scale that is not finite and > 0 (naming the layer).
  static StatusOr<std::unique_ptr<KvCache>> Create(kernels::Backend& backend, int num_layers,
                                                   int64_t num_blocks, int64_t block_size,
                                                   int64_t kv_heads, int64_t head_dim,
                                                   KvCacheDType kv_dtype = KvCacheDType::kAuto,
                                                   const std::vector<KvLayerScales>& scales = {});

  kernels::KvCacheLayer& layer(int local_layer) {
    return layers_[static_cast<size_t>(local_layer)];
  }
  int64_t num_blocks() const { return num_blocks_; }
  int64_t block_size() const { return block_size_; }
  int64_t bytes() const { return bytes_; }
  // The element type the cache stores (the compute dtype or kF8E4M3).
  DType dtype() const { return dtype_; }
  // Bytes one block takes across all layers (K and V).
  static int64_t BlockBytes(int num_layers, int64_t block_size, int64_t kv_heads, int64_t head_dim,
                            DType dtype = DType::kF32);

 private:
  KvCache(int64_t num_blocks, int64_t block_size)
      : num_blocks_(num_blocks), block_size_(block_size) {}

  std::vector<kernels::KvCacheLayer> layers_;
  int64_t num_blocks_;
  int64_t block_size_;
  int64_t bytes_ = 0;
  DType dtype_ = DType::kF32;
};

}  // namespace tessera
