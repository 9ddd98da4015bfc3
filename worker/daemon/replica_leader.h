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
// (admissions, prompt log-probabilities, tokens, finish). The output thread
// runs at most one iteration behind the scheduler (Scheduler's contract),
// so a token's update leaves with a later iteration's flush, or at once
// when the leader goes idle. A busy leader flushes at most once per
// kLeaderFlushSeconds: iterations faster than that (small batches, a fast
// GPU) share one message, so the coordinator's cost follows the tokens, not
// the steps; a step of a few milliseconds or more sends one message each.
//
// Thread-safety: the constructor, Handle, Step and busy() on the owner
// thread (the worker's main thread, which owns the model and KV cache);
// the scheduler's callbacks run on its output thread and only append to
// the pending updates (guarded by mu_).
#pragma once

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
  // Requests queued or running, or updates not sent yet: Step has work.
  bool busy() const EXCLUDES(mu_);
  uint64_t plan_version() const { return plan_version_; }

 private:
  RequestCallbacks Callbacks(int64_t request_id);
  control::RequestUpdate& PendingLocked(int64_t request_id) REQUIRES(mu_);
  void Refuse(const control::Generate& generate, const Status& why);
  Status Flush();

  const uint64_t plan_version_;
  const SendFn send_;
  BlockAllocator allocator_;
  std::unique_ptr<Scheduler> scheduler_;
  std::chrono::steady_clock::time_point last_flush_{};  // owner thread
  // Owner thread: coordinator request id -> scheduler id, for cancels.
  std::unordered_map<int64_t, int64_t> scheduler_ids_;

  mutable Mutex mu_;
  std::vector<control::RequestUpdate> pending_ GUARDED_BY(mu_);
  std::unordered_map<int64_t, size_t> pending_index_ GUARDED_BY(mu_);  // request id -> pending_
  std::vector<int64_t> finished_ GUARDED_BY(mu_);  // request ids finished since the last flush
};

}  // namespace tessera
