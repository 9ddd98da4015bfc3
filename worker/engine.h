// Engine: the generation loop over a StepExecutor. Prefills a batch of
// prompts of different lengths in one flat step (no padding), then decodes
// every unfinished sequence one token per step, allocating KV-cache blocks as
// sequences grow and freeing them when they finish.
//
// Stops a sequence on an EOS id (config.json eos_token_id plus the
// tokenizer's eos token), on a stop string (the text is cut before it), or
// after max_tokens generated tokens. Prompts longer than max_batch_tokens are
// prefilled in chunks.
//
// Thread-safety: one thread drives an Engine.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/model_config.h"
#include "common/status.h"
#include "common/tokenizer.h"
#include "worker/kv_cache.h"
#include "worker/sampler.h"
#include "worker/step_executor.h"

namespace tessera {

struct GenerationRequest {
  std::vector<int32_t> prompt_ids;
  SamplingParams sampling;
  int32_t max_tokens = 64;         // generated tokens at most
  std::vector<std::string> stop;   // stop strings (need a tokenizer)
  bool ignore_eos = false;
};

enum class FinishReason { kLength, kEos, kStop };
const char* FinishReasonName(FinishReason reason);  // "length", "eos", "stop"

struct GenerationResult {
  std::vector<int32_t> tokens;  // generated ids (the stop-string token included)
  std::string text;             // decoded text, cut before a stop string
  FinishReason finish_reason = FinishReason::kLength;
};

struct EngineStats {
  int64_t prefill_tokens = 0;
  double prefill_seconds = 0.0;  // wall time of steps that only prefilled
  int64_t decode_tokens = 0;
  double decode_seconds = 0.0;   // wall time of steps with decode tokens
  int max_in_flight = 0;         // most micro-batches in flight at once
};

struct EngineOptions {
  int64_t max_batch_tokens = 2048;  // tokens per step; longer prefills are chunked
};

// Streams text as it becomes final: (request index, new text).
using TextCallback = std::function<void(size_t request, const std::string& text)>;

class Engine {
 public:
  // `tokenizer` may be null (then stop strings are rejected and text is empty).
  // `allocator` hands out the KV blocks of the executor's cache.
  Engine(const ModelConfig& config, StepExecutor* executor, BlockAllocator* allocator,
         int64_t block_size, const Tokenizer* tokenizer, EngineOptions options = {});

  // Errors: kInvalidArgument naming the request index and field (empty
  // prompt, bad sampling params, stop strings without a tokenizer, token id
  // outside the vocab); kResourceExhausted when the KV cache cannot hold the
  // batch; executor errors.
  StatusOr<std::vector<GenerationResult>> Generate(const std::vector<GenerationRequest>& requests,
                                                   const TextCallback& on_text = {});

  const EngineStats& stats() const { return stats_; }

 private:
  ModelConfig config_;
  StepExecutor* executor_;
  BlockAllocator* allocator_;
  int64_t block_size_;
  const Tokenizer* tokenizer_;
  EngineOptions options_;
  EngineStats stats_;
  int64_t next_seq_id_ = 0;
};

}  // namespace tessera
