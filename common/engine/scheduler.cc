#include "common/engine/scheduler.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>

#include "common/engine/prefill_chunk.h"
#include "common/engine/scheduler_seq.h"

namespace tessera {

const char* FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kLength:
      return "length";
    case FinishReason::kEos:
      return "eos";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kCancelled:
      return "cancelled";
    case FinishReason::kError:
      return "error";
  }
  return "?";
}

namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

struct Scheduler::InFlight {
  StepBatch batch;
  std::vector<Seq*> members;
  bool has_decode = false;
  int64_t prefill_tokens = 0;
  int64_t decode_tokens = 0;
  double submitted = 0.0;
};

Scheduler::Scheduler(const ModelConfig& config, StepExecutor* executor, BlockAllocator* allocator,
                     int64_t block_size, const Tokenizer* tokenizer, SchedulerOptions options)
    : config_(config),
      executor_(executor),
      allocator_(allocator),
      block_size_(block_size),
      tokenizer_(tokenizer),
      options_(options),
      eos_(config.eos_token_ids.begin(), config.eos_token_ids.end()),
      output_(options.output
                  ? options.output
                  : std::make_shared<OutputProcessor>(tokenizer, options.on_output_batch)),
      plan_version_(options.plan_version) {
  if (tokenizer_ && tokenizer_->eos_id()) eos_.insert(*tokenizer_->eos_id());
  if (options_.prefill_chunk_budget == PrefillChunkBudget::kTokens)
    options_.prefill_context_tokens = 0;
  else if (options_.prefill_context_tokens <= 0)
    options_.prefill_context_tokens = PrefillContextTokens(config);
}

// The output thread finishes what was posted before the sequences go.
Scheduler::~Scheduler() { output_.reset(); }

Status Scheduler::Validate(const GenerationRequest& r) const {
  return ValidateGenerationRequest(r, config_, options_, tokenizer_ != nullptr,
                                   allocator_->num_blocks(), block_size_);
}

Status ValidateGenerationRequest(const GenerationRequest& r, const ModelConfig& config,
                                 const SchedulerOptions& options, bool has_tokenizer,
                                 int64_t kv_blocks, int64_t block_size) {
  if (r.prompt_ids.empty()) return InvalidArgument("prompt: must not be empty");
  for (size_t i = 0; i < r.prompt_ids.size(); ++i)
    if (r.prompt_ids[i] < 0 || r.prompt_ids[i] >= config.vocab_size)
      return InvalidArgument("prompt: token id " + std::to_string(r.prompt_ids[i]) +
                             " at position " + std::to_string(i) + " is outside the vocab [0, " +
                             std::to_string(config.vocab_size) + ")");
  TESSERA_RETURN_IF_ERROR(r.sampling.Validate());
  if (r.max_tokens < 0)
    return InvalidArgument("max_tokens: must be >= 0, got " + std::to_string(r.max_tokens));
  auto outside = [&](int32_t id) { return id < 0 || id >= config.vocab_size; };
  for (const auto& [id, bias] : r.sampling.logit_bias)
    if (outside(id))
      return InvalidArgument(fmt::format("logit_bias: token id {} is outside the vocab [0, {})", id,
                                         config.vocab_size));
  for (int32_t id : r.sampling.stop_token_ids)
    if (outside(id))
      return InvalidArgument(fmt::format("stop_token_ids: token id {} is outside the vocab [0, {})",
                                         id, config.vocab_size));
  if (r.sampling.prompt_logprobs >= 0 &&
      static_cast<int64_t>(r.prompt_ids.size()) > options.max_batch_tokens)
    return InvalidArgument(fmt::format(
        "prompt_logprobs: the prompt's {} tokens exceed the {} tokens of one step "
        "(scheduler.max_batch_tokens): prompt log-probabilities need the whole prompt in one step",
        r.prompt_ids.size(), options.max_batch_tokens));
  if (!r.resume_tokens.empty() && static_cast<int64_t>(r.resume_tokens.size()) >= r.max_tokens)
    return InvalidArgument(fmt::format("resume_tokens: {} tokens leave none of max_tokens {}",
                                       r.resume_tokens.size(), r.max_tokens));
  for (int32_t id : r.resume_tokens)
    if (outside(id))
      return InvalidArgument(fmt::format("resume_tokens: token id {} is outside the vocab [0, {})",
                                         id, config.vocab_size));
  if (r.sampling.min_tokens > r.max_tokens)
    return InvalidArgument(
        fmt::format("min_tokens: {} exceeds max_tokens {}", r.sampling.min_tokens, r.max_tokens));
  if (!r.stop.empty() && !has_tokenizer)
    return InvalidArgument("stop: stop strings need a tokenizer");
  for (const std::string& s : r.stop)
    if (s.empty()) return InvalidArgument("stop: stop strings must not be empty");
  const int64_t ctx = static_cast<int64_t>(r.prompt_ids.size()) + r.max_tokens;
  if (ctx > options.max_context)
    return InvalidArgument("prompt: " + std::to_string(r.prompt_ids.size()) +
                           " prompt tokens + max_tokens " + std::to_string(r.max_tokens) + " = " +
                           std::to_string(ctx) + " exceeds the maximum context of " +
                           std::to_string(options.max_context) + " tokens");
  if (BlockAllocator::BlocksFor(ctx, block_size) > kv_blocks)
    return InvalidArgument("prompt: " + std::to_string(ctx) +
                           " tokens need more KV-cache blocks than the " +
                           std::to_string(kv_blocks) + " of " + std::to_string(block_size) +
                           " tokens the cache holds");
  return Status::Ok();
}

StatusOr<int64_t> Scheduler::Enqueue(GenerationRequest request, RequestCallbacks callbacks) {
  std::vector<GenerationRequest> requests;
  requests.push_back(std::move(request));
  std::vector<RequestCallbacks> cbs;
  cbs.push_back(std::move(callbacks));
  TESSERA_ASSIGN_OR_RETURN(std::vector<int64_t> ids,
                           EnqueueAll(std::move(requests), std::move(cbs)));
  return ids[0];
}

StatusOr<std::vector<int64_t>> Scheduler::EnqueueAll(std::vector<GenerationRequest> requests,
                                                     std::vector<RequestCallbacks> callbacks) {
  TESSERA_CHECK(requests.size() == callbacks.size());
  std::vector<std::unique_ptr<Seq>> seqs;
  seqs.reserve(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    TESSERA_RETURN_IF_ERROR(Validate(requests[i]));
    auto s = std::make_unique<Seq>();
    s->req = std::move(requests[i]);
    s->callbacks = std::move(callbacks[i]);
    SamplingParams& sp = s->req.sampling;
    if (sp.min_tokens > 0) {  // what min_tokens keeps from being drawn
      std::set<int32_t> blocked(sp.stop_token_ids.begin(), sp.stop_token_ids.end());
      if (!s->req.ignore_eos) blocked.insert(eos_.begin(), eos_.end());
      sp.min_tokens_blocked.assign(blocked.begin(), blocked.end());
    }
    s->tokens = s->req.prompt_ids;
    s->prompt_len = static_cast<int32_t>(s->tokens.size());
    s->tokens.insert(s->tokens.end(), s->req.resume_tokens.begin(), s->req.resume_tokens.end());
    s->generated = static_cast<int32_t>(s->req.resume_tokens.size());
    s->prompt_logprobs_pending = s->req.sampling.prompt_logprobs >= 0;
    s->rope_len = s->prompt_len;
    seqs.push_back(std::move(s));
  }
  for (size_t i = 0; i < seqs.size(); ++i) {
    const int32_t src = seqs[i]->req.share_prompt_of;
    if (src >= 0 && (static_cast<size_t>(src) >= i ||
                     seqs[static_cast<size_t>(src)]->req.prompt_ids != seqs[i]->req.prompt_ids))
      return InvalidArgument("share_prompt_of: request " + std::to_string(i) + " names request " +
                             std::to_string(src) + ", not an earlier one with the same prompt");
  }
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t n = static_cast<int64_t>(seqs.size());
  if (static_cast<int64_t>(waiting_.size()) + n > options_.queue_limit) {
    if (n > 1)
      return ResourceExhausted(fmt::format(
          "the request queue has room for {} of {} requests ({} waiting, limit {}); retry later",
          std::max<int64_t>(options_.queue_limit - static_cast<int64_t>(waiting_.size()), 0), n,
          waiting_.size(), options_.queue_limit));
    return ResourceExhausted("the request queue is full (" + std::to_string(options_.queue_limit) +
                             " waiting); retry later");
  }
  std::vector<int64_t> ids;
  ids.reserve(seqs.size());
  for (auto& s : seqs) {
    s->id = output_->NextId();
    ids.push_back(s->id);
    if (s->req.share_prompt_of >= 0)
      s->prompt_source = ids[static_cast<size_t>(s->req.share_prompt_of)];
    if (!s->req.resume_tokens.empty()) {
      Register(*s);
      output_->Replay(s->id, std::move(s->req.resume_tokens));
      s->req.resume_tokens.clear();
    }
    waiting_.push_back(std::move(s));
  }
  return ids;
}

Scheduler::Migrant::Migrant(std::unique_ptr<Seq> seq, bool cancelled, const OutputProcessor* output)
    : seq_(std::move(seq)), cancelled_(cancelled), output_(output) {}
Scheduler::Migrant::Migrant(Migrant&&) noexcept = default;
Scheduler::Migrant& Scheduler::Migrant::operator=(Migrant&&) noexcept = default;
Scheduler::Migrant::~Migrant() = default;
int64_t Scheduler::Migrant::id() const { return seq_->id; }
int64_t Scheduler::Migrant::tokens() const { return static_cast<int64_t>(seq_->tokens.size()); }
int64_t Scheduler::Migrant::remaining_tokens() const {
  return std::max<int64_t>(0, seq_->req.max_tokens - seq_->generated);
}

std::vector<Scheduler::Migrant> Scheduler::TakeWaiting() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Migrant> out;
  out.reserve(waiting_.size());
  for (auto& s : waiting_) {
    const bool cancelled = cancelled_.erase(s->id) > 0;
    out.push_back(Migrant(std::move(s), cancelled, output_.get()));
  }
  waiting_.clear();
  return out;
}

Status Scheduler::AdoptWaiting(std::vector<Migrant>* migrants_in) {
  std::vector<Migrant>& migrants = *migrants_in;
  for (const Migrant& m : migrants) {
    if (m.output_ != output_.get())
      return FailedPrecondition("request " + std::to_string(m.id()) +
                                " comes from a scheduler with another output processor");
    const int64_t ctx = static_cast<int64_t>(m.seq_->prompt_len) + m.seq_->req.max_tokens;
    if (ctx > options_.max_context ||
        BlockAllocator::BlocksFor(ctx, block_size_) > allocator_->num_blocks())
      return InvalidArgument("request " + std::to_string(m.id()) + ": " + std::to_string(ctx) +
                             " tokens do not fit this scheduler's context or KV cache");
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = migrants.rbegin(); it != migrants.rend(); ++it) {
    it->seq_->waiting = true;
    it->seq_->cached = 0;
    it->seq_->registered_blocks = 0;
    it->seq_->blocks.clear();
    if (it->cancelled_) cancelled_.insert(it->seq_->id);
    waiting_.push_front(std::move(it->seq_));
  }
  migrants.clear();
  return Status::Ok();
}

void Scheduler::Cancel(int64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  cancelled_.insert(id);
}

size_t Scheduler::waiting() const {
  std::lock_guard<std::mutex> lock(mu_);
  return waiting_.size();
}

size_t Scheduler::running() const { return running_count_.load() + output_->pending_finishes(); }

void Scheduler::WaitForOutput() { output_->WaitProcessed(output_->posted()); }

size_t Scheduler::in_flight() const { return in_flight_.size(); }

void Scheduler::Register(Seq& s) {
  if (s.registered) return;
  s.registered = true;
  output_->Register(s.id, std::move(s.callbacks), s.req.stop, s.req.sampling.logprobs >= 0,
                    s.prompt_len);
}

void Scheduler::Finish(Seq& s, FinishReason reason, Status error) {
  if (s.done) return;
  s.done = true;
  allocator_->Free(s.blocks);
  finished_ids_.push_back(s.id);
  if (options_.output) finished_recent_[0].push_back(s.id);
  Register(s);
  output_->Finish(s.id, reason, std::move(error), s.preemptions);
}

void Scheduler::ApplyToken(Seq& s, const SampledToken& sampled_in) {
  SampledToken sampled = sampled_in;
  sampled.prompt_logprobs.clear();  // went out as their own event
  const int32_t token = sampled.token_id;
  s.tokens.push_back(token);
  ++s.generated;
  const bool eos = !s.req.ignore_eos && eos_.count(token) > 0;
  const std::vector<int32_t>& stop_ids = s.req.sampling.stop_token_ids;
  const bool stop_token = std::find(stop_ids.begin(), stop_ids.end(), token) != stop_ids.end();
  Register(s);
  output_->Token(s.id, sampled, eos || stop_token, s.preemptions);
  if (eos) {
    Finish(s, FinishReason::kEos);
  } else if (stop_token) {
    Finish(s, FinishReason::kStop);
  } else if (s.generated >= s.req.max_tokens) {
    Finish(s, FinishReason::kLength);
  }
}

void Scheduler::TakeStops(uint64_t upto) {
  // Under mu_, so no request moves to another scheduler (TakeWaiting)
  // between taking its stop and cancelling it.
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<int64_t> ids;
  if (options_.output) {
    // A shared processor: only this scheduler's requests.
    std::set<int64_t> mine;
    for (auto& s : running_) mine.insert(s->id);
    for (auto& s : waiting_) mine.insert(s->id);
    // And those finished in the last rounds (a stop on a request's last
    // token is taken after it finished): taken and dropped, not left over.
    for (const auto& round : finished_recent_) mine.insert(round.begin(), round.end());
    finished_recent_[2].swap(finished_recent_[1]);
    finished_recent_[1].swap(finished_recent_[0]);
    finished_recent_[0].clear();
    ids = output_->TakeStops(upto, [&](int64_t id) { return mine.count(id) > 0; });
  } else {
    ids = output_->TakeStops(upto);
  }
  if (ids.empty()) return;
  // Cancel those still alive (one may have finished at max_tokens meanwhile).
  const std::set<int64_t> stopped(ids.begin(), ids.end());
  for (auto& s : running_)
    if (!s->done && stopped.count(s->id)) cancelled_.insert(s->id);
  for (auto& s : waiting_)
    if (stopped.count(s->id)) cancelled_.insert(s->id);
}

void Scheduler::Admit(StepPlan& plan) {
  std::vector<std::unique_ptr<Seq>> cancelled_waiting;
  std::vector<Seq*> cancelled_running;
  std::vector<Seq*> admitted;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = waiting_.begin(); it != waiting_.end();) {
      if (cancelled_.erase((*it)->id)) {
        cancelled_waiting.push_back(std::move(*it));
        it = waiting_.erase(it);
      } else {
        ++it;
      }
    }
    for (auto& s : running_)
      if (!s->in_flight && cancelled_.erase(s->id)) cancelled_running.push_back(s.get());
    // Admit while the blocks for the prompt are free and the running set has room.
    while (admitting_ && !waiting_.empty() &&
           static_cast<int64_t>(running_.size()) < options_.max_sequences) {
      Seq& s = *waiting_.front();
      const int64_t len = static_cast<int64_t>(s.tokens.size());
      const int64_t need = BlockAllocator::BlocksFor(len, block_size_);
      if (s.req.max_tokens > 0 || s.prompt_logprobs_pending) {
        // The longest chain of cached blocks that starts the tokens, short
        // of the block holding the last token (it must be computed).
        std::vector<int32_t> hit;
        int64_t idle_hits = 0;  // hits that are cached, not referenced: part of num_free
        // Prompt log-probabilities need logits at every prompt position.
        const bool cacheable = Cacheable(s) && !s.prompt_logprobs_pending;
        const SharedPrompt shared = SharedPromptBlocks(s);
        if (shared.wait) break;  // the source's prefill comes first (FIFO holds)
        hit = shared.blocks;
        if (cacheable && hit.empty()) {
          const int64_t limit = (len - 1) / block_size_;
          ComputeKeys(s, limit);
          for (int64_t i = 0; i < limit; ++i) {
            const std::optional<int32_t> b = allocator_->Find(s.keys[static_cast<size_t>(i)]);
            if (!b) break;
            hit.push_back(*b);
            if (allocator_->ref_count(*b) == 0) ++idle_hits;
          }
        }
        const int64_t fresh = need - static_cast<int64_t>(hit.size());
        if (fresh > allocator_->num_free() - idle_hits) break;
        for (int32_t b : hit) allocator_->AddRef(b);
        s.blocks = hit;
        TESSERA_CHECK(allocator_->Allocate(fresh, s.blocks).ok());
        s.cached = static_cast<int32_t>(hit.size() * block_size_);
        s.registered_blocks = static_cast<int32_t>(hit.size());
        if (cacheable) {
          stats_.prefix_cache_query_tokens += len;
          stats_.prefix_cache_hit_tokens += s.cached;
        }
      }
      s.waiting = false;
      s.history_sent = false;
      admitted.push_back(&s);
      plan.admitted.push_back(s.id);
      running_.push_back(std::move(waiting_.front()));
      waiting_.pop_front();
    }
  }
  for (Seq* s : admitted) {
    Register(*s);
    output_->Admitted(s->id, std::min(s->cached, s->prompt_len));
  }
  for (auto& s : cancelled_waiting) Finish(*s, FinishReason::kCancelled);
  for (Seq* s : cancelled_running) Finish(*s, FinishReason::kCancelled);
  for (auto& s : running_)
    if (s->req.max_tokens == 0 && !s->prompt_logprobs_pending) Finish(*s, FinishReason::kLength);
  DropFinished();
}

void Scheduler::FailInFlight(const Status& error) {
  // A failed step may have left any block half written, and the workers'
  // KV may be gone: nothing cached is trusted again.
  ClearPrefixCache();
  for (InFlight& f : in_flight_)
    for (Seq* s : f.members) {
      s->in_flight = false;
      if (!options_.requeue_on_executor_error) Finish(*s, FinishReason::kError, error);
    }
  in_flight_.clear();
  if (options_.requeue_on_executor_error) RequeueRunning();
}

int Scheduler::RequeueRunning() {
  TESSERA_CHECK(in_flight_.empty() && !plan_open_);
  int moved = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = running_.rbegin(); it != running_.rend(); ++it) {
      Seq& s = **it;
      if (s.done) continue;
      allocator_->Free(s.blocks);
      s.cached = 0;
      s.registered_blocks = 0;
      s.waiting = true;
      ++s.preemptions;
      ++stats_.preemptions;
      ++stats_.requeued;
      ++moved;
      waiting_.push_front(std::move(*it));
    }
    running_.clear();
  }
  running_count_.store(0);
  return moved;
}

int Scheduler::FailAll(const Status& error) {
  for (InFlight& f : in_flight_)
    for (Seq* s : f.members) s->in_flight = false;
  in_flight_.clear();
  plan_open_ = false;
  int failed = 0;
  for (auto& s : running_) {
    if (s->done) continue;
    Finish(*s, FinishReason::kError, error);
    ++failed;
  }
  std::deque<std::unique_ptr<Seq>> waiting;
  {
    std::lock_guard<std::mutex> lock(mu_);
    waiting.swap(waiting_);
    cancelled_.clear();
  }
  for (auto& s : waiting) {
    Finish(*s, FinishReason::kError, error);
    ++failed;
  }
  DropFinished();
  WaitForOutput();
  return failed;
}

void Scheduler::SetExecutor(StepExecutor* executor, uint64_t plan_version) {
  TESSERA_CHECK(in_flight_.empty() && !plan_open_);
  executor_ = executor;
  plan_version_ = plan_version;
  ClearPrefixCache();     // the new plan's workers start with empty KV caches
  finished_ids_.clear();  // the new plan's workers hold no state of earlier sequences
}

Status Scheduler::CollectInFlight() {
  TESSERA_CHECK(!plan_open_ && (in_flight_.empty() || executor_ != nullptr));
  while (!in_flight_.empty()) TESSERA_RETURN_IF_ERROR(ApplyCollected(executor_->Collect(), {}));
  return Status::Ok();
}

void Scheduler::DropFinished() {
  running_.erase(std::remove_if(running_.begin(), running_.end(),
                                [](const auto& s) { return s->done && !s->in_flight; }),
                 running_.end());
  running_count_.store(running_.size());
}

StatusOr<bool> Scheduler::RunOnce() {
  TESSERA_CHECK(executor_ != nullptr);
  const StepPlan plan = Schedule(executor_->max_in_flight());
  if (plan.empty()) {
    TESSERA_RETURN_IF_ERROR(Apply(plan, StepOutcome{}));
    // Idle: let every callback run, and take every stop report.
    const uint64_t all = output_->posted();
    output_->WaitProcessed(all);
    TakeStops(all);
    return false;
  }
  TESSERA_RETURN_IF_ERROR(Apply(plan, ExecutePlan(*executor_, plan)));
  return true;
}

StepPlan Scheduler::Schedule() {
  TESSERA_CHECK(executor_ != nullptr);
  return Schedule(executor_->max_in_flight());
}

StepPlan Scheduler::Schedule(int max_in_flight) {
  TESSERA_CHECK(!plan_open_ && max_in_flight >= 1);
  plan_open_ = true;
  StepPlan plan;
  plan.serial = ++serial_;
  output_->WaitProcessed(stop_barrier_);
  TakeStops(stop_barrier_);
  Admit(plan);
  // Fill the free micro-batch slots.
  const size_t max_slots = static_cast<size_t>(max_in_flight);
  while (in_flight_.size() + planned_.size() < max_slots) {
    std::vector<Seq*> ready;
    for (auto& s : running_)
      if (!s->done && !s->in_flight && static_cast<int64_t>(s->tokens.size()) > s->cached)
        ready.push_back(s.get());
    if (ready.empty()) break;
    const size_t slots = max_slots - in_flight_.size() - planned_.size();
    const size_t per_batch = (ready.size() + slots - 1) / slots;
    InFlight f;
    int64_t budget = options_.max_batch_tokens;
    for (Seq* s : ready) {
      if (f.members.size() >= per_batch || budget <= 0) break;
      if (s->done || s->waiting) continue;  // preempted by an earlier member's block allocation
      LongRopeRecompute(*s);
      const int64_t pending = static_cast<int64_t>(s->tokens.size()) - s->cached;
      const bool decode = pending == 1 && s->generated > 0;
      int64_t n = std::min(pending, budget);
      if (!decode)
        n = std::min(n, PrefillChunkTokens(options_.prefill_chunk_tokens,
                                           options_.prefill_context_tokens, s->cached, pending));
      // Prompt log-probabilities: the whole prompt in this step, or a later one.
      const bool whole_prompt = s->prompt_logprobs_pending && s->cached == 0;
      if (whole_prompt && pending > budget) continue;
      if (whole_prompt) n = pending;
      if (!EnsureBlocks(*s, s->cached + n, plan)) continue;  // waits for blocks to free up
      s->in_flight = true;  // members of this batch are not preemption victims
      SeqStep step;
      step.seq_id = s->id;
      step.start_pos = s->cached;
      step.num_tokens = static_cast<int32_t>(n);
      step.prompt_len = s->rope_len;
      step.block_table = s->blocks;
      step.want_logits = s->cached + n == static_cast<int64_t>(s->tokens.size());
      step.want_prompt_logprobs = whole_prompt;
      step.sampling = s->req.sampling;
      step.sampling.stop_token_ids.clear();  // the scheduler's; workers never read them
      step.output_start = s->prompt_len;
      if (step.sampling.NeedsHistory() && !s->history_sent) {
        if (s->cached > 0) step.history.assign(s->tokens.begin(), s->tokens.begin() + s->cached);
        s->history_sent = true;
      }
      f.batch.token_ids.insert(f.batch.token_ids.end(), s->tokens.begin() + s->cached,
                               s->tokens.begin() + s->cached + n);
      f.batch.seqs.push_back(std::move(step));
      f.members.push_back(s);
      if (decode) {
        f.has_decode = true;
        f.decode_tokens += n;
      } else {
        f.prefill_tokens += n;
      }
      budget -= n;
    }
    if (f.members.empty()) break;
    f.batch.finished_seq_ids = std::move(finished_ids_);
    finished_ids_.clear();
    PlannedBatch b;
    b.batch = f.batch;
    b.prefill_tokens = f.prefill_tokens;
    b.decode_tokens = f.decode_tokens;
    plan.submit.push_back(std::move(b));
    planned_.push_back(std::move(f));
  }
  if (in_flight_.empty() && planned_.empty()) {
    DropFinished();
    return plan;
  }
  plan.collect = true;
  const InFlight& oldest = in_flight_.empty() ? planned_.front() : in_flight_.front();
  for (const SeqStep& step : oldest.batch.seqs)
    if (step.want_logits) plan.collect_rows.push_back(step.seq_id);
  return plan;
}

Status Scheduler::Apply(const StepPlan& plan, StepOutcome outcome) {
  TESSERA_CHECK(plan_open_ && plan.serial == serial_ && plan.submit.size() == planned_.size());
  plan_open_ = false;
  Status st = ApplyOutcome(plan, std::move(outcome));
  // The next Schedule waits for the output of the Apply before this one.
  stop_barrier_ = applied_mark_;
  applied_mark_ = output_->posted();
  return st;
}

Status Scheduler::ApplyOutcome(const StepPlan& plan, StepOutcome outcome) {
  std::vector<InFlight> planned = std::move(planned_);
  planned_.clear();
  TESSERA_CHECK(outcome.submitted <= planned.size());
  const double now = Now();
  for (size_t k = 0; k < outcome.submitted; ++k) {
    planned[k].submitted = k < outcome.submit_times.size() ? outcome.submit_times[k] : now;
    in_flight_.push_back(std::move(planned[k]));
    stats_.max_in_flight = std::max(stats_.max_in_flight, static_cast<int>(in_flight_.size()));
  }
  if (outcome.submitted < planned.size()) {
    Status st = outcome.submit_error.ok()
                    ? Internal("executor: micro-batch " + std::to_string(outcome.submitted) +
                               " of the plan was not submitted")
                    : outcome.submit_error;
    for (Seq* s : planned[outcome.submitted].members) {
      s->in_flight = false;
      if (!options_.requeue_on_executor_error) Finish(*s, FinishReason::kError, st);
    }
    // Later micro-batches of the plan never ran: their sequences stay as they were.
    for (size_t k = outcome.submitted + 1; k < planned.size(); ++k)
      for (Seq* s : planned[k].members) s->in_flight = false;
    FailInFlight(st);
    return st;
  }
  if (!plan.collect) return Status::Ok();
  return ApplyCollected(std::move(outcome.collected), outcome.row_errors);
}

Status Scheduler::ApplyCollected(StatusOr<std::vector<SampledToken>> tokens,
                                 const std::vector<Status>& row_errors) {
  if (!tokens.ok()) {
    FailInFlight(tokens.status());
    return tokens.status();
  }
  TESSERA_CHECK(!in_flight_.empty());
  InFlight f = std::move(in_flight_.front());
  in_flight_.pop_front();
  const double now = Now();
  const double dt = now - std::max(f.submitted, last_done_);
  last_done_ = now;
  (f.has_decode ? stats_.decode_seconds : stats_.prefill_seconds) += dt;
  stats_.prefill_tokens += f.prefill_tokens;
  stats_.decode_tokens += f.decode_tokens;
  auto fail_all = [&](const Status& err) {
    for (Seq* m : f.members) {
      m->in_flight = false;
      if (!options_.requeue_on_executor_error) Finish(*m, FinishReason::kError, err);
    }
    FailInFlight(err);
    return err;
  };
  if (!row_errors.empty() && row_errors.size() != tokens->size())
    return fail_all(Internal("executor returned " + std::to_string(row_errors.size()) +
                             " row errors for " + std::to_string(tokens->size()) + " tokens"));
  size_t row = 0;
  for (size_t k = 0; k < f.members.size(); ++k) {
    Seq& s = *f.members[k];
    s.in_flight = false;
    s.cached += f.batch.seqs[k].num_tokens;
    RegisterFullBlocks(s);  // its blocks now full are final: others may share them
    if (!f.batch.seqs[k].want_logits) continue;
    if (row >= tokens->size())
      return fail_all(Internal("executor returned " + std::to_string(tokens->size()) +
                               " tokens for " + std::to_string(f.members.size()) + " sequences"));
    const size_t r = row++;
    const SampledToken& token = (*tokens)[r];
    if (s.done) continue;  // cancelled while in flight
    bool cancelled;
    {
      std::lock_guard<std::mutex> lock(mu_);
      cancelled = cancelled_.erase(s.id) > 0;
    }
    if (cancelled) {
      Finish(s, FinishReason::kCancelled);
      continue;
    }
    if (!row_errors.empty() && !row_errors[r].ok()) {
      Finish(s, FinishReason::kError, row_errors[r]);
      continue;
    }
    if (s.prompt_logprobs_pending && f.batch.seqs[k].want_prompt_logprobs &&
        !IsFailedToken(token.token_id)) {
      s.prompt_logprobs_pending = false;
      Register(s);
      output_->PromptLogprobs(s.id, token.prompt_logprobs);
      if (s.req.max_tokens == 0) {  // echo with max_tokens 0: no completion token
        Finish(s, FinishReason::kLength);
        continue;
      }
    }
    if (token.token_id == kNonFiniteLogitsToken) {
      // The sampling rank saw a NaN or an infinity in this sequence's
      // logits: no token exists, this sequence alone fails.
      Finish(s, FinishReason::kError,
             DataLoss(fmt::format("the model produced non-finite logits (NaN or inf) for "
                                  "request {} at position {}: its activations overflowed "
                                  "(the sampling worker's log names the layers)",
                                  s.id, s.cached)));
      continue;
    }
    if (token.token_id == kGrammarFailedToken) {
      Finish(s, FinishReason::kError,
             Internal(fmt::format("the structured-output grammar of request {} failed on the "
                                  "sampling worker at position {} (its log names the reason)",
                                  s.id, s.cached)));
      continue;
    }
    ApplyToken(s, token);
  }
  DropFinished();
  return Status::Ok();
}

}  // namespace tessera
