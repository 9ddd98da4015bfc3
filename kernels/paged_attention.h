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
// attends to positions 0..p. Softmax accumulates in fp32.
//
// Thread-safety: stateless; callers serialise writes to the cache.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/status.h"
#include "common/tensor.h"

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

// Writes k/v rows of every sequence into its cache slots.
// Shapes: k, v [tokens, kv_heads, head_dim]. Errors: kOutOfRange when a
// position has no block in its table or a block id is out of range.
Status WriteKv(KvCacheLayer& cache, const Tensor& k, const Tensor& v,
               const std::vector<AttentionSeq>& seqs);

// out[t, h*head_dim:(h+1)*head_dim] = softmax(q[t,h] . K[0..p] * scale) V[0..p].
// Shapes: q [tokens, heads, head_dim], out [tokens, heads * head_dim].
Status PagedAttention(const Tensor& q, const KvCacheLayer& cache,
                      const std::vector<AttentionSeq>& seqs, float scale, Tensor& out);

namespace cpu {
Status WriteKv(KvCacheLayer& cache, const Tensor& k, const Tensor& v,
               const std::vector<AttentionSeq>& seqs);
Status PagedAttention(const Tensor& q, const KvCacheLayer& cache,
                      const std::vector<AttentionSeq>& seqs, float scale, Tensor& out);
}  // namespace cpu

}  // namespace tessera::kernels
