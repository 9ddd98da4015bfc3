// Launchers of FlashInfer's paged attention kernels (the headers of the PyPI wheel
// flashinfer-python 0.7.4, which scripts/setup unpacks; CMake option TESSERA_FLASHINFER),
// instantiated in kernels/flashinfer_decode_cuda.cu and kernels/flashinfer_prefill_cuda.cu for
// BF16 and F16, head_dim 64 and 128, and the GQA groups FlashInferTakes() lists
// (kernels/paged_attention.h). Tessera's paged KV cache is FlashInfer's NHD layout
// ([num_blocks, block_size, kv_heads, head_dim], a block being a page), so the kernels read the
// cache in place: the page arrays (kv_indptr, the block tables as page indices, kv_last_page_len)
// are regions of the step's packed layout (kernels/attention_meta.h).
//
// Both take q [tokens, heads, head_dim] and write out [tokens, heads * head_dim], contiguous,
// in the cache's dtype; scores, softmax and the output accumulate in fp32 (FlashInfer stores
// the partial outputs of a split decode in the dtype). Causal: query row i of a sequence with
// q_len rows and kv_len positions sits at position kv_len - q_len + i.
//
// Errors: the launch's cudaError_t; a FlashInfer exception (an unsupported configuration)
// becomes cudaErrorNotSupported with its message in *error. Nothing here synchronises.
//
// Thread-safety: stateless; ordering is that of the stream. C++17 (nvcc).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "common/base/dtype.h"

namespace tessera::kernels::cuda {

// One step's paged KV cache as FlashInfer reads it (device pointers).
struct FlashInferPagedKv {
  void* k_cache = nullptr;                 // [num_blocks, block_size, kv_heads, head_dim]
  void* v_cache = nullptr;                 // same shape
  const int32_t* indices = nullptr;        // block tables, concatenated
  const int32_t* indptr = nullptr;         // [num_seqs + 1] offsets into indices
  const int32_t* last_page_len = nullptr;  // [num_seqs] positions used in the last block
  int32_t num_seqs = 0, kv_heads = 0, block_size = 0;
};

// Decode: every sequence has exactly one query row (q row s belongs to sequence s). The context
// of sequence s is split into work items of *chunk positions: items o_indptr[s] ..
// o_indptr[s + 1] - 1, each naming its sequence (request) and chunk (kv_tile); `valid` marks
// the real items among work_items (padding after them). With work_items == num_seqs the kernel
// runs unsplit (one CTA per sequence and kv head; tmp_* unused); otherwise each item writes a
// partial output to tmp_v [work_items, heads, head_dim] (dtype) and tmp_s [work_items, heads]
// (fp32) and a second kernel merges them. The grid depends on work_items only, so a recorded
// CUDA graph replays for any contexts whose plan fits its work_items.
struct FlashInferDecodeArgs {
  FlashInferPagedKv kv;
  const void* q = nullptr;
  void* out = nullptr;
  int32_t heads = 0, head_dim = 0;
  float scale = 1.0f;
  const int32_t* request = nullptr;   // [work_items]
  const int32_t* kv_tile = nullptr;   // [work_items]
  const int32_t* o_indptr = nullptr;  // [num_seqs + 1]
  const int32_t* chunk = nullptr;     // [1]
  const uint8_t* valid = nullptr;     // [work_items]
  int32_t work_items = 0;
  void* tmp_v = nullptr;
  float* tmp_s = nullptr;
};
cudaError_t LaunchFlashInferDecode(DType dtype, const FlashInferDecodeArgs& args,
                                   cudaStream_t stream, std::string* error);

// Prefill (any number of query rows per sequence, causal): query rows are packed as
// (token, head of the GQA group) pairs, cta_tile_q of them per CTA; work item i takes packed
// tile qo_tile[i] of sequence request[i] over its whole context (no split). cta_tile_q is 16 or
// 128 (FlashInferPrefillTileQ).
struct FlashInferPrefillArgs {
  FlashInferPagedKv kv;
  const void* q = nullptr;
  void* out = nullptr;
  int32_t heads = 0, head_dim = 0;
  float scale = 1.0f;
  const int32_t* q_indptr = nullptr;  // [num_seqs + 1] first q row of every sequence, then T
  const int32_t* request = nullptr;   // [work_items]
  const int32_t* qo_tile = nullptr;   // [work_items]
  const int32_t* kv_tile = nullptr;   // [work_items], zeros
  const int32_t* chunk = nullptr;     // [1] (read, unused without a split)
  int32_t work_items = 0;
  int32_t cta_tile_q = 128;
};
cudaError_t LaunchFlashInferPrefill(DType dtype, const FlashInferPrefillArgs& args,
                                    cudaStream_t stream, std::string* error);

// Prefill on Hopper: FlashInfer's FlashAttention-3 kernel (prefill_sm90.cuh: warp-specialised,
// wgmma, built for sm_90a only, TESSERA_WITH_FLASHINFER_SM90), causal over the paged cache, whose
// pages it loads with cp.async. Instantiated for BF16 and F16 at head_dim 128. Query tiles are
// kFlashInferSm90TileQ rows of one query head (no packing of the GQA group); one persistent CTA
// per SM walks the work items of a host plan (kernels/prefill_work_plan.h) whose arrays are on the
// device: CTA c takes items work_indptr[c] .. work_indptr[c + 1] - 1, for `ctas` CTAs and `works`
// items, and ctas must be the device's SM count (else cudaErrorInvalidValue). The plan carries
// each sequence's q row offset, K/V offset and lengths, so kv.indptr and kv.last_page_len are
// not read. Two kinds:
//   paged (step_k == nullptr): keys and values gathered from the cache's pages with cp.async
//     (FlashInfer's tiles of 128 query rows x 96 keys); kv_indptr is the sequence's offset in
//     kv.indices (pages).
//   ragged (step_k, step_v: the step's own rows, [num_tokens, kv_heads, head_dim], contiguous):
//     for fresh prompts (start_pos 0), keys and values read with TMA (128 x 128 tiles);
//     kv_indptr is the sequence's first row in step_k, and kv_len its rows.
struct FlashInferPrefillSm90Args {
  FlashInferPagedKv kv;
  const void* q = nullptr;
  void* out = nullptr;
  int32_t num_tokens = 0;  // rows of q and out
  int32_t heads = 0, head_dim = 0;
  float scale = 1.0f;
  const void* step_k = nullptr;  // ragged: the step's K rows, else nullptr (paged)
  const void* step_v = nullptr;
  const int32_t* work_indptr = nullptr;  // [ctas + 1]
  // [works] each: the query tile, the sequence's first q row and page offset, its q rows and
  // context positions, the query head, the sequence's index in the step.
  const int32_t *qo_tile = nullptr, *qo_indptr = nullptr, *kv_indptr = nullptr, *qo_len = nullptr,
                *kv_len = nullptr, *head = nullptr, *batch = nullptr;
  int32_t ctas = 0, works = 0;
};
inline constexpr int32_t kFlashInferSm90TileQ = 128;
cudaError_t LaunchFlashInferPrefillSm90(DType dtype, const FlashInferPrefillSm90Args& args,
                                        cudaStream_t stream, std::string* error);

// Packed query rows per prefill CTA for a step of `num_tokens` rows over `num_seqs` sequences
// with `group` query heads per kv head: 128 when the average sequence packs more than 64 rows,
// 16 otherwise (FlashInfer's FA2 choice, restricted to the two tiles instantiated).
inline int32_t FlashInferPrefillTileQ(int64_t num_tokens, int64_t num_seqs, int64_t group) {
  return num_seqs > 0 && num_tokens * group > 64 * num_seqs ? 128 : 16;
}

}  // namespace tessera::kernels::cuda
