#include "common/engine/prefill_chunk.h"

#include <algorithm>
#include <cmath>

namespace tessera {

int64_t PrefillContextTokens(const ModelConfig& c) {
  const int64_t layers = c.num_hidden_layers, hidden = c.hidden_size;
  const int64_t heads = c.num_attention_heads;
  const int64_t kv_heads = c.num_key_value_heads > 0 ? c.num_key_value_heads : heads;
  const int64_t head_dim = c.head_dim > 0 ? c.head_dim : (heads > 0 ? hidden / heads : 0);
  if (layers <= 0 || hidden <= 0 || heads <= 0 || head_dim <= 0) return 0;
  double linear = 0;  // weights a token multiplies, over every layer
  int64_t full_layers = 0;
  for (int64_t l = 0; l < layers; ++l) {
    linear += static_cast<double>(hidden) * static_cast<double>(head_dim) *
              static_cast<double>(2 * heads + 2 * kv_heads);
    double mlp = static_cast<double>(c.intermediate_size);
    if (c.is_moe() && c.LayerIsSparse(l))
      mlp = static_cast<double>(c.moe_intermediate_size) *
                static_cast<double>(std::max<int64_t>(c.num_experts_per_tok, 1)) +
            static_cast<double>(c.shared_expert_intermediate_size);
    linear += 3.0 * static_cast<double>(hidden) * mlp;
    if (c.LayerSlidingWindow(l) <= 0) ++full_layers;
  }
  if (full_layers == 0) return 0;
  const double per_key = 4.0 * static_cast<double>(heads * head_dim * full_layers);
  return std::max<int64_t>(1, static_cast<int64_t>(2.0 * linear / (2.0 * per_key)));
}

int64_t PrefillChunkTokens(int64_t chunk_tokens, int64_t context_tokens, int64_t start,
                           int64_t remaining) {
  int64_t n = chunk_tokens;
  if (context_tokens > 0 && start > 0) {
    // n + n (s + n/2) / K <= C + C^2 / (2K): n^2 / (2K) + n (1 + s/K) - budget <= 0.
    const double k = static_cast<double>(context_tokens), c = static_cast<double>(chunk_tokens);
    const double b = 1.0 + static_cast<double>(start) / k;
    const double budget = c + c * c / (2.0 * k);
    const int64_t fit = static_cast<int64_t>(k * (std::sqrt(b * b + 2.0 * budget / k) - b));
    n = std::clamp(fit, std::min(chunk_tokens, kMinPrefillChunkTokens), chunk_tokens);
    if (remaining - n <= chunk_tokens / 8) n = chunk_tokens;  // the tail joins
  }
  return std::min(n, remaining);
}

}  // namespace tessera
