// Token sampling from one row of logits: greedy, temperature, top-k, top-p,
// min-p, after logits processing (penalties, logit_bias, min_tokens).
//
// Order of the warpers is HF generate's: temperature, then top-k, then top-p
// (nucleus sampling, Holtzman et al. 2019: keep the smallest set of tokens
// whose probability mass reaches top_p, at least one token), then min-p.
// Greedy (temperature == 0) takes the first index of the maximum, as
// torch.argmax, of the processed logits.
// A seeded Sampler draws the same tokens for the same logits on every run and
// on every rank, so tp/pp layouts agree.
//
// Logits processing (kernels/logit_adjust.h, formulas in
// kernels/logit_adjust_entry.h) changes the logits of a sequence's seen,
// biased and banned tokens in place before the draw, on the logits' device.
// The counts come from the sequence's token history, which SequenceSamplers
// keeps per sequence from the batches it samples (SeqStep::history fills
// what a prefix-cache hit skipped; SeqStep::output_start splits prompt from
// output).
//
// Log-probabilities: a sequence whose SamplingParams::logprobs is >= 0 also
// gets log_softmax(logits) of its drawn token and its top alternatives,
// from the raw distribution before logits processing and the warpers
// (definition in kernels/sampling.h). They are computed from the full-vocab
// logits the token is drawn from (after the vocab-parallel lm_head's
// all-gather); when a batch's logits are processed, the rows that ask for
// log-probabilities are copied to the host first.
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
#include "kernels/logit_adjust.h"
#include "kernels/sampling.h"
#include "worker/model/grammar_masks.h"

namespace tessera {

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);

  // Picks a token id from logits [vocab] (F32, unnormalised, processed).
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

// The logits-processing entries of one logits row (kernels/logit_adjust.h)
// for a sequence with `params` whose tokens so far are `tokens`, the first
// `output_start` of them its prompt. One entry per distinct logit:
// penalties for the output tokens (and the prompt's when
// repetition_penalty != 1), logit_bias, and the min_tokens ban while fewer
// than min_tokens tokens were generated. Ids outside [0, vocab) are skipped.
std::vector<kernels::LogitAdjustment> LogitAdjustmentsFor(const SamplingParams& params,
                                                          const std::vector<int32_t>& tokens,
                                                          int32_t output_start, int64_t row,
                                                          int64_t vocab);

}  // namespace tessera

namespace tessera {

// The samplers of every live sequence on the sampling rank, keyed by seq_id.
// A sequence's Sampler is created from its SamplingParams the first time it
// is sampled and dropped when a batch lists it as finished; so is its token
// history (kept for sequences whose sampling.NeedsHistory()).
class SequenceSamplers {
 public:
  // `grammar` loads the structured-output engine on the first sequence with
  // a grammar (worker/model/grammar_masks.h); without one such a sequence
  // gets kGrammarFailedToken.
  explicit SequenceSamplers(GrammarSource grammar = {}) : grammars_(std::move(grammar)) {}

  // Samples one token for every sequence of `batch` with want_logits, in
  // batch order, from logits [batch.LogitsRows(), vocab] F32 on the CPU or a
  // CUDA device (its first SampledRows() rows are sampled; the rest give the
  // SampledToken::prompt_logprobs of the want_prompt_logprobs sequences) (processed and sampled
  // there, in place; the tokens come back, and the logits rows of sequences that ask for
  // log-probabilities). Releases finished sequences first. Each entry has_logprobs exactly when its
  // sequence's sampling.logprobs >= 0, except the entries whose logits row
  // holds a NaN or an infinity: those are token_id kNonFiniteLogitsToken
  // without log-probabilities. Errors: kInvalidArgument when a sequence's
  // history has a gap (a step starts past the tokens known and carries no
  // history); those of kernels::AdjustLogits, MaskLogits, SampleTokens,
  // TokenLogprobs. Sequences with a grammar draw only the tokens it allows:
  // their masks (computed while the step ran) are applied after logits
  // processing; one whose grammar fails (SequenceGrammars) gets
  // kGrammarFailedToken and fails alone.
  StatusOr<std::vector<SampledToken>> Sample(const StepBatch& batch, Tensor& logits);
  size_t live() const { return samplers_.size(); }
  size_t histories() const { return histories_.size(); }

 private:
  struct History {
    std::vector<int32_t> tokens;  // by position
    int32_t output_start = 0;
  };
  // Extends the histories of `batch`'s sequences that need one.
  Status UpdateHistories(const StepBatch& batch);

  std::map<int64_t, Sampler> samplers_;
  std::map<int64_t, History> histories_;
  SequenceGrammars grammars_;
};

}  // namespace tessera
