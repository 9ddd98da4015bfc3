// Token sampling from one row of logits: greedy, temperature, top-k, top-p.
//
// Order of the warpers is HF generate's: temperature, then top-k, then top-p
// (nucleus sampling, Holtzman et al. 2019: keep the smallest set of tokens
// whose probability mass reaches top_p, at least one token). Greedy
// (temperature == 0) takes the first index of the maximum, as torch.argmax.
// A seeded Sampler draws the same tokens for the same logits on every run and
// on every rank, so tp/pp layouts agree.
//
// Thread-safety: a Sampler holds RNG state; one per sequence, one thread.
#pragma once

#include <cstdint>
#include <random>
#include <string>

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

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);

  // Picks a token id from logits [vocab] (F32, unnormalised).
  int32_t Sample(const float* logits, int64_t vocab);

 private:
  // Uniform double in [0, 1) from the 53 high bits of the generator, so the
  // stream does not depend on the standard library's distributions.
  double Uniform();

  SamplingParams params_;
  std::mt19937_64 rng_;
};

}  // namespace tessera
