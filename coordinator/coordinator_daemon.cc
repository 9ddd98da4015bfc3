#include "coordinator/coordinator_daemon.h"

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>
#include <set>

#include "common/control_codec.h"
#include "common/logging.h"
#include "common/metric_catalog.h"
#include "common/shard_spec.h"
#include "coordinator/openai_api.h"

namespace tessera {

using nlohmann::json;

CoordinatorDaemon::CoordinatorDaemon(DaemonConfig config) : config_(std::move(config)) {}

CoordinatorDaemon::~CoordinatorDaemon() { Stop(); }

int CoordinatorDaemon::api_port() const { return api_ ? api_->port() : 0; }
int CoordinatorDaemon::admin_port() const { return admin_ ? admin_->port() : api_port(); }

Status CoordinatorDaemon::Start() {
  const std::string& dir = config_.model.path;
  TESSERA_ASSIGN_OR_RETURN(model_, LoadModelConfig(dir));
  TESSERA_ASSIGN_OR_RETURN(tokenizer_, Tokenizer::Load(dir));
  if (config_.model.chat_template) {
    TESSERA_ASSIGN_OR_RETURN(chat_template_,
                             ChatTemplate::FromName(ChatFormatName(*config_.model.chat_template)));
  } else {
    auto t = ChatTemplate::Detect(tokenizer_->chat_template());
    if (t.ok()) chat_template_ = *t;  // else chat requests get a 400 naming the problem
  }
  if (config_.parallel.mode != ParallelMode::kExplicit)
    return Unimplemented(
        "parallel.mode = \"auto\" needs the topology planner wiring; set tp and pp explicitly");
  TESSERA_ASSIGN_OR_RETURN(
      parallel_, config_.parallel.tp_per_stage.empty()
                     ? ParallelConfig::Make(model_, config_.parallel.tp, config_.parallel.pp,
                                            config_.parallel.layers_per_stage)
                     : ParallelConfig::MakePerStage(model_, config_.parallel.tp_per_stage,
                                                    config_.parallel.layers_per_stage));
  wanted_ = parallel_;
  max_context_ = config_.scheduler.max_context > 0 ? config_.scheduler.max_context
                                                   : model_.max_position_embeddings;
  if (max_context_ > model_.max_position_embeddings)
    return InvalidArgument("scheduler.max_context " + std::to_string(max_context_) +
                           " exceeds the model's max_position_embeddings " +
                           std::to_string(model_.max_position_embeddings));
  const int64_t block = config_.kv_cache.block_size;
  kv_blocks_ = config_.kv_cache.max_blocks > 0
                   ? config_.kv_cache.max_blocks
                   : BlockAllocator::BlocksFor(max_context_, block) *
                         std::min<int64_t>(8, config_.scheduler.max_sequences);
  model_name_ = ServedModelName(config_.model);

  ControlServerOptions co;
  co.heartbeat_interval =
      std::chrono::milliseconds(static_cast<int64_t>(config_.heartbeat.interval_seconds * 1000));
  co.heartbeat_miss_limit = std::max(
      1, static_cast<int>(config_.heartbeat.timeout_seconds / config_.heartbeat.interval_seconds));
  co.on_message = [this](const ControlPeer& p, const control::Envelope& e) {
    OnControlMessage(p, e);
  };
  co.on_worker_lost = [this](const std::string& id) { OnWorkerLost(id); };
  control_ = std::make_unique<ControlServer>(co);
  TESSERA_ASSIGN_OR_RETURN(control_endpoint_, control_->Start(config_.server.control_endpoint));
  // The rendezvous store listens on the control plane's host.
  std::string store_host = "127.0.0.1";
  const std::string& ep = config_.server.control_endpoint;
  if (ep.rfind("tcp://", 0) == 0) store_host = ep.substr(6, ep.rfind(':') - 6);
  if (store_host == "*") store_host = "0.0.0.0";
  TESSERA_ASSIGN_OR_RETURN(store_, TcpStoreServer::Start(store_host, 0));

  HttpServerOptions ho;
  ho.bind_address = config_.server.host;
  ho.port = config_.server.port;
  ho.read_timeout_seconds = config_.server.read_timeout_seconds;
  ho.max_body_bytes = static_cast<size_t>(config_.server.max_body_bytes);
  ho.max_connections = config_.server.max_connections;
  api_ = std::make_unique<HttpServer>(ho);
  if (config_.admin.port != 0) {
    HttpServerOptions ao = ho;
    ao.bind_address = config_.admin.host;
    ao.port = config_.admin.port;
    admin_ = std::make_unique<HttpServer>(ao);
  }
  RegisterRoutes(*api_, admin_.get());
  TESSERA_RETURN_IF_ERROR(api_->Start());
  if (admin_) TESSERA_RETURN_IF_ERROR(admin_->Start());
  TESSERA_LOG_INFO("coordinator",
                   "serving {} on http://{}:{}, control {}, waiting for {} workers ({})",
                   model_name_, config_.server.host, api_port(), control_endpoint_,
                   parallel_.world_size(), parallel_.ToString());
  placement_thread_ = std::thread([this] { PlaceAndServe(); });
  return Status::Ok();
}

void CoordinatorDaemon::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  cv_.notify_all();
  work_cv_.notify_all();
  if (placement_thread_.joinable()) placement_thread_.join();
  if (scheduler_thread_.joinable()) scheduler_thread_.join();
  if (control_) {
    std::vector<std::string> ids;
    for (const ControlWorkerInfo& w : control_->Workers())
      if (w.alive) ids.push_back(w.worker_id);
    for (const std::string& id : ids) {
      control::Envelope e;
      e.mutable_shutdown()->set_reason("coordinator stopping");
      control_->Send(id, std::move(e)).IgnoreError();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  if (api_) api_->Stop();
  if (admin_) admin_->Stop();
  if (control_) control_->Stop();
}

Status CoordinatorDaemon::WaitReady(double timeout_seconds) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, std::chrono::duration<double>(timeout_seconds),
               [&] { return ready_.load() || !placement_status_.ok() || stopping_; });
  if (!placement_status_.ok()) return placement_status_;
  if (!ready_.load())
    return DeadlineExceeded("not ready after " + std::to_string(timeout_seconds) + " s");
  return Status::Ok();
}

namespace {

double SecondsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// How long a plan's workers get to load and report Loaded.
constexpr double kLoadTimeoutSeconds = 120.0;
// Consecutive failed re-fits before the cluster is reported degraded.
constexpr int kMaxFitAttempts = 3;

}  // namespace

std::vector<std::string> CoordinatorDaemon::UsableWorkers() const {
  std::vector<std::string> out;
  std::lock_guard<std::mutex> lock(mu_);
  for (const ControlWorkerInfo& w : control_->Workers()) {
    if (!w.alive) continue;
    auto has = [&](const std::vector<std::string>& v) {
      return std::find(v.begin(), v.end(), w.worker_id) != v.end();
    };
    if (has(failed_workers_) || has(drained_workers_) || has(out)) continue;
    out.push_back(w.worker_id);
  }
  return out;
}

std::map<std::string, HeldSlice> CoordinatorDaemon::HeldSlices() const {
  std::map<std::string, HeldSlice> held;
  // What re-registered workers say they hold (a restarted coordinator) ...
  for (const ControlWorkerInfo& w : control_->Workers()) {
    if (!w.alive || !w.registration.has_held_shard()) continue;
    const control::AssignShard& a = w.registration.held_shard();
    if (a.model_path() != config_.model.path) continue;
    HeldSlice h;
    h.tp = a.tp_per_stage_size() > static_cast<int>(a.stage())
               ? static_cast<int>(a.tp_per_stage(static_cast<int>(a.stage())))
               : static_cast<int>(a.tp());
    h.tp_rank = static_cast<int>(a.tp_rank());
    h.first_layer = static_cast<int>(a.first_layer());
    h.end_layer = static_cast<int>(a.end_layer());
    h.embedding = a.stage() == 0;
    h.lm_head = a.stage() + 1 == a.pp();
    held[w.worker_id] = h;
  }
  // ... and, more recent, what the workers loaded for this coordinator.
  std::lock_guard<std::mutex> lock(mu_);
  for (const Assignment& a : assignments_) {
    if (a.loaded_weight_bytes < 0) continue;  // never loaded: holds nothing of this plan
    HeldSlice h;
    h.tp = parallel_.TpOfStage(a.stage);
    h.tp_rank = a.tp_rank;
    h.first_layer = parallel_.FirstLayer(a.stage);
    h.end_layer = parallel_.EndLayer(a.stage);
    h.embedding = a.stage == 0;
    h.lm_head = a.stage == parallel_.pp - 1;
    held[a.worker_id] = h;
  }
  return held;
}

std::optional<std::pair<ParallelConfig, std::vector<RankPlacement>>> CoordinatorDaemon::HeldPlan(
    const std::vector<std::string>& usable, uint64_t* version) const {
  std::map<std::string, control::AssignShard> shards;
  uint64_t newest = 0;
  for (const ControlWorkerInfo& w : control_->Workers()) {
    if (!w.alive || !w.registration.has_held_shard() ||
        std::find(usable.begin(), usable.end(), w.worker_id) == usable.end())
      continue;
    shards[w.worker_id] = w.registration.held_shard();
    newest = std::max(newest, w.registration.held_shard().plan_version());
  }
  if (newest == 0) return std::nullopt;
  const control::AssignShard* first = nullptr;
  std::map<int, std::string> by_rank;
  for (const auto& [id, a] : shards) {
    if (a.plan_version() != newest) continue;
    if (!first) first = &a;
    const bool same =
        a.tp() == first->tp() && a.pp() == first->pp() &&
        std::equal(a.tp_per_stage().begin(), a.tp_per_stage().end(), first->tp_per_stage().begin(),
                   first->tp_per_stage().end()) &&
        std::equal(a.layers_per_stage().begin(), a.layers_per_stage().end(),
                   first->layers_per_stage().begin(), first->layers_per_stage().end()) &&
        a.model_path() == config_.model.path;
    if (!same || by_rank.count(static_cast<int>(a.world_rank()))) return std::nullopt;
    by_rank[static_cast<int>(a.world_rank())] = id;
  }
  std::vector<int> layers(first->layers_per_stage().begin(), first->layers_per_stage().end());
  std::vector<int> tps(first->tp_per_stage().begin(), first->tp_per_stage().end());
  auto parallel = tps.empty() ? ParallelConfig::Make(model_, static_cast<int>(first->tp()),
                                                     static_cast<int>(first->pp()), layers)
                              : ParallelConfig::MakePerStage(model_, tps, layers);
  if (!parallel.ok() || static_cast<int>(by_rank.size()) != parallel->world_size())
    return std::nullopt;
  std::vector<RankPlacement> ranks;
  for (const auto& [rank, id] : by_rank) {
    RankPlacement p = RankSlice(*parallel, rank);
    p.worker_id = id;
    p.reused_first = p.first_layer;
    p.reused_end = p.end_layer;
    p.reuses_embedding = p.stage == 0;
    p.reuses_lm_head = p.stage == parallel->pp - 1;
    ranks.push_back(p);
  }
  *version = newest;
  return std::make_pair(*parallel, std::move(ranks));
}

void CoordinatorDaemon::PlaceAndServe() {
  auto fail = [&](const Status& s) {
    TESSERA_LOG_ERROR("coordinator", "placement failed: {}", s.ToString());
    std::lock_guard<std::mutex> lock(mu_);
    placement_status_ = s;
    cv_.notify_all();
  };
  // 1. Wait for the workers: tp * pp of them, or (after a coordinator
  //    restart) workers re-registering with a complete plan they hold.
  std::vector<std::string> workers;
  std::optional<std::pair<ParallelConfig, std::vector<RankPlacement>>> adopted;
  uint64_t adopted_version = 0;
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (cv_.wait_for(lock, std::chrono::milliseconds(100), [&] { return stopping_; })) return;
    }
    workers = UsableWorkers();
    adopted = HeldPlan(workers, &adopted_version);
    if (adopted || static_cast<int>(workers.size()) >= parallel_.world_size()) break;
  }
  // 2. Assign shards (world ranks in registration order, or the adopted
  //    plan's) and apply: workers reuse the weights they hold.
  std::vector<RankPlacement> ranks;
  std::string reason = "initial placement";
  if (adopted) {
    std::lock_guard<std::mutex> lock(mu_);
    parallel_ = wanted_ = adopted->first;
    plan_version_ = adopted_version;
    ranks = adopted->second;
    reason = "adopted plan " + std::to_string(adopted_version) + " held by the workers";
    TESSERA_LOG_INFO("coordinator", "{}: {}", reason, parallel_.ToString());
  } else {
    auto placed = PlaceRanks(parallel_, workers, HeldSlices());
    if (!placed.ok()) return fail(placed.status());
    ranks = *placed;
  }
  json report;
  Status applied = ApplyPlan(parallel_, ranks, reason, report);
  if (!applied.ok()) return fail(applied);
  // 3. Serve.
  allocator_ = std::make_unique<BlockAllocator>(kv_blocks_);
  SchedulerOptions so;
  so.max_batch_tokens = config_.scheduler.max_batch_tokens;
  so.max_sequences = config_.scheduler.max_sequences;
  so.queue_limit = config_.scheduler.queue_limit;
  so.max_context = max_context_;
  so.prefill_chunk_tokens = config_.scheduler.prefill_chunk_tokens;
  so.requeue_on_executor_error = true;  // a re-plan finishes them
  {
    std::lock_guard<std::mutex> lock(exec_mu_);
    scheduler_ = std::make_unique<Scheduler>(model_, executor_.get(), allocator_.get(),
                                             config_.kv_cache.block_size, tokenizer_.get(), so);
  }
  scheduler_thread_ = std::thread([this] { SchedulerLoop(); });
  {
    std::lock_guard<std::mutex> lock(mu_);
    serving_ = true;
  }
  ready_.store(true);
  cv_.notify_all();
  // 4. Re-plan on demand.
  PlanLoop();
}

Status CoordinatorDaemon::ApplyPlan(const ParallelConfig& parallel,
                                    const std::vector<RankPlacement>& ranks,
                                    const std::string& reason, json& report) {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<Assignment> plan;
  for (const RankPlacement& r : ranks) {
    Assignment a;
    a.worker_id = r.worker_id;
    a.world_rank = r.world_rank;
    a.stage = r.stage;
    a.tp_rank = r.tp_rank;
    TESSERA_ASSIGN_OR_RETURN(ShardSpec spec, ShardSpec::Make(model_, parallel, r.world_rank));
    a.predicted_weight_bytes = spec.WeightBytes(DType::kF32);
    plan.push_back(a);
  }
  std::vector<std::string> old_workers;
  uint64_t version = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const Assignment& a : assignments_) old_workers.push_back(a.worker_id);
    version = ++plan_version_;
    metrics_.Gauge(metric::kPlanVersion).WithLabels({}).Set(static_cast<double>(version));
    parallel_ = parallel;
    assignments_ = plan;
    load_error_.clear();
  }
  TESSERA_LOG_INFO("coordinator", "plan {}: applying {} ({}) on {} workers", version,
                   parallel.ToString(), reason, plan.size());
  // End the old plan on its workers: stage-0 ranks pass the end down their
  // pipelines, everyone drops the plan's communicators and keeps its weights.
  for (const std::string& w : old_workers) {
    control::Envelope e;
    e.mutable_drain()->set_reason("plan " + std::to_string(version) + ": " + reason);
    control_->Send(w, std::move(e)).IgnoreError();  // a lost worker cannot be drained
  }
  for (const Assignment& a : plan) {
    control::Envelope e;
    control::AssignShard* s = e.mutable_assign_shard();
    s->set_plan_version(version);
    s->set_tp(static_cast<uint32_t>(parallel.tp));  // 0 when stages differ in tp
    for (int t : parallel.tp_per_stage) s->add_tp_per_stage(static_cast<uint32_t>(t));
    s->set_pp(static_cast<uint32_t>(parallel.pp));
    for (int n : parallel.layers_per_stage) s->add_layers_per_stage(static_cast<uint32_t>(n));
    s->set_stage(static_cast<uint32_t>(a.stage));
    s->set_tp_rank(static_cast<uint32_t>(a.tp_rank));
    s->set_world_rank(static_cast<uint32_t>(a.world_rank));
    s->set_first_layer(static_cast<uint32_t>(parallel.FirstLayer(a.stage)));
    s->set_end_layer(static_cast<uint32_t>(parallel.EndLayer(a.stage)));
    s->set_model_path(config_.model.path);
    s->set_dtype("F32");
    s->set_kv_block_size(static_cast<uint32_t>(config_.kv_cache.block_size));
    s->set_kv_num_blocks(static_cast<uint64_t>(kv_blocks_));
    uint32_t device = 0;
    for (const ControlWorkerInfo& w : control_->Workers())
      if (w.worker_id == a.worker_id && w.alive && w.registration.devices_size())
        device = w.registration.devices(0).index();
    s->set_device_index(device);
    control::GlooRendezvous* g = s->mutable_gloo();
    g->set_store_host(store_->host() == "0.0.0.0" ? "127.0.0.1" : store_->host());
    g->set_store_port(static_cast<uint32_t>(store_->port()));
    g->set_key_prefix("plan" + std::to_string(version) + "/");
    TESSERA_RETURN_IF_ERROR(control_->Send(a.worker_id, std::move(e))
                                .WithContext("assigning rank " + std::to_string(a.world_rank) +
                                             " of plan " + std::to_string(version)));
  }
  // Wait for every Loaded of this version.
  const auto deadline = t0 + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                 std::chrono::duration<double>(kLoadTimeoutSeconds));
  int64_t reused = 0, weights = 0;
  {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      if (stopping_) return Unavailable("stopping");
      for (const Assignment& a : assignments_)
        if (std::find(failed_workers_.begin(), failed_workers_.end(), a.worker_id) !=
            failed_workers_.end())
          return Unavailable("worker " + a.worker_id + " was lost while loading plan " +
                             std::to_string(version));
      if (!load_error_.empty())
        return Unavailable("loading plan " + std::to_string(version) + ": " + load_error_);
      if (std::all_of(assignments_.begin(), assignments_.end(),
                      [](const Assignment& a) { return a.loaded_weight_bytes >= 0; }))
        break;
      if (std::chrono::steady_clock::now() > deadline)
        return DeadlineExceeded("plan " + std::to_string(version) +
                                ": not every worker loaded within " +
                                std::to_string(kLoadTimeoutSeconds) + " s");
      cv_.wait_for(lock, std::chrono::milliseconds(50));
    }
    for (const Assignment& a : assignments_) {
      reused += a.reused_weight_bytes;
      weights += a.loaded_weight_bytes;
    }
  }
  std::vector<std::string> first, all;
  for (const Assignment& a : plan) {
    all.push_back(a.worker_id);
    if (a.stage == 0) first.push_back(a.worker_id);
  }
  auto executor =
      std::make_shared<RemoteExecutor>(control_.get(), version, first, all, parallel.pp,
                                       model_.vocab_size, config_.heartbeat.timeout_seconds + 30.0);
  {
    std::lock_guard<std::mutex> lock(exec_mu_);
    executor_ = executor;
    // The scheduler is paused (or not created yet): its owner thread does not run it.
    if (scheduler_) scheduler_->SetExecutor(executor_.get());
  }
  const double seconds = SecondsSince(t0);
  report = {{"plan_version", version},        {"reason", reason},
            {"layout", LayoutJson(parallel)}, {"workers", all},
            {"load_seconds", seconds},        {"weight_bytes", weights},
            {"reused_weight_bytes", reused},  {"unix_time", UnixSeconds()}};
  {
    std::lock_guard<std::mutex> lock(mu_);
    history_.push_back(report);
    if (history_.size() > 32) history_.erase(history_.begin());
  }
  TESSERA_LOG_INFO("coordinator",
                   "plan {} loaded on {} workers in {:.2f} s ({:.1f} of {:.1f} MB reused); serving",
                   version, plan.size(), seconds, static_cast<double>(reused) / 1e6,
                   static_cast<double>(weights) / 1e6);
  return Status::Ok();
}

void CoordinatorDaemon::PauseScheduler(double drain_seconds) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!scheduler_thread_.joinable()) return;
  gate_ = Gate::kDraining;
  drain_deadline_ = std::chrono::steady_clock::now() +
                    std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                        std::chrono::duration<double>(drain_seconds));
  work_cv_.notify_all();
  cv_.wait(lock, [&] { return gate_ == Gate::kPaused || stopping_; });
}

void CoordinatorDaemon::ResumeScheduler() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Paused: the owner thread does not touch the scheduler until the gate opens.
    if (scheduler_) scheduler_->set_admitting(true);
    gate_ = Gate::kRunning;
  }
  work_cv_.notify_all();
}

void CoordinatorDaemon::RequestReplan(const std::string& reason, bool fault) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_) return;
  // One pending re-fit covers every fault reported before it runs.
  for (PlanJob& j : jobs_)
    if (!j.target && !j.res) {
      j.reason += "; " + reason;
      j.fault |= fault;
      return;
    }
  PlanJob job;
  job.reason = reason;
  job.fault = fault;
  job.plan_version = plan_version_;
  job.raised = std::chrono::steady_clock::now();
  jobs_.push_back(std::move(job));
  cv_.notify_all();
}

void CoordinatorDaemon::PlanLoop() {
  while (true) {
    PlanJob job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
      if (stopping_) {
        for (PlanJob& j : jobs_)
          if (j.res) j.res->SendError(503, "the coordinator is stopping");
        jobs_.clear();
        return;
      }
      job = std::move(jobs_.front());
      jobs_.pop_front();
      job_running_ = true;
    }
    RunJob(std::move(job));
    std::lock_guard<std::mutex> lock(mu_);
    job_running_ = false;
  }
}

bool CoordinatorDaemon::PlanUnchanged(const ParallelConfig& target,
                                      const std::vector<RankPlacement>& ranks) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!degraded_.empty() || target.tp != parallel_.tp ||
      target.tp_per_stage != parallel_.tp_per_stage || target.pp != parallel_.pp ||
      target.layers_per_stage != parallel_.layers_per_stage || ranks.size() != assignments_.size())
    return false;
  for (size_t i = 0; i < ranks.size(); ++i)
    if (ranks[i].worker_id != assignments_[i].worker_id) return false;
  return true;
}

void CoordinatorDaemon::AwaitLiveness(std::chrono::steady_clock::time_point since) {
  // A worker that died may not be declared lost yet: wait until every worker
  // has been heard from after `since`, or was declared lost (at most one
  // heartbeat timeout), so the re-plan does not place a rank on a dead one.
  const double limit = config_.heartbeat.timeout_seconds + 2 * config_.heartbeat.interval_seconds;
  while (SecondsSince(since) < limit) {
    bool settled = true;
    const double elapsed = SecondsSince(since);
    for (const ControlWorkerInfo& w : control_->Workers())
      if (w.alive && w.seconds_since_last_message >= elapsed) settled = false;
    if (settled) return;
    std::unique_lock<std::mutex> lock(mu_);
    if (cv_.wait_for(lock, std::chrono::milliseconds(20), [&] { return stopping_; })) return;
  }
}

void CoordinatorDaemon::RunJob(PlanJob job) {
  const auto t0 = std::chrono::steady_clock::now();
  const bool admin = job.target.has_value();
  if (job.fault) {
    bool superseded;
    {
      std::lock_guard<std::mutex> lock(mu_);
      superseded = job.plan_version < plan_version_ && degraded_.empty();
    }
    std::shared_ptr<RemoteExecutor> ex;
    {
      std::lock_guard<std::mutex> lock(exec_mu_);
      ex = executor_;
    }
    if (superseded && ex && ex->health().ok()) {
      TESSERA_LOG_INFO("coordinator", "fault already handled by a later plan: {}", job.reason);
      return;
    }
  } else if (!admin) {
    // Drain / undrain / a registration: nothing to do when the fitted layout
    // and its placement are the running ones.
    auto fit = FitLayout(model_, wanted_, static_cast<int>(UsableWorkers().size()));
    if (fit.ok()) {
      auto placed = PlaceRanks(*fit, UsableWorkers(), HeldSlices());
      if (placed.ok() && PlanUnchanged(*fit, *placed)) {
        TESSERA_LOG_INFO("coordinator", "re-plan not needed ({}): the placement is unchanged",
                         job.reason);
        return;
      }
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++reconfigurations_;
    if (job.fault) ++faults_;
  }
  metrics_.Counter(metric::kReconfigurationsTotal).WithLabels({}).Inc();
  if (job.fault) metrics_.Counter(metric::kFaultsTotal).WithLabels({}).Inc();
  TESSERA_LOG_INFO("coordinator", "re-plan: {}", job.reason);
  // Drain: no admission; in-flight sequences get the deadline (none after a
  // fault: the plan is broken), the rest are re-queued.
  PauseScheduler(job.fault ? 0.0 : config_.scheduler.drain_timeout_seconds);
  const double drain_seconds = SecondsSince(t0);
  if (job.fault) AwaitLiveness(job.raised);
  const double detect_seconds = SecondsSince(job.raised);
  int requeued = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    requeued = requeued_last_;
    requeued_total_ += requeued;
  }
  metrics_.Counter(metric::kRequeuedRequestsTotal)
      .WithLabels({})
      .Inc(static_cast<double>(requeued));
  Status result = Status::Ok();
  json report;
  for (int attempt = 1;; ++attempt) {
    ParallelConfig target;
    std::vector<RankPlacement> ranks;
    std::vector<std::string> usable = UsableWorkers();
    if (job.target) {
      target = *job.target;
    } else {
      auto fit = FitLayout(model_, wanted_, static_cast<int>(usable.size()));
      if (!fit.ok()) {
        result = fit.status();
        break;
      }
      target = *fit;
    }
    auto placed = PlaceRanks(target, usable, HeldSlices());
    if (!placed.ok()) {
      result = placed.status();
      break;
    }
    result = ApplyPlan(target, *placed, job.reason, report);
    if (result.ok() || job.target || attempt >= kMaxFitAttempts) break;
    TESSERA_LOG_WARN("coordinator", "re-plan attempt {} failed: {}; retrying", attempt,
                     result.ToString());
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return;
    }
  }
  if (result.ok()) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      degraded_.clear();
      if (admin) wanted_ = *job.target;
      report["drain_seconds"] = drain_seconds;
      if (job.fault) report["detect_seconds"] = detect_seconds;
      report["requeued_requests"] = requeued;
      report["total_seconds"] = SecondsSince(t0);
      if (!history_.empty()) history_.back() = report;
    }
    ResumeScheduler();
    ready_.store(true);
    cv_.notify_all();
    TESSERA_LOG_INFO("coordinator",
                     "re-plan done in {:.2f} s (drain {:.2f} s, {} requests re-queued): {}",
                     SecondsSince(t0), drain_seconds, requeued, job.reason);
    if (job.res) job.res->SendJson(200, report.dump());
    return;
  }
  TESSERA_LOG_ERROR("coordinator", "re-plan failed: {}", result.ToString());
  if (admin) {
    // The new layout could not be loaded: fall back to the wanted layout on
    // the usable workers, so the cluster serves again.
    if (job.res)
      job.res->SendError(503, "applying the plan failed: " + result.message() +
                                  "; re-planning the previous layout");
    RequestReplan("recovering after a failed reconfiguration", true);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    degraded_ = result.message();
  }
  ready_.store(false);
  TESSERA_LOG_ERROR("coordinator", "degraded: {}; waiting for workers", result.message());
}

void CoordinatorDaemon::SchedulerLoop() {
  while (true) {
    Gate gate;
    std::chrono::steady_clock::time_point deadline;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return;
      gate = gate_;
      deadline = drain_deadline_;
    }
    if (gate == Gate::kPaused) {
      std::unique_lock<std::mutex> lock(work_mu_);
      work_cv_.wait_for(lock, std::chrono::milliseconds(20));
      continue;
    }
    if (gate == Gate::kDraining) {
      scheduler_->set_admitting(false);
      const bool idle = scheduler_->running() == 0 && scheduler_->in_flight() == 0;
      bool broken;
      {
        std::lock_guard<std::mutex> lock(exec_mu_);
        broken = !executor_ || !executor_->health().ok();
      }
      if (idle || broken || std::chrono::steady_clock::now() >= deadline) {
        // Collect what is in flight (a broken executor fails it back, and
        // its sequences are re-queued), then re-queue the unfinished rest.
        scheduler_->CollectInFlight().IgnoreError();
        scheduler_->RequeueRunning();
        // Every sequence re-queued since the last pause: by an executor
        // error (a fault) or by this drain.
        const int64_t requeued = scheduler_->stats().requeued;
        std::lock_guard<std::mutex> lock(mu_);
        requeued_last_ = static_cast<int>(requeued - requeued_seen_);
        requeued_seen_ = requeued;
        gate_ = Gate::kPaused;
        cv_.notify_all();
        continue;
      }
    }
    auto progressed = scheduler_->RunOnce();
    const int64_t preempted = scheduler_->stats().preemptions;
    metrics_.Counter(metric::kPreemptionsTotal)
        .WithLabels({})
        .Inc(static_cast<double>(preempted - preemptions_seen_));
    preemptions_seen_ = preempted;
    metrics_.Gauge(metric::kKvCacheUsedBlocks)
        .WithLabels({})
        .Set(static_cast<double>(allocator_->num_blocks() - allocator_->num_free()));
    if (!progressed.ok()) {
      // The sequences in flight were re-queued (requeue_on_executor_error).
      TESSERA_LOG_ERROR("coordinator", "step failed: {}", progressed.status().ToString());
      bool report = false;
      {
        std::lock_guard<std::mutex> lock(mu_);
        report = gate_ == Gate::kRunning;
      }
      if (report) {
        ready_.store(false);
        RequestReplan("step failed: " + progressed.status().message(), true);
        // Wait for the plan thread to pause us instead of failing every step.
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait_for(lock, std::chrono::seconds(1),
                     [&] { return gate_ != Gate::kRunning || stopping_; });
      }
      continue;
    }
    if (!*progressed) {
      std::unique_lock<std::mutex> lock(work_mu_);
      work_cv_.wait_for(lock, std::chrono::milliseconds(20));
    }
  }
}

void CoordinatorDaemon::OnControlMessage(const ControlPeer& peer, const control::Envelope& e) {
  if (e.has_step_result()) {
    std::shared_ptr<RemoteExecutor> ex;
    {
      std::lock_guard<std::mutex> lock(exec_mu_);
      ex = executor_;
    }
    if (ex) ex->OnStepResult(peer.worker_id, e.step_result());
    return;
  }
  if (e.has_register_worker()) {
    bool replan = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      failed_workers_.erase(
          std::remove(failed_workers_.begin(), failed_workers_.end(), peer.worker_id),
          failed_workers_.end());
      // A worker joining a degraded cluster, or one running a smaller layout
      // than wanted, is used at once.
      replan = serving_ && (!degraded_.empty() || parallel_.world_size() < wanted_.world_size());
      cv_.notify_all();
    }
    TESSERA_LOG_INFO("coordinator", "worker {} registered ({}, pid {})", peer.worker_id,
                     e.register_worker().host(), e.register_worker().pid());
    if (replan) RequestReplan("worker " + peer.worker_id + " registered", false);
    return;
  }
  std::unique_lock<std::mutex> lock(mu_);
  if (e.has_load_progress()) {
    if (e.load_progress().plan_version() != plan_version_) return;
    for (Assignment& a : assignments_) {
      if (a.worker_id != peer.worker_id) continue;
      a.load_bytes_done = static_cast<int64_t>(e.load_progress().bytes_done());
      a.load_bytes_total = static_cast<int64_t>(e.load_progress().bytes_total());
    }
  } else if (e.has_loaded()) {
    if (e.loaded().plan_version() != plan_version_) return;
    for (Assignment& a : assignments_) {
      if (a.worker_id != peer.worker_id) continue;
      a.loaded_weight_bytes = static_cast<int64_t>(e.loaded().weights_bytes());
      a.reused_weight_bytes = static_cast<int64_t>(e.loaded().reused_bytes());
      a.kv_bytes = static_cast<int64_t>(e.loaded().kv_bytes());
      a.load_seconds = e.loaded().load_seconds();
    }
  } else if (e.has_error()) {
    const uint64_t v = e.error().plan_version();
    if (v != 0 && v != plan_version_) {
      TESSERA_LOG_INFO("coordinator", "worker {} (plan {}, superseded): {}", peer.worker_id, v,
                       e.error().message());
      return;
    }
    TESSERA_LOG_ERROR("coordinator", "worker {}: {}", peer.worker_id, e.error().message());
    const bool loading = std::any_of(assignments_.begin(), assignments_.end(),
                                     [](const Assignment& a) { return a.loaded_weight_bytes < 0; });
    if (loading) {
      load_error_ = "worker " + peer.worker_id + ": " + e.error().message();
      cv_.notify_all();
      return;
    }
    lock.unlock();
    {
      std::lock_guard<std::mutex> el(exec_mu_);
      if (executor_) executor_->OnWorkerFailed(peer.worker_id, ErrorToStatus(e.error()));
    }
    // A hung or broken collective: rebuild the plan's communicators.
    RequestReplan("worker " + peer.worker_id + " reported: " + e.error().message(), true);
    return;
  }
  cv_.notify_all();
}

void CoordinatorDaemon::OnWorkerLost(const std::string& worker_id) {
  TESSERA_LOG_ERROR("coordinator", "worker {} missed its heartbeats: marked failed", worker_id);
  bool in_plan = false, serving = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    failed_workers_.push_back(worker_id);
    for (const Assignment& a : assignments_) in_plan |= a.worker_id == worker_id;
    serving = serving_;
    cv_.notify_all();
  }
  {
    std::lock_guard<std::mutex> lock(exec_mu_);
    if (executor_) executor_->OnWorkerFailed(worker_id, Unavailable("missed heartbeats"));
  }
  if (in_plan && serving) {
    ready_.store(false);
    RequestReplan("worker " + worker_id + " lost (missed heartbeats)", true);
  }
}

StatusOr<std::pair<ParallelConfig, std::vector<RankPlacement>>> CoordinatorDaemon::ProposePlan(
    const PlanRequest& request) const {
  if (request.auto_plan)
    return Unimplemented(
        "auto: the topology planner needs the workers' GPU topology reports, which CPU workers do "
        "not send; give tp and pp");
  auto parallel = request.Layout(model_);
  if (!parallel.ok()) return InvalidArgument(parallel.status().message());
  std::vector<std::string> usable = UsableWorkers();
  if (parallel->world_size() > static_cast<int>(usable.size()))
    return InvalidArgument(parallel->ToString() + " needs " +
                           std::to_string(parallel->world_size()) + " workers; the cluster has " +
                           std::to_string(usable.size()) + " usable (alive, not drained)");
  TESSERA_ASSIGN_OR_RETURN(std::vector<RankPlacement> ranks,
                           PlaceRanks(*parallel, usable, HeldSlices()));
  return std::make_pair(*parallel, std::move(ranks));
}

void CoordinatorDaemon::HandlePlanPost(const HttpRequest& req, std::shared_ptr<Responder> res) {
  auto parsed = ParsePlanRequest(req.body);
  if (!parsed.ok()) {
    res->SendError(
        400, parsed.status().message(), std::nullopt,
        parsed.status().code() == StatusCode::kUnimplemented ? "not_supported" : "invalid_plan");
    return;
  }
  auto proposal = ProposePlan(*parsed);
  if (!proposal.ok()) {
    res->SendError(
        400, proposal.status().message(), std::nullopt,
        proposal.status().code() == StatusCode::kUnimplemented ? "not_supported" : "invalid_plan");
    return;
  }
  const auto dry = req.query.find("dry_run");
  const bool dry_run = dry != req.query.end() && (dry->second == "true" || dry->second == "1");
  std::lock_guard<std::mutex> lock(mu_);
  if (dry_run) {
    std::vector<std::string> from;
    for (const Assignment& a : assignments_) from.push_back(a.worker_id);
    json j = PlanChangeJson(serving_ ? &parallel_ : nullptr, proposal->first, proposal->second,
                            from, plan_version_ + 1);
    j["dry_run"] = true;
    j["drain_timeout_seconds"] = config_.scheduler.drain_timeout_seconds;
    res->SendJson(200, j.dump());
    return;
  }
  if (!serving_ || job_running_ || !jobs_.empty()) {
    res->SendError(409,
                   serving_ ? "a reconfiguration is in progress; retry when it is done"
                            : "the initial placement is in progress; retry when serving",
                   std::nullopt, "conflict");
    return;
  }
  PlanJob job;
  job.target = proposal->first;
  job.reason = "POST /admin/plan " + proposal->first.ToString();
  job.res = res;
  jobs_.push_back(std::move(job));
  cv_.notify_all();
}

void CoordinatorDaemon::HandleWorkerDrain(const HttpRequest& req, std::shared_ptr<Responder> res,
                                          bool drain) {
  const std::string id = req.path_params.empty() ? "" : req.path_params[0];
  bool known = false;
  for (const ControlWorkerInfo& w : control_->Workers()) known |= w.worker_id == id;
  if (!known) {
    res->SendError(404, "no worker '" + id + "' has registered", std::nullopt, "unknown_worker");
    return;
  }
  bool in_plan = false, changed = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = std::find(drained_workers_.begin(), drained_workers_.end(), id);
    if (drain && it == drained_workers_.end()) {
      drained_workers_.push_back(id);
      changed = true;
    } else if (!drain && it != drained_workers_.end()) {
      drained_workers_.erase(it);
      changed = true;
    }
    for (const Assignment& a : assignments_) in_plan |= a.worker_id == id;
  }
  TESSERA_LOG_INFO("coordinator", "worker {} {} by the admin API", id,
                   drain ? "drained" : "undrained");
  // Draining a worker of the plan moves its ranks; undraining re-plans so
  // the worker is used again (a no-op layout change reuses every slice).
  const bool replan = changed && (drain ? in_plan : true);
  if (replan) RequestReplan(std::string(drain ? "drain" : "undrain") + " worker " + id, false);
  res->SendJson(
      200,
      json{{"worker", id}, {"drained", drain}, {"changed", changed}, {"replan", replan}}.dump());
}

std::string CoordinatorDaemon::ClusterJson() const {
  json workers = json::array();
  std::lock_guard<std::mutex> lock(mu_);
  for (const ControlWorkerInfo& w : control_->Workers()) {
    const bool failed = std::find(failed_workers_.begin(), failed_workers_.end(), w.worker_id) !=
                        failed_workers_.end();
    const bool drained = std::find(drained_workers_.begin(), drained_workers_.end(), w.worker_id) !=
                         drained_workers_.end();
    bool in_plan = false;
    for (const Assignment& a : assignments_) in_plan |= a.worker_id == w.worker_id;
    json devices = json::array();
    for (const auto& d : w.registration.devices())
      devices.push_back({{"index", d.index()}, {"name", d.name()}});
    workers.push_back({{"id", w.worker_id},
                       {"host", w.registration.host()},
                       {"pid", w.registration.pid()},
                       {"devices", devices},
                       {"state", failed || !w.alive ? "failed"
                                 : drained          ? "drained"
                                                    : "alive"},
                       {"in_plan", in_plan && w.alive},
                       {"seconds_since_last_message", w.seconds_since_last_message}});
  }
  return json{{"workers", workers},
              {"ready", ready_.load()},
              {"degraded", degraded_.empty() ? json(nullptr) : json(degraded_)},
              {"plan_version", plan_version_},
              {"reconfiguring", job_running_ || !jobs_.empty()},
              {"reconfigurations_total", reconfigurations_},
              {"faults_total", faults_},
              {"requeued_requests_total", requeued_total_}}
      .dump();
}

std::string CoordinatorDaemon::PlanJson() const {
  json ranks = json::array();
  std::lock_guard<std::mutex> lock(mu_);
  for (const Assignment& a : assignments_) {
    ranks.push_back({{"worker", a.worker_id},
                     {"world_rank", a.world_rank},
                     {"stage", a.stage},
                     {"tp_rank", a.tp_rank},
                     {"layers", {parallel_.FirstLayer(a.stage), parallel_.EndLayer(a.stage)}},
                     {"predicted_weight_bytes", a.predicted_weight_bytes},
                     {"weight_bytes", a.loaded_weight_bytes},
                     {"reused_weight_bytes", a.reused_weight_bytes},
                     {"kv_bytes", a.kv_bytes},
                     {"load_seconds", a.load_seconds},
                     {"load_bytes_done", a.load_bytes_done},
                     {"load_bytes_total", a.load_bytes_total}});
  }
  return json{{"plan_version", plan_version_},
              {"tp", parallel_.tp},
              {"tp_per_stage", parallel_.TpPerStage()},
              {"pp", parallel_.pp},
              {"layers_per_stage", parallel_.layers_per_stage},
              {"wanted", LayoutJson(wanted_)},
              {"kv_blocks", kv_blocks_},
              {"kv_block_size", config_.kv_cache.block_size},
              {"ranks", ranks},
              {"history", history_}}
      .dump();
}

}  // namespace tessera
