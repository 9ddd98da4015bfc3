// GrammarEngine and GrammarMatcher: the glue between Tessera and LLGuidance
// (common/grammar/llguidance_library.h) for structured outputs.
//
// A GrammarEngine is LLGuidance's view of one model's vocabulary: every token
// id's bytes (Tokenizer::TokenBytes; special tokens as 0xFF followed by their
// text, LLGuidance's marker, so that no grammar can produce them as text),
// the EOS id, and Tokenizer::Encode as its tokenize function. It compiles a
// GrammarSpec (common/base/sampling_params.h) into matchers.
//
// A GrammarMatcher follows one sequence: ComputeMask gives the tokens the
// grammar allows next as a bitmask (bit t % 32 of word t / 32, 1 = allowed;
// EOS is allowed once the grammar accepts, and alone once it is complete),
// Accept advances it by the token drawn. JSON is generated without free
// whitespace between tokens (LLGuidance's whitespace_flexible off), so a
// small model cannot pad an object with blank lines until max_tokens.
//
// Thread-safety: a GrammarEngine is immutable and shared (Check and
// NewMatcher from any thread); a GrammarMatcher is used by one thread at a
// time (the sampler hands it to its mask thread and back).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/base/sampling_params.h"
#include "common/base/status.h"
#include "common/grammar/llguidance_library.h"
#include "common/tokenizer/tokenizer.h"

namespace tessera {

class GrammarMatcher {
 public:
  ~GrammarMatcher();
  GrammarMatcher(const GrammarMatcher&) = delete;
  GrammarMatcher& operator=(const GrammarMatcher&) = delete;

  // Words of the mask: ceil(vocab / 32).
  size_t mask_words() const { return mask_words_; }
  // mask <- the allowed next tokens ([mask_words()] words). Errors:
  // kInternal with LLGuidance's reason (the matcher is then unusable).
  Status ComputeMask(std::vector<uint32_t>& mask);
  // Advances by `token`. EOS (allowed once the output is complete) ends the
  // matcher: it is not passed to LLGuidance, whose parser has stopped, and
  // ended() turns true; the last mask (EOS alone) then stays. Errors: kInvalidArgument with
  // LLGuidance's reason for a token the grammar does not allow.
  Status Accept(int32_t token);
  // EOS was accepted: no token follows.
  bool ended() const { return ended_; }

 private:
  friend class GrammarEngine;
  GrammarMatcher(std::shared_ptr<const LlguidanceLibrary> lib, LlgMatcher* m, size_t words,
                 int32_t eos_id)
      : lib_(std::move(lib)), matcher_(m), mask_words_(words), eos_id_(eos_id) {}
  std::string Error();

  std::shared_ptr<const LlguidanceLibrary> lib_;
  LlgMatcher* matcher_;
  size_t mask_words_;
  int32_t eos_id_;
  bool ended_ = false;
};

class GrammarEngine {
 public:
  // `vocab_size`: the model's logits width (>= the tokenizer's; ids past the
  // tokenizer's have no bytes and are never allowed). `eos_id`: the id that
  // ends a complete output. Errors: kInvalidArgument for an eos_id outside
  // the vocab; kFailedPrecondition with LLGuidance's reason when it refuses
  // the vocabulary.
  static StatusOr<std::shared_ptr<const GrammarEngine>> Create(
      std::shared_ptr<const LlguidanceLibrary> lib, std::shared_ptr<const Tokenizer> tokenizer,
      int32_t vocab_size, int32_t eos_id);
  ~GrammarEngine();
  GrammarEngine(const GrammarEngine&) = delete;
  GrammarEngine& operator=(const GrammarEngine&) = delete;

  // Whether `spec` (kind != kNone) is usable: LLGuidance compiles it, and
  // following it for up to kCheckTokens tokens (the lowest allowed id each
  // time) every mask computes and the first allows some token. A schema that
  // recurses without producing output compiles and fails on its first mask,
  // one that requires itself a mask or two later; a failure deeper on some
  // other path is still the sampling worker's. Costs one compile and up to
  // kCheckTokens masks over the vocabulary (measured on SmolLM2's 49152
  // tokens, a 3-property extraction schema, a busy 2-core host: 890 us, of
  // which the compile is 650 us; GrammarCheck caches verdicts). A kJsonSchema keeps its
  // properties' order (the order LLGuidance generates them in). Errors:
  // kInvalidArgument with the engine's reason (its parser-state dump cut).
  Status Check(const GrammarSpec& spec) const;
  // A matcher at the start of `spec`'s output. Errors: as Check.
  StatusOr<std::unique_ptr<GrammarMatcher>> NewMatcher(const GrammarSpec& spec) const;

  static constexpr int kCheckTokens = 8;

  int32_t vocab_size() const { return vocab_size_; }
  int32_t eos_id() const { return eos_id_; }

 private:
  GrammarEngine() = default;
  // The LLGuidance constraint type and data of `spec`.
  static StatusOr<std::string> GrammarData(const GrammarSpec& spec);
  // LLGuidance's constraint type of `spec`: "lark" or "json_schema".
  static const char* ConstraintType(const GrammarSpec& spec);
  LlgConstraintInit Init() const;

  std::shared_ptr<const LlguidanceLibrary> lib_;
  std::shared_ptr<const Tokenizer> tokenizer_;
  LlgTokenizer* llg_tokenizer_ = nullptr;
  int32_t vocab_size_ = 0;
  int32_t eos_id_ = 0;
};

}  // namespace tessera
