#include "worker/model/kv_cache.h"

#include <string>

#include "kernels/kv_quant.h"

namespace tessera {

namespace {

Status CheckScales(int num_layers, const std::vector<KvLayerScales>& scales) {
  if (scales.empty()) return Status::Ok();
  if (static_cast<int>(scales.size()) != num_layers)
    return InvalidArgument("kv cache: " + std::to_string(scales.size()) + " layer scales for " +
                           std::to_string(num_layers) + " layers");
  for (size_t l = 0; l < scales.size(); ++l) {
    const std::string what = "kv cache layer " + std::to_string(l);
    TESSERA_RETURN_IF_ERROR(kernels::CheckKvScale(scales[l].k, what + " K"));
    TESSERA_RETURN_IF_ERROR(kernels::CheckKvScale(scales[l].v, what + " V"));
  }
  return Status::Ok();
}

KvLayerScales ScalesOf(const std::vector<KvLayerScales>& scales, int layer) {
  return scales.empty() ? KvLayerScales{} : scales[static_cast<size_t>(layer)];
}

}  // namespace

KvCache::KvCache(int num_layers, int64_t num_blocks, int64_t block_size, int64_t kv_heads,
                 int64_t head_dim, KvCacheDType kv_dtype, const std::vector<KvLayerScales>& scales)
    : num_blocks_(num_blocks), block_size_(block_size) {
  TESSERA_CHECK(CheckScales(num_layers, scales).ok());
  dtype_ = KvStorageDType(kv_dtype, DType::kF32);
  layers_.reserve(static_cast<size_t>(num_layers));
  for (int l = 0; l < num_layers; ++l) {
    const KvLayerScales s = ScalesOf(scales, l);
    layers_.push_back({Tensor::Zeros({num_blocks, block_size, kv_heads, head_dim}, dtype_),
                       Tensor::Zeros({num_blocks, block_size, kv_heads, head_dim}, dtype_), s.k,
                       s.v});
  }
  bytes_ = BlockBytes(num_layers, block_size, kv_heads, head_dim, dtype_) * num_blocks;
}

StatusOr<std::unique_ptr<KvCache>> KvCache::Create(kernels::Backend& backend, int num_layers,
                                                   int64_t num_blocks, int64_t block_size,
                                                   int64_t kv_heads, int64_t head_dim,
                                                   KvCacheDType kv_dtype,
                                                   const std::vector<KvLayerScales>& scales) {
  TESSERA_RETURN_IF_ERROR(CheckScales(num_layers, scales));
  const DType compute = backend.compute_dtype();
  // The CUDA kernels read e4m3 next to 16-bit queries only (paged_attention_cuda.cu).
  if (kv_dtype == KvCacheDType::kFp8 && backend.device() == Device::kCUDA &&
      compute != DType::kBF16 && compute != DType::kF16)
    return InvalidArgument(std::string("kv_cache.dtype \"fp8\" on CUDA needs a BF16 or F16 ") +
                           "model.dtype, not " + DTypeName(compute));
  std::unique_ptr<KvCache> c(new KvCache(num_blocks, block_size));
  const DType dtype = KvStorageDType(kv_dtype, compute);
  c->dtype_ = dtype;
  c->layers_.reserve(static_cast<size_t>(num_layers));
  for (int l = 0; l < num_layers; ++l) {
    kernels::KvCacheLayer layer;
    const std::vector<int64_t> shape = {num_blocks, block_size, kv_heads, head_dim};
    auto k = backend.Zeros(shape, dtype);
    if (!k.ok()) return k.status().WithContext("kv cache layer " + std::to_string(l));
    auto v = backend.Zeros(shape, dtype);
    if (!v.ok()) return v.status().WithContext("kv cache layer " + std::to_string(l));
    const KvLayerScales s = ScalesOf(scales, l);
    c->layers_.push_back({std::move(*k), std::move(*v), s.k, s.v});
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
