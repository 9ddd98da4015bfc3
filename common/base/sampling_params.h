// SamplingParams: how one sequence picks its next token (see
// worker/model/sampler.h for the algorithm). Travels with every step so the rank
// that samples (the last pipeline stage) needs no other state.
//
// Thread-safety: a plain value.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/base/status.h"

namespace tessera {

// Most top log-probabilities per sampled token (OpenAI's top_logprobs limit).
inline constexpr int32_t kMaxTopLogprobs = 20;
// |logit_bias| at most (OpenAI's range, -100..100).
inline constexpr float kMaxLogitBias = 100.0f;
// repetition_penalty at most (keeps a penalised logit finite: l * r).
inline constexpr float kMaxRepetitionPenalty = 100.0f;

// Structured output: the grammar the sampled tokens must follow (LLGuidance,
// common/grammar/grammar_engine.h; the sampling rank masks every other token).
enum class GrammarKind : uint8_t {
  kNone = 0,        // free text
  kJsonObject = 1,  // OpenAI's json_object: any JSON object
  kJsonSchema = 2,  // OpenAI's json_schema: JSON valid against `schema`
  // A Lark grammar in LLGuidance's syntax (`schema` holds its text), with
  // %json sub-schemas: tool calls in a model family's format
  // (coordinator/api/tool_call_grammar.h).
  kLark = 3,
};
// Largest schema accepted (bytes of JSON text); it travels with every step.
inline constexpr size_t kMaxGrammarSchemaBytes = 64 * 1024;

struct GrammarSpec {
  GrammarKind kind = GrammarKind::kNone;
  std::string schema;  // kJsonSchema: the JSON Schema as JSON text; kLark: the grammar; else ""
  bool active() const { return kind != GrammarKind::kNone; }
  bool operator==(const GrammarSpec&) const = default;
};

struct SamplingParams {
  float temperature = 0.0f;  // 0 = greedy; otherwise logits are divided by it
  int32_t top_k = 0;         // 0 = off; keep the k largest logits
  float top_p = 1.0f;        // 1 = off; nucleus mass in (0, 1]
  uint64_t seed = 0;         // RNG seed (per sequence)
  // Log-probabilities to return with each sampled token: -1 = none (not
  // requested); 0..kMaxTopLogprobs = the sampled token's log-probability
  // plus that many top alternatives. They are those of the model's raw
  // distribution, log_softmax(logits), before penalties, logit_bias,
  // temperature/top-k/top-p/min-p (see kernels/sampling.h); they never
  // change which token is drawn.
  int32_t logprobs = -1;
  // Log-probabilities of the prompt's tokens (echo with logprobs, vLLM's
  // prompt_logprobs): -1 = none; 0..kMaxTopLogprobs = each prompt token's
  // (from position 1) plus that many top alternatives, from the raw
  // logits of the prefill. The whole prompt is then prefilled in one step.
  int32_t prompt_logprobs = -1;

  // Logits processing before the warpers (kernels/logit_adjust.h has the
  // formulas and their sources). Penalties count the sequence's tokens: its
  // generated tokens ("output") and, for repetition_penalty, its prompt.
  float presence_penalty = 0.0f;    // OpenAI: l -= presence * (count > 0); 0 = off
  float frequency_penalty = 0.0f;   // OpenAI: l -= frequency * count; 0 = off
  float repetition_penalty = 1.0f;  // HF/vLLM: l > 0 ? l / r : l * r on seen tokens; 1 = off
  // (token id, bias) added to that token's logit, |bias| <= kMaxLogitBias;
  // ids unique.
  std::vector<std::pair<int32_t, float>> logit_bias;
  // Warper after top-p (HF MinPLogitsWarper): drop tokens whose probability
  // is below min_p times the most likely one's; 0 = off, in [0, 1].
  float min_p = 0.0f;
  // While fewer than min_tokens tokens were generated, the ids of
  // min_tokens_blocked are never drawn. The scheduler fills
  // min_tokens_blocked (the EOS ids unless ignore_eos, and stop_token_ids).
  int32_t min_tokens = 0;
  std::vector<int32_t> min_tokens_blocked;
  // Token ids that end the sequence like EOS (finish reason "stop", the
  // token's text not in the output). Scheduler-side; not sent to workers.
  std::vector<int32_t> stop_token_ids;
  // Structured output: with a grammar, only the tokens it allows next are
  // drawn (the others' logits are masked to kBannedLogit after logits
  // processing), and EOS only once the output is complete.
  GrammarSpec grammar;

  // The sampling rank needs the sequence's token history (penalties count
  // tokens, min_tokens counts generated ones, a grammar matcher made
  // mid-sequence replays the generated ones).
  bool NeedsHistory() const {
    return presence_penalty != 0.0f || frequency_penalty != 0.0f || repetition_penalty != 1.0f ||
           (min_tokens > 0 && !min_tokens_blocked.empty()) || grammar.active();
  }
  // Some logit is changed before the warpers (NeedsHistory or logit_bias).
  bool AdjustsLogits() const { return NeedsHistory() || !logit_bias.empty(); }

  // Errors: kInvalidArgument naming the field (temperature < 0, top_k < 0,
  // top_p outside (0, 1], logprobs outside -1..kMaxTopLogprobs, a penalty
  // not finite, presence/frequency outside [-2, 2], repetition_penalty
  // <= 0 or above kMaxRepetitionPenalty, min_p outside [0, 1], min_tokens < 0, a logit_bias outside
  // +-kMaxLogitBias or a token id given twice, a negative token id,
  // repetition_penalty above kMaxRepetitionPenalty, a grammar kind out of
  // range, a schema with kJsonObject/kNone or over kMaxGrammarSchemaBytes).
  Status Validate() const;
};

}  // namespace tessera
