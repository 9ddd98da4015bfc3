// ReplicaLeader: a replica that schedules itself. Its leader (the worker
// of stage 0, tp rank 0; AssignShard.leader set) owns the replica's
// Scheduler, KV block allocator and output processing (detokenization,
// stop strings, log-probabilities), and the coordinator only routes
// requests to it and relays their progress (issue #33, docs/architecture.md
// "A replica that schedules itself").
//
// Messages (common/wire/control.proto):
//  - in: Generate (queue requests, all or none) and CancelRequests, named
//    by the coordinator's request ids;
//  - out: RequestUpdates, batched per iteration: for each request that
//    moved, its admissions, prompt log-probabilities, tokens with their
//    final text and log-probabilities, and its finish; plus the leader's
//    load (waiting, running, free KV blocks) for the coordinator's router.
// A Generate the scheduler refuses (queue full, a prompt over max_context,
// an id outside the vocab) comes back as a finished update with the error
// for each of its requests. A Generate or CancelRequests of another plan
// is refused the same way (the coordinator re-sends to the current one).
//
// Updates of one request arrive in the order RequestCallbacks promises
// (admissions, prompt log-probabilities, tokens, finish). The scheduler's
// output thread turns a step's tokens into text while the next step runs
// and, after each batch of them (the scheduler's on_output_batch hook),
// sends what it made: a token leaves during the next step, not after it
// (a step's time off every token's latency, TTFT included). It sends at
// most once per kLeaderFlushSeconds: what a batch made within that time of
// the last send goes with a later batch, so iterations faster than that
// (small batches, a fast GPU) share one message and the coordinator's cost
// follows the tokens, not the steps; a step of a few milliseconds or more
// sends one message each. The owner sends after each iteration what waited
// past that time, and at once when the leader goes idle, a step fails or a
// Generate is refused.
//
// Thread-safety: the constructor, Handle, Step and busy() on the owner
// thread (the worker's main thread, which owns the model and KV cache);
// the scheduler's callbacks run on its output thread and append to the
// pending updates (guarded by mu_); a send runs on either thread, one at a
// time (flush_mu_, taken before mu_), so messages leave in order. `send`
// must be safe from both threads (ControlClient::Send is).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <unordered_map>
#include <vector>

#include "common/base/mutex.h"
#include "common/base/status.h"
#include "common/base/thread_annotations.h"
#include "common/engine/block_allocator.h"
#include "common/engine/scheduler.h"
#include "common/format/model_config.h"
#include "common/tokenizer/tokenizer.h"
#include "common/wire/control.pb.h"

namespace tessera {

// AssignShard.leader -> the leader's scheduler options (with
// requeue_on_executor_error: a failed step fails the plan, and the
// coordinator resumes the requests on the next one).
SchedulerOptions LeaderSchedulerOptions(const control::LeaderOptions& leader,
                                        uint64_t plan_version);

// The shortest time between two RequestUpdates of a busy leader, seconds.
inline constexpr double kLeaderFlushSeconds = 0.002;

class ReplicaLeader {
 public:
  // Sends one envelope to the coordinator (ControlClient::Send).
  using SendFn = std::function<Status(control::Envelope)>;
  // `model`, `tokenizer` (may be null: stop strings are then refused) and
  // `executor` (the replica's stage-0 executor) outlive the leader.
  // `kv_blocks` blocks of `block_size` tokens (the worker's KV cache).
  ReplicaLeader(const ModelConfig& model, const Tokenizer* tokenizer, StepExecutor* executor,
                int64_t kv_blocks, int64_t block_size, SchedulerOptions options, SendFn send);
  ~ReplicaLeader();
  ReplicaLeader(const ReplicaLeader&) = delete;
  ReplicaLeader& operator=(const ReplicaLeader&) = delete;

  // A Generate or CancelRequests envelope (anything else is ignored).
  void Handle(const control::Envelope& envelope);
  // One scheduler iteration, then the updates so far go out. Returns
  // whether there was work. Errors: the executor's (the sequences it ran
  // have finished with an error update) or the send's.
  StatusOr<bool> Step();
  // Requests queued or running, updates not sent yet, or free KV blocks the coordinator has
  // not been told of: Step has work. Owner thread.
  bool busy() const EXCLUDES(mu_);
  uint64_t plan_version() const { return plan_version_; }

 private:
  RequestCallbacks Callbacks(int64_t request_id);
  control::RequestUpdate& PendingLocked(int64_t request_id) REQUIRES(mu_);
  void Refuse(const control::Generate& generate, const Status& why);
  // Sends the pending updates: always with `force`, else only when
  // kLeaderFlushSeconds have passed since the last send. Either thread.
  Status Flush(bool force) EXCLUDES(flush_mu_, mu_);
  // The scheduler's on_output_batch (output thread): Flush(false); a
  // failed send is kept for the owner's next Step.
  void FlushFromOutput() EXCLUDES(flush_mu_, mu_);
  // Owner thread: forgets the scheduler ids of finished requests.
  void ReapFinished() EXCLUDES(mu_);

  const uint64_t plan_version_;
  const SendFn send_;
  BlockAllocator allocator_;
  // The load the owner saw after its last iteration or message, for a send
  // from the output thread (the allocator is the owner's; the scheduler may
  // be going away while the output thread finishes).
  std::atomic<int64_t> free_kv_blocks_{0};
  // The load the last send told the coordinator. A finish the output thread sends carries the
  // load noted before the scheduler ended that sequence and freed its blocks: until a send has
  // told the coordinator the load it has now, the leader is busy (busy()), and the owner's
  // Flush sends the load even without updates. Else the router would see a running sequence
  // and blocks held by nothing for as long as the leader stays idle.
  std::atomic<int64_t> sent_free_kv_blocks_{0};
  std::atomic<uint64_t> sent_waiting_{0}, sent_running_{0};
  // Whether the noted load differs from the one last sent.
  bool LoadUnsent() const {
    return free_kv_blocks_.load() != sent_free_kv_blocks_.load() ||
           waiting_.load() != sent_waiting_.load() || running_.load() != sent_running_.load();
  }
  std::atomic<uint64_t> waiting_{0}, running_{0};
  std::atomic<int64_t> preemptions_{0}, prefix_query_tokens_{0}, prefix_hit_tokens_{0};
  // Owner thread: the load figures above, now.
  void NoteLoad();
  // Set before the scheduler goes: what its destructor fails is not sent.
  std::atomic<bool> closing_{false};
  std::unique_ptr<Scheduler> scheduler_;
  // Owner thread: coordinator request id -> scheduler id, for cancels.
  std::unordered_map<int64_t, int64_t> scheduler_ids_;

  Mutex flush_mu_;  // taken before mu_
  std::chrono::steady_clock::time_point last_flush_ GUARDED_BY(flush_mu_){};
  Status send_error_ GUARDED_BY(flush_mu_);  // a failed send on the output thread

  mutable Mutex mu_;
  std::vector<control::RequestUpdate> pending_ GUARDED_BY(mu_);
  std::unordered_map<int64_t, size_t> pending_index_ GUARDED_BY(mu_);  // request id -> pending_
  std::vector<int64_t> finished_ GUARDED_BY(mu_);  // request ids finished, not reaped yet
};

}  // namespace tessera
