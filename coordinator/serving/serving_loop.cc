#include "coordinator/serving/serving_loop.h"

#include <utility>

#include "common/base/logging.h"
#include "common/metrics/metric_catalog.h"

namespace tessera {

ServingLoop::ServingLoop(const ModelConfig& model, const Tokenizer* tokenizer, int64_t block_size,
                         SchedulerOptions options, MetricsRegistry* metrics,
                         std::function<void(const Status&)> on_step_failed, int replica)
    : model_(model),
      tokenizer_(tokenizer),
      block_size_(block_size),
      options_(options),
      metrics_(metrics),
      on_step_failed_(std::move(on_step_failed)),
      replica_(std::to_string(replica)) {}

ServingLoop::~ServingLoop() { Stop(); }

void ServingLoop::Start(std::shared_ptr<StepExecutor> executor, Health health, int64_t kv_blocks,
                        uint64_t plan_version) {
  TESSERA_CHECK(!started() && executor && health);
  health_ = std::move(health);
  allocator_ = std::make_unique<BlockAllocator>(kv_blocks);
  kv_blocks_.store(kv_blocks);
  free_blocks_.store(kv_blocks);
  executor_ = std::move(executor);
  SchedulerOptions options = options_;
  options.plan_version = plan_version;
  scheduler_ = std::make_unique<Scheduler>(model_, executor_.get(), allocator_.get(), block_size_,
                                           tokenizer_, options);
  started_.store(true, std::memory_order_release);
  thread_ = std::thread([this] { Loop(); });
}

void ServingLoop::Stop() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  cv_.notify_all();
  state_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

StatusOr<std::vector<int64_t>> ServingLoop::Submit(std::vector<GenerationRequest> requests,
                                                   std::vector<RequestCallbacks> callbacks) {
  if (!started()) return Unavailable("no plan is serving yet");
  auto ids = scheduler_->EnqueueAll(std::move(requests), std::move(callbacks));
  if (ids.ok()) Wake();
  return ids;
}

void ServingLoop::Cancel(const std::vector<int64_t>& ids) {
  if (!started()) return;
  for (int64_t id : ids) scheduler_->Cancel(id);
  Wake();
}

size_t ServingLoop::waiting() const { return started() ? scheduler_->waiting() : 0; }
size_t ServingLoop::running() const { return started() ? scheduler_->running() : 0; }

std::vector<ReplicaMigrant> ServingLoop::TakeWaiting() {
  if (!started()) return {};
  std::vector<ReplicaMigrant> out;
  for (Scheduler::Migrant& m : scheduler_->TakeWaiting()) out.emplace_back(std::move(m));
  return out;
}

Status ServingLoop::Adopt(std::vector<ReplicaMigrant>* migrants) {
  if (!started()) return Unavailable("no plan is serving yet");
  for (const ReplicaMigrant& m : *migrants)
    if (!std::holds_alternative<Scheduler::Migrant>(m))
      return FailedPrecondition("request " + std::to_string(MigrantId(m)) +
                                " was held by a replica that schedules on its leader; this one "
                                "schedules in the coordinator");
  std::vector<Scheduler::Migrant> scheduled;
  for (ReplicaMigrant& m : *migrants)
    scheduled.push_back(std::move(std::get<Scheduler::Migrant>(m)));
  Status adopted = scheduler_->AdoptWaiting(&scheduled);
  if (!adopted.ok()) {
    // All or none: they go back as they were.
    for (size_t i = 0; i < scheduled.size(); ++i) (*migrants)[i] = std::move(scheduled[i]);
    return adopted;
  }
  migrants->clear();
  Wake();
  return Status::Ok();
}

void ServingLoop::Wake() {
  {
    MutexLock lock(&mu_);
    wake_ = true;
  }
  cv_.notify_all();
}

bool ServingLoop::RunOnLoop(std::function<void()> fn) {
  if (!started()) return false;
  MutexLock lock(&mu_);
  if (stop_) return false;
  commands_.push_back(std::move(fn));
  const uint64_t id = ++commands_posted_;
  cv_.notify_all();
  state_cv_.wait(mu_, [&]() REQUIRES(mu_) { return commands_done_ >= id || stop_; });
  return commands_done_ >= id;
}

size_t ServingLoop::pending_commands() const {
  MutexLock lock(&mu_);
  return commands_.size();
}

bool ServingLoop::RunCommands() {
  std::deque<std::function<void()>> todo;
  {
    MutexLock lock(&mu_);
    if (stop_) return false;
    todo.swap(commands_);
  }
  if (todo.empty()) return true;
  for (auto& fn : todo) fn();
  {
    MutexLock lock(&mu_);
    commands_done_ += todo.size();
  }
  state_cv_.notify_all();
  return true;
}

std::optional<int> ServingLoop::Pause(double drain_seconds) {
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(drain_seconds));
  const bool ran = RunOnLoop([this, deadline] {
    scheduler_->set_admitting(false);
    MutexLock lock(&mu_);
    mode_ = Mode::kDraining;
    drain_deadline_ = deadline;
  });
  if (!ran) return std::nullopt;
  MutexLock lock(&mu_);
  state_cv_.wait(mu_, [&]() REQUIRES(mu_) { return mode_ == Mode::kPaused || stop_; });
  if (mode_ != Mode::kPaused) return std::nullopt;
  return requeued_last_;
}

bool ServingLoop::SwapExecutor(std::shared_ptr<StepExecutor> executor, Health health,
                               uint64_t plan_version) {
  return RunOnLoop(
      [this, executor = std::move(executor), health = std::move(health), plan_version]() mutable {
        // Paused: nothing is in flight (Scheduler::SetExecutor checks). The
        // prefix cache is cleared: the new plan's workers start with empty KV.
        scheduler_->SetExecutor(executor.get(), plan_version);
        executor_ = std::move(executor);
        health_ = std::move(health);
      });
}

bool ServingLoop::Resume() {
  return RunOnLoop([this] {
    scheduler_->set_admitting(true);
    MutexLock lock(&mu_);
    mode_ = Mode::kRunning;
  });
}

void ServingLoop::Publish() {
  const int64_t preempted = scheduler_->stats().preemptions;
  metrics_->Counter(metric::kPreemptionsTotal)
      .WithLabels({replica_})
      .Inc(static_cast<double>(preempted - preemptions_seen_));
  preemptions_seen_ = preempted;
  const SchedulerStats& st = scheduler_->stats();
  metrics_->Counter(metric::kPrefixCacheQueriesTokensTotal)
      .WithLabels({replica_})
      .Inc(static_cast<double>(st.prefix_cache_query_tokens - prefix_queries_seen_));
  prefix_queries_seen_ = st.prefix_cache_query_tokens;
  metrics_->Counter(metric::kPrefixCacheHitsTokensTotal)
      .WithLabels({replica_})
      .Inc(static_cast<double>(st.prefix_cache_hit_tokens - prefix_hits_seen_));
  prefix_hits_seen_ = st.prefix_cache_hit_tokens;
  metrics_->Gauge(metric::kKvCacheUsedBlocks)
      .WithLabels({replica_})
      .Set(static_cast<double>(allocator_->num_blocks() - allocator_->num_free()));
  free_blocks_.store(allocator_->num_free(), std::memory_order_relaxed);
}

void ServingLoop::Loop() {
  LoopUntilStopped();
  // Stopping: every request still queued or running ends with an error (a
  // stream gets an error event and [DONE]) instead of a cut connection.
  const int failed = scheduler_->FailAll(Unavailable(kShuttingDownMessage));
  if (failed > 0)
    TESSERA_LOG_INFO("coordinator", "stopping: {} request(s) ended with an error", failed);
}

void ServingLoop::LoopUntilStopped() {
  while (RunCommands()) {
    Mode mode;
    std::chrono::steady_clock::time_point deadline;
    {
      MutexLock lock(&mu_);
      mode = mode_;
      deadline = drain_deadline_;
      wake_ = false;  // what arrives from here on wakes the next sleep
    }
    if (mode == Mode::kPaused) {
      MutexLock lock(&mu_);
      cv_.wait(mu_, [&]() REQUIRES(mu_) { return stop_ || !commands_.empty(); });
      continue;
    }
    auto idle = [&] { return scheduler_->running() == 0 && scheduler_->in_flight() == 0; };
    if (mode == Mode::kDraining &&
        (idle() || !health_().ok() || std::chrono::steady_clock::now() >= deadline)) {
      // Collect what is in flight (a broken executor fails it back, and its
      // sequences are re-queued), then re-queue the unfinished rest.
      scheduler_->CollectInFlight().IgnoreError();
      scheduler_->RequeueRunning();
      // Every sequence re-queued since the last pause: by an executor error
      // (a fault) or by this drain.
      const int64_t requeued = scheduler_->stats().requeued;
      {
        MutexLock lock(&mu_);
        requeued_last_ = static_cast<int>(requeued - requeued_seen_);
        mode_ = Mode::kPaused;
      }
      requeued_seen_ = requeued;
      state_cv_.notify_all();
      continue;
    }
    auto progressed = scheduler_->RunOnce();
    Publish();
    if (!progressed.ok()) {
      // The sequences in flight were re-queued (requeue_on_executor_error).
      TESSERA_LOG_ERROR("coordinator", "step failed: {}", progressed.status().ToString());
      if (mode == Mode::kRunning) {
        if (on_step_failed_) on_step_failed_(progressed.status());
        // Wait for the re-plan's pause instead of failing every step.
        MutexLock lock(&mu_);
        cv_.wait_for(mu_, std::chrono::seconds(1),
                     [&]() REQUIRES(mu_) { return stop_ || !commands_.empty(); });
      }
      continue;
    }
    if (*progressed || (mode == Mode::kDraining && idle())) continue;
    // Nothing to do: sleep until a request, a cancellation, a command, a
    // health change or stop (a drain also until its deadline).
    MutexLock lock(&mu_);
    auto woken = [&]() REQUIRES(mu_) { return stop_ || wake_ || !commands_.empty(); };
    if (mode == Mode::kDraining) {
      cv_.wait_until(mu_, deadline, woken);
    } else {
      cv_.wait(mu_, woken);
    }
  }
}

}  // namespace tessera
