// SamplingParams: how one sequence picks its next token (see
// worker/model/sampler.h for the algorithm). Travels with every step so the rank
// that samples (the last pipeline stage) needs no other state.
//
// Thread-safety: a plain value.
#pragma once

#include <cstdint>

#include "common/base/status.h"

namespace tessera {

// Most top log-probabilities per sampled token (OpenAI's top_logprobs limit).
inline constexpr int32_t kMaxTopLogprobs = 20;

struct SamplingParams {
  float temperature = 0.0f;  // 0 = greedy; otherwise logits are divided by it
  int32_t top_k = 0;         // 0 = off; keep the k largest logits
  float top_p = 1.0f;        // 1 = off; nucleus mass in (0, 1]
  uint64_t seed = 0;         // RNG seed (per sequence)
  // Log-probabilities to return with each sampled token: -1 = none (not
  // requested); 0..kMaxTopLogprobs = the sampled token's log-probability
  // plus that many top alternatives. They are those of the model's raw
  // distribution, log_softmax(logits), before temperature/top-k/top-p (see
  // kernels/sampling.h); they never change which token is drawn.
  int32_t logprobs = -1;

  // Errors: kInvalidArgument naming the field (temperature < 0, top_k < 0,
  // top_p outside (0, 1], logprobs outside -1..kMaxTopLogprobs).
  Status Validate() const;
};

}  // namespace tessera
