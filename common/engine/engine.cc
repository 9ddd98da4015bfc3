#include "common/engine/engine.h"

#include <atomic>
#include <limits>

namespace tessera {

namespace {

SchedulerOptions ToSchedulerOptions(const EngineOptions& o) {
  SchedulerOptions s;
  s.max_batch_tokens = o.max_batch_tokens;
  s.prefill_chunk_tokens = o.prefill_chunk_tokens;
  s.prefill_chunk_budget = o.prefill_chunk_budget;
  s.prefix_caching = o.prefix_caching;
  s.model_id = o.model_id;
  s.max_sequences = std::numeric_limits<int32_t>::max();
  s.queue_limit = std::numeric_limits<int32_t>::max();
  s.max_context = std::numeric_limits<int32_t>::max();
  return s;
}

}  // namespace

Engine::Engine(const ModelConfig& config, StepExecutor* executor, BlockAllocator* allocator,
               int64_t block_size, const Tokenizer* tokenizer, EngineOptions options)
    : scheduler_(config, executor, allocator, block_size, tokenizer, ToSchedulerOptions(options)) {}

StatusOr<std::vector<GenerationResult>> Engine::Generate(
    const std::vector<GenerationRequest>& requests, const TextCallback& on_text) {
  // Written on the scheduler's output thread; read here after WaitForOutput.
  std::vector<GenerationResult> results(requests.size());
  std::atomic<size_t> finished{0};
  for (size_t i = 0; i < requests.size(); ++i) {
    RequestCallbacks cb;
    cb.on_token = [&, i](const std::string& text, int32_t, const SampledToken*) {
      if (on_text && !text.empty()) on_text(i, text);
    };
    cb.on_finish = [&, i](const GenerationResult& r) {
      results[i] = r;
      ++finished;
    };
    auto id = scheduler_.Enqueue(requests[i], std::move(cb));
    if (!id.ok()) {
      scheduler_.WaitForOutput();  // the callbacks of earlier requests refer to locals
      return id.status().WithContext("request " + std::to_string(i));
    }
  }
  while (finished.load() < requests.size()) {
    auto progressed = scheduler_.RunOnce();
    if (!progressed.ok()) {
      scheduler_.WaitForOutput();
      return progressed.status();
    }
    if (!*progressed && finished.load() < requests.size() && scheduler_.running() == 0 &&
        scheduler_.waiting() == 0)
      return Internal("engine: requests unfinished with nothing left to run");
  }
  scheduler_.WaitForOutput();
  for (size_t i = 0; i < results.size(); ++i)
    if (results[i].finish_reason == FinishReason::kError)
      return results[i].error.WithContext("request " + std::to_string(i));
  return results;
}

}  // namespace tessera
