// Token sampling from one row of logits: greedy, temperature, top-k, top-p.
//
// Order of the warpers is HF generate's: temperature, then top-k, then top-p
// (nucleus sampling, Holtzman et al. 2019: keep the smallest set of tokens
// whose probability mass reaches top_p, at least one token). Greedy
// (temperature == 0) takes the first index of the maximum, as torch.argmax.
// A seeded Sampler draws the same tokens for the same logits on every run and
// on every rank, so tp/pp layouts agree.
//
// Log-probabilities: a sequence whose SamplingParams::logprobs is >= 0 also
// gets log_softmax(logits) of its drawn token and its top alternatives,
// from the raw distribution before temperature/top-k/top-p (definition in
// kernels/sampling.h). They are computed from the full-vocab logits the
// token is drawn from (after the vocab-parallel lm_head's all-gather).
//
// Thread-safety: a Sampler holds RNG state; one per sequence, one thread.
#pragma once

#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "common/base/sampled_token.h"
#include "common/base/sampling_params.h"
#include "common/base/status.h"
#include "common/base/tensor.h"
#include "common/wire/step_batch.h"
#include "kernels/sampling.h"

namespace tessera {

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);

  // Picks a token id from logits [vocab] (F32, unnormalised).
  int32_t Sample(const float* logits, int64_t vocab);

  // The next draw as a kernel row (kernels/sampling.h): the warper settings
  // plus one uniform from this sequence's generator (none for greedy), so a
  // device sampler consumes the same random stream as Sample.
  kernels::SampleRow NextRow();

 private:
  // Uniform double in [0, 1) from the 53 high bits of the generator, so the
  // stream does not depend on the standard library's distributions.
  double Uniform();

  SamplingParams params_;
  std::mt19937_64 rng_;
};

}  // namespace tessera

namespace tessera {

// The samplers of every live sequence on the sampling rank, keyed by seq_id.
// A sequence's Sampler is created from its SamplingParams the first time it
// is sampled and dropped when a batch lists it as finished.
class SequenceSamplers {
 public:
  // Samples one token for every sequence of `batch` with want_logits, in
  // batch order, from logits [num_wanted, vocab] F32 on the CPU or a CUDA
  // device (sampled there; the tokens come back, and the logits rows of
  // sequences that ask for log-probabilities). Releases finished sequences
  // first. Each entry has_logprobs exactly when its sequence's
  // sampling.logprobs >= 0, except the entries whose logits row holds a NaN
  // or an infinity: those are token_id kNonFiniteLogitsToken without
  // log-probabilities. Errors: those of kernels::SampleTokens and
  // kernels::TokenLogprobs.
  StatusOr<std::vector<SampledToken>> Sample(const StepBatch& batch, const Tensor& logits);
  size_t live() const { return samplers_.size(); }

 private:
  std::map<int64_t, Sampler> samplers_;
};

}  // namespace tessera
