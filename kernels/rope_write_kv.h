// What a layer does to its fresh q, k and v rows between the q|k|v projection and attention,
// as one call: the per-head RMSNorm of q and of k (Qwen3, Gemma 3; kernels/head_rms_norm.h),
// RoPE of q and k (kernels/rope.h), and the write of k and v into the paged KV cache
// (kernels/paged_attention.h WriteKv).
//
// The result equals, bit for bit on each backend, the calls in sequence:
//   HeadRmsNorm(q, norms.q_weight, eps, weight_offset)   when q_weight is defined
//   HeadRmsNorm(k, norms.k_weight, eps, weight_offset)   when k_weight is defined
//   ApplyRopeQk(q, k, positions, inv_freq)
//   WriteKv(cache, k, v, batch)
// On the CPU it is those calls. On CUDA it is one kernel (kernels/rope_write_kv_cuda.cu) instead
// of up to four: at batch 1 each launch is a few microseconds of a step that reads a layer's
// weights in about 35 (the ncu table of bench/results/NOTES.md, 2026-12-07g: q/k norms 3.5 + 3.5,
// RoPE 3.6, KV write 4.0 us a layer). The environment variable TESSERA_CUDA_FUSED_ROPE_KV=0 makes
// CUDA take the four kernels instead (an A/B switch for bench/).
//
// Shapes: q [tokens, heads, head_dim]; k, v [tokens, kv_heads, head_dim], all contiguous, one
// float dtype (F32 on the CPU; F32, BF16 or F16 on CUDA); the norm weights [head_dim] in that
// dtype; positions [tokens] I32 (absolute positions); inv_freq [head_dim / 2] F32; the cache
// [num_blocks, block_size, kv_heads, head_dim] in the dtype or kF8E4M3 (see KvCacheLayer).
// q and k are rotated (and normalised) in place, as the separate calls leave them: the attention
// that follows may read the step's K/V rows (StepKv) as well as the cache.
//
// Errors: kInvalidArgument naming the tensor (q, k, v, a norm weight, positions, inv_freq, the
// cache) whose shape, dtype or device does not match; those checks come before anything is
// written. kOutOfRange when a position has no block in its table, as WriteKv's.
// Thread-safety: stateless; callers serialise writes to the cache.
#pragma once

#include "common/base/status.h"
#include "common/base/tensor.h"
#include "kernels/attention_meta.h"
#include "kernels/paged_attention.h"

namespace tessera::kernels {

// The per-head RMSNorms before RoPE: x / sqrt(mean(x^2) + eps) * (weight_offset + weight), per
// (token, head) row. An undefined weight skips that norm (Llama, Mistral: neither is defined).
struct QkNorms {
  Tensor q_weight;  // [head_dim] or undefined
  Tensor k_weight;  // [head_dim] or undefined
  float eps = 1e-6f;
  float weight_offset = 0.0f;  // 0 (Qwen3) or 1 (Gemma 3's 1 + weight)
};

Status NormRopeWriteKv(Tensor& q, Tensor& k, const Tensor& v, const QkNorms& norms,
                       const Tensor& positions, const Tensor& inv_freq, KvCacheLayer& cache,
                       const AttentionBatch& batch);

// The separate calls in sequence, each dispatched on its tensors' device: the CPU's form, and
// CUDA's with TESSERA_CUDA_FUSED_ROPE_KV=0. No checks of its own beyond theirs.
Status NormRopeWriteKvSeparately(Tensor& q, Tensor& k, const Tensor& v, const QkNorms& norms,
                                 const Tensor& positions, const Tensor& inv_freq,
                                 KvCacheLayer& cache, const AttentionBatch& batch);

namespace cpu {
Status NormRopeWriteKv(Tensor& q, Tensor& k, const Tensor& v, const QkNorms& norms,
                       const Tensor& positions, const Tensor& inv_freq, KvCacheLayer& cache,
                       const AttentionBatch& batch);
}  // namespace cpu
namespace cuda {
Status NormRopeWriteKv(Tensor& q, Tensor& k, const Tensor& v, const QkNorms& norms,
                       const Tensor& positions, const Tensor& inv_freq, KvCacheLayer& cache,
                       const AttentionBatch& batch);
}  // namespace cuda

}  // namespace tessera::kernels
