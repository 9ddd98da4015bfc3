// Engine: offline generation of a fixed batch of requests, the loop behind
// `tessera generate` and the rank processes of a local tp x pp launch. It
// enqueues every request into a Scheduler (continuous batching, chunked
// prefill, paged KV cache) and runs it until all have finished.
//
// Thread-safety: one thread drives an Engine.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "common/base/status.h"
#include "common/engine/block_allocator.h"
#include "common/engine/scheduler.h"
#include "common/engine/step_executor.h"
#include "common/format/model_config.h"
#include "common/tokenizer/tokenizer.h"

namespace tessera {

using EngineStats = SchedulerStats;

// Defaults: the [scheduler] section's (common/config/daemon_config.h).
struct EngineOptions {
  int64_t max_batch_tokens = SchedulerSection{}.max_batch_tokens;          // tokens per micro-batch
  int64_t prefill_chunk_tokens = SchedulerSection{}.prefill_chunk_tokens;  // per sequence per step
  // Later chunks of a long prompt shrink with its context (SchedulerOptions).
  PrefillChunkBudget prefill_chunk_budget = SchedulerSection{}.prefill_chunk_budget;
  // Reuse the KV blocks of shared prompt prefixes (common/engine/scheduler.h).
  bool prefix_caching = KvCacheSection{}.prefix_caching;
  // Part of every prefix-cache key (SchedulerOptions::model_id).
  std::string model_id;
};

// Streams text as it becomes final: (request index, new text). Runs on the
// scheduler's output thread (common/engine/output_processor.h), one call at a
// time, and never after Generate returned.
using TextCallback = std::function<void(size_t request, const std::string& text)>;

class Engine {
 public:
  // `tokenizer` may be null (then stop strings are rejected and text is empty).
  // `allocator` hands out the KV blocks of the executor's cache.
  Engine(const ModelConfig& config, StepExecutor* executor, BlockAllocator* allocator,
         int64_t block_size, const Tokenizer* tokenizer, EngineOptions options = {});

  // The prefix cache (options.prefix_caching) persists from one call to the
  // next. Errors: kInvalidArgument naming the request index and field;
  // executor errors.
  StatusOr<std::vector<GenerationResult>> Generate(const std::vector<GenerationRequest>& requests,
                                                   const TextCallback& on_text = {});

  const EngineStats& stats() const { return scheduler_.stats(); }

 private:
  Scheduler scheduler_;
};

}  // namespace tessera
