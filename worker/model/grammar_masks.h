// SequenceGrammars: the structured-output state of every live sequence on
// the sampling rank (the last pipeline stage's tp rank 0, beside its
// Sampler): one LLGuidance matcher per sequence whose SamplingParams carry a
// grammar (common/grammar/grammar_engine.h), and the token mask of its next
// draw.
//
// The mask of a sequence's next token is computed off the critical path: as
// soon as its token is drawn and accepted (Advance), a task on the mask
// threads computes the next mask while the next forward step runs; Masks
// waits only for masks not finished by then. A sequence's first mask is
// computed when its matcher is made (its first step on this rank). The state
// is per sequence and moves with nothing: a step only needs the grammar in
// its SamplingParams, so a sampling rank that never saw a sequence (after a
// worker replacement) starts its matcher and replays the sequence's generated
// tokens from SeqStep history when the step carries it.
//
// The engine (LLGuidance and the model's vocabulary) is loaded on first use
// through a GrammarSource, so a rank that serves no grammar loads nothing.
//
// Thread-safety: one owner thread (the sampler's); the mask threads touch a
// sequence's matcher only between Advance (or its creation) and the wait in
// Masks or Drop.
#pragma once

#include <cstdint>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/base/status.h"
#include "common/base/work_pool.h"
#include "common/grammar/grammar_engine.h"
#include "common/grammar/grammar_library_paths.h"
#include "common/wire/step_batch.h"

namespace tessera {

// Loads the grammar engine (called at most once per SequenceGrammars, on the
// owner thread).
using GrammarSource = std::function<StatusOr<std::shared_ptr<const GrammarEngine>>()>;

// The source of a worker serving the model at `model_dir` whose logits are
// `vocab` wide: its tokenizer (model_dir/tokenizer.json), its EOS
// (tokenizer_config.json's eos_token) and the libraries at `paths`. Errors
// name the missing library or the model without an eos_token.
GrammarSource ModelGrammarSource(std::string model_dir, int64_t vocab, GrammarLibraryPaths paths);

// The masked rows of one step: rows[i] is a logits row (in sampled-row
// order) and words[i * words_per_row ...] its mask (bit t % 32 of word
// t / 32 set = token t allowed).
struct StepMasks {
  std::vector<int64_t> rows;
  std::vector<uint32_t> words;
  int64_t words_per_row = 0;
  // Rows whose grammar failed (no engine, a schema LLGuidance refused, a
  // mask it could not compute): they get kGrammarFailedToken, not a draw.
  std::vector<int64_t> failed_rows;
  bool empty() const { return rows.empty(); }
};

class SequenceGrammars {
 public:
  explicit SequenceGrammars(GrammarSource source);
  ~SequenceGrammars();

  // Drops the state of `finished` sequences.
  void Drop(const std::vector<int64_t>& finished);
  // The masks of `batch`'s want_logits sequences with a grammar, making the
  // matchers of sequences first seen. A sequence whose grammar fails is
  // listed in failed_rows, its reason logged, its state dropped; the others
  // go on. Never fails the step.
  // `generated(seq_id)` gives a sequence's generated tokens so far (from the
  // sampler's history), replayed into a matcher made mid-sequence.
  StepMasks Masks(const StepBatch& batch,
                  const std::function<std::vector<int32_t>(int64_t)>& generated);
  // Accepts `tokens` (one per want_logits sequence, in batch order) into the
  // matchers and starts their next masks. A token the matcher refuses
  // (LLGuidance's reason is logged) becomes kGrammarFailedToken in `tokens`
  // and the sequence's state is dropped; failed ids (< 0) are skipped.
  void Advance(const StepBatch& batch, std::vector<int32_t>& tokens);

  size_t live() const { return states_.size(); }

 private:
  struct State {
    std::unique_ptr<GrammarMatcher> matcher;
    std::vector<uint32_t> mask;
    std::future<Status> pending;  // the mask task in flight, if valid()
  };
  Status Start(const SeqStep& step, const std::vector<int32_t>& generated, State& state);
  void SubmitMask(State& state);
  static Status Wait(State& state);

  GrammarSource source_;
  std::shared_ptr<const GrammarEngine> engine_;
  Status engine_status_;  // the source's failure, kept so every later grammar gets it
  bool loaded_ = false;
  std::map<int64_t, State> states_;
  std::unique_ptr<WorkPool> pool_;  // the mask threads, made with the engine
};

}  // namespace tessera
