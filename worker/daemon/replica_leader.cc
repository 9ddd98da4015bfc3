#include "worker/daemon/replica_leader.h"

#include <chrono>
#include <utility>

#include "common/engine/generation_codec.h"
#include "common/wire/control_codec.h"

namespace tessera {

SchedulerOptions LeaderSchedulerOptions(const control::LeaderOptions& leader,
                                        uint64_t plan_version) {
  SchedulerOptions o = LeaderOptionsFromProto(leader, plan_version);
  // A failed step (a lost tp peer) ends the plan, not the requests: the
  // coordinator re-plans and resumes them from the tokens delivered.
  o.requeue_on_executor_error = true;
  return o;
}

ReplicaLeader::ReplicaLeader(const ModelConfig& model, const Tokenizer* tokenizer,
                             StepExecutor* executor, int64_t kv_blocks, int64_t block_size,
                             SchedulerOptions options, SendFn send)
    : plan_version_(options.plan_version),
      send_(std::move(send)),
      allocator_(kv_blocks),
      free_kv_blocks_(allocator_.num_free()),
      sent_free_kv_blocks_(allocator_.num_free()) {
  options.on_output_batch = [this] { FlushFromOutput(); };
  scheduler_ = std::make_unique<Scheduler>(model, executor, &allocator_, block_size, tokenizer,
                                           std::move(options));
}

// The scheduler's destructor fails what is left (its callbacks append to
// pending_, never sent: the coordinator decides what becomes of them).
ReplicaLeader::~ReplicaLeader() {
  closing_ = true;
  scheduler_.reset();
}

control::RequestUpdate& ReplicaLeader::PendingLocked(int64_t request_id) {
  auto it = pending_index_.find(request_id);
  if (it != pending_index_.end()) return pending_[it->second];
  pending_index_.emplace(request_id, pending_.size());
  pending_.emplace_back().set_request_id(request_id);
  return pending_.back();
}

RequestCallbacks ReplicaLeader::Callbacks(int64_t request_id) {
  RequestCallbacks cb;
  cb.on_admit = [this, request_id] {
    MutexLock lock(&mu_);
    control::RequestUpdate& u = PendingLocked(request_id);
    u.set_admissions(u.admissions() + 1);
  };
  cb.on_prompt_logprobs = [this, request_id](const std::vector<SampledToken>& prompt) {
    MutexLock lock(&mu_);
    PromptLogprobsToProto(prompt, PendingLocked(request_id).mutable_prompt_logprobs());
  };
  cb.on_token = [this, request_id](const std::string& text, int32_t token,
                                   const SampledToken* logprobs) {
    MutexLock lock(&mu_);
    TokenUpdateToProto(text, token, logprobs, PendingLocked(request_id).add_tokens());
  };
  cb.on_finish = [this, request_id](const GenerationResult& r) {
    MutexLock lock(&mu_);
    control::RequestUpdate& u = PendingLocked(request_id);
    u.set_finished(true);
    u.set_finish_reason(FinishReasonName(r.finish_reason));
    if (r.finish_reason == FinishReason::kError) *u.mutable_error() = StatusToError(r.error);
    u.set_prompt_tokens(r.prompt_tokens);
    u.set_cached_tokens(r.cached_tokens);
    u.set_preemptions(static_cast<uint32_t>(r.preemptions));
    finished_.push_back(request_id);
  };
  return cb;
}

void ReplicaLeader::Refuse(const control::Generate& generate, const Status& why) {
  {
    MutexLock lock(&mu_);
    for (const control::GenerationRequest& r : generate.requests()) {
      control::RequestUpdate& u = PendingLocked(r.request_id());
      u.set_finished(true);
      u.set_finish_reason(FinishReasonName(FinishReason::kError));
      *u.mutable_error() = StatusToError(why);
    }
  }
  NoteLoad();
  Flush(true).IgnoreError();  // a send that fails fails the next Step's flush too
}

void ReplicaLeader::ReapFinished() {
  std::vector<int64_t> finished;
  {
    MutexLock lock(&mu_);
    finished.swap(finished_);
  }
  for (int64_t id : finished) scheduler_ids_.erase(id);
}

void ReplicaLeader::Handle(const control::Envelope& e) {
  ReapFinished();
  if (e.has_cancel_requests()) {
    if (e.cancel_requests().plan_version() != plan_version_) return;  // nothing of ours
    for (int64_t id : e.cancel_requests().request_ids()) {
      auto it = scheduler_ids_.find(id);
      if (it != scheduler_ids_.end()) scheduler_->Cancel(it->second);
    }
    return;
  }
  if (!e.has_generate()) return;
  const control::Generate& g = e.generate();
  if (g.plan_version() != plan_version_)
    return Refuse(g, Unavailable("Generate for plan " + std::to_string(g.plan_version()) +
                                 " reached the leader of plan " + std::to_string(plan_version_)));
  std::vector<GenerationRequest> requests;
  std::vector<RequestCallbacks> callbacks;
  for (const control::GenerationRequest& r : g.requests()) {
    if (scheduler_ids_.count(r.request_id()))
      return Refuse(g, InvalidArgument("request_id " + std::to_string(r.request_id()) +
                                       " is already queued or running on this leader"));
    requests.push_back(GenerationRequestFromProto(r));
    callbacks.push_back(Callbacks(r.request_id()));
  }
  auto ids = scheduler_->EnqueueAll(std::move(requests), std::move(callbacks));
  if (!ids.ok()) return Refuse(g, ids.status());
  for (int i = 0; i < g.requests_size(); ++i)
    scheduler_ids_.emplace(g.requests(i).request_id(), (*ids)[static_cast<size_t>(i)]);
  NoteLoad();
}

StatusOr<bool> ReplicaLeader::Step() {
  StatusOr<bool> ran = scheduler_->RunOnce();
  NoteLoad();
  ReapFinished();
  // A busy leader's output thread sends (FlushFromOutput), and so does
  // this thread what waited past kLeaderFlushSeconds (updates a batch made
  // too soon after the last send); an idle leader, or one whose step
  // failed, sends what it has at once. A failed send of the output thread
  // surfaces here.
  const Status sent = Flush(/*force=*/!ran.ok() || !*ran);
  if (!ran.ok()) return ran;
  if (!sent.ok()) return sent;
  return ran;
}

void ReplicaLeader::NoteLoad() {
  free_kv_blocks_ = allocator_.num_free();
  waiting_ = scheduler_->waiting();
  running_ = scheduler_->running();
  const SchedulerStats& st = scheduler_->stats();
  preemptions_ = st.preemptions;
  prefix_query_tokens_ = st.prefix_cache_query_tokens;
  prefix_hit_tokens_ = st.prefix_cache_hit_tokens;
}

void ReplicaLeader::FlushFromOutput() {
  if (closing_) return;
  const Status sent = Flush(false);
  if (sent.ok()) return;
  MutexLock lock(&flush_mu_);
  if (send_error_.ok()) send_error_ = sent;
}

bool ReplicaLeader::busy() const {
  if (scheduler_->waiting() > 0 || scheduler_->running() > 0) return true;
  // The load now (nothing waits or runs) against the one last sent.
  if (allocator_.num_free() != sent_free_kv_blocks_.load() || sent_waiting_.load() != 0 ||
      sent_running_.load() != 0)
    return true;
  // The output thread may have made updates (a finish) after the last flush.
  MutexLock lock(&mu_);
  return !pending_.empty();
}

Status ReplicaLeader::Flush(bool force) {
  // One send at a time, the updates taken and sent under flush_mu_, so
  // messages leave in the order their updates were made.
  MutexLock flush_lock(&flush_mu_);
  if (!send_error_.ok()) return std::exchange(send_error_, Status::Ok());
  const auto now = std::chrono::steady_clock::now();
  if (!force && now - last_flush_ < std::chrono::duration<double>(kLeaderFlushSeconds))
    return Status::Ok();
  control::Envelope e;
  control::RequestUpdates* out = e.mutable_request_updates();
  {
    MutexLock lock(&mu_);
    // Nothing to send, unless the owner flushes a load the coordinator has not been told.
    if (pending_.empty() && !(force && LoadUnsent())) return Status::Ok();
    for (control::RequestUpdate& u : pending_) *out->add_updates() = std::move(u);
    pending_.clear();
    pending_index_.clear();
  }
  last_flush_ = now;
  out->set_plan_version(plan_version_);
  control::LeaderLoad* load = out->mutable_load();
  const uint64_t waiting = waiting_.load(), running = running_.load();
  const int64_t free_blocks = free_kv_blocks_.load();
  load->set_waiting(waiting);
  load->set_running(running);
  load->set_free_kv_blocks(static_cast<uint64_t>(free_blocks));
  sent_waiting_ = waiting;
  sent_running_ = running;
  sent_free_kv_blocks_ = free_blocks;
  load->set_kv_blocks(static_cast<uint64_t>(allocator_.num_blocks()));
  load->set_preemptions(static_cast<uint64_t>(preemptions_.load()));
  load->set_prefix_cache_query_tokens(static_cast<uint64_t>(prefix_query_tokens_.load()));
  load->set_prefix_cache_hit_tokens(static_cast<uint64_t>(prefix_hit_tokens_.load()));
  return send_(std::move(e));
}

}  // namespace tessera
