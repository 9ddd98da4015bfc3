// Scheduler: continuous batching of generation requests over a StepExecutor.
//
// Requests join and leave at iteration boundaries. Each iteration fills the
// executor's free micro-batch slots (max_in_flight, i.e. pp for a pipeline)
// with sequences that can run: decodes of running sequences and prefill
// chunks (at most prefill_chunk_tokens of one prompt per step) of admitted
// ones, within max_batch_tokens and max_sequences, then collects the oldest
// micro-batch and applies its sampled tokens.
//
// KV cache (PagedAttention, Kwon et al. 2023): blocks of block_size tokens
// from a BlockAllocator. A waiting request is admitted when the blocks for its
// prompt are free. When a running sequence needs a block and none is free,
// the newest running sequence not in flight is preempted: its blocks are
// freed and it returns to the front of the queue, to be recomputed from its
// prompt plus the tokens it already generated (so its output continues
// without gaps or duplicates).
//
// Re-planning (the coordinator swaps the plan under a live scheduler): with
// set_admitting(false) no waiting request is admitted, so the running set
// drains; CollectInFlight collects the micro-batches still in flight without
// submitting more; RequeueRunning returns every unfinished running sequence
// to the front of the queue (in order, KV blocks freed), to be recomputed from
// prompt + generated tokens on the next executor (SetExecutor). With
// requeue_on_executor_error an executor failure re-queues the sequences the
// same way instead of failing them, so a re-plan can finish them.
//
// Admission control: Enqueue refuses with kResourceExhausted when queue_limit
// requests are waiting, and with kInvalidArgument when prompt + max_tokens
// exceeds max_context (the message names both).
//
// Thread-safety: Enqueue, Cancel and the counters are thread-safe. RunOnce and
// the other owner-thread methods are called by one owner thread (or another
// thread while the owner is known to be parked, as the coordinator does while
// a re-plan pauses it). Callbacks run on the owner thread.
#pragma once

#include <atomic>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "common/base/status.h"
#include "common/engine/block_allocator.h"
#include "common/engine/step_executor.h"
#include "common/format/model_config.h"
#include "common/tokenizer/tokenizer.h"

namespace tessera {

struct GenerationRequest {
  std::vector<int32_t> prompt_ids;
  SamplingParams sampling;
  int32_t max_tokens = 64;        // generated tokens at most
  std::vector<std::string> stop;  // stop strings (need a tokenizer)
  bool ignore_eos = false;
};

enum class FinishReason { kLength, kEos, kStop, kCancelled, kError };
const char* FinishReasonName(FinishReason reason);  // "length", "eos", "stop", "cancelled", "error"

struct GenerationResult {
  std::vector<int32_t> tokens;  // generated ids (the stop-string token included)
  // When the request's sampling.logprobs >= 0: one entry per entry of
  // `tokens` (EOS and the stop-string token included), has_logprobs unless
  // the executor cannot return them (PipelineExecutor with pp > 1).
  std::vector<SampledToken> logprobs;
  std::string text;  // decoded text, cut before a stop string
  FinishReason finish_reason = FinishReason::kLength;
  // Set when finish_reason == kError: the executor's error, or kDataLoss
  // when the sampling rank found non-finite logits for this sequence
  // (kNonFiniteLogitsToken; only that sequence of its batch fails).
  Status error;
  int64_t prompt_tokens = 0;
  int preemptions = 0;
};

// Per-request callbacks, run on the scheduler's owner thread.
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
};

struct SchedulerOptions {
  int64_t max_batch_tokens = 2048;     // tokens per micro-batch
  int64_t max_sequences = 256;         // running sequences at most
  int64_t queue_limit = 1024;          // waiting requests at most (beyond: kResourceExhausted)
  int64_t max_context = 4096;          // prompt + max_tokens at most
  int64_t prefill_chunk_tokens = 512;  // prompt tokens of one sequence per step
  // On an executor error, re-queue the running sequences (recompute from
  // prompt + generated tokens later) instead of finishing them with kError.
  bool requeue_on_executor_error = false;
};

struct SchedulerStats {
  int64_t prefill_tokens = 0;
  double prefill_seconds = 0.0;  // wall time of micro-batches that only prefilled
  int64_t decode_tokens = 0;
  double decode_seconds = 0.0;  // wall time of micro-batches with decode tokens
  int max_in_flight = 0;        // most micro-batches in flight at once
  int64_t preemptions = 0;
  int64_t requeued = 0;  // sequences re-queued by RequeueRunning (re-plans, executor errors)
};

class Scheduler {
 public:
  // `tokenizer` may be null (then stop strings are refused and text is empty).
  Scheduler(const ModelConfig& config, StepExecutor* executor, BlockAllocator* allocator,
            int64_t block_size, const Tokenizer* tokenizer, SchedulerOptions options);
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Thread-safe. Returns the request id. Errors: kInvalidArgument naming the
  // field (empty prompt, token id outside the vocab, sampling params, stop
  // strings without a tokenizer, context too long); kResourceExhausted when
  // the queue is full.
  StatusOr<int64_t> Enqueue(GenerationRequest request, RequestCallbacks callbacks);
  // Thread-safe. Admits every request or none (one API request with several
  // prompts): all are validated, then all join the queue under one lock when
  // it has room for all of them. On an error nothing was queued and no
  // callback runs. Returns the ids in order. Errors as Enqueue; `requests`
  // and `callbacks` have the same size.
  StatusOr<std::vector<int64_t>> EnqueueAll(std::vector<GenerationRequest> requests,
                                            std::vector<RequestCallbacks> callbacks);
  // The most requests the queue holds (SchedulerOptions::queue_limit).
  int64_t queue_limit() const { return options_.queue_limit; }
  // Thread-safe. The request finishes with kCancelled at the next iteration.
  void Cancel(int64_t id);

  // Owner thread: one iteration (submit into free slots, collect one
  // micro-batch). Returns false when there was nothing to do. Errors from
  // the executor fail every request in flight (on_finish with kError), or
  // with requeue_on_executor_error re-queue every running sequence, and are
  // returned.
  StatusOr<bool> RunOnce();

  // Owner thread. While false, waiting requests stay queued (cancellations
  // are still honoured) and only running sequences make progress.
  void set_admitting(bool admitting) { admitting_ = admitting; }
  bool admitting() const { return admitting_; }
  // Owner thread: collects every micro-batch in flight without submitting
  // new ones, applying the sampled tokens. Errors: as RunOnce.
  Status CollectInFlight();
  // Owner thread, nothing in flight: moves every unfinished running sequence
  // back to the front of the queue in its running order, freeing its KV
  // blocks; it resumes by recomputing prompt + generated tokens, so its
  // output continues without gaps or duplicates. Returns how many moved.
  int RequeueRunning();
  // Owner thread, nothing in flight: runs later micro-batches on `executor`.
  void SetExecutor(StepExecutor* executor);
  size_t in_flight() const;  // owner thread: micro-batches in flight

  size_t waiting() const;  // thread-safe
  size_t running() const;  // thread-safe
  const SchedulerStats& stats() const { return stats_; }

 private:
  struct Seq;
  struct InFlight;

  Status Validate(const GenerationRequest& r) const;
  void Admit();
  bool EnsureBlocks(Seq& s, int64_t tokens);
  void Preempt(Seq& s);
  void Finish(Seq& s, FinishReason reason, Status error = Status::Ok());
  void Emit(Seq& s, const SampledToken* sampled);
  void ApplyToken(Seq& s, const SampledToken& sampled);
  void FailInFlight(const Status& error);
  StatusOr<bool> CollectOne();

  ModelConfig config_;
  StepExecutor* executor_;
  BlockAllocator* allocator_;
  int64_t block_size_;
  const Tokenizer* tokenizer_;
  SchedulerOptions options_;
  std::set<int32_t> eos_;

  mutable std::mutex mu_;
  std::deque<std::unique_ptr<Seq>> waiting_;  // protected by mu_
  std::set<int64_t> cancelled_;               // protected by mu_
  std::atomic<size_t> running_count_{0};
  int64_t next_id_ = 0;  // protected by mu_

  // Owner thread only.
  std::vector<std::unique_ptr<Seq>> running_;
  std::deque<InFlight> in_flight_;
  std::vector<int64_t> finished_ids_;
  SchedulerStats stats_;
  double last_done_ = 0.0;
  bool admitting_ = true;
};

}  // namespace tessera
