// Paged KV-cache writes and causal grouped-query attention over it.
//
// KV cache layout (PagedAttention, Kwon et al. 2023): per layer, K and V are
// each [num_blocks, block_size, kv_heads, head_dim]. A sequence owns a block
// table: the token at position p lives in block block_table[p / block_size],
// slot p % block_size. Blocks are fixed-size so sequences grow without
// copying and without reserving max_context up front.
//
// The step's layout (sequences, block tables, the packed device form) is an
// AttentionBatch (kernels/attention_meta.h). Prefill chunks and single decode
// tokens mix freely.
//
// Grouped-query attention (Ainslie et al. 2023): query head h reads KV head
// h / (heads / kv_heads). Attention is causal: the token at position p
// attends to positions 0..p, or with a sliding window of W > 0 positions
// (Mistral, Phi-3, Gemma's sliding layers) to positions max(0, p - W + 1)..p,
// as transformers' sliding-window mask has it (kv_idx > q_idx - W). With a
// soft-cap C > 0 (Gemma 2's attn_logit_softcapping) each scaled score s
// becomes C * tanh(s / C) before the mask and softmax. Softmax accumulates
// in fp32.
//
// Thread-safety: stateless; callers serialise writes to the cache.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/base/status.h"
#include "common/base/tensor.h"
#include "kernels/attention_meta.h"
#include "kernels/backend.h"

namespace tessera::kernels {

// One layer's K and V. In the compute dtype, or in float8 e4m3fn (kF8E4M3, the
// fp8 KV cache of common/format/kv_cache_dtype.h) with fp32 scales: a value x
// is stored as F32ToF8E4M3(x / scale) (round to nearest even, saturating to
// +-448) and read as F8E4M3ToF32(stored) * scale. The scales are ignored for
// a cache in the compute dtype.
struct KvCacheLayer {
  Tensor k;  // [num_blocks, block_size, kv_heads, head_dim]
  Tensor v;  // [num_blocks, block_size, kv_heads, head_dim]
  float k_scale = 1.0f;
  float v_scale = 1.0f;
};

// Writes k/v rows of every sequence into its cache slots, quantizing them
// when the cache is kF8E4M3.
// Shapes: k, v [tokens, kv_heads, head_dim] in the compute dtype; the cache
// in the same dtype or kF8E4M3 (scales finite and > 0).
Status WriteKv(KvCacheLayer& cache, const Tensor& k, const Tensor& v, const AttentionBatch& batch);

// The step's own K and V rows, as WriteKv has just written them into the cache: [tokens, kv_heads,
// head_dim] in the compute dtype, contiguous, not owned. Optional: a kernel may read the keys of a
// fresh prompt (a sequence with start_pos 0) from them instead of gathering them from the paged
// cache (FlashInfer's Hopper prefill does, kernels/flashinfer_launch.h); the CPU and every other
// kernel read the cache. Ignored when a shape or dtype does not match the step's.
struct StepKv {
  const Tensor* k = nullptr;
  const Tensor* v = nullptr;
};

// out[t, h*head_dim:(h+1)*head_dim] = softmax(cap(q[t,h] . K[b..p] * scale)) V[b..p]
// with b = 0, or b = max(0, p - sliding_window + 1) when sliding_window > 0,
// and cap(s) = softcap * tanh(s / softcap) when softcap > 0, else s.
// Shapes: q [tokens, heads, head_dim], out [tokens, heads * head_dim], both
// in the compute dtype; the cache in the same dtype or kF8E4M3 (dequantized
// on read with its scales). fp32 scores, softmax and accumulation.
// Errors: kInvalidArgument on shapes, dtypes, a negative sliding_window or a
// negative or non-finite softcap.
Status PagedAttention(const Tensor& q, const KvCacheLayer& cache, const AttentionBatch& batch,
                      float scale, Tensor& out, int64_t sliding_window = 0, float softcap = 0.0f,
                      StepKv step_kv = {});

// The CUDA attention kernels (the CPU has one implementation).
//   kFlashInfer: FlashInfer's (flashinfer-python 0.7.4's headers, kernels/flashinfer_launch.h):
//     paged decode with a host-planned split of long contexts when every sequence of the step
//     has one token, tensor-core causal prefill over the paged cache otherwise. Shapes
//     FlashInferTakes() refuses run Tessera's kernels.
//   kTessera: Tessera's own (kernels/paged_attention_cuda.cu): split-K decode and scalar tiled
//     prefill, fp32 arithmetic, F32/BF16/F16, head_dim <= 256: the fallback and the parity
//     reference of the GPU tests.
enum class AttentionKernels { kFlashInfer, kTessera };

// "flashinfer" or "tessera". Errors: kInvalidArgument naming the value and `what`.
StatusOr<AttentionKernels> ParseAttentionKernels(const std::string& name, const char* what);
const char* AttentionKernelsName(AttentionKernels kernels);

// The process's choice: the environment's TESSERA_ATTENTION ("flashinfer" or "tessera"),
// read once; kFlashInfer when it is unset and the build has FlashInfer, kTessera otherwise.
// Errors: kInvalidArgument for another value; kFailedPrecondition for "flashinfer" in a build
// without it (TESSERA_FLASHINFER=OFF), naming the variable.
StatusOr<AttentionKernels> DefaultAttentionKernels();

// Whether the build has FlashInfer's kernels (CMake TESSERA_FLASHINFER, CUDA builds only).
bool FlashInferBuilt();

// Whether FlashInfer's kernels are instantiated for the shape: BF16 or F16, head_dim 64 or 128,
// heads / kv_heads in {1, 2, 3, 4, 6, 8, 16}.
bool FlashInferTakes(DType dtype, int64_t heads, int64_t kv_heads, int64_t head_dim);

namespace cpu {
Status WriteKv(KvCacheLayer& cache, const Tensor& k, const Tensor& v, const AttentionBatch& batch);
Status PagedAttention(const Tensor& q, const KvCacheLayer& cache, const AttentionBatch& batch,
                      float scale, Tensor& out, int64_t sliding_window, float softcap = 0.0f,
                      StepKv step_kv = {});
}  // namespace cpu

namespace cuda {
Status WriteKv(KvCacheLayer& cache, const Tensor& k, const Tensor& v, const AttentionBatch& batch);
// With DefaultAttentionKernels().
Status PagedAttention(const Tensor& q, const KvCacheLayer& cache, const AttentionBatch& batch,
                      float scale, Tensor& out, int64_t sliding_window, float softcap = 0.0f,
                      StepKv step_kv = {});
// With `kernels` (kFlashInfer falls back to Tessera's for a shape FlashInferTakes() refuses, a
// sliding window, a soft-cap, or a build without FlashInfer). A decode graph records the kernels
// of its first step: `kernels` and the batch's decode_work_items must stay the same for its batch
// size.
Status PagedAttention(const Tensor& q, const KvCacheLayer& cache, const AttentionBatch& batch,
                      float scale, Tensor& out, int64_t sliding_window, float softcap,
                      AttentionKernels kernels, StepKv step_kv = {});
}  // namespace cuda

}  // namespace tessera::kernels
