// Scheduler: continuous batching of generation requests over a StepExecutor.
//
// One iteration is Schedule -> ExecutePlan -> Apply (common/engine/
// step_plan.h): Schedule decides and returns a StepPlan, the executor carries
// it out, Apply updates the state from the StepOutcome. RunOnce is that
// iteration on the scheduler's own executor; tests drive Schedule and Apply
// directly to check policy without one.
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
// Prefix caching (options.prefix_caching): every full block of a sequence
// is registered in the BlockAllocator's index under its BlockKey (parent
// key, token ids, options.model_id, plan version; common/engine/block_key.h)
// once the step that wrote its last position has been applied. A request
// being admitted takes the longest chain of registered blocks matching the
// start of its tokens (prompt, plus the generated tokens of a preempted or
// re-queued sequence), adds a reference to each and prefills only the rest.
// The chain stops before the block holding the last token, so at least that
// token is computed and gives the logits to sample from. A shared block is
// full and nobody writes into it again: a sequence writes only positions
// from its `cached` count on, which lie in blocks of its own. Unreferenced
// blocks stay cached and are evicted least recently released first when
// blocks run out (BlockAllocator::Allocate), before anything is preempted.
// A new executor (SetExecutor: a plan change, a lost worker) and an
// executor error clear the cache: the workers' KV may be gone. With dynamic
// NTK RoPE the keys written depend on the sequence's length once it passes
// max_position_embeddings, so a request that may grow past it neither
// shares nor registers blocks.
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
// Moving requests (the coordinator's replicas, whose schedulers share one
// OutputProcessor): TakeWaiting removes every waiting request, re-queued
// ones included, as Migrants, and AdoptWaiting on another scheduler queues
// them at its front. A migrant keeps its id, callbacks, output state
// (detokenizer, stop strings, result so far) and generated tokens: it
// resumes from prompt + generated tokens, so its output continues without
// gaps or duplicates, as after a re-queue.
//
// Admission control: Enqueue refuses with kResourceExhausted when queue_limit
// requests are waiting, and with kInvalidArgument when prompt + max_tokens
// exceeds max_context (the message names both).
//
// Output (common/engine/output_processor.h): the owner thread only decides
// on token ids (EOS, max_tokens); it hands each sampled token to the
// scheduler's OutputProcessor, whose thread detokenizes, matches stop
// strings and runs the request callbacks. A stop-string hit comes back as a
// finish: the scheduler ends that sequence like a cancellation at a later
// Schedule (the tokens it generated meanwhile are dropped from the result
// and never reach a callback). Schedule takes the stop reports of the
// tokens applied up to the Apply before the previous one (waiting for the
// output thread to have processed them), so the output thread runs at most
// one iteration behind and decisions do not depend on thread timing;
// RunOnce with nothing to do waits for all output.
//
// Thread-safety: Enqueue, Cancel and the counters are thread-safe. RunOnce and
// the other owner-thread methods (set_admitting, CollectInFlight,
// RequeueRunning, SetExecutor, in_flight, stats) are called by the owner
// thread only, never by another thread, parked owner or not: the coordinator
// pauses, swaps and resumes through commands its serving loop runs on that
// thread (coordinator/serving/serving_loop.h). Callbacks run on the output
// thread (RequestCallbacks).
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
#include "common/config/daemon_config.h"
#include "common/engine/block_allocator.h"
#include "common/engine/generation.h"
#include "common/engine/output_processor.h"
#include "common/engine/step_executor.h"
#include "common/engine/step_plan.h"
#include "common/format/model_config.h"
#include "common/tokenizer/tokenizer.h"

namespace tessera {

// Defaults: the [scheduler] section's (common/config/daemon_config.h), the
// one home of defaults; max_context has no default there (0 = the model's).
struct SchedulerOptions {
  int64_t max_batch_tokens = SchedulerSection{}.max_batch_tokens;  // tokens per micro-batch
  int64_t max_sequences = SchedulerSection{}.max_sequences;        // running sequences at most
  int64_t queue_limit = SchedulerSection{}.queue_limit;  // waiting (beyond: kResourceExhausted)
  int64_t max_context = 4096;                            // prompt + max_tokens at most
  int64_t prefill_chunk_tokens = SchedulerSection{}.prefill_chunk_tokens;  // per sequence per step
  // kCost: a prompt's later chunks shrink with the context before them
  // (common/engine/prefill_chunk.h), by prefill_context_tokens (K there; 0 =
  // PrefillContextTokens of the scheduler's model). kTokens: fixed chunks.
  PrefillChunkBudget prefill_chunk_budget = SchedulerSection{}.prefill_chunk_budget;
  int64_t prefill_context_tokens = 0;
  // On an executor error, re-queue the running sequences (recompute from
  // prompt + generated tokens later) instead of finishing them with kError.
  bool requeue_on_executor_error = false;
  // Reuse the KV blocks of shared prompt prefixes (see above).
  bool prefix_caching = KvCacheSection{}.prefix_caching;
  // Part of every prefix-cache key: the model served (a checkpoint's path
  // or name), so blocks of different models never match.
  std::string model_id;
  // The plan the first executor runs (SetExecutor names later ones); part of
  // every prefix-cache key.
  uint64_t plan_version = 0;
  // The output processor, shared with other schedulers (the coordinator's
  // replicas: a waiting request can then move between them, TakeWaiting /
  // AdoptWaiting); null: one of its own.
  std::shared_ptr<OutputProcessor> output;
  // With a processor of its own (output null): its on_batch hook
  // (OutputProcessor's constructor), run on the output thread after the
  // callbacks of each batch of events. Ignored with a shared one.
  std::function<void()> on_output_batch;
};

struct SchedulerStats {
  int64_t prefill_tokens = 0;
  double prefill_seconds = 0.0;  // wall time of micro-batches that only prefilled
  int64_t decode_tokens = 0;
  double decode_seconds = 0.0;  // wall time of micro-batches with decode tokens
  int max_in_flight = 0;        // most micro-batches in flight at once
  int64_t preemptions = 0;
  int64_t requeued = 0;  // sequences re-queued by RequeueRunning (re-plans, executor errors)
  // Prefix caching, counted at each admission while it is on: the tokens
  // looked up (prompt plus generated tokens to recompute) and those found
  // in cached blocks (not prefilled).
  int64_t prefix_cache_query_tokens = 0;
  int64_t prefix_cache_hit_tokens = 0;
  // Longrope sequences recomputed from an empty cache when they outgrew
  // original_max_position_embeddings (Scheduler::LongRopeRecompute).
  int64_t longrope_recomputes = 0;
};

// The checks Scheduler::Enqueue makes of one request, for a scheduler
// over `config` with `options`, a tokenizer or not, and `kv_blocks` KV blocks
// of `block_size` tokens (the coordinator checks a request before it goes
// to a replica's leader). Errors: as Enqueue's kInvalidArgument.
Status ValidateGenerationRequest(const GenerationRequest& request, const ModelConfig& config,
                                 const SchedulerOptions& options, bool has_tokenizer,
                                 int64_t kv_blocks, int64_t block_size);

class Scheduler {
  struct Seq;

 public:
  // A waiting request taken out of one scheduler for another (see above).
  class Migrant {
   public:
    Migrant(Migrant&&) noexcept;
    Migrant& operator=(Migrant&&) noexcept;
    ~Migrant();
    int64_t id() const;
    // Prompt + generated tokens (what the adopter recomputes) and the
    // tokens it may still generate.
    int64_t tokens() const;
    int64_t remaining_tokens() const;
    bool cancelled() const { return cancelled_; }

   private:
    friend class Scheduler;
    Migrant(std::unique_ptr<Seq> seq, bool cancelled, const OutputProcessor* output);
    std::unique_ptr<Seq> seq_;
    bool cancelled_ = false;
    const OutputProcessor* output_ = nullptr;
  };

  // `tokenizer` may be null (then stop strings are refused and text is empty).
  // `executor` may be null when only Schedule(n)/Apply drive the scheduler
  // (RunOnce, CollectInFlight need one; SetExecutor sets it).
  Scheduler(const ModelConfig& config, StepExecutor* executor, BlockAllocator* allocator,
            int64_t block_size, const Tokenizer* tokenizer, SchedulerOptions options);
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Thread-safe. Returns the request id. Errors: kInvalidArgument naming the
  // field first ("field: reason": empty prompt, token id outside the vocab,
  // sampling params, a logit_bias or stop_token_ids id outside the vocab,
  // min_tokens above max_tokens, prompt_logprobs with a prompt over
  // max_batch_tokens, stop strings without a tokenizer, context too long);
  // kResourceExhausted when the queue is full. With min_tokens > 0 it fills
  // sampling.min_tokens_blocked (the EOS ids unless ignore_eos, and
  // stop_token_ids); a generated stop_token_ids token finishes the request
  // with kStop (no text). With sampling.prompt_logprobs >= 0 the whole
  // prompt is prefilled in one step without prefix-cache hits, and the
  // result carries prompt_logprobs (max_tokens 0 then finishes kLength
  // after that step).
  StatusOr<int64_t> Enqueue(GenerationRequest request, RequestCallbacks callbacks);
  // Thread-safe. Admits every request or none (one API request with several
  // prompts): all are validated, then all join the queue under one lock when
  // it has room for all of them. A request with share_prompt_of (choices of
  // one prompt) is admitted once its source has prefilled the full blocks of
  // the prompt, holding references to them (it waits at the head of the
  // queue; it prefills alone when the source was preempted or finished). On an error nothing was
  // queued and no callback runs. Returns the ids in order. Errors as Enqueue; `requests` and
  // `callbacks` have the same size.
  StatusOr<std::vector<int64_t>> EnqueueAll(std::vector<GenerationRequest> requests,
                                            std::vector<RequestCallbacks> callbacks);
  // Thread-safe: removes every waiting request (queue order), its pending
  // cancellation with it.
  std::vector<Migrant> TakeWaiting();
  // Thread-safe: queues `migrants` (from TakeWaiting of a scheduler sharing
  // this one's OutputProcessor) at the front, in order, past queue_limit
  // (they were admitted once), and empties the vector. Errors (nothing is
  // queued, `migrants` is left as it was): kFailedPrecondition when a
  // migrant comes from a scheduler with another output processor,
  // kInvalidArgument when one does not fit this scheduler's KV cache or
  // context.
  Status AdoptWaiting(std::vector<Migrant>* migrants);
  // The most requests the queue holds (SchedulerOptions::queue_limit).
  int64_t queue_limit() const { return options_.queue_limit; }
  // Thread-safe. The request finishes with kCancelled at the next iteration.
  void Cancel(int64_t id);

  // Owner thread: one iteration (submit into free slots, collect one
  // micro-batch). Returns false when there was nothing to do. Errors from
  // the executor fail every request in flight (on_finish with kError), or
  // with requeue_on_executor_error re-queue every running sequence, and are
  // returned. Equivalent to Schedule(), ExecutePlan on the executor, Apply:
  // false when the plan was empty, returned only after every callback so far
  // has run.
  StatusOr<bool> RunOnce();

  // Owner thread: the decision half of an iteration, for `max_in_flight`
  // micro-batches in flight at once (Schedule(): the executor's). In order:
  // cancelled requests that are not in flight finish (kCancelled); waiting
  // requests are admitted in queue order (FIFO, preempted ones first) while
  // set_admitting(true), the running set is below max_sequences and the
  // blocks for the whole prompt + generated tokens, less those found in the
  // prefix cache, are free (unused or cached; the first that does not fit
  // stops admission: no request overtakes another); requests
  // with max_tokens 0 finish (kLength). Then the free slots are filled: the
  // ready sequences (running, not in flight, with tokens not yet in the KV
  // cache) are split evenly over the free slots, each micro-batch taking
  // them in running order within max_batch_tokens, a prefill chunk being at
  // most prefill_chunk_tokens; a sequence that needs a KV block when none is
  // free preempts the newest running sequence that is not in flight (or
  // waits when there is none). The plan's sequences are marked in flight
  // (no later plan includes them or preempts them) until Apply. Stop-string
  // hits reported by the output thread (see above) are taken first and end
  // their sequences as cancellations do. Every Schedule must be
  // followed by Apply of its plan before the next Schedule, CollectInFlight,
  // RequeueRunning or SetExecutor.
  StepPlan Schedule();
  StepPlan Schedule(int max_in_flight);
  // Owner thread: the update half. The submitted micro-batches go in
  // flight; on a submit error the failed micro-batch's sequences and every
  // micro-batch in flight fail (kError) or, with requeue_on_executor_error,
  // every running sequence is re-queued, and the error is returned (the
  // plan's unsubmitted micro-batches are simply not run). When plan.collect,
  // the collected tokens are applied to the oldest micro-batch in flight:
  // each sequence appends its token (handed to the output thread) and
  // finishes on EOS (unless ignore_eos) or max_tokens; one cancelled (or
  // stopped by a stop string) while in flight finishes kCancelled and drops
  // its token; a row error finishes that sequence alone (kError). A Collect
  // error (or a token count that does not match the rows) fails everything
  // in flight as a submit error does.
  Status Apply(const StepPlan& plan, StepOutcome outcome);

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
  // Owner thread, at shutdown: every waiting, running and in-flight sequence
  // finishes with kError `error` (micro-batches in flight are abandoned, not
  // collected), and returns once their callbacks ran. Returns how many.
  int FailAll(const Status& error);
  // Owner thread, nothing in flight: runs later micro-batches on `executor`,
  // which serves plan `plan_version`. Clears the prefix cache.
  void SetExecutor(StepExecutor* executor, uint64_t plan_version);
  // Owner thread: forgets every cached prefix block. Running sequences keep
  // their blocks (unregistered); later admissions find nothing cached.
  void ClearPrefixCache();
  bool prefix_caching() const { return options_.prefix_caching; }
  size_t in_flight() const;  // owner thread: micro-batches in flight
  // Owner thread: blocks until every callback for what has happened so far
  // has run on the output thread.
  void WaitForOutput();

  size_t waiting() const;  // thread-safe
  // Thread-safe: admitted sequences not finished, plus finished requests
  // whose on_finish has not run yet (0 means every on_finish has returned;
  // with a shared output processor, those of every scheduler sharing it).
  size_t running() const;
  const SchedulerStats& stats() const { return stats_; }

 private:
  struct InFlight;

  Status Validate(const GenerationRequest& r) const;
  void Admit(StepPlan& plan);
  bool EnsureBlocks(Seq& s, int64_t tokens, StepPlan& plan);
  // Whether `s` takes part in prefix caching (options and the RoPE rule).
  bool Cacheable(const Seq& s) const;
  // The RoPE rule alone: `s`'s full blocks never change once written.
  bool SharesBlocks(const Seq& s) const;
  // A choice's share of its source's prompt blocks (share_prompt_of).
  struct SharedPrompt {
    std::vector<int32_t> blocks;  // to AddRef (referenced by the source)
    bool wait = false;            // the source is still prefilling them
  };
  SharedPrompt SharedPromptBlocks(const Seq& s) const;
  // Extends s's keys to its first `blocks` full blocks (at the current plan).
  void ComputeKeys(Seq& s, int64_t blocks);
  // Registers s's full blocks that are in the KV cache and not registered yet.
  void RegisterFullBlocks(Seq& s);
  void Preempt(Seq& s);
  // Longrope: recompute a sequence that outgrows the pre-training context
  // (see scheduler.cc).
  void LongRopeRecompute(Seq& s);
  void DropFinished();
  void Finish(Seq& s, FinishReason reason, Status error = Status::Ok());
  void Register(Seq& s);  // hands s's callbacks to output_ once
  void ApplyToken(Seq& s, const SampledToken& sampled);
  void FailInFlight(const Status& error);
  Status ApplyOutcome(const StepPlan& plan, StepOutcome outcome);
  // Cancels the live sequences whose stop string the output thread reported
  // with events up to `upto`.
  void TakeStops(uint64_t upto);
  // Applies Collect's result to the oldest micro-batch in flight.
  Status ApplyCollected(StatusOr<std::vector<SampledToken>> tokens,
                        const std::vector<Status>& row_errors);

  ModelConfig config_;
  StepExecutor* executor_;
  BlockAllocator* allocator_;
  int64_t block_size_;
  const Tokenizer* tokenizer_;
  SchedulerOptions options_;
  std::set<int32_t> eos_;
  std::shared_ptr<OutputProcessor> output_;  // its own thread; maybe shared (options.output)

  mutable std::mutex mu_;
  std::deque<std::unique_ptr<Seq>> waiting_;  // protected by mu_
  std::set<int64_t> cancelled_;               // protected by mu_
  std::atomic<size_t> running_count_{0};

  // Owner thread only.
  std::vector<std::unique_ptr<Seq>> running_;
  std::deque<InFlight> in_flight_;
  std::vector<InFlight> planned_;  // the open plan's micro-batches, not yet submitted
  bool plan_open_ = false;         // a Schedule awaits its Apply
  uint64_t serial_ = 0;            // of the latest plan
  std::vector<int64_t> finished_ids_;
  // With a shared output processor: the ids finished in the last three
  // TakeStops rounds (newest first), whose late stop reports are its own.
  std::vector<int64_t> finished_recent_[3];
  SchedulerStats stats_;
  double last_done_ = 0.0;
  bool admitting_ = true;
  uint64_t plan_version_ = 0;  // of the executor's plan: part of every block key
  uint64_t stop_barrier_ = 0;  // Schedule takes the stop reports up to this output event
  uint64_t applied_mark_ = 0;  // the last output event posted by the latest Apply
};

}  // namespace tessera
