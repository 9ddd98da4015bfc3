// ServingLoop: the one thread that owns the coordinator's Scheduler and the
// executor it runs on (a RemoteExecutor for the running plan).
//
// The loop runs Scheduler::RunOnce while there is work and sleeps on a
// condition variable when there is none; it is woken by a new request
// (Submit), a cancellation (Cancel), a command, a change of the executor's
// health (Wake) or Stop: it never polls. Every owner-thread call of the
// scheduler (RunOnce, CollectInFlight, RequeueRunning, SetExecutor,
// set_admitting) happens on this thread. Other threads change what the loop
// does through commands, which the loop runs between two iterations and the
// caller waits for:
//
//   Pause(drain_seconds)  stop admitting; running sequences get drain_seconds
//                         to finish (none once the executor is broken); then
//                         the micro-batches in flight are collected and the
//                         unfinished sequences re-queued (they resume from
//                         prompt + generated tokens). Returns once paused.
//   SwapExecutor(e, v)    paused: later steps run on `e` (the new plan, version
//                         v); the prefix cache is cleared.
//   Resume()              admit again and run.
//
// A step that fails while running (not paused or draining) calls
// `on_step_failed` on the loop thread (the coordinator re-plans, which
// pauses the loop); the loop then waits up to a second for that command
// instead of failing every step.
//
// The loop runs steps on a StepExecutor (the running plan's RemoteExecutor)
// and asks `health` whether it is broken (a draining loop then stops
// waiting for in-flight sequences).
//
// Metrics it keeps (labelled with its replica): tessera_scheduler_
// preemptions_total, tessera_kv_cache_used_blocks and the prefix cache's
// tessera_prefix_cache_queries_tokens_total and
// tessera_prefix_cache_hits_tokens_total after every iteration.
//
// Thread-safety: Submit, Cancel, waiting, running, Wake and the commands are
// safe from any thread except the loop's own (a command from a scheduler
// callback would wait for itself). Start and Stop from one thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/base/mutex.h"
#include "common/base/thread_annotations.h"
#include "common/engine/block_allocator.h"
#include "common/engine/scheduler.h"
#include "common/format/model_config.h"
#include "common/metrics/metrics_registry.h"
#include "common/tokenizer/tokenizer.h"
#include "coordinator/serving/replica_loop.h"

namespace tessera {

class ServingLoop : public ReplicaLoop {
 public:
  // `model`, `tokenizer` (may be null) and `metrics` outlive the loop.
  // `block_size`: tokens per KV block. `replica`: the `replica` label of
  // its metrics.
  ServingLoop(const ModelConfig& model, const Tokenizer* tokenizer, int64_t block_size,
              SchedulerOptions options, MetricsRegistry* metrics,
              std::function<void(const Status&)> on_step_failed, int replica = 0);
  ~ServingLoop() override;
  ServingLoop(const ServingLoop&) = delete;
  ServingLoop& operator=(const ServingLoop&) = delete;

  // Creates the KV pool (`kv_blocks` blocks) and the scheduler over
  // `executor`, which serves plan `plan_version`, and starts the loop
  // thread. Once.
  void Start(std::shared_ptr<StepExecutor> executor, Health health, int64_t kv_blocks,
             uint64_t plan_version) override;
  bool started() const override { return started_.load(std::memory_order_acquire); }
  // Stops the thread (a command in progress ends first; waiting callers of
  // the commands return false). Idempotent.
  void Stop() override;

  // RequestSink. Before Start, Submit answers kUnavailable.
  StatusOr<std::vector<int64_t>> Submit(std::vector<GenerationRequest> requests,
                                        std::vector<RequestCallbacks> callbacks) override;
  void Cancel(const std::vector<int64_t>& ids) override;
  size_t waiting() const override;
  size_t running() const override;
  // Commands posted and not run yet (tests wait for a command to be posted
  // before they let the loop step on). Any thread.
  size_t pending_commands() const EXCLUDES(mu_);

  // The executor's health may have changed (a worker lost or failing):
  // a draining loop re-checks it.
  void Wake() override;

  // Moving queued requests between replicas (their schedulers share one
  // OutputProcessor, SchedulerOptions::output): every waiting request, and
  // queueing such requests at the front (Scheduler::TakeWaiting /
  // AdoptWaiting). Before Start: nothing / kUnavailable.
  std::vector<ReplicaMigrant> TakeWaiting() override;
  Status Adopt(std::vector<ReplicaMigrant>* migrants) override;
  // KV blocks free after the last iteration, and the pool's size (0 before
  // Start).
  int64_t free_kv_blocks() const override { return free_blocks_.load(std::memory_order_relaxed); }
  int64_t kv_blocks() const override { return kv_blocks_.load(std::memory_order_relaxed); }

  // Commands (see the header comment). Each returns once run on the loop
  // thread; nullopt / false when the loop was not started or stopped.
  // Pause returns the sequences re-queued since the previous pause (by
  // executor errors or by this drain).
  std::optional<int> Pause(double drain_seconds) override;
  bool SwapExecutor(std::shared_ptr<StepExecutor> executor, Health health,
                    uint64_t plan_version) override;
  bool Resume() override;

 private:
  enum class Mode { kRunning, kDraining, kPaused };

  void Loop();
  void LoopUntilStopped();  // the serving loop proper; Loop then fails what is left
  // Runs the queued commands (loop thread). Returns false once stopping.
  bool RunCommands() EXCLUDES(mu_);
  // Queues `fn` for the loop thread and waits until it ran. False: stopped.
  bool RunOnLoop(std::function<void()> fn) EXCLUDES(mu_);
  void Publish();  // the per-iteration metrics (loop thread)

  const ModelConfig& model_;
  const Tokenizer* tokenizer_;
  const int64_t block_size_;
  const SchedulerOptions options_;
  MetricsRegistry* metrics_;
  const std::function<void(const Status&)> on_step_failed_;
  const std::string replica_;  // the metrics' replica label

  // Written once by Start before started_ turns true, never reset until
  // the destructor: read by other threads only after started().
  std::unique_ptr<BlockAllocator> allocator_;
  std::unique_ptr<Scheduler> scheduler_;
  std::atomic<bool> started_{false};
  std::thread thread_;
  std::atomic<int64_t> free_blocks_{0};  // published by the loop thread
  std::atomic<int64_t> kv_blocks_{0};

  // Loop thread only.
  std::shared_ptr<StepExecutor> executor_;
  Health health_;
  int64_t preemptions_seen_ = 0;
  int64_t requeued_seen_ = 0;
  int64_t prefix_queries_seen_ = 0;
  int64_t prefix_hits_seen_ = 0;

  mutable Mutex mu_;
  std::condition_variable_any cv_;        // wakes the loop thread
  std::condition_variable_any state_cv_;  // wakes command callers
  bool stop_ GUARDED_BY(mu_) = false;
  // Set by Submit, Cancel and Wake; cleared by the loop before each iteration.
  bool wake_ GUARDED_BY(mu_) = false;
  std::deque<std::function<void()>> commands_ GUARDED_BY(mu_);
  uint64_t commands_posted_ GUARDED_BY(mu_) = 0;
  uint64_t commands_done_ GUARDED_BY(mu_) = 0;
  // Written by the loop thread (commands and the end of a drain).
  Mode mode_ GUARDED_BY(mu_) = Mode::kRunning;
  std::chrono::steady_clock::time_point drain_deadline_ GUARDED_BY(mu_);
  int requeued_last_ GUARDED_BY(mu_) = 0;  // re-queued up to the last pause
};

}  // namespace tessera
