#include "worker/model/kv_cache.h"

namespace tessera {

KvCache::KvCache(int num_layers, int64_t num_blocks, int64_t block_size, int64_t kv_heads,
                 int64_t head_dim)
    : num_blocks_(num_blocks), block_size_(block_size) {
  layers_.reserve(static_cast<size_t>(num_layers));
  for (int l = 0; l < num_layers; ++l) {
    layers_.push_back({Tensor::Zeros({num_blocks, block_size, kv_heads, head_dim}),
                       Tensor::Zeros({num_blocks, block_size, kv_heads, head_dim})});
  }
  bytes_ = BlockBytes(num_layers, block_size, kv_heads, head_dim) * num_blocks;
}

StatusOr<std::unique_ptr<KvCache>> KvCache::Create(kernels::Backend& backend, int num_layers,
                                                   int64_t num_blocks, int64_t block_size,
                                                   int64_t kv_heads, int64_t head_dim) {
  std::unique_ptr<KvCache> c(new KvCache(num_blocks, block_size));
  const DType dtype = backend.compute_dtype();
  c->layers_.reserve(static_cast<size_t>(num_layers));
  for (int l = 0; l < num_layers; ++l) {
    kernels::KvCacheLayer layer;
    const std::vector<int64_t> shape = {num_blocks, block_size, kv_heads, head_dim};
    auto k = backend.Zeros(shape, dtype);
    if (!k.ok()) return k.status().WithContext("kv cache layer " + std::to_string(l));
    auto v = backend.Zeros(shape, dtype);
    if (!v.ok()) return v.status().WithContext("kv cache layer " + std::to_string(l));
    c->layers_.push_back({std::move(*k), std::move(*v)});
  }
  c->bytes_ = BlockBytes(num_layers, block_size, kv_heads, head_dim, dtype) * num_blocks;
  return c;
}

int64_t KvCache::BlockBytes(int num_layers, int64_t block_size, int64_t kv_heads, int64_t head_dim,
                            DType dtype) {
  return 2 * static_cast<int64_t>(num_layers) * block_size * kv_heads * head_dim *
         static_cast<int64_t>(DTypeSize(dtype));
}

}  // namespace tessera
