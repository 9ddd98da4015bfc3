// SamplingParams: how one sequence picks its next token (see
// worker/sampler.h for the algorithm). Travels with every step so the rank
// that samples (the last pipeline stage) needs no other state.
//
// Thread-safety: a plain value.
#pragma once

#include <cstdint>

#include "common/status.h"

namespace tessera {

struct SamplingParams {
  float temperature = 0.0f;  // 0 = greedy; otherwise logits are divided by it
  int32_t top_k = 0;         // 0 = off; keep the k largest logits
  float top_p = 1.0f;        // 1 = off; nucleus mass in (0, 1]
  uint64_t seed = 0;         // RNG seed (per sequence)

  // Errors: kInvalidArgument naming the field (temperature < 0, top_k < 0,
  // top_p outside (0, 1]).
  Status Validate() const;
};

}  // namespace tessera
