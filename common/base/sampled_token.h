// SampledToken: what the sampling rank returns for one sequence of a step:
// the token drawn and, when the sequence asked for them
// (SamplingParams::logprobs >= 0), log-probabilities of the model's raw
// distribution (kernels/sampling.h defines them).
//
// Thread-safety: plain values.
#pragma once

#include <cstdint>
#include <vector>

namespace tessera {

// One candidate token and its log-probability (natural log, <= 0).
struct TopLogprob {
  int32_t token_id = 0;
  float logprob = 0.0f;
  bool operator==(const TopLogprob&) const = default;
};

// The token id a sampler returns for a row of logits holding a NaN or an
// infinity (the model's activations overflowed): no token is drawn from such
// a row. It travels as an ordinary id (tp broadcast, pipeline return frame,
// StepResult), and the scheduler finishes that sequence alone with
// FinishReason::kError and kDataLoss (common/engine/scheduler.h); the other
// sequences of the batch go on.
inline constexpr int32_t kNonFiniteLogitsToken = -1;
// The token id a sampler returns for a sequence whose structured-output
// grammar failed on the sampling rank (the engine's library does not load
// there, or LLGuidance gave up on the schema mid-sequence: its limits).
// Travels like kNonFiniteLogitsToken; the scheduler finishes that sequence
// alone with FinishReason::kError, the rank's log names the reason.
inline constexpr int32_t kGrammarFailedToken = -2;
// No token was drawn for the sequence (one of the two ids above).
inline bool IsFailedToken(int32_t token_id) {
  return token_id == kNonFiniteLogitsToken || token_id == kGrammarFailedToken;
}

struct SampledToken {
  // The drawn id in [0, vocab), or kNonFiniteLogitsToken (then has_logprobs
  // is false).
  int32_t token_id = 0;
  // logprob and top are set (the sequence asked for log-probabilities).
  bool has_logprobs = false;
  float logprob = 0.0f;  // log p(token_id), <= 0
  // min(SamplingParams::logprobs, vocab) most likely tokens, best first;
  // equal logits: lower token id first.
  std::vector<TopLogprob> top;
  // Prompt log-probabilities (SeqStep::want_prompt_logprobs): for prompt
  // positions 1 .. n-1 in order, the prompt token (token_id), its
  // log-probability given the tokens before it, and the
  // min(SamplingParams::prompt_logprobs, vocab) top alternatives; each
  // has_logprobs. Empty otherwise.
  std::vector<SampledToken> prompt_logprobs;
};

}  // namespace tessera
