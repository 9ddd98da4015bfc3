// Generation requests, results and callbacks: the values a Scheduler takes
// and hands back (common/engine/scheduler.h), and its OutputProcessor
// produces (common/engine/output_processor.h).
//
// Thread-safety: plain values; RequestCallbacks says where they run.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/base/sampled_token.h"
#include "common/base/sampling_params.h"
#include "common/base/status.h"

namespace tessera {

// The error of every request still queued or running when the coordinator
// stops (Scheduler::FailAll at shutdown).
inline constexpr char kShuttingDownMessage[] = "the coordinator is shutting down";

struct GenerationRequest {
  std::vector<int32_t> prompt_ids;
  SamplingParams sampling;
  int32_t max_tokens = 64;        // generated tokens at most
  std::vector<std::string> stop;  // stop strings (need a tokenizer)
  bool ignore_eos = false;
  // Choices of one prompt (n > 1, best_of): the index, in the same
  // Scheduler::EnqueueAll call, of an earlier request with the same prompt
  // whose KV blocks of full prompt blocks this one shares instead of
  // prefilling them (it waits for that prefill); -1 = none.
  int32_t share_prompt_of = -1;
  // Tokens this request generated before, elsewhere (a replica whose
  // leader was lost or re-planned; docs/architecture.md): it resumes from
  // prompt + these, they count toward max_tokens, and they go through its
  // output state (detokenizer, stop strings) without reaching a callback,
  // so its output continues without gaps or duplicates.
  std::vector<int32_t> resume_tokens;
};

enum class FinishReason { kLength, kEos, kStop, kCancelled, kError };
const char* FinishReasonName(FinishReason reason);  // "length", "eos", "stop", "cancelled", "error"

struct GenerationResult {
  // Generated ids (the stop-string token included; tokens the scheduler
  // generated after the stop string, before it learned of it, are not).
  std::vector<int32_t> tokens;
  // When the request's sampling.logprobs >= 0: one entry per entry of
  // `tokens` (EOS and the stop-string token included), has_logprobs unless
  // the executor cannot return them (PipelineExecutor with pp > 1).
  std::vector<SampledToken> logprobs;
  // When the request's sampling.prompt_logprobs >= 0: prompt positions
  // 1 .. n-1, each the prompt token and its log-probabilities (empty when
  // the executor cannot return them: PipelineExecutor with pp > 1).
  std::vector<SampledToken> prompt_logprobs;
  std::string text;  // decoded text, cut before a stop string
  FinishReason finish_reason = FinishReason::kLength;
  // Set when finish_reason == kError: the executor's error, or kDataLoss
  // when the sampling rank found non-finite logits for this sequence
  // (kNonFiniteLogitsToken; only that sequence of its batch fails).
  Status error;
  int64_t prompt_tokens = 0;
  // Prompt tokens whose KV came from the prefix cache instead of being
  // prefilled, at the request's latest admission (OpenAI's
  // usage.prompt_tokens_details.cached_tokens).
  int64_t cached_tokens = 0;
  int preemptions = 0;
};

// Per-request callbacks. They run on the Scheduler's output thread (its
// OutputProcessor, common/engine/output_processor.h), never two of one
// Scheduler at once; per request in order: on_admit, the on_token calls in
// token order, then on_finish once, last.
struct RequestCallbacks {
  // New final text (never half a UTF-8 character, never part of a stop
  // string) and the token just generated (-1 for text flushed at the finish,
  // with no new token). `logprobs` is that token's SampledToken when the
  // request's sampling.logprobs >= 0, else null; text held back (a partial
  // character or stop-string prefix) arrives in a later call than its
  // token's logprobs.
  std::function<void(const std::string& text, int32_t token, const SampledToken* logprobs)>
      on_token;
  std::function<void(const GenerationResult& result)> on_finish;
  // The scheduler admitted the request (gave it KV blocks); called again
  // after each preemption's re-admission. Optional.
  std::function<void()> on_admit;
  // The prompt's log-probabilities (sampling.prompt_logprobs >= 0;
  // GenerationResult::prompt_logprobs), before the first on_token. Optional.
  std::function<void(const std::vector<SampledToken>& prompt)> on_prompt_logprobs;
};

}  // namespace tessera
