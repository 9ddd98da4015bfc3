// KvCache: the paged K/V storage of one rank's layers. The free list of its
// blocks is common/engine/block_allocator.h.
//
// Every layer of the stage has K and V tensors of shape
// [num_blocks, block_size, kv_heads_local, head_dim] in the backend's compute
// dtype (F32 on the CPU), zero-filled, on the backend's device. A block
// id indexes the same block in every layer, so one block table per sequence
// serves the whole stage. Block ids are handed out by BlockAllocator; the
// single-process engine owns one, and the scheduler owns the authoritative
// one in a deployment (every stage then receives the same block tables).
//
// Bytes: 2 * layers * num_blocks * block_size * kv_heads_local * head_dim *
// DTypeSize(dtype).
// Thread-safety: owned by the rank's owner thread; not thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "common/base/status.h"
#include "kernels/backend.h"
#include "kernels/paged_attention.h"

namespace tessera {

class KvCache {
 public:
  // F32 in host memory (the CPU backend).
  KvCache(int num_layers, int64_t num_blocks, int64_t block_size, int64_t kv_heads,
          int64_t head_dim);
  // On `backend`, in its compute dtype. Errors: kResourceExhausted naming
  // the bytes when the device cannot hold the cache.
  static StatusOr<std::unique_ptr<KvCache>> Create(kernels::Backend& backend, int num_layers,
                                                   int64_t num_blocks, int64_t block_size,
                                                   int64_t kv_heads, int64_t head_dim);

  kernels::KvCacheLayer& layer(int local_layer) {
    return layers_[static_cast<size_t>(local_layer)];
  }
  int64_t num_blocks() const { return num_blocks_; }
  int64_t block_size() const { return block_size_; }
  int64_t bytes() const { return bytes_; }
  // Bytes one block takes across all layers (K and V).
  static int64_t BlockBytes(int num_layers, int64_t block_size, int64_t kv_heads, int64_t head_dim,
                            DType dtype = DType::kF32);

 private:
  KvCache(int64_t num_blocks, int64_t block_size)
      : num_blocks_(num_blocks), block_size_(block_size) {}

  std::vector<kernels::KvCacheLayer> layers_;
  int64_t num_blocks_;
  int64_t block_size_;
  int64_t bytes_;
};

}  // namespace tessera
