// LeaderLoop: the coordinator's side of a replica that schedules itself
// ([scheduler] runs_on = "leader"; the leader's side is
// worker/daemon/replica_leader.h). The replica's leader worker (stage 0,
// tp rank 0) runs the Scheduler, KV block allocator and output processing;
// this loop
//
//  - checks each request as the leader's scheduler will
//    (ValidateGenerationRequest) and against the queue limit, so that a bad
//    request is a 400 and a full queue a 429 before anything is sent;
//  - sends the requests of one Submit in one Generate (all or none) and
//    cancellations in CancelRequests, named by ids drawn from the replica
//    set's shared OutputProcessor (unique over the replicas);
//  - takes the leader's RequestUpdates (from the current plan's leader
//    only; anything else is dropped) on the control server's thread, which
//    applies them and runs the requests' callbacks there, in the order the
//    leader made them: no thread of its own, so an update costs no hand-over
//    and no wake-up of another thread (issue #33: one owner thread per
//    replica, or none at all);
//  - keeps each request until it finishes: its request, the tokens and
//    log-probabilities delivered so far and its text, so that a pause
//    (a re-plan or a fault) re-queues the unfinished ones and Resume sends
//    them to the next plan's leader with those tokens
//    (GenerationRequest::resume_tokens): the output continues without a gap
//    or a duplicate, and a greedy one equals an uninterrupted run.
//
// The router's load comes from the leader's reports (LeaderLoad: free KV
// blocks); waiting and running are counted here (sent and not admitted /
// admitted and not finished).
//
// Moving queued requests to another replica (ReplicaSet::HandOff): while
// paused, TakeWaiting gives up the requests held here (those re-queued from
// the old plan's leader, with their output so far, and those submitted
// since) as HeldRequests; another LeaderLoop's Adopt sends them to its own
// leader (or holds them, paused), so a broken replica's requests resume on
// the replicas that serve while it re-plans, exactly as they would on its
// next plan. Running, nothing is taken: what was sent is at the leader.
//
// Thread-safety: as ReplicaLoop's; OnUpdates from the control server's
// thread only (one caller at a time). State shared by the threads is
// guarded by mu_; callbacks run with no lock held: OnUpdates' on its
// thread, those of requests ended by Cancel, Stop or a failed send on the
// caller's. Stop waits for an OnUpdates running callbacks to return, so no
// update's callback runs after Stop's.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/base/mutex.h"
#include "common/base/thread_annotations.h"
#include "common/engine/output_processor.h"
#include "common/engine/scheduler.h"
#include "common/format/model_config.h"
#include "common/metrics/metrics_registry.h"
#include "common/wire/control.pb.h"
#include "coordinator/control/control_server.h"
#include "coordinator/serving/replica_loop.h"

namespace tessera {

class LeaderLoop : public ReplicaLoop {
 public:
  // Everything here outlives the loop. `options.output` draws the request
  // ids (the replica set's shared processor); `has_tokenizer`: stop strings
  // can be served. `replica`: the metrics' label.
  LeaderLoop(const ModelConfig& model, bool has_tokenizer, int64_t block_size,
             SchedulerOptions options, ControlServer* control, MetricsRegistry* metrics,
             int replica);
  ~LeaderLoop() override;
  LeaderLoop(const LeaderLoop&) = delete;
  LeaderLoop& operator=(const LeaderLoop&) = delete;

  // ReplicaLoop. `executor` is the plan's RemoteExecutor: it names the
  // leader (RemoteExecutor::leader) and its health says when the plan broke.
  void Start(std::shared_ptr<StepExecutor> executor, Health health, int64_t kv_blocks,
             uint64_t plan_version) override EXCLUDES(mu_);
  bool started() const override { return started_.load(std::memory_order_acquire); }
  void Stop() override EXCLUDES(mu_);
  void Wake() override EXCLUDES(mu_);
  std::vector<ReplicaMigrant> TakeWaiting() override EXCLUDES(mu_);
  Status Adopt(std::vector<ReplicaMigrant>* migrants) override EXCLUDES(mu_);
  int64_t free_kv_blocks() const override { return free_blocks_.load(std::memory_order_relaxed); }
  int64_t kv_blocks() const override { return kv_blocks_.load(std::memory_order_relaxed); }
  std::optional<int> Pause(double drain_seconds) override EXCLUDES(mu_);
  bool SwapExecutor(std::shared_ptr<StepExecutor> executor, Health health,
                    uint64_t plan_version) override EXCLUDES(mu_);
  bool Resume() override EXCLUDES(mu_);

  // RequestSink.
  StatusOr<std::vector<int64_t>> Submit(std::vector<GenerationRequest> requests,
                                        std::vector<RequestCallbacks> callbacks) override
      EXCLUDES(mu_);
  void Cancel(const std::vector<int64_t>& ids) override EXCLUDES(mu_);
  size_t waiting() const override EXCLUDES(mu_);
  size_t running() const override EXCLUDES(mu_);

  // The control server's thread: applies the leader `worker_id`'s updates
  // and runs their callbacks before it returns. Returns false when they
  // were dropped (not the current plan's leader, or stopped); `updates` is
  // left as it was then.
  bool OnUpdates(const std::string& worker_id, control::RequestUpdates&& updates) EXCLUDES(mu_);

 private:
  struct Request {
    int64_t id = 0;
    GenerationRequest request;
    // Shared with the Deliveries in flight: a token costs no copy of them.
    std::shared_ptr<const RequestCallbacks> callbacks;
    GenerationResult result;  // tokens, logprobs and text delivered so far
    bool sent = false;        // to the current plan's leader
    bool admitted = false;    // by it, since it was sent
    bool cancelled = false;
  };
  // What one request's callbacks are told, in this order: its admissions,
  // its prompt's log-probabilities, its tokens, its finish. Run on the
  // control server's thread (or the caller's) with no lock held.
  struct Delivery {
    std::shared_ptr<const RequestCallbacks> callbacks;
    uint32_t admissions = 0;
    std::optional<std::vector<SampledToken>> prompt_logprobs;
    size_t first_token = 0;  // its tokens: Deliveries::tokens[first_token, +token_count)
    size_t token_count = 0;
    std::optional<GenerationResult> finish;
  };
  struct DeliveredToken {
    std::string text;
    int32_t id = -1;
    std::optional<SampledToken> logprobs;
  };
  // OnUpdates keeps one and reuses its storage: a token costs no allocation.
  struct Deliveries {
    std::vector<Delivery> items;
    std::vector<DeliveredToken> tokens;  // the items' tokens, in order
  };
  enum class Mode { kRunning, kDraining, kPaused };

  // Applies one RequestUpdates (under mu_): its deliveries go to `out`, in
  // order.
  void ApplyLocked(control::RequestUpdates& updates, Deliveries& out) REQUIRES(mu_);
  void ApplyOne(Request& r, control::RequestUpdate& u, Deliveries& out) REQUIRES(mu_);
  // Sends requests `ids` (in order; the unfinished ones) to the leader in
  // one Generate, with the tokens each already has; when the send fails
  // (the leader is gone) they are held for the next plan.
  void SendLocked(const std::vector<int64_t>& ids) REQUIRES(mu_);
  // Ends `r` (it leaves requests_): its finish goes to `d`.
  void Finish(Request& r, FinishReason reason, Status error, Delivery& d) REQUIRES(mu_);
  // Finish with a delivery of its own, appended to `out`.
  void FinishAlone(Request& r, FinishReason reason, Status error, Deliveries& out) REQUIRES(mu_);
  // Sets r.admitted, keeping admitted_count_.
  void SetAdmittedLocked(Request& r, bool admitted) REQUIRES(mu_);
  static void Run(Deliveries& deliveries);

  const ModelConfig& model_;
  const bool has_tokenizer_;
  const int64_t block_size_;
  const SchedulerOptions options_;
  ControlServer* const control_;
  MetricsRegistry* const metrics_;
  const std::string replica_;

  std::atomic<bool> started_{false};
  std::atomic<int64_t> free_blocks_{0};
  std::atomic<int64_t> kv_blocks_{0};

  mutable Mutex mu_;
  std::condition_variable_any drain_cv_;  // Pause: a request finished, or health changed
  // Stop: the OnUpdates running callbacks returned (delivering_ fell to 0).
  std::condition_variable_any delivered_cv_;
  bool stop_ GUARDED_BY(mu_) = false;
  Mode mode_ GUARDED_BY(mu_) = Mode::kRunning;
  uint64_t plan_version_ GUARDED_BY(mu_) = 0;  // 0 while paused: no updates taken
  std::string leader_ GUARDED_BY(mu_);
  Health health_ GUARDED_BY(mu_);
  std::map<int64_t, Request> requests_ GUARDED_BY(mu_);  // unfinished, by id
  size_t admitted_count_ GUARDED_BY(mu_) = 0;            // of requests_ with `admitted`
  // Submits held while paused (each all or none), the re-queued first.
  std::deque<std::vector<int64_t>> held_ GUARDED_BY(mu_);
  int requeued_ GUARDED_BY(mu_) = 0;  // since the last Pause returned
  // An OnUpdates is running the callbacks of updates it applied (0 or 1:
  // one caller at a time).
  int delivering_ GUARDED_BY(mu_) = 0;
  // OnUpdates' deliveries, reused (its storage stays): only OnUpdates
  // touches it, under mu_ while applying and with no lock while delivering
  // (delivering_ says so, and Stop waits for it).
  Deliveries inbound_;
  // The metrics' series of this replica (null without metrics), looked up
  // once: an update costs no label lookup.
  Gauge* used_blocks_ = nullptr;
  Counter* preemptions_ = nullptr;
  Counter* prefix_queries_ = nullptr;
  Counter* prefix_hits_ = nullptr;
  // The leader's scheduler counters (LeaderLoad) of plan counted_plan_
  // already added to the metrics: its next load adds the growth.
  uint64_t counted_plan_ GUARDED_BY(mu_) = 0;
  uint64_t counted_preemptions_ GUARDED_BY(mu_) = 0;
  uint64_t counted_prefix_queries_ GUARDED_BY(mu_) = 0;
  uint64_t counted_prefix_hits_ GUARDED_BY(mu_) = 0;
  // Publishes the growth of the scheduler counters of `updates`' load.
  void CountSchedulerLocked(const control::RequestUpdates& updates) REQUIRES(mu_);
};

}  // namespace tessera
