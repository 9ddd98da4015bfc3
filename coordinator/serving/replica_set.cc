#include "coordinator/serving/replica_set.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <unordered_set>
#include <utility>

#include "common/base/logging.h"
#include "common/engine/generation_codec.h"

namespace tessera {

namespace {

// How long the workers' registrations must pause before PlaceAll adopts the
// plans they hold when parallel.replicas = 0 (how many to adopt is then
// up to who registered).
constexpr std::chrono::milliseconds kRegistrationBatch{100};

RouterOptions RouterOptionsFor(const ReplicaSet::Context& c) {
  RouterOptions o;
  o.block_size = c.config->kv_cache.block_size;
  o.model_id = c.config->model.path;
  // Affinity pays only where the prefix cache can reuse the blocks; it may
  // leave a replica one micro-batch of tokens above the least loaded.
  o.affinity_slack_tokens =
      c.config->kv_cache.prefix_caching ? c.config->scheduler.max_batch_tokens : 0;
  return o;
}

int64_t Cost(const GenerationRequest& r) {
  return static_cast<int64_t>(r.prompt_ids.size()) + std::max<int64_t>(0, r.max_tokens);
}

}  // namespace

ReplicaSet::ReplicaSet(Context c)
    : c_(std::move(c)),
      placer_(c_.config, c_.model, c_.configured, c_.overrides, c_.max_context, c_.planner),
      router_(RouterOptionsFor(c_)),
      output_(std::make_shared<OutputProcessor>(c_.tokenizer)) {}

ReplicaSet::~ReplicaSet() {
  Stop();
  replicas_.clear();  // the schedulers first; the shared processor then runs what is left
  output_.reset();
}

void ReplicaSet::Start() {
  thread_ = std::thread([this] { PlaceAll(); });
}

void ReplicaSet::Stop() {
  if (thread_.joinable()) thread_.join();
  if (!placed()) return;
  // The loops first: a plan change waiting for its pause returns.
  for (auto& r : replicas_) r->loop->Stop();
  for (auto& r : replicas_) r->runner->Stop();
}

void ReplicaSet::PlaceAll() {
  ClusterState& state = *c_.state;
  const int wanted = c_.config->parallel.replicas;
  auto fail = [&](const Status& s) {
    TESSERA_LOG_ERROR("coordinator", "placement failed: {}", s.ToString());
    MutexLock lock(&state.mu);
    state.placement_status = s;
    state.cv.notify_all();
  };
  // 1. Wait for the workers, or (after a coordinator restart) for workers
  //    re-registering with the complete plans they hold.
  //    Each pass runs on an event of the control server (a registration, a
  //    loss: WorkerActivity), not on a timer.
  std::vector<ControlWorkerInfo> infos;
  std::vector<ReplicaStart> held;
  WorkerActivity& activity = c_.control->activity();
  uint64_t seen = activity.generation();
  // The last event: an adoption that any registration could grow waits for
  // a quiet kRegistrationBatch after it.
  auto last_event = std::chrono::steady_clock::now();
  while (true) {
    {
      MutexLock lock(&state.mu);
      if (state.stopping) return;
    }
    const std::vector<ControlWorkerInfo> all = c_.control->Workers();
    const std::vector<std::string> usable = state.UsableWorkers(all);
    // The usable workers' records, in registration order (both lists are).
    infos.clear();
    std::unordered_set<std::string> usable_ids(usable.begin(), usable.end());
    for (const ControlWorkerInfo& w : all)
      if (usable_ids.erase(w.worker_id)) infos.push_back(w);
    held = placer_.HeldPlans(infos);
    size_t holding = 0, in_held = 0;  // workers holding a shard of this model / of a held plan
    for (const ControlWorkerInfo& w : infos)
      holding += w.registration->has_held_shard() &&
                 w.registration->held_shard().model_path() == c_.config->model.path;
    for (const ReplicaStart& h : held) in_held += h.ranks.size();
    const bool adopt = !held.empty() &&
                       (wanted > 0 ? static_cast<int>(held.size()) >= wanted : in_held == holding);
    // With parallel.replicas = 0 the adopted plans are those of the workers
    // registered so far: a restarted coordinator's workers re-register
    // within moments of each other, so it decides once they paused for
    // kRegistrationBatch, or it could adopt fewer replicas than there are.
    const auto quiet_from = last_event + kRegistrationBatch;
    if (adopt && wanted == 0 && std::chrono::steady_clock::now() < quiet_from) {
      if (activity.WaitChange(seen, quiet_from) != seen)
        last_event = std::chrono::steady_clock::now();
      seen = activity.generation();
      continue;
    }
    if (adopt) {
      if (wanted > 0) held.resize(static_cast<size_t>(wanted));
      break;
    }
    held.clear();
    if (static_cast<int>(infos.size()) >= c_.expected_workers) break;
    seen = activity.WaitChange(seen);
    last_event = std::chrono::steady_clock::now();
  }
  // 2. Place: the adopted plans' ranks, or the planner's placement of every
  //    replica (nothing is assigned unless the layout fits).
  std::vector<ReplicaStart> starts;
  if (!held.empty()) {
    starts = std::move(held);
  } else {
    infos.resize(static_cast<size_t>(c_.expected_workers));  // the rest are spares
    auto placed = placer_.Place(infos);
    if (!placed.ok()) return fail(placed.status());
    starts = std::move(placed).value();
  }
  const size_t n = starts.size();
  std::string layouts = starts[0].parallel.ToString();
  for (size_t r = 1; r < n; ++r)
    if (starts[r].parallel.ToString() != starts[0].parallel.ToString())
      layouts += ", replica " + std::to_string(r) + ": " + starts[r].parallel.ToString();
  TESSERA_LOG_INFO("coordinator", "{} replica(s) of {} on {} worker(s)", n, layouts, infos.size());
  {
    MutexLock lock(&state.mu);
    state.SizeReplicas(n);
    for (size_t r = 0; r < n; ++r) {
      state.replicas[r].parallel = state.replicas[r].wanted = starts[r].parallel;
      state.replicas[r].kv_blocks = starts[r].kv_blocks;
      state.last_plan_version = std::max(state.last_plan_version, starts[r].adopted_version);
    }
  }
  {
    MutexLock lock(&state.exec_mu);
    state.executors.resize(n);
  }
  {
    MutexLock lock(&routes_mu_);
    outstanding_.assign(n, 0);
    drained_.assign(n, false);
    routed_.assign(n, 0);
    finished_.assign(n, 0);
    handed_off_.assign(n, 0);
  }
  SchedulerOptions sched = c_.scheduler;
  sched.output = output_;
  for (size_t r = 0; r < n; ++r) {
    auto rep = std::make_unique<Replica>();
    const int index = static_cast<int>(r);
    const bool on_leader = c_.config->scheduler.runs_on == SchedulerHost::kLeader;
    if (on_leader) {
      auto leader = std::make_unique<LeaderLoop>(*c_.model, c_.tokenizer != nullptr,
                                                 c_.config->kv_cache.block_size, sched, c_.control,
                                                 c_.metrics, index);
      rep->leader = leader.get();
      rep->loop = std::move(leader);
    } else {
      rep->loop = std::make_unique<ServingLoop>(
          *c_.model, c_.tokenizer, c_.config->kv_cache.block_size, sched, c_.metrics,
          [this, index](const Status& failed) { runner(index)->OnStepFailed(failed); }, index);
    }
    PlanRunner::Context rc;
    rc.config = c_.config;
    rc.model = c_.model;
    rc.replica = index;
    rc.placer = &placer_;
    rc.control = c_.control;
    rc.store = c_.store;
    rc.store_secret = c_.store_secret;
    rc.metrics = c_.metrics;
    rc.planner = c_.planner;
    rc.state = c_.state;
    rc.loop = rep->loop.get();
    if (on_leader) rc.leader = LeaderOptionsToProto(c_.scheduler);
    rc.hand_off = [this, index] { return HandOff(index); };
    rep->runner = std::make_unique<PlanRunner>(std::move(rc));
    replicas_.push_back(std::move(rep));
  }
  placed_.store(true, std::memory_order_release);
  for (size_t r = 0; r < n; ++r) replicas_[r]->runner->Start(std::move(starts[r]));
}

bool ReplicaSet::reconfiguring() const {
  for (int r = 0; r < size(); ++r)
    if (runner(r)->reconfiguring()) return true;
  return false;
}

void ReplicaSet::Loads(int exclude, std::vector<ReplicaLoad>& loads) const {
  const int n = size();
  loads.assign(static_cast<size_t>(n), ReplicaLoad{});
  // No fleet-wide lock on a request's path: readiness is read lock-free.
  MutexLock lock(&routes_mu_);
  for (int r = 0; r < n; ++r) {
    ReplicaLoad& l = loads[static_cast<size_t>(r)];
    l.ready = c_.state->ReplicaReady(r, static_cast<size_t>(n));
    l.accepting = r != exclude && loop(r)->started() && !drained_[static_cast<size_t>(r)];
    l.outstanding_tokens = outstanding_[static_cast<size_t>(r)];
    l.free_kv_blocks = loop(r)->free_kv_blocks();
  }
}

ReplicaLoadInfo ReplicaSet::Load(int r) const {
  ReplicaLoadInfo info;
  ReplicaLoop* l = loop(r);
  info.free_kv_blocks = l->free_kv_blocks();
  info.kv_blocks = l->kv_blocks();
  info.waiting = l->waiting();
  info.running = l->running();
  MutexLock lock(&routes_mu_);
  const size_t i = static_cast<size_t>(r);
  info.accepting = l->started() && !drained_[i];
  info.outstanding_tokens = outstanding_[i];
  info.routed_total = routed_[i];
  info.finished_total = finished_[i];
  info.handed_off_total = handed_off_[i];
  return info;
}

RequestCallbacks ReplicaSet::Wrap(const std::shared_ptr<Route>& route) {
  // Each closure holds the route alone (no copy of the request's own
  // callbacks, no allocation): set and inner are fixed in it.
  const RequestCallbacks& inner = *route->inner;
  RequestCallbacks cb;
  if (inner.on_admit) cb.on_admit = [route] { route->inner->on_admit(); };
  if (inner.on_prompt_logprobs)
    cb.on_prompt_logprobs = [route](const std::vector<SampledToken>& prompt) {
      route->inner->on_prompt_logprobs(prompt);
    };
  cb.on_token = [route](const std::string& text, int32_t token, const SampledToken* logprobs) {
    ReplicaSet& set = *route->set;
    if (token >= 0) {
      MutexLock lock(&set.routes_mu_);
      if (route->remaining > 0) {
        --route->remaining;
        --set.outstanding_[static_cast<size_t>(route->replica)];
      }
    }
    if (route->inner->on_token) route->inner->on_token(text, token, logprobs);
  };
  cb.on_finish = [route](const GenerationResult& result) {
    ReplicaSet& set = *route->set;
    {
      MutexLock lock(&set.routes_mu_);
      set.outstanding_[static_cast<size_t>(route->replica)] -= route->remaining;
      route->remaining = 0;
      route->finished = true;
      ++set.finished_[static_cast<size_t>(route->replica)];
      if (route->id >= 0) set.routes_.erase(route->id);
    }
    if (route->inner->on_finish) route->inner->on_finish(result);
  };
  return cb;
}

StatusOr<std::vector<int64_t>> ReplicaSet::Submit(std::vector<GenerationRequest> requests,
                                                  std::vector<RequestCallbacks> callbacks) {
  if (!placed()) return Unavailable("no plan is serving yet");
  if (requests.empty()) return std::vector<int64_t>{};
  // A fleet's loads are kilobytes: each request thread reuses its buffer
  // (a fresh one per request was a large allocation, and malloc
  // consolidated its free lists for each).
  thread_local std::vector<ReplicaLoad> loads;
  Loads(-1, loads);
  // The affinity key (a SHA-256) once, for the order and the record.
  const std::optional<BlockKey> key = router_.Key(requests[0].prompt_ids);
  const std::vector<int> order = router_.OrderFor(key, loads);
  if (order.empty()) return Unavailable("no replica is serving");
  // Each request's callbacks, shared by the routes of every replica tried.
  std::vector<std::shared_ptr<const RequestCallbacks>> inner;
  inner.reserve(callbacks.size());
  for (RequestCallbacks& cb : callbacks)
    inner.push_back(std::make_shared<const RequestCallbacks>(std::move(cb)));
  Status last = Unavailable("no replica is serving");
  for (int r : order) {
    std::vector<std::shared_ptr<Route>> routes;
    std::vector<RequestCallbacks> wrapped;
    {
      MutexLock lock(&routes_mu_);
      for (size_t i = 0; i < requests.size(); ++i) {
        const GenerationRequest& q = requests[i];
        auto route = std::make_shared<Route>();
        route->set = this;
        route->inner = inner[i];
        route->replica = r;
        route->remaining = Cost(q);
        outstanding_[static_cast<size_t>(r)] += route->remaining;
        routes.push_back(std::move(route));
      }
    }
    for (const auto& route : routes) wrapped.push_back(Wrap(route));
    // The requests are copied: a full queue passes them to the next replica.
    auto ids = loop(r)->Submit(requests, std::move(wrapped));
    {
      MutexLock lock(&routes_mu_);
      if (!ids.ok()) {
        for (const auto& route : routes) outstanding_[static_cast<size_t>(r)] -= route->remaining;
        last = ids.status();
        if (ids.status().code() == StatusCode::kResourceExhausted) continue;
        return ids.status();
      }
      ++routed_[static_cast<size_t>(r)];
      for (size_t i = 0; i < routes.size(); ++i) {
        routes[i]->id = (*ids)[i];
        if (!routes[i]->finished) routes_[(*ids)[i]] = routes[i];
      }
    }
    router_.RoutedFor(key, r);
    return ids;
  }
  if (last.code() == StatusCode::kResourceExhausted && order.size() > 1)
    return ResourceExhausted("every replica's request queue is full (" +
                             std::to_string(order.size()) + " replicas); retry later");
  return last;
}

void ReplicaSet::Cancel(const std::vector<int64_t>& ids) {
  if (!placed()) return;
  for (int64_t id : ids) {
    int r = -1;
    {
      MutexLock lock(&routes_mu_);
      auto it = routes_.find(id);
      if (it == routes_.end()) continue;  // finished already
      it->second->cancelled = true;
      r = it->second->replica;
    }
    loop(r)->Cancel({id});
  }
}

size_t ReplicaSet::waiting() const {
  size_t n = 0;
  for (int r = 0; r < size(); ++r) n += loop(r)->waiting();
  return n;
}

size_t ReplicaSet::running() const {
  size_t n = 0;
  for (int r = 0; r < size(); ++r) n += loop(r)->running();
  return n;
}

bool ReplicaSet::OnLeaderUpdates(int replica, const std::string& worker_id,
                                 control::RequestUpdates&& updates) {
  if (!placed() || replica < 0 || replica >= size()) return false;
  LeaderLoop* leader = replicas_[static_cast<size_t>(replica)]->leader;
  return leader != nullptr && leader->OnUpdates(worker_id, std::move(updates));
}

int ReplicaSet::HandOff(int from) {
  if (!placed() || size() < 2) return 0;
  std::vector<ReplicaMigrant> migrants = loop(from)->TakeWaiting();
  if (migrants.empty()) return 0;
  std::vector<std::vector<ReplicaMigrant>> to(static_cast<size_t>(size()));
  std::vector<ReplicaMigrant> stay;
  for (ReplicaMigrant& m : migrants) {
    // The least loaded serving replica, the loads updated as requests move.
    std::vector<ReplicaLoad> loads;
    Loads(from, loads);
    const std::vector<int> order = router_.Order({}, loads);
    if (order.empty()) {
      stay.push_back(std::move(m));
      continue;
    }
    // Nobody serves: they wait for this replica's re-plan.
    if (!c_.state->ReplicaReady(order[0], static_cast<size_t>(size()))) {
      stay.push_back(std::move(m));
      continue;
    }
    const int dest = order[0];
    {
      MutexLock lock(&routes_mu_);
      auto it = routes_.find(MigrantId(m));
      if (it != routes_.end()) {
        outstanding_[static_cast<size_t>(from)] -= it->second->remaining;
        outstanding_[static_cast<size_t>(dest)] += it->second->remaining;
        it->second->replica = dest;
      }
      ++handed_off_[static_cast<size_t>(from)];
      ++routed_[static_cast<size_t>(dest)];
    }
    to[static_cast<size_t>(dest)].push_back(std::move(m));
  }
  int moved = 0;
  for (int dest = 0; dest < size(); ++dest) {
    std::vector<ReplicaMigrant>& batch = to[static_cast<size_t>(dest)];
    if (batch.empty()) continue;
    std::vector<int64_t> ids;
    for (const ReplicaMigrant& m : batch) ids.push_back(MigrantId(m));
    const size_t count = batch.size();
    Status adopted = loop(dest)->Adopt(&batch);
    if (!adopted.ok()) {
      // Nothing was queued there (all or none): they stay on `from`.
      TESSERA_LOG_ERROR("coordinator", "replica {}: handing {} request(s) to replica {}: {}", from,
                        count, dest, adopted.ToString());
      MutexLock lock(&routes_mu_);
      for (const ReplicaMigrant& m : batch) {
        auto it = routes_.find(MigrantId(m));
        if (it == routes_.end()) continue;
        outstanding_[static_cast<size_t>(dest)] -= it->second->remaining;
        outstanding_[static_cast<size_t>(from)] += it->second->remaining;
        it->second->replica = from;
      }
      for (ReplicaMigrant& m : batch) stay.push_back(std::move(m));
      continue;
    }
    moved += static_cast<int>(count);
    // A cancellation that reached the old replica after TakeWaiting.
    std::vector<int64_t> cancelled;
    {
      MutexLock lock(&routes_mu_);
      for (int64_t id : ids) {
        auto it = routes_.find(id);
        if (it != routes_.end() && it->second->cancelled) cancelled.push_back(id);
      }
    }
    if (!cancelled.empty()) loop(dest)->Cancel(cancelled);
  }
  // Back where they were (same scheduler: they fit).
  if (!stay.empty()) loop(from)->Adopt(&stay).IgnoreError();
  return moved;
}

Status ReplicaSet::CheckReplica(int replica) const {
  if (!placed())
    return FailedPrecondition("the initial placement is in progress; retry when serving");
  if (replica < 0 || replica >= size())
    return InvalidArgument("replica: no replica " + std::to_string(replica) +
                           " (the coordinator serves " + std::to_string(size()) + ", 0.." +
                           std::to_string(size() - 1) + ")");
  return Status::Ok();
}

StatusOr<PlanProposal> ReplicaSet::Propose(const PlanRequest& request) const {
  int r = request.replica;
  if (r < 0) {
    if (size() > 1)
      return InvalidArgument("replica: the coordinator serves " + std::to_string(size()) +
                             " replicas; name the one to change (\"replica\": 0.." +
                             std::to_string(size() - 1) + ")");
    r = 0;
  }
  TESSERA_RETURN_IF_ERROR(CheckReplica(r));
  TESSERA_ASSIGN_OR_RETURN(PlanProposal p, runner(r)->Propose(request));
  p.replica = r;
  return p;
}

PlanDryRun ReplicaSet::DryRun(const PlanProposal& proposal) const {
  return runner(proposal.replica)->DryRun(proposal);
}

Status ReplicaSet::Apply(PlanProposal proposal, PlanApplyDone done) {
  TESSERA_RETURN_IF_ERROR(CheckReplica(proposal.replica));
  const int r = proposal.replica;
  router_.Forget(r);  // its prefix cache starts empty under the new plan
  return runner(r)->Apply(std::move(proposal), std::move(done));
}

PlanControl::DrainOutcome ReplicaSet::SetDrained(const std::string& id, bool drain) {
  if (!placed()) {
    DrainOutcome out;
    for (const ControlWorkerInfo& w : c_.control->Workers()) out.known |= w.worker_id == id;
    if (!out.known) return out;
    MutexLock lock(&c_.state->mu);
    auto& d = c_.state->drained_workers;
    auto it = std::find(d.begin(), d.end(), id);
    if (drain && it == d.end()) {
      d.push_back(id);
      out.changed = true;
    } else if (!drain && it != d.end()) {
      d.erase(it);
      out.changed = true;
    }
    return out;
  }
  // The worker's replica; a spare: the first replica that runs short of
  // workers (degraded, or smaller than wanted) may use it again, else 0.
  int r = -1;
  {
    MutexLock lock(&c_.state->mu);
    r = c_.state->ReplicaOf(id);
    if (r < 0)
      for (int i = 0; i < static_cast<int>(c_.state->replicas.size()) && r < 0; ++i) {
        const ReplicaPlan& p = c_.state->replicas[static_cast<size_t>(i)];
        if (!p.degraded.empty() || p.parallel.world_size() < p.wanted.world_size()) r = i;
      }
  }
  return runner(r < 0 ? 0 : r)->SetDrained(id, drain);
}

StatusOr<bool> ReplicaSet::SetReplicaDrained(int replica, bool drain) {
  if (!placed() || replica < 0 || replica >= size())
    return NotFound("no replica " + std::to_string(replica) + " (the coordinator serves " +
                    std::to_string(size()) + ")");
  bool changed = false;
  {
    MutexLock lock(&routes_mu_);
    changed = drained_[static_cast<size_t>(replica)] != drain;
    drained_[static_cast<size_t>(replica)] = drain;
  }
  TESSERA_LOG_INFO("coordinator", "replica {} {} by the admin API", replica,
                   drain ? "drained" : "undrained");
  // Its queued requests go to the others; those running finish where they are.
  if (drain && changed) HandOff(replica);
  return changed;
}

}  // namespace tessera
