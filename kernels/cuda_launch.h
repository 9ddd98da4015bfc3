// Launchers of the CUDA kernels in kernels/*_cuda.cu. They take raw device
// pointers, sizes and the stream; the Tensor-level functions in
// kernels/*_cuda.cc check shapes, dtypes and devices first and turn the
// returned cudaError_t (the launch's configuration error) into a Status.
// Every floating kernel is instantiated for F32, BF16 and F16 and computes in
// fp32. C++17 (nvcc builds the .cu files as C++17).
//
// Thread-safety: launchers are stateless; ordering is that of the stream.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "common/base/dtype.h"
#include "kernels/logit_adjust_entry.h"

namespace tessera::kernels::cuda {

// Whether Tessera's decode kernels (and FlashInfer's decode) launch with programmatic dependent
// launch on the calling thread's current device (kernels/pdl.cuh): compute capability 9.0 or
// later, unless the environment's TESSERA_CUDA_PDL=0.
// Cached per thread.
bool PdlEnabled();

// The decode GEMM (kernels/skinny_gemm_cuda.cu): y[m, n] = x[m, k] w[n, k]^T (+ bias[n]) for
// 1 <= m <= kSkinnyGemmMaxRows, x, w and bias of dtype `in` (BF16 or F16), y of dtype `in` or
// F32, fp32 accumulation; x and y dense row-major, w in the nn.Linear layout. SkinnyGemmApplies
// says whether the kernel takes these inputs (dtype, m, k % 8 == 0, 16-byte aligned x and w);
// the launcher returns cudaErrorInvalidValue where it does not.
inline constexpr int64_t kSkinnyGemmMaxRows = 8;
// Steps of at most this many tokens launch their kernels with PDL (where PdlEnabled()): those
// whose projections are the skinny GEMMs, which start their weight stream before the wait. On an
// H100, larger steps (cuBLASLt's GEMMs) ran 1.6-4.5% slower with it, batch 1 1.6-2.7% faster
// (bench/results/NOTES.md, 2026-12-07); with this rule batch 1 ran 1.5-2.8% faster and batch 64
// level (2026-12-07, later).
inline constexpr int64_t kPdlMaxTokens = kSkinnyGemmMaxRows;
bool SkinnyGemmApplies(DType in, int64_t m, int64_t k, const void* x, const void* w);
cudaError_t LaunchSkinnyGemm(DType in, DType out, const void* x, const void* w, const void* bias,
                             void* y, int64_t m, int64_t n, int64_t k, cudaStream_t stream);
// act[m, inter] = silu(x w[i]^T + b[i]) * (x w[inter + i]^T + b[inter + i]) from the fused gate|up
// weight w [2 * inter, k] (kernels/linear_swiglu.h): the skinny GEMM with the SwiGLU in its
// epilogue, each sum rounded to `in` first. The same preconditions as LaunchSkinnyGemm; act in
// `in`.
cudaError_t LaunchSkinnyGemmSwiGlu(DType in, const void* x, const void* w, const void* bias,
                                   void* act, int64_t m, int64_t inter, int64_t k,
                                   cudaStream_t stream);

// The FP8 weight GEMMs (kernels/fp8_gemm_cuda.cu, kernels/linear_fp8.h): w [n, k] float8
// e4m3fn in the nn.Linear layout, scales fp32 [n, scale_cols] (one row per weight row; column j
// covers local columns [j * cols_per_scale - col_phase, (j + 1) * cols_per_scale - col_phase)),
// x [m, k] and bias [n] of the compute dtype, y [m, n].
struct Fp8GemmArgs {
  const void* x = nullptr;
  const void* w = nullptr;
  const float* scales = nullptr;
  int64_t scale_cols = 1, cols_per_scale = 1, col_phase = 0;
  const void* bias = nullptr;
  void* y = nullptr;
  int64_t m = 0, n = 0, k = 0;
};
// Whether the FP8 kernels take these inputs: `in` BF16 or F16, k % 16 == 0, a 16-byte aligned w,
// block scales whose blocks and phase are multiples of 16 columns.
bool Fp8GemmApplies(DType in, const Fp8GemmArgs& args);
// y = x (w * scales)^T (+ bias) for 1 <= m <= kSkinnyGemmMaxRows (also needs a 16-byte aligned x).
cudaError_t LaunchFp8SkinnyGemm(DType in, DType out, const Fp8GemmArgs& args, cudaStream_t stream);
// out[n, k] (dtype `out_dtype`, 16-byte aligned) = w * scales; args.x, bias, y and m unused.
cudaError_t LaunchFp8Dequantize(DType out_dtype, const Fp8GemmArgs& args, void* out,
                                cudaStream_t stream);
// Dynamic per-token activation quantization for the FP8 tensor-core GEMM: for each row of
// x [m, k] (BF16 or F16, 16-byte aligned, k % 8 == 0), x_scales[row] = max|x[row, :]| / 448
// (1 for a zero row) and xq[row, :] = e4m3fn(x[row, :] / x_scales[row]) (round to nearest,
// saturating). xq [m, k] bytes, 8-byte aligned; x_scales [m] fp32.
cudaError_t LaunchFp8QuantizeRows(DType in, const void* x, int64_t m, int64_t k, void* xq,
                                  float* x_scales, cudaStream_t stream);

// y = rmsnorm(x) * (w_offset + w), or with `add`: residual += add (rounded
// to the dtype), y = rmsnorm(residual) * (w_offset + w). x is ignored when
// add is given. Shapes: rows x hidden.
cudaError_t LaunchRmsNorm(DType dtype, const void* x, void* residual, const void* add,
                          const void* w, void* y, int64_t rows, int64_t hidden, float eps,
                          float w_offset, cudaStream_t stream);

// Each of `rows` rows of head_dim elements normalised in place:
// x = rmsnorm(x) * (w_offset + w) (kernels/head_rms_norm.h).
cudaError_t LaunchHeadRmsNorm(DType dtype, void* x, const void* w, int64_t rows, int64_t head_dim,
                              float eps, float w_offset, cudaStream_t stream);

// x [tokens, heads, head_dim] rotated in place (HF rotate_half layout).
cudaError_t LaunchRope(DType dtype, void* x, const int32_t* positions, const float* inv_freq,
                       int64_t tokens, int64_t heads, int64_t head_dim, cudaStream_t stream);
// q [tokens, q_heads, head_dim] and k [tokens, k_heads, head_dim] rotated in place, one launch.
cudaError_t LaunchRopeQk(DType dtype, void* q, void* k, const int32_t* positions,
                         const float* inv_freq, int64_t tokens, int64_t q_heads, int64_t k_heads,
                         int64_t head_dim, cudaStream_t stream);

// out = silu(gate) * up, `count` elements.
cudaError_t LaunchSiluMul(DType dtype, const void* gate, const void* up, void* out, int64_t count,
                          cudaStream_t stream);

// out = gelu_tanh(gate) * up, `count` elements (kernels/geglu.h).
cudaError_t LaunchGeluTanhMul(DType dtype, const void* gate, const void* up, void* out,
                              int64_t count, cudaStream_t stream);

// The fused gate|up variants: gate_up [rows, 2 * cols] (gate columns, then
// up), out [rows, cols] (kernels/swiglu.h SiluMulFused, kernels/geglu.h
// GeluTanhMulFused).
cudaError_t LaunchSiluMulFused(DType dtype, const void* gate_up, void* out, int64_t rows,
                               int64_t cols, cudaStream_t stream);
cudaError_t LaunchGeluTanhMulFused(DType dtype, const void* gate_up, void* out, int64_t rows,
                                   int64_t cols, cudaStream_t stream);

// x = cap * tanh(x / cap), `count` elements in place (kernels/softcap.h).
cudaError_t LaunchSoftCap(DType dtype, void* x, int64_t count, float cap, cudaStream_t stream);

// x *= FromF<T>(scale) (the scale rounded to the dtype first), `count`
// elements in place (kernels/tensor_ops.h ScaleInPlace).
cudaError_t LaunchScale(DType dtype, void* x, int64_t count, float scale, cudaStream_t stream);

// out[t] = table[ids[t] - vocab_begin] or zeros outside [0, rows).
cudaError_t LaunchEmbedding(DType dtype, const int32_t* ids, int64_t tokens, const void* table,
                            int64_t rows, int64_t hidden, int64_t vocab_begin, void* out,
                            cudaStream_t stream);

// acc[r, i] += x[r, i] + bias[i] (x or bias may be null).
cudaError_t LaunchAddInPlace(DType dtype, void* acc, const void* x, const void* bias, int64_t rows,
                             int64_t cols, cudaStream_t stream);

// src [rows, bytes[0] + bytes[1] + bytes[2]] (row bytes) split by columns
// into dst[0..2], rows of bytes[i] each (kernels/tensor_ops.h SplitColumns).
cudaError_t LaunchSplitColumns(const void* src, int64_t rows, const size_t bytes[3],
                               void* const dst[3], cudaStream_t stream);

// out[i] = src[rows[i]] for rows of `row_bytes` bytes.
cudaError_t LaunchGatherRows(const void* src, const int32_t* rows, int64_t num_rows,
                             size_t row_bytes, void* out, cudaStream_t stream);

// The MoE layer (kernels/moe_routing.h, kernels/moe_experts.h; one launch each).
// The CUDA-core kernels below (not the tensor-core ones) launch with PDL (kernels/pdl.cuh) in
// steps of at most kPdlMaxTokens tokens, as the dense decode kernels do; MoePdl(tokens) says
// whether, and TESSERA_CUDA_MOE_PDL=0 in the environment turns it off for them alone (A/B runs).
bool MoePdl(int64_t tokens);
// Router top-k: logits F32 [tokens, experts] -> ids I32, weights F32 [tokens, top_k].
cudaError_t LaunchMoeTopK(const float* logits, int64_t tokens, int64_t experts, int64_t top_k,
                          bool renormalize, int32_t* ids, float* weights, cudaStream_t stream);
// The top-k and the sort below in one launch, for a small step: at most kPdlMaxTokens tokens,
// 512 router experts, 256 pairs and 1024 held experts (MoeRouteApplies;
// TESSERA_CUDA_MOE_FUSED_ROUTE=0 in the environment says no, for A/B runs). Outputs as
// LaunchMoeTopK's and LaunchMoeSort's, with the slots of an expert in pair order.
bool MoeRouteApplies(int64_t tokens, int64_t experts, int64_t top_k, int64_t held);
cudaError_t LaunchMoeRoute(const float* logits, int64_t tokens, int64_t experts, int64_t top_k,
                           bool renormalize, int64_t expert_begin, int64_t held, int32_t* ids,
                           float* weights, int32_t* expert_rows, int32_t* slot_token,
                           int32_t* token_slot, int32_t* active, int64_t* token_totals,
                           cudaStream_t stream);
// Sort of the (token, k) pairs of ids [pairs / top_k, top_k] by held expert
// [expert_begin, expert_begin + experts): expert_rows [experts + 1], slot_token [pairs],
// token_slot [pairs], active [experts + 1] (count, then the active experts); token_totals (I64
// [experts] or null) += the pairs of each held expert.
cudaError_t LaunchMoeSort(const int32_t* ids, int64_t pairs, int64_t top_k, int64_t expert_begin,
                          int64_t experts, int32_t* expert_rows, int32_t* slot_token,
                          int32_t* token_slot, int32_t* active, int64_t* token_totals,
                          cudaStream_t stream);
// table: I64 [experts, 3] addresses of each held expert's gate [inter, hidden], up [inter,
// hidden] and down [hidden, inter]. `vec`: rows of x/act and of every weight start on 16-byte
// boundaries and hidden, inter are multiples of 16 bytes (16-byte loads). `active` as
// LaunchMoeSort wrote it; `grid_experts` (>= active[0]) experts' blocks are launched.
// act[s] = silu(x[slot_token[s]] gate_e^T) * (x[slot_token[s]] up_e^T), act [slots, inter].
cudaError_t LaunchMoeGateUp(DType dtype, const void* x, const int64_t* table,
                            const int32_t* expert_rows, const int32_t* active,
                            const int32_t* slot_token, void* act, int64_t grid_experts,
                            int64_t hidden, int64_t inter, bool vec, int64_t tokens,
                            cudaStream_t stream);
// y[s] = act[s] down_e^T, y [slots, hidden]. `tokens`: the step's tokens (for MoePdl).
cudaError_t LaunchMoeDown(DType dtype, const void* act, const int64_t* table,
                          const int32_t* expert_rows, const int32_t* active, void* y,
                          int64_t grid_experts, int64_t hidden, int64_t inter, bool vec,
                          int64_t tokens, cudaStream_t stream);
// The same two products on tensor cores (kernels/moe_experts_tc_cuda.cu), for many pairs per
// expert: bf16 or fp16, hidden and inter multiples of 32 (MoeTcShapeOk), rows 16-byte aligned
// (the `vec` condition above). `wide_m`: 64 slots per block pass instead of 16.
bool MoeTcShapeOk(DType dtype, int64_t hidden, int64_t inter);
cudaError_t LaunchMoeGateUpTc(DType dtype, const void* x, const int64_t* table,
                              const int32_t* expert_rows, const int32_t* active,
                              const int32_t* slot_token, void* act, int64_t grid_experts,
                              int64_t hidden, int64_t inter, bool wide_m, cudaStream_t stream);
cudaError_t LaunchMoeDownTc(DType dtype, const void* act, const int64_t* table,
                            const int32_t* expert_rows, const int32_t* active, void* y,
                            int64_t grid_experts, int64_t hidden, int64_t inter, bool wide_m,
                            cudaStream_t stream);
// out[t] = sum_k weights[t, k] y[token_slot[t, k]] (+ sigmoid(shared_gate[t]) shared[t]).
cudaError_t LaunchMoeCombine(DType dtype, const void* y, const int32_t* token_slot,
                             const float* weights, int64_t top_k, const void* shared,
                             const float* shared_gate, void* out, int64_t tokens, int64_t hidden,
                             cudaStream_t stream);
// The down product and the combine in one launch (kernels/moe_down_combine.h): out[t] = sum_k
// weights[t, k] round(act[token_slot[t, k]] down_e^T) (+ sigmoid(shared_gate[t]) shared[t]), e =
// expert_ids[t, k] - expert_begin. act, every down row and inter's bytes 16-byte aligned.
cudaError_t LaunchMoeDownCombine(DType dtype, const void* act, const int64_t* table,
                                 const int32_t* token_slot, const int32_t* expert_ids,
                                 int64_t expert_begin, const float* weights, int64_t top_k,
                                 const void* shared, const float* shared_gate, void* out,
                                 int64_t tokens, int64_t hidden, int64_t inter,
                                 cudaStream_t stream);

// The packed AttentionBatch layout (kernels/paged_attention.h).
struct AttentionMetaDev {
  const int32_t* token_seq = nullptr;  // [T]
  const int32_t* token_pos = nullptr;  // [T]
  const int32_t* seq_info = nullptr;   // [S, 4]: token_begin, num_tokens, start_pos, table offset
  const int32_t* tables = nullptr;     // concatenated block tables
  int32_t num_tokens = 0;
  int32_t num_seqs = 0;
  int32_t max_seq_tokens = 0;
  int32_t max_context = 0;
};

struct AttentionShape {
  int32_t heads = 0, kv_heads = 0, head_dim = 0, block_size = 0;
  // Sliding window (0 = none): the token at position p attends to
  // positions [max(0, p - window + 1), p].
  int32_t window = 0;
  // Tanh soft-capping of the scaled scores (0 = none): s = softcap *
  // tanh(s / softcap) before the mask and softmax (Gemma 2).
  float softcap = 0.0f;
  // The fp8 KV cache's per-layer scales (kernels/kv_quant.h); unused when the
  // cache holds the compute dtype.
  float k_scale = 1.0f, v_scale = 1.0f;
};

// K/V rows (dtype) of every token into their cache slots (cache_dtype: dtype,
// or kF8E4M3 for BF16/F16 K/V, stored as e4m3(x / scale)).
cudaError_t LaunchWriteKv(DType dtype, const AttentionMetaDev& meta, const AttentionShape& shape,
                          const void* k, const void* v, void* k_cache, void* v_cache,
                          DType cache_dtype, cudaStream_t stream);

// kernels/rope_write_kv.h in one launch: the per-head RMSNorm of q [tokens, shape.heads,
// head_dim] and k [tokens, shape.kv_heads, head_dim] (q_norm / k_norm [head_dim] in dtype, or
// null to skip), RoPE of both at positions [tokens] with inv_freq [head_dim / 2], q and k written
// back in place, then k and v (dtype) into their cache slots as LaunchWriteKv stores them.
cudaError_t LaunchNormRopeWriteKv(DType dtype, const AttentionMetaDev& meta,
                                  const AttentionShape& shape, void* q, void* k, const void* v,
                                  const void* q_norm, const void* k_norm, float eps, float w_offset,
                                  const int32_t* positions, const float* inv_freq, void* k_cache,
                                  void* v_cache, DType cache_dtype, cudaStream_t stream);

// Split-K decode attention (one query token per CTA row; any number of
// tokens per sequence, each attending to its own causal prefix). When
// num_splits > 1, `partials` holds num_tokens * heads * num_splits *
// (head_dim + 2) floats. Limits: head_dim <= 256, heads / kv_heads <= 16.
// The cache holds `cache_dtype`: dtype, or kF8E4M3 (dtype BF16 or F16),
// read as e4m3 x the shape's scale.
cudaError_t LaunchDecodeAttention(DType dtype, const AttentionMetaDev& meta,
                                  const AttentionShape& shape, const void* q, const void* k_cache,
                                  const void* v_cache, DType cache_dtype, void* out, float scale,
                                  int partition, int num_splits, float* partials,
                                  cudaStream_t stream);
size_t DecodeAttentionSharedBytes(const AttentionShape& shape, int partition);

// Flash-style causal prefill attention: a CTA takes a tile of query rows
// (tokens x the GQA group) of one sequence and one kv head, walks the key
// tiles of its causal range through the paged cache with an online fp32
// softmax. Limits: head_dim <= 256, heads / kv_heads <= 64. The cache as
// LaunchDecodeAttention's.
cudaError_t LaunchPrefillAttention(DType dtype, const AttentionMetaDev& meta,
                                   const AttentionShape& shape, const void* q, const void* k_cache,
                                   const void* v_cache, DType cache_dtype, void* out, float scale,
                                   cudaStream_t stream);

// Logits processing (kernels/logit_adjust.h): entries[i] applied to its
// logit of logits [rows, vocab] F32; no two entries name one logit.
cudaError_t LaunchAdjustLogits(float* logits, int64_t vocab, const LogitAdjustment* entries,
                               int64_t count, cudaStream_t stream);
// Structured-output masks (kernels/logit_adjust.h MaskLogits): row rows[i] of
// logits [*, vocab] keeps the tokens whose bit is set in words[i *
// words_per_row ...]; the others become kBannedLogit.
cudaError_t LaunchMaskLogits(float* logits, int64_t vocab, const int64_t* rows,
                             const uint32_t* words, int64_t words_per_row, int64_t count,
                             cudaStream_t stream);

// Sampling (kernels/sampling.h). Row settings in device memory.
struct SampleRowDev {
  double uniform;
  float temperature;
  float top_p;
  int32_t top_k;
  int32_t greedy;
  float min_p;  // 0 = off (kernels/sampling.h)
};
// kNonFiniteLogitsToken of common/base/sampled_token.h (which nvcc's C++17
// cannot include; kernels/sampling_cuda.cc checks they agree).
inline constexpr int32_t kNonFiniteRowToken = -1;
// First index of each row's maximum, or kNonFiniteRowToken for a row holding
// a NaN or an infinity.
cudaError_t LaunchArgmax(const float* logits, int64_t rows, int64_t vocab, int32_t* out,
                         cudaStream_t stream);
// Device scratch bytes LaunchSampleRows needs for `rows` x `vocab`.
size_t SampleScratchBytes(int64_t rows, int64_t vocab);
// Sorts every row (descending, stable) and draws the non-greedy rows' tokens
// into out (greedy rows, and rows LaunchArgmax marked kNonFiniteRowToken,
// are left alone; LaunchArgmax must have run first on `stream`).
cudaError_t LaunchSampleRows(const float* logits, int64_t rows, int64_t vocab,
                             const SampleRowDev* params, int32_t* out, void* scratch,
                             size_t scratch_bytes, cudaStream_t stream);

}  // namespace tessera::kernels::cuda
