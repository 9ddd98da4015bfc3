#include "coordinator/serving/leader_loop.h"

#include <algorithm>
#include <utility>

#include "common/base/logging.h"
#include "common/engine/generation_codec.h"
#include "common/metrics/metric_catalog.h"
#include "common/wire/control_codec.h"
#include "coordinator/control/remote_executor.h"

namespace tessera {

LeaderLoop::LeaderLoop(const ModelConfig& model, bool has_tokenizer, int64_t block_size,
                       SchedulerOptions options, ControlServer* control, MetricsRegistry* metrics,
                       int replica)
    : model_(model),
      has_tokenizer_(has_tokenizer),
      block_size_(block_size),
      options_(std::move(options)),
      control_(control),
      metrics_(metrics),
      replica_(std::to_string(replica)) {
  if (metrics_) {
    used_blocks_ = &metrics_->Gauge(metric::kKvCacheUsedBlocks).WithLabels({replica_});
    preemptions_ = &metrics_->Counter(metric::kPreemptionsTotal).WithLabels({replica_});
    prefix_queries_ =
        &metrics_->Counter(metric::kPrefixCacheQueriesTokensTotal).WithLabels({replica_});
    prefix_hits_ = &metrics_->Counter(metric::kPrefixCacheHitsTokensTotal).WithLabels({replica_});
  }
}

LeaderLoop::~LeaderLoop() { Stop(); }

void LeaderLoop::Start(std::shared_ptr<StepExecutor> executor, Health health, int64_t kv_blocks,
                       uint64_t plan_version) {
  auto remote = std::dynamic_pointer_cast<RemoteExecutor>(executor);
  TESSERA_CHECK(remote != nullptr);
  kv_blocks_.store(kv_blocks, std::memory_order_relaxed);
  free_blocks_.store(kv_blocks, std::memory_order_relaxed);
  {
    MutexLock lock(&mu_);
    plan_version_ = plan_version;
    leader_ = remote->leader();
    health_ = std::move(health);
  }
  started_.store(true, std::memory_order_release);
}

void LeaderLoop::Stop() {
  {
    MutexLock lock(&mu_);
    if (stop_) return;
    stop_ = true;  // OnUpdates takes nothing more
    // The callbacks of updates already applied run before any of Stop's.
    delivered_cv_.wait(mu_, [&]() REQUIRES(mu_) { return delivering_ == 0; });
  }
  drain_cv_.notify_all();
  // Every request left ends with an error (a stream gets an error event
  // and [DONE]) instead of a cut connection.
  Deliveries out;
  {
    MutexLock lock(&mu_);
    std::vector<int64_t> ids;
    for (auto& [id, r] : requests_) ids.push_back(id);
    for (int64_t id : ids)
      FinishAlone(requests_.at(id), FinishReason::kError, Unavailable(kShuttingDownMessage), out);
    held_.clear();
  }
  Run(out);
}

void LeaderLoop::Wake() { drain_cv_.notify_all(); }

std::vector<ReplicaMigrant> LeaderLoop::TakeWaiting() {
  std::vector<ReplicaMigrant> out;
  MutexLock lock(&mu_);
  if (stop_ || mode_ != Mode::kPaused) return out;
  for (const std::vector<int64_t>& ids : held_)
    for (int64_t id : ids) {
      auto it = requests_.find(id);
      if (it == requests_.end()) continue;  // cancelled while held
      Request& r = it->second;
      HeldRequest h;
      h.id = id;
      h.request = std::move(r.request);
      h.callbacks = std::move(r.callbacks);
      h.result = std::move(r.result);
      SetAdmittedLocked(r, false);
      requests_.erase(it);
      out.emplace_back(std::move(h));
    }
  held_.clear();
  return out;
}

Status LeaderLoop::Adopt(std::vector<ReplicaMigrant>* migrants) {
  if (migrants->empty()) return Status::Ok();
  if (!started()) return Unavailable("replica " + replica_ + " is not serving yet");
  const int64_t blocks = kv_blocks_.load(std::memory_order_relaxed);
  for (const ReplicaMigrant& m : *migrants) {
    const auto* h = std::get_if<HeldRequest>(&m);
    if (h == nullptr)
      return FailedPrecondition("request " + std::to_string(MigrantId(m)) +
                                " was queued by a coordinator's scheduler; replica " + replica_ +
                                " schedules on its leader");
    TESSERA_RETURN_IF_ERROR(
        ValidateGenerationRequest(h->request, model_, options_, has_tokenizer_, blocks, block_size_)
            .WithContext("request " + std::to_string(h->id) + " moving to replica " + replica_));
  }
  std::vector<int64_t> ids;
  {
    MutexLock lock(&mu_);
    if (stop_) return Unavailable(kShuttingDownMessage);
    for (ReplicaMigrant& m : *migrants) {
      HeldRequest& h = std::get<HeldRequest>(m);
      Request& r = requests_[h.id];
      r.id = h.id;
      r.request = std::move(h.request);
      // Its Submit's other requests went elsewhere or finished: it
      // prefills alone.
      r.request.share_prompt_of = -1;
      r.callbacks = std::move(h.callbacks);
      r.result = std::move(h.result);
      ids.push_back(h.id);
    }
    if (mode_ == Mode::kRunning) {
      SendLocked(ids);
    } else {
      held_.push_front(ids);  // they waited longest
    }
  }
  migrants->clear();
  return Status::Ok();
}

StatusOr<std::vector<int64_t>> LeaderLoop::Submit(std::vector<GenerationRequest> requests,
                                                  std::vector<RequestCallbacks> callbacks) {
  TESSERA_CHECK(requests.size() == callbacks.size());
  if (!started()) return Unavailable("replica " + replica_ + " is not serving yet");
  const int64_t blocks = kv_blocks_.load(std::memory_order_relaxed);
  for (size_t i = 0; i < requests.size(); ++i) {
    const GenerationRequest& r = requests[i];
    TESSERA_RETURN_IF_ERROR(
        ValidateGenerationRequest(r, model_, options_, has_tokenizer_, blocks, block_size_));
    const int32_t src = r.share_prompt_of;
    if (src >= 0 && (static_cast<size_t>(src) >= i ||
                     requests[static_cast<size_t>(src)].prompt_ids != r.prompt_ids))
      return InvalidArgument("share_prompt_of: request " + std::to_string(i) + " names request " +
                             std::to_string(src) + ", not an earlier one with the same prompt");
  }
  std::vector<int64_t> ids;
  {
    MutexLock lock(&mu_);
    if (stop_) return Unavailable(kShuttingDownMessage);
    const size_t queued = requests_.size() - admitted_count_;
    if (static_cast<int64_t>(queued + requests.size()) > options_.queue_limit)
      return ResourceExhausted("the request queue is full (" +
                               std::to_string(options_.queue_limit) + " waiting); retry later");
    for (size_t i = 0; i < requests.size(); ++i) {
      int64_t id = options_.output->NextId();
      if (id == 0) id = options_.output->NextId();  // the wire's ids are > 0
      Request& r = requests_[id];
      r.id = id;
      r.request = std::move(requests[i]);
      r.callbacks = std::make_shared<const RequestCallbacks>(std::move(callbacks[i]));
      r.result.prompt_tokens = static_cast<int64_t>(r.request.prompt_ids.size());
      ids.push_back(id);
    }
    if (mode_ == Mode::kRunning) {
      SendLocked(ids);
    } else {
      held_.push_back(ids);
    }
  }
  return ids;
}

void LeaderLoop::Cancel(const std::vector<int64_t>& ids) {
  Deliveries out;
  {
    MutexLock lock(&mu_);
    control::Envelope e;
    control::CancelRequests* c = e.mutable_cancel_requests();
    c->set_plan_version(plan_version_);
    for (int64_t id : ids) {
      auto it = requests_.find(id);
      if (it == requests_.end()) continue;
      it->second.cancelled = true;
      if (it->second.sent) {
        c->add_request_ids(id);
      } else {
        // Held here (paused): it ends now. Its held entry is skipped at Resume.
        FinishAlone(it->second, FinishReason::kCancelled, Status::Ok(), out);
      }
    }
    if (c->request_ids_size() > 0 && plan_version_ != 0) {
      Status s = control_->Send(leader_, std::move(e));
      if (!s.ok())
        TESSERA_LOG_WARN("coordinator", "replica {}: cancel to leader {}: {}", replica_, leader_,
                         s.ToString());
    }
  }
  Run(out);
}

void LeaderLoop::SetAdmittedLocked(Request& r, bool admitted) {
  if (r.admitted == admitted) return;
  r.admitted = admitted;
  if (admitted) {
    ++admitted_count_;
  } else {
    --admitted_count_;
  }
}

size_t LeaderLoop::waiting() const {
  MutexLock lock(&mu_);
  return requests_.size() - admitted_count_;
}

size_t LeaderLoop::running() const {
  MutexLock lock(&mu_);
  return admitted_count_;
}

void LeaderLoop::SendLocked(const std::vector<int64_t>& ids) {
  control::Envelope e;
  control::Generate* g = e.mutable_generate();
  g->set_plan_version(plan_version_);
  std::vector<int64_t> sent;
  std::map<int64_t, int32_t> position;  // request id -> its index in this Generate
  for (int64_t id : ids) {
    auto it = requests_.find(id);
    if (it == requests_.end()) continue;  // finished (cancelled) while held
    const Request& r = it->second;
    // A choice shares its source's prompt blocks when both go now, neither
    // resumed, as they first did; otherwise it prefills alone.
    int32_t share = r.request.share_prompt_of;
    if (share >= 0) {
      const size_t src = static_cast<size_t>(share);
      auto p = src < ids.size() ? position.find(ids[src]) : position.end();
      const bool fresh = r.result.tokens.empty() && p != position.end() &&
                         requests_.at(p->first).result.tokens.empty();
      share = fresh ? p->second : -1;
    }
    position[id] = static_cast<int32_t>(sent.size());
    // The request as kept, with the tokens it already has to resume from
    // (encoded in place: no copy of the request).
    control::GenerationRequest* out = g->add_requests();
    GenerationRequestToProto(id, r.request, out);
    out->set_share_prompt_of(share);
    out->clear_resume_tokens();
    out->mutable_resume_tokens()->Add(r.result.tokens.begin(), r.result.tokens.end());
    sent.push_back(id);
  }
  if (sent.empty()) return;
  Status s = control_->Send(leader_, std::move(e));
  if (!s.ok()) {
    // The leader is gone: the re-plan its loss starts pauses this loop and
    // sends these to the next plan's leader.
    TESSERA_LOG_WARN("coordinator", "replica {}: Generate to leader {}: {}", replica_, leader_,
                     s.ToString());
    held_.push_front(sent);
    return;
  }
  for (int64_t id : sent) {
    Request& r = requests_.at(id);
    r.sent = true;
    SetAdmittedLocked(r, false);
  }
}

void LeaderLoop::Finish(Request& r, FinishReason reason, Status error, Delivery& d) {
  r.result.finish_reason = reason;
  r.result.error = std::move(error);
  SetAdmittedLocked(r, false);  // it leaves requests_
  d.callbacks = r.callbacks;
  d.finish = std::move(r.result);
  requests_.erase(r.id);
  drain_cv_.notify_all();
}

void LeaderLoop::FinishAlone(Request& r, FinishReason reason, Status error, Deliveries& out) {
  Finish(r, reason, std::move(error), out.items.emplace_back());
}

bool LeaderLoop::OnUpdates(const std::string& worker_id, control::RequestUpdates&& updates) {
  {
    MutexLock lock(&mu_);
    // Paused (plan_version_ 0), a plan that ended, or not its leader.
    if (stop_ || plan_version_ == 0 || updates.plan_version() != plan_version_ ||
        worker_id != leader_)
      return false;
    ApplyLocked(updates, inbound_);
    ++delivering_;
  }
  // Applied and delivered on this thread, in the leader's order: no queue
  // and no other thread to wake (a wake per update was about a fifth of
  // the coordinator's CPU in decode64leader, bench/results/fleet_sim.md).
  // However the callbacks return (the control server's loop catches what
  // one throws), the deliveries are done with and Stop may go on.
  struct Done {
    LeaderLoop* self;
    ~Done() {
      self->inbound_.items.clear();
      self->inbound_.tokens.clear();
      MutexLock lock(&self->mu_);
      if (--self->delivering_ == 0 && self->stop_) self->delivered_cv_.notify_all();
    }
  } done{this};
  Run(inbound_);
  return true;
}

void LeaderLoop::ApplyLocked(control::RequestUpdates& updates, Deliveries& out) {
  const int64_t blocks = kv_blocks_.load(std::memory_order_relaxed);
  const int64_t free_blocks =
      std::min<int64_t>(static_cast<int64_t>(updates.load().free_kv_blocks()), blocks);
  free_blocks_.store(free_blocks, std::memory_order_relaxed);
  if (metrics_) {
    used_blocks_->Set(static_cast<double>(blocks - free_blocks));
    CountSchedulerLocked(updates);
  }
  for (control::RequestUpdate& u : *updates.mutable_updates()) {
    auto it = requests_.find(u.request_id());
    if (it == requests_.end() || !it->second.sent) continue;  // finished, or not the leader's
    ApplyOne(it->second, u, out);
  }
}

void LeaderLoop::CountSchedulerLocked(const control::RequestUpdates& updates) {
  if (updates.plan_version() != counted_plan_) {
    // A new plan's leader: its scheduler counts from 0.
    counted_plan_ = updates.plan_version();
    counted_preemptions_ = counted_prefix_queries_ = counted_prefix_hits_ = 0;
  }
  const control::LeaderLoad& load = updates.load();
  // Loads of one plan only grow; an Inc of 0 still shows the replica's series.
  const auto add = [&](Counter* series, uint64_t now, uint64_t& counted) {
    const uint64_t growth = now > counted ? now - counted : 0;
    series->Inc(static_cast<double>(growth));
    counted = std::max(counted, now);
  };
  add(preemptions_, load.preemptions(), counted_preemptions_);
  add(prefix_queries_, load.prefix_cache_query_tokens(), counted_prefix_queries_);
  add(prefix_hits_, load.prefix_cache_hit_tokens(), counted_prefix_hits_);
}

void LeaderLoop::ApplyOne(Request& r, control::RequestUpdate& u, Deliveries& out) {
  Delivery& d = out.items.emplace_back();
  d.callbacks = r.callbacks;
  d.first_token = out.tokens.size();
  d.admissions = u.admissions();
  if (u.admissions() > 0) SetAdmittedLocked(r, true);
  if (u.prompt_logprobs_size() > 0) {
    r.result.prompt_logprobs = PromptLogprobsFromProto(u.prompt_logprobs());
    if (r.callbacks->on_prompt_logprobs) d.prompt_logprobs = r.result.prompt_logprobs;
  }
  const bool want_logprobs = r.request.sampling.logprobs >= 0;
  const bool deliver_tokens = static_cast<bool>(r.callbacks->on_token);
  for (control::TokenUpdate& t : *u.mutable_tokens()) {
    std::optional<SampledToken> logprobs = TokenLogprobsFromProto(t);
    if (t.token_id() >= 0) {
      r.result.tokens.push_back(t.token_id());
      if (want_logprobs) {
        SampledToken entry = logprobs.value_or(SampledToken{});
        entry.token_id = t.token_id();
        r.result.logprobs.push_back(entry);
      }
    }
    r.result.text += t.text();
    if (deliver_tokens)
      out.tokens.push_back({std::move(*t.mutable_text()), t.token_id(), std::move(logprobs)});
  }
  d.token_count = out.tokens.size() - d.first_token;
  if (!u.finished()) return;
  r.result.prompt_tokens = u.prompt_tokens();
  r.result.cached_tokens = u.cached_tokens();
  r.result.preemptions += static_cast<int>(u.preemptions());
  const FinishReason reason =
      FinishReasonFromName(u.finish_reason()).value_or(FinishReason::kError);
  Finish(r, reason, u.has_error() ? ErrorToStatus(u.error()) : Status::Ok(), d);
}

void LeaderLoop::Run(Deliveries& deliveries) {
  for (Delivery& d : deliveries.items) {
    const RequestCallbacks& cb = *d.callbacks;
    for (uint32_t i = 0; i < d.admissions; ++i)
      if (cb.on_admit) cb.on_admit();
    if (d.prompt_logprobs && cb.on_prompt_logprobs) cb.on_prompt_logprobs(*d.prompt_logprobs);
    for (size_t i = d.first_token; i < d.first_token + d.token_count; ++i) {
      const DeliveredToken& t = deliveries.tokens[i];
      cb.on_token(t.text, t.id, t.logprobs ? &*t.logprobs : nullptr);
    }
    if (d.finish && cb.on_finish) cb.on_finish(*d.finish);
  }
  deliveries.items.clear();
  deliveries.tokens.clear();
}

std::optional<int> LeaderLoop::Pause(double drain_seconds) {
  if (!started()) return std::nullopt;
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(drain_seconds));
  int requeued = 0;
  {
    MutexLock lock(&mu_);
    if (stop_) return std::nullopt;
    mode_ = Mode::kDraining;
    // The requests at the leader get drain_seconds to finish (none once the
    // plan is broken); new ones are held from now on.
    auto sent_left = [&]() REQUIRES(mu_) {
      for (const auto& [id, r] : requests_)
        if (r.sent) return true;
      return false;
    };
    while (!stop_ && sent_left() && (!health_ || health_().ok()) &&
           std::chrono::steady_clock::now() < deadline)
      drain_cv_.wait_until(mu_, deadline);
    if (stop_) return std::nullopt;
    // What the leader still has resumes on the next plan from the tokens
    // delivered; the old plan's later updates are dropped.
    control::Envelope e;
    control::CancelRequests* c = e.mutable_cancel_requests();
    c->set_plan_version(plan_version_);
    std::vector<int64_t> back;
    for (auto& [id, r] : requests_) {
      if (!r.sent) continue;
      r.sent = false;
      SetAdmittedLocked(r, false);
      back.push_back(id);
      c->add_request_ids(id);
    }
    if (!back.empty() && plan_version_ != 0)
      control_->Send(leader_, std::move(e)).IgnoreError();  // best effort: the plan ends
    for (auto it = back.rbegin(); it != back.rend(); ++it) held_.push_front({*it});
    requeued_ += static_cast<int>(back.size());
    requeued = requeued_;
    requeued_ = 0;
    plan_version_ = 0;  // the old plan's later updates are dropped
    mode_ = Mode::kPaused;
  }
  if (requeued > 0)
    TESSERA_LOG_INFO("coordinator", "replica {}: {} request(s) re-queued for the next plan",
                     replica_, requeued);
  return requeued;
}

bool LeaderLoop::SwapExecutor(std::shared_ptr<StepExecutor> executor, Health health,
                              uint64_t plan_version) {
  auto remote = std::dynamic_pointer_cast<RemoteExecutor>(executor);
  TESSERA_CHECK(remote != nullptr);
  MutexLock lock(&mu_);
  if (stop_) return false;
  plan_version_ = plan_version;
  leader_ = remote->leader();
  health_ = std::move(health);
  return true;
}

bool LeaderLoop::Resume() {
  MutexLock lock(&mu_);
  if (stop_) return false;
  mode_ = Mode::kRunning;
  std::deque<std::vector<int64_t>> held = std::move(held_);
  held_.clear();
  for (const std::vector<int64_t>& ids : held) SendLocked(ids);
  return true;
}

}  // namespace tessera
