// Paged KV-cache writes and causal grouped-query attention over it.
//
// KV cache layout (PagedAttention, Kwon et al. 2023): per layer, K and V are
// each [num_blocks, block_size, kv_heads, head_dim]. A sequence owns a block
// table: the token at position p lives in block block_table[p / block_size],
// slot p % block_size. Blocks are fixed-size so sequences grow without
// copying and without reserving max_context up front.
//
// A step processes a flat batch of tokens from several sequences with no
// padding: sequence s covers rows [token_begin, token_begin + num_tokens) of
// q/k/v and its first token is at absolute position start_pos (the number of
// tokens already in its cache). Prefill chunks and single decode tokens mix
// freely.
//
// Grouped-query attention (Ainslie et al. 2023): query head h reads KV head
// h / (heads / kv_heads). Attention is causal: the token at position p
// attends to positions 0..p, or with a sliding window of W > 0 positions
// (Mistral, Phi-3) to positions max(0, p - W + 1)..p, as transformers'
// sliding-window mask has it (kv_idx > q_idx - W). Softmax accumulates in
// fp32.
//
// Thread-safety: stateless; callers serialise writes to the cache.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/base/status.h"
#include "common/base/tensor.h"
#include "kernels/backend.h"

namespace tessera::kernels {

struct KvCacheLayer {
  Tensor k;  // [num_blocks, block_size, kv_heads, head_dim]
  Tensor v;  // [num_blocks, block_size, kv_heads, head_dim]
};

struct AttentionSeq {
  int64_t token_begin = 0;               // first row in the step's q/k/v
  int64_t num_tokens = 0;                // rows of this sequence in the step
  int32_t start_pos = 0;                 // absolute position of the first row
  std::span<const int32_t> block_table;  // covers positions [0, start_pos + num_tokens)
};

// The layout of one step's sequences, built once per forward step and shared
// by every layer's WriteKv and PagedAttention. On a CUDA backend it also
// holds the layout packed into one device I32 tensor (uploaded once per
// step, not once per layer):
//   [0, T)            sequence index of every token
//   [T, 2T)           absolute position of every token
//   [2T, 2T + 4S)     per sequence: token_begin, num_tokens, start_pos,
//                     offset of its block table in the tables below
//   [2T + 4S, ...)    the block tables, concatenated
struct AttentionBatch {
  std::vector<AttentionSeq> seqs;
  int64_t num_tokens = 0;      // T: rows of q/k/v
  int64_t max_seq_tokens = 0;  // largest num_tokens of a sequence
  int64_t max_context = 0;     // largest start_pos + num_tokens
  Tensor device_meta;          // I32 packed layout on the backend's device, or undefined on the CPU
};

// Checks and packs `seqs` for a cache of `num_blocks` blocks of `block_size`
// positions. The block tables are referenced, not copied: they must outlive
// the batch. Errors: kInvalidArgument when the sequences do not tile
// [0, num_tokens) in order; kOutOfRange when a position has no block in its
// table or a block id lies outside [0, num_blocks) (naming both).
StatusOr<AttentionBatch> MakeAttentionBatch(std::vector<AttentionSeq> seqs, int64_t num_tokens,
                                            int64_t block_size, int64_t num_blocks,
                                            Backend& backend);

// MakeAttentionBatch without the upload: checks `seqs` and fills num_tokens,
// max_seq_tokens and max_context (device_meta stays undefined). Errors: as
// MakeAttentionBatch.
StatusOr<AttentionBatch> CheckAttentionBatch(std::vector<AttentionSeq> seqs, int64_t num_tokens,
                                             int64_t block_size, int64_t num_blocks);

// The I32 values of the packed device layout of `batch` (see AttentionBatch)
// for a cache of `block_size`. With table_stride > 0 sequence i's block table
// starts at offset i * table_stride of the tables region (which then holds
// S * table_stride values, the unused ones 0): the layout of a CUDA graph,
// whose pointers and sizes must not change between steps. table_stride must
// be at least the blocks every sequence needs (TESSERA_CHECKed).
std::vector<int32_t> PackAttentionMeta(const AttentionBatch& batch, int64_t block_size,
                                       int64_t table_stride = 0);

// The context length by which the CUDA decode kernel splits its work
// (flash-decoding): the smallest power of two >= 256 holding max_context.
// Eager steps and recorded decode graphs (whose split is fixed when they are
// recorded) both split by it, so a replayed graph computes bit for bit what
// an eager step computes.
int64_t DecodeContextBucket(int64_t max_context);

// Writes k/v rows of every sequence into its cache slots.
// Shapes: k, v [tokens, kv_heads, head_dim] in the cache's dtype.
Status WriteKv(KvCacheLayer& cache, const Tensor& k, const Tensor& v, const AttentionBatch& batch);

// out[t, h*head_dim:(h+1)*head_dim] = softmax(q[t,h] . K[b..p] * scale) V[b..p]
// with b = 0, or b = max(0, p - sliding_window + 1) when sliding_window > 0.
// Shapes: q [tokens, heads, head_dim], out [tokens, heads * head_dim], both
// in the cache's dtype. fp32 scores, softmax and accumulation.
// Errors: kInvalidArgument on shapes, dtypes or a negative sliding_window.
Status PagedAttention(const Tensor& q, const KvCacheLayer& cache, const AttentionBatch& batch,
                      float scale, Tensor& out, int64_t sliding_window = 0);

namespace cpu {
Status WriteKv(KvCacheLayer& cache, const Tensor& k, const Tensor& v, const AttentionBatch& batch);
Status PagedAttention(const Tensor& q, const KvCacheLayer& cache, const AttentionBatch& batch,
                      float scale, Tensor& out, int64_t sliding_window);
}  // namespace cpu

namespace cuda {
Status WriteKv(KvCacheLayer& cache, const Tensor& k, const Tensor& v, const AttentionBatch& batch);
Status PagedAttention(const Tensor& q, const KvCacheLayer& cache, const AttentionBatch& batch,
                      float scale, Tensor& out, int64_t sliding_window);
}  // namespace cuda

}  // namespace tessera::kernels
