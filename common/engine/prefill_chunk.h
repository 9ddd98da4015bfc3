// Chunk sizes for chunked prefill by cost (scheduler.prefill_chunk_budget =
// "cost"): a prompt's first chunk is prefill_chunk_tokens tokens, and each
// later chunk is shrunk so that it costs what the first one did, counting
// the attention to the context already in the KV cache.
//
// Cost model (units: "token-equivalents", the work of one token through the
// projections and MLP): a chunk of n tokens starting at position s costs
//   n + n * (s + n / 2) / K
// where the second term is causal attention over s cached keys plus, on
// average, half of its own n, and K (context tokens) is the context length
// at which one token's attention costs as much as its projections:
//   K = linear FLOPs per token / (2 * attention FLOPs per token per key)
//   linear FLOPs per token = 2 * (q, k, v, o, gate, up, down weights of every
//       layer; the active experts' (top-k, and the shared expert) for MoE)
//   attention FLOPs per token per key = 4 * heads * head_dim * full-attention
//       layers (QK^T and PV, 2 FLOPs per multiply-add each)
// The factor 2 in K's denominator is an estimate of attention's lower
// efficiency on a GPU: FlashAttention-2 reaches 50-73% of an A100's peak FLOPs
// (Dao 2023, "FlashAttention-2"), below what cuBLAS's large GEMMs reach. Layers
// with a sliding window attend to at most the window, so they are left out of
// the attention term (a model whose every layer slides gets K = 0: fixed
// chunks). Why: a decode step that also prefills a chunk late in a long prompt
// costs more than one early in it; constant-cost chunks keep the decoding
// sequences' inter-token latency steady (the idea of Agrawal et al. 2024, "Taming
// Throughput-Latency Tradeoff in LLM Inference with Sarathi-Serve": a token budget per step).
// Measured on an H100 (bench/mixing_bench, bench/results/NOTES.md 2026-12-07, later) this made
// the decoders' inter-token p99 worse than fixed chunks (2.90 x their p50 alone at 128 tokens
// against 1.76 x): a step that prefills has a fixed cost beyond its FLOPs (it runs eagerly,
// outside the decode CUDA graph), which this model leaves out, so smaller chunks add steps and a
// long prompt takes longer, most likely overlapping the next one (two chunks in a step); so
// "tokens" is the default and "cost" an option.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>

#include "common/format/model_config.h"

namespace tessera {

// K above, context tokens (>= 1), or 0 when `config` has no full-attention
// layer or misses a dimension (then chunks are not shrunk).
int64_t PrefillContextTokens(const ModelConfig& config);

// The chunk to prefill of a prompt with `remaining` (>= 1) tokens left,
// starting at position `start` (>= 0): the largest of at most `chunk_tokens`
// (>= 1) tokens whose cost is at most that of a `chunk_tokens` chunk starting
// at 0, with `context_tokens` = K (0: `chunk_tokens`, fixed chunks); at least
// min(chunk_tokens, kMinPrefillChunkTokens), so that a prompt always moves.
// A tail of at most chunk_tokens / 8 tokens that would be left after it joins
// it (still within chunk_tokens): a step of its own would cost a whole step's
// overhead for a few tokens. Never more than `remaining`.
inline constexpr int64_t kMinPrefillChunkTokens = 16;
int64_t PrefillChunkTokens(int64_t chunk_tokens, int64_t context_tokens, int64_t start,
                           int64_t remaining);

}  // namespace tessera
