// Tensor-level CUDA KV writes and attention: checks, kernel choice (decode
// split-K or flash-style prefill) and launch of kernels/paged_attention_cuda.cu.
#include <algorithm>
#include <cstdint>

#include "kernels/cuda_context.h"
#include "kernels/cuda_launch.h"
#include "kernels/dispatch.h"
#include "kernels/paged_attention.h"

namespace tessera::kernels::cuda {

namespace {

// Sequences with at most this many query tokens in the step use the decode
// kernel (each query token reads its own K/V prefix); larger ones the tiled
// prefill kernel.
constexpr int64_t kDecodeMaxTokens = 8;

StatusOr<AttentionMetaDev> DeviceMeta(const AttentionBatch& b) {
  if (!b.device_meta.defined() || b.device_meta.device() != Device::kCUDA)
    return FailedPrecondition("attention: the AttentionBatch was not built for a CUDA backend");
  const int64_t T = b.num_tokens, S = static_cast<int64_t>(b.seqs.size());
  const int32_t* m = b.device_meta.data<int32_t>();
  AttentionMetaDev d;
  d.token_seq = m;
  d.token_pos = m + T;
  d.seq_info = m + 2 * T;
  d.tables = m + 2 * T + 4 * S;
  d.num_tokens = static_cast<int32_t>(T);
  d.num_seqs = static_cast<int32_t>(S);
  d.max_seq_tokens = static_cast<int32_t>(b.max_seq_tokens);
  d.max_context = static_cast<int32_t>(b.max_context);
  return d;
}

Status CheckCache(const KvCacheLayer& cache, int64_t kv_heads, int64_t head_dim, DType dtype) {
  TESSERA_RETURN_IF_ERROR(ExpectFloatTensor(cache.k, 4, Device::kCUDA, "kv cache K"));
  TESSERA_RETURN_IF_ERROR(ExpectFloatTensor(cache.v, 4, Device::kCUDA, "kv cache V"));
  if (cache.k.shape() != cache.v.shape() || cache.k.dtype() != dtype || cache.v.dtype() != dtype ||
      cache.k.dim(2) != kv_heads || cache.k.dim(3) != head_dim)
    return InvalidArgument("kv cache " + cache.k.Describe() + " does not hold " +
                           std::to_string(kv_heads) + " kv heads of dim " +
                           std::to_string(head_dim) + " in " + DTypeName(dtype));
  return Status::Ok();
}

}  // namespace

Status WriteKv(KvCacheLayer& cache, const Tensor& k, const Tensor& v, const AttentionBatch& batch) {
  TESSERA_RETURN_IF_ERROR(ExpectFloatTensor(k, 3, Device::kCUDA, "kv write K"));
  if (v.shape() != k.shape() || v.dtype() != k.dtype() || v.device() != k.device())
    return InvalidArgument("kv write: K " + k.Describe() + " vs V " + v.Describe());
  if (k.dim(0) != batch.num_tokens)
    return InvalidArgument("kv write: K " + k.Describe() + " for a step of " +
                           std::to_string(batch.num_tokens) + " tokens");
  TESSERA_RETURN_IF_ERROR(CheckCache(cache, k.dim(1), k.dim(2), k.dtype()));
  TESSERA_ASSIGN_OR_RETURN(AttentionMetaDev meta, DeviceMeta(batch));
  TESSERA_ASSIGN_OR_RETURN(Context * ctx, Current());
  AttentionShape shape;
  shape.heads = static_cast<int32_t>(k.dim(1));
  shape.kv_heads = static_cast<int32_t>(k.dim(1));
  shape.head_dim = static_cast<int32_t>(k.dim(2));
  shape.block_size = static_cast<int32_t>(cache.k.dim(1));
  TESSERA_CUDA_LAUNCH_CHECK(LaunchWriteKv(k.dtype(), meta, shape, k.raw(), v.raw(), cache.k.raw(),
                                          cache.v.raw(), ctx->stream()),
                            "WriteKvKernel");
  return Status::Ok();
}

Status PagedAttention(const Tensor& q, const KvCacheLayer& cache, const AttentionBatch& batch,
                      float scale, Tensor& out, int64_t sliding_window) {
  TESSERA_RETURN_IF_ERROR(ExpectFloatTensor(q, 3, Device::kCUDA, "attention query"));
  const int64_t heads = q.dim(1), head_dim = q.dim(2);
  const int64_t kv_heads = cache.k.rank() == 4 ? cache.k.dim(2) : 0;
  TESSERA_RETURN_IF_ERROR(CheckCache(cache, kv_heads, head_dim, q.dtype()));
  if (kv_heads == 0 || heads % kv_heads != 0)
    return InvalidArgument("attention: " + std::to_string(heads) + " query heads over " +
                           std::to_string(kv_heads) + " kv heads");
  TESSERA_RETURN_IF_ERROR(ExpectFloatTensor(out, 2, Device::kCUDA, "attention output"));
  if (out.dim(0) != q.dim(0) || out.dim(1) != heads * head_dim || out.dtype() != q.dtype() ||
      q.dim(0) != batch.num_tokens)
    return InvalidArgument("attention: out " + out.Describe() + " for q " + q.Describe() +
                           " in a step of " + std::to_string(batch.num_tokens) + " tokens");
  if (head_dim > 256)
    return Unimplemented("attention: head_dim " + std::to_string(head_dim) +
                         " (the CUDA kernels take <= 256)");
  if (batch.num_tokens == 0) return Status::Ok();
  TESSERA_ASSIGN_OR_RETURN(AttentionMetaDev meta, DeviceMeta(batch));
  TESSERA_ASSIGN_OR_RETURN(Context * ctx, Current());
  AttentionShape shape;
  shape.heads = static_cast<int32_t>(heads);
  shape.kv_heads = static_cast<int32_t>(kv_heads);
  shape.head_dim = static_cast<int32_t>(head_dim);
  shape.block_size = static_cast<int32_t>(cache.k.dim(1));
  // A window at least the longest context masks nothing.
  shape.window = static_cast<int32_t>(std::min<int64_t>(sliding_window, INT32_MAX));
  const int64_t group = heads / kv_heads;

  if (batch.max_seq_tokens > kDecodeMaxTokens || group > 16) {
    if (group > 64)
      return Unimplemented("attention: " + std::to_string(group) +
                           " query heads per kv head (the CUDA kernels take <= 64)");
    TESSERA_CUDA_LAUNCH_CHECK(
        LaunchPrefillAttention(q.dtype(), meta, shape, q.raw(), cache.k.raw(), cache.v.raw(),
                               out.raw(), scale, ctx->stream()),
        "PrefillAttentionKernel");
    return Status::Ok();
  }
  // Decode: split the context so that the grid covers about two waves of
  // SMs (flash-decoding), at least 32 positions per split. The split is
  // chosen for the context bucket, not the exact context, so decode graphs
  // (recorded per bucket) and eager steps reduce in the same order.
  const int64_t ctas = batch.num_tokens * kv_heads;
  const int64_t target = 2 * static_cast<int64_t>(ctx->props().multiProcessorCount);
  const int64_t max_ctx = DecodeContextBucket(batch.max_context);
  int64_t splits = 1;
  if (ctas < target) splits = std::min((target + ctas - 1) / ctas, (max_ctx + 31) / 32);
  int64_t partition = (max_ctx + splits - 1) / splits;
  partition = (partition + 31) / 32 * 32;
  const int64_t max_partition =
      std::max<int64_t>(32, (16384 / group) / 32 * 32);  // <= 64 KiB of scores
  if (partition > max_partition) partition = max_partition;
  splits = (max_ctx + partition - 1) / partition;
  Tensor partials;
  if (splits > 1) {
    TESSERA_ASSIGN_OR_RETURN(
        partials, ctx->Allocate({batch.num_tokens * heads * splits * (head_dim + 2)}, DType::kF32));
  }
  TESSERA_CUDA_LAUNCH_CHECK(
      LaunchDecodeAttention(q.dtype(), meta, shape, q.raw(), cache.k.raw(), cache.v.raw(),
                            out.raw(), scale, static_cast<int>(partition), static_cast<int>(splits),
                            splits > 1 ? partials.data<float>() : nullptr, ctx->stream()),
      "DecodeAttentionKernel");
  return Status::Ok();
}

}  // namespace tessera::kernels::cuda
