#include "coordinator/coordinator_daemon.h"

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>
#include <set>

#include "common/base/logging.h"
#include "common/metrics/metric_catalog.h"
#include "common/model/shard_spec.h"
#include "common/net/curve_keys.h"
#include "common/net/endpoint.h"
#include "common/net/store_auth.h"
#include "common/wire/control_codec.h"
#include "coordinator/api/openai_api.h"
#include "coordinator/control/control_plane_guard.h"
#include "coordinator/control/worker_cluster.h"
#include "coordinator/placement/cluster_model.h"
#include "coordinator/placement/cost_model.h"
#include "coordinator/placement/placement_planner.h"

namespace tessera {

using nlohmann::json;

CoordinatorDaemon::CoordinatorDaemon(DaemonConfig config) : config_(std::move(config)) {}

CoordinatorDaemon::~CoordinatorDaemon() { Stop(); }

int CoordinatorDaemon::api_port() const { return api_ ? api_->port() : 0; }
int CoordinatorDaemon::admin_port() const { return admin_ ? admin_->port() : api_port(); }

ListenerPorts CoordinatorDaemon::ports() const {
  ListenerPorts p;
  p.api = api_port();
  p.admin = admin_port();
  auto control = EndpointPort(control_endpoint_);
  p.control = control.ok() ? *control : 0;
  p.store = store_ ? store_->port() : 0;
  return p;
}

Status CoordinatorDaemon::Start() {
  const std::string& dir = config_.model.path;
  // Errors found here name the config key (and its file:line:col) to fix.
  const std::string model_key = ConfigKeyContext(config_, "model.path");
  auto model = LoadModelConfig(dir);
  if (!model.ok()) return model.status().WithContext(model_key);
  model_ = std::move(model).value();
  auto tokenizer = Tokenizer::Load(dir);
  if (!tokenizer.ok()) return tokenizer.status().WithContext(model_key);
  tokenizer_ = std::move(tokenizer).value();
  if (config_.model.chat_template) {
    TESSERA_ASSIGN_OR_RETURN(chat_template_,
                             ChatTemplate::FromName(ChatFormatName(*config_.model.chat_template)));
  } else {
    auto t = ChatTemplate::Detect(tokenizer_->chat_template());
    if (t.ok()) chat_template_ = *t;  // else chat requests get a 400 naming the problem
  }
  if (config_.parallel.mode == ParallelMode::kExplicit) {
    // The layout's rules against the model, before any worker is waited for.
    auto parallel = config_.parallel.tp_per_stage.empty()
                        ? ParallelConfig::Make(model_, config_.parallel.tp, config_.parallel.pp,
                                               config_.parallel.layers_per_stage)
                        : ParallelConfig::MakePerStage(model_, config_.parallel.tp_per_stage,
                                                       config_.parallel.layers_per_stage);
    if (!parallel.ok()) {
      // Name the key the message is about (pp=3 over 2 layers: parallel.pp).
      const char* layout_key = "parallel.tp";
      switch (LayoutParamOfError(parallel.status())) {
        case LayoutParam::kPp:
          layout_key = "parallel.pp";
          break;
        case LayoutParam::kLayersPerStage:
          layout_key = "parallel.layers_per_stage";
          break;
        case LayoutParam::kModel:
          layout_key = "model.path";
          break;
        case LayoutParam::kTp:
          break;
      }
      return parallel.status().WithContext(ConfigKeyContext(config_, layout_key) + " (model.path " +
                                           dir + ")");
    }
    parallel_ = std::move(parallel).value();
    expected_workers_ = parallel_.world_size();
    wanted_ = parallel_;
  } else {
    expected_workers_ = std::max(1, config_.parallel.workers);
  }
  planner_ = std::make_unique<PlacementPlanner>();
  const ContextLimit limit = ModelContextLimit(model_);  // common/format/model_config.h
  max_context_ =
      config_.scheduler.max_context > 0 ? config_.scheduler.max_context : limit.default_tokens;
  if (max_context_ > limit.max_tokens)
    return InvalidArgument(ConfigKeyContext(config_, "scheduler.max_context") + ": " +
                           std::to_string(max_context_) + " exceeds the model's " + limit.bound);
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
  co.on_worker_forgotten = [this](const std::string& id) { OnWorkerForgotten(id); };
  co.on_dropped = [this](const ControlPeer&, const Status& why) { drops_.CountServerDrop(why); };
  co.accept_register = [](const ControlPeer&, const control::Register& reg) -> Status {
    // The planner needs a readable topology report; refuse a broken one now.
    if (reg.topology_json().empty()) return Status::Ok();
    return TopologyReportFromJson(reg.topology_json(), "Register.topology_json").status();
  };
  TESSERA_RETURN_IF_ERROR(ConfigureControlSecurity(config_, &co));
  control_ = std::make_unique<ControlServer>(co);
  TESSERA_ASSIGN_OR_RETURN(control_endpoint_, control_->Start(config_.server.control_endpoint));
  // The rendezvous store listens on the control plane's host (every
  // interface for a wildcard endpoint; workers then use the address they
  // reach the control plane at).
  std::string store_host = "127.0.0.1";
  const std::string& ep = config_.server.control_endpoint;
  if (ep.rfind("tcp://", 0) == 0) store_host = ep.substr(6, ep.rfind(':') - 6);
  if (store_host == "*") store_host = "0.0.0.0";
  TESSERA_ASSIGN_OR_RETURN(store_secret_, NewStoreSecret());
  TcpStoreServerOptions so;
  so.secret = store_secret_;
  so.limits.max_frame_bytes = config_.store.max_frame_bytes;
  so.limits.max_connections = config_.store.max_connections;
  so.limits.max_keys = config_.store.max_keys;
  so.limits.max_bytes = config_.store.max_bytes;
  so.limits.handshake_timeout_seconds = config_.store.handshake_timeout_seconds;
  static_assert(StoreSection{}.max_frame_bytes == TcpStoreLimits{}.max_frame_bytes &&
                    StoreSection{}.max_connections == TcpStoreLimits{}.max_connections &&
                    StoreSection{}.max_keys == TcpStoreLimits{}.max_keys &&
                    StoreSection{}.max_bytes == TcpStoreLimits{}.max_bytes,
                "[store] defaults and TcpStoreLimits' (the launcher's) differ");
  TESSERA_ASSIGN_OR_RETURN(store_, TcpStoreServer::Start(store_host, 0, std::move(so)));
  TESSERA_LOG_INFO("coordinator", "rendezvous store listening on {}:{}", store_->host(),
                   store_->port());

  HttpServerOptions ho;
  ho.bind_address = config_.server.host;
  ho.port = config_.server.port;
  ho.read_timeout_seconds = config_.server.read_timeout_seconds;
  ho.max_body_bytes = static_cast<size_t>(config_.server.max_body_bytes);
  ho.max_connections = config_.server.max_connections;
  ho.max_header_count = static_cast<size_t>(config_.server.max_header_count);
  ho.tls_cert_file = config_.server.tls_cert;  // the admin listener (ao = ho) too
  ho.tls_key_file = config_.server.tls_key;
  api_ = std::make_unique<HttpServer>(ho);
  if (config_.admin.port != 0 || config_.admin.pick_port) {
    HttpServerOptions ao = ho;
    ao.bind_address = config_.admin.host;
    ao.port = config_.admin.pick_port ? 0 : config_.admin.port;
    admin_ = std::make_unique<HttpServer>(ao);
  }
  RegisterRoutes(*api_, admin_.get());
  TESSERA_RETURN_IF_ERROR(api_->Start());
  if (admin_) TESSERA_RETURN_IF_ERROR(admin_->Start());
  TESSERA_LOG_INFO("coordinator", "listening: api {}:{}, admin {}:{}, control {}, store {}",
                   config_.server.host, api_port(),
                   admin_ ? config_.admin.host : config_.server.host, admin_port(),
                   control_endpoint_, store_->port());
  TESSERA_LOG_INFO(
      "coordinator", "serving {} on http://{}:{}, control {}, waiting for {} workers ({})",
      model_name_, config_.server.host, api_port(), control_endpoint_, expected_workers_,
      config_.parallel.mode == ParallelMode::kExplicit
          ? parallel_.ToString()
          : std::string("auto placement, objective ") +
                ParallelObjectiveName(config_.parallel.objective));
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
    // Every live worker, assigned or idle, exits.
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

std::vector<ControlWorkerInfo> CoordinatorDaemon::WorkerInfos(
    const std::vector<std::string>& ids) const {
  std::vector<ControlWorkerInfo> all = control_->Workers(), out;
  for (const std::string& id : ids)
    for (const ControlWorkerInfo& w : all)
      if (w.worker_id == id) {
        out.push_back(w);
        break;
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
    const std::vector<std::string>& usable, uint64_t* version, int64_t* kv_blocks) const {
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
  *kv_blocks = static_cast<int64_t>(first->kv_num_blocks());
  return std::make_pair(*parallel, std::move(ranks));
}

// An explicit tp per stage: the planner searches uniform tp only, so the
// ranks go to the workers in registration order (docs/operations.md), with
// the KV cache kv_cache.max_blocks (or room for min(8, max_sequences)
// sequences of scheduler.max_context).
Status CoordinatorDaemon::PlanPerStageTp(const std::vector<ControlWorkerInfo>& workers) {
  const int64_t block = config_.kv_cache.block_size;
  const int64_t blocks = config_.kv_cache.max_blocks > 0
                             ? config_.kv_cache.max_blocks
                             : BlockAllocator::BlocksFor(max_context_, block) *
                                   std::min<int64_t>(8, config_.scheduler.max_sequences);
  std::vector<Assignment> plan;
  for (int r = 0; r < parallel_.world_size(); ++r) {
    const ControlWorkerInfo& w = workers[static_cast<size_t>(r)];
    Assignment a;
    a.worker_id = w.worker_id;
    a.host = w.registration.host();
    a.data_address = w.registration.data_address();
    a.device_index = w.registration.devices_size() ? w.registration.devices(0).index() : 0;
    a.world_rank = r;
    a.stage = parallel_.StageOf(r);
    a.tp_rank = parallel_.TpRankOf(r);
    TESSERA_ASSIGN_OR_RETURN(ShardSpec spec, ShardSpec::Make(model_, parallel_, r));
    a.shard_weight_bytes = a.predicted_weight_bytes = spec.WeightBytes(DType::kF32);
    plan.push_back(a);
  }
  std::lock_guard<std::mutex> lock(mu_);
  kv_blocks_ = blocks;
  assignments_ = std::move(plan);
  plan_result_.reset();
  return Status::Ok();
}

PlanOptions CoordinatorDaemon::PlanOptionsFor(bool cpu) const {
  PlanOptions o;
  o.objective = config_.parallel.objective == ParallelObjective::kThroughput
                    ? Objective::kThroughput
                    : Objective::kLatency;
  o.max_context = max_context_;
  o.min_kv_tokens = max_context_;  // one sequence of the longest context, at least
  o.gpu_memory_fraction = config_.kv_cache.memory_fraction;
  // The CPU backend holds weights and KV in float32 whatever the checkpoint.
  if (cpu) {
    o.weight_dtype = o.kv_dtype = DType::kF32;
  } else if (config_.model.dtype) {
    o.weight_dtype = o.kv_dtype = *config_.model.dtype;
  }
  o.prefill_chunk_tokens = config_.scheduler.prefill_chunk_tokens;
  o.max_batch = config_.scheduler.max_sequences;
  o.max_replicas = 1;  // the scheduler drives one pipeline
  o.uniform_tp = true;
  if (cpu) {
    // Gloo over TCP: a collective costs tens of microseconds, not NCCL's ten.
    o.cost.collective_launch_s = 50e-6;
    o.cost.pcie_step_s = 20e-6;
    o.cost.network_step_s = 50e-6;
  }
  if (config_.parallel.mode == ParallelMode::kExplicit) {
    o.fixed_tp = config_.parallel.tp;
    o.fixed_pp = config_.parallel.pp;
    // The configured split, or the even one ParallelConfig made of `[]`.
    o.fixed_layers_per_stage = config_.parallel.layers_per_stage.empty()
                                   ? parallel_.layers_per_stage
                                   : config_.parallel.layers_per_stage;
    o.allow_cross_node_tp = true;  // the operator chose the tp
  }
  return o;
}

Status CoordinatorDaemon::Plan(const std::vector<ControlWorkerInfo>& workers) {
  if (config_.parallel.mode == ParallelMode::kExplicit && !parallel_.tp_per_stage.empty())
    return PlanPerStageTp(workers);
  TESSERA_ASSIGN_OR_RETURN(WorkerCluster cluster, BuildWorkerCluster(workers));
  TESSERA_ASSIGN_OR_RETURN(ClusterModel model, BuildClusterModel(cluster.topology));
  auto result = planner_->Plan(model_, model, PlanOptionsFor(cluster.cpu));
  if (!result.ok())
    return result.status().WithContext(std::string("placement refused (parallel.mode = ") +
                                       ParallelModeName(config_.parallel.mode) + ", " +
                                       std::to_string(workers.size()) +
                                       " worker(s)); no worker was assigned anything");
  for (const std::string& n : cluster.notes) result->explanation.notes.push_back(n);
  if (result->plan.replicas.empty()) return Internal("the planner placed no replica");
  TESSERA_ASSIGN_OR_RETURN(ParallelConfig par, result->plan.ParallelConfigOf(model_, 0));
  const PlannedReplica& rep = result->plan.replicas[0];
  // KV blocks: what fits on the tightest rank (the planner's KV pool), at
  // most what the scheduler can use and kv_cache.max_blocks.
  const int64_t block = config_.kv_cache.block_size;
  int64_t blocks = rep.kv_tokens / block;
  blocks = std::min(
      blocks, config_.scheduler.max_sequences * BlockAllocator::BlocksFor(max_context_, block));
  if (config_.kv_cache.max_blocks > 0) blocks = std::min(blocks, config_.kv_cache.max_blocks);
  if (blocks < BlockAllocator::BlocksFor(max_context_, block))
    return ResourceExhausted("the KV cache holds " + std::to_string(blocks) + " blocks of " +
                             std::to_string(block) + " tokens, less than one sequence of " +
                             "scheduler.max_context " + std::to_string(max_context_));
  std::vector<Assignment> plan;
  for (int s = 0; s < rep.pp(); ++s) {
    const PlannedStage& st = rep.stages[s];
    for (int i = 0; i < st.tp; ++i) {
      const GpuRef& ref = st.gpus[i];
      Assignment a;
      a.worker_id = cluster.workers[ref.node][ref.gpu];
      for (const ControlWorkerInfo& w : workers) {
        if (w.worker_id != a.worker_id) continue;
        a.host = w.registration.host();
        a.data_address = w.registration.data_address();
        a.device_index = w.registration.devices(0).index();
      }
      a.world_rank = s * par.tp + i;
      a.stage = s;
      a.tp_rank = i;
      a.predicted_weight_bytes = st.weight_bytes;
      TESSERA_ASSIGN_OR_RETURN(ShardSpec spec, ShardSpec::Make(model_, par, a.world_rank));
      a.shard_weight_bytes = spec.WeightBytes(DType::kF32);
      a.predicted_kv_bytes = PredictedKvBytes(par, s, blocks);
      plan.push_back(a);
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  parallel_ = par;
  kv_blocks_ = blocks;
  assignments_ = std::move(plan);
  plan_result_ = std::move(*result);
  return Status::Ok();
}

std::string CoordinatorDaemon::StoreHostFor(const std::string& worker_address) const {
  if (store_->host() != "0.0.0.0") return store_->host();
  // The store listens on every interface: name the one that routes to the
  // worker (its Gloo address is on the network it shares with us).
  if (!worker_address.empty()) {
    auto local = LocalAddressToward("tcp://" + worker_address + ":1");
    if (local.ok()) return *local;
  }
  return "127.0.0.1";
}

void CoordinatorDaemon::PlaceAndServe() {
  auto fail = [&](const Status& s) {
    TESSERA_LOG_ERROR("coordinator", "placement failed: {}", s.ToString());
    std::lock_guard<std::mutex> lock(mu_);
    placement_status_ = s;
    cv_.notify_all();
  };
  // 1. Wait for the workers: the layout's count (parallel.workers in auto
  //    mode), or (after a coordinator restart) workers re-registering with a
  //    complete plan they hold.
  std::vector<std::string> workers;
  std::optional<std::pair<ParallelConfig, std::vector<RankPlacement>>> adopted;
  uint64_t adopted_version = 0;
  int64_t adopted_kv_blocks = 0;
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (cv_.wait_for(lock, std::chrono::milliseconds(100), [&] { return stopping_; })) return;
    }
    workers = UsableWorkers();
    adopted = HeldPlan(workers, &adopted_version, &adopted_kv_blocks);
    if (adopted || static_cast<int>(workers.size()) >= expected_workers_) break;
  }
  // 2. Place: the adopted plan's ranks, or the planner's placement (nothing
  //    is assigned unless a layout fits); then apply: workers reuse the
  //    weights they hold.
  std::vector<RankPlacement> ranks;
  std::optional<PlanResult> planned;
  std::vector<Assignment> predicted;
  std::string reason = "initial placement";
  if (adopted) {
    std::lock_guard<std::mutex> lock(mu_);
    parallel_ = wanted_ = adopted->first;
    plan_version_ = adopted_version;
    kv_blocks_ = adopted_kv_blocks;
    ranks = adopted->second;
    reason = "adopted plan " + std::to_string(adopted_version) + " held by the workers";
    TESSERA_LOG_INFO("coordinator", "{}: {}", reason, parallel_.ToString());
  } else {
    std::vector<ControlWorkerInfo> infos = WorkerInfos(workers);
    infos.resize(static_cast<size_t>(expected_workers_));  // the rest are spares
    if (Status st = Plan(infos); !st.ok()) return fail(st);
    std::lock_guard<std::mutex> lock(mu_);
    wanted_ = parallel_;
    predicted.swap(assignments_);  // ApplyPlan fills assignments_ anew
    planned = std::move(plan_result_);
    plan_result_.reset();
    TESSERA_LOG_INFO("coordinator", "placing {} on {} of {} workers\n{}", parallel_.ToString(),
                     predicted.size(), workers.size(),
                     planned ? planned->ToText() : std::string("(explicit tp per stage)"));
    for (const Assignment& a : predicted) {
      RankPlacement r = RankSlice(parallel_, a.world_rank);
      r.worker_id = a.worker_id;
      ranks.push_back(r);
    }
  }
  json report;
  const ParallelConfig layout = parallel_;  // only this thread writes it before serving
  Status applied = ApplyPlan(layout, ranks, reason, report, std::move(planned), &predicted);
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

int64_t CoordinatorDaemon::PredictedKvBytes(const ParallelConfig& parallel, int stage,
                                            int64_t blocks) const {
  StageShape shape;
  shape.tp = parallel.TpOfStage(stage);
  shape.layers = parallel.EndLayer(stage) - parallel.FirstLayer(stage);
  return static_cast<int64_t>(
      static_cast<double>(blocks * config_.kv_cache.block_size) *
      KvBytesPerTokenPerGpu(ModelSizes::From(model_, DType::kF32, DType::kF32), shape));
}

Status CoordinatorDaemon::ApplyPlan(const ParallelConfig& parallel,
                                    const std::vector<RankPlacement>& ranks,
                                    const std::string& reason, json& report,
                                    std::optional<PlanResult> planned,
                                    const std::vector<Assignment>* predicted) {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<Assignment> plan;
  const std::vector<ControlWorkerInfo> infos = control_->Workers();
  int64_t kv_blocks = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    kv_blocks = kv_blocks_;
  }
  for (const RankPlacement& r : ranks) {
    Assignment a;
    a.worker_id = r.worker_id;
    for (const ControlWorkerInfo& w : infos) {
      if (w.worker_id != a.worker_id || !w.alive) continue;
      a.host = w.registration.host();
      a.data_address = w.registration.data_address();
      a.device_index = w.registration.devices_size() ? w.registration.devices(0).index() : 0;
    }
    a.world_rank = r.world_rank;
    a.stage = r.stage;
    a.tp_rank = r.tp_rank;
    TESSERA_ASSIGN_OR_RETURN(ShardSpec spec, ShardSpec::Make(model_, parallel, r.world_rank));
    a.shard_weight_bytes = a.predicted_weight_bytes = spec.WeightBytes(DType::kF32);
    // The KV pool keeps its kv_blocks_ across re-plans; this rank's part of it.
    a.predicted_kv_bytes = PredictedKvBytes(parallel, a.stage, kv_blocks);
    // The planner's predictions for this rank, when it placed the plan.
    if (predicted)
      for (const Assignment& p : *predicted)
        if (p.world_rank == a.world_rank && p.worker_id == a.worker_id) {
          a.predicted_weight_bytes = p.predicted_weight_bytes;
          if (p.predicted_kv_bytes > 0) a.predicted_kv_bytes = p.predicted_kv_bytes;
        }
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
    plan_result_ = std::move(planned);  // the planner's explanation, when it placed this plan
    for (const Assignment& a : plan) states_[a.worker_id] = control::WORKER_STATE_LOADING;
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
  // The store admits this plan's ranks (and erases the last plan's keys)
  // before any of them hears of it.
  const std::string key_prefix = "plan" + std::to_string(version) + "/";
  store_->OpenPlan(version, static_cast<int>(plan.size()), key_prefix);
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
    // model.dtype, or the checkpoint's; CPU workers compute in F32 regardless.
    s->set_dtype(DTypeName(config_.model.dtype.value_or(model_.torch_dtype)));
    s->set_kv_block_size(static_cast<uint32_t>(config_.kv_cache.block_size));
    s->set_kv_num_blocks(static_cast<uint64_t>(kv_blocks_));
    s->set_device_index(a.device_index);
    control::GlooRendezvous* g = s->mutable_gloo();
    g->set_store_host(StoreHostFor(a.data_address));
    g->set_store_port(static_cast<uint32_t>(store_->port()));
    g->set_key_prefix(key_prefix);
    g->set_store_key(StoreCredentials::Rank(store_secret_, version, a.world_rank).key);
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
  std::string sampler;  // tp rank 0 of the last stage returns the tokens
  for (const Assignment& a : plan) {
    all.push_back(a.worker_id);
    if (a.stage == 0) first.push_back(a.worker_id);
    if (a.stage == parallel.pp - 1 && a.tp_rank == 0) sampler = a.worker_id;
  }
  auto executor =
      std::make_shared<RemoteExecutor>(control_.get(), version, first, all, sampler, parallel.pp,
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
  // A fault breaks the running plan: /readyz answers 503 (re-planning) from
  // here until the new plan serves, whoever reported the fault.
  if (job.fault) ready_.store(false);
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
    // The planner's workers when it chose them and they are all still usable.
    const bool keep = !job.ranks.empty() &&
                      std::all_of(job.ranks.begin(), job.ranks.end(), [&](const RankPlacement& r) {
                        return std::find(usable.begin(), usable.end(), r.worker_id) != usable.end();
                      });
    auto placed = keep ? StatusOr<std::vector<RankPlacement>>(job.ranks)
                       : PlaceRanks(target, usable, HeldSlices());
    if (!placed.ok()) {
      result = placed.status();
      break;
    }
    result = ApplyPlan(target, *placed, job.reason, report,
                       keep ? job.planned : std::optional<PlanResult>());
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
    if (!ex) {
      drops_.Drop(peer.worker_id, "no_plan",
                  "StepResult for plan " + std::to_string(e.step_result().plan_version()) +
                      " while no plan is serving");
      return;
    }
    const StepResultVerdict verdict = ex->OnStepResult(peer.worker_id, e.step_result());
    if (!verdict.accepted()) drops_.Drop(peer.worker_id, verdict.reason, verdict.detail);
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
  if (e.has_heartbeat()) {
    // A heartbeat written before the worker took in its assignment (or its
    // Loaded) is stale: the coordinator already knows better.
    for (const Assignment& a : assignments_) {
      if (a.worker_id != peer.worker_id) continue;
      if (e.heartbeat().plan_version() != plan_version_) return;
      if (a.loaded_weight_bytes >= 0 && e.heartbeat().state() == control::WORKER_STATE_LOADING)
        return;
    }
    states_[peer.worker_id] = e.heartbeat().state();
    return;
  }
  if (e.has_load_progress()) {
    if (e.load_progress().plan_version() != plan_version_) return;
    for (Assignment& a : assignments_) {
      if (a.worker_id != peer.worker_id) continue;
      a.load_bytes_done = static_cast<int64_t>(e.load_progress().bytes_done());
      a.load_bytes_total = static_cast<int64_t>(e.load_progress().bytes_total());
    }
  } else if (e.has_loaded()) {
    if (e.loaded().plan_version() != plan_version_) return;
    states_[peer.worker_id] = control::WORKER_STATE_READY;
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
    const bool in_plan =
        std::any_of(assignments_.begin(), assignments_.end(),
                    [&](const Assignment& a) { return a.worker_id == peer.worker_id; });
    if (!in_plan) {
      // Only a rank of the plan can break it: an idle worker's Error
      // neither fails steps nor forces a re-plan.
      const std::string detail = "Error from a worker outside plan " +
                                 std::to_string(plan_version_) + ": " + e.error().message();
      lock.unlock();
      drops_.Drop(peer.worker_id, "not_in_plan", detail);
      return;
    }
    states_[peer.worker_id] = control::WORKER_STATE_FAILED;
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

void CoordinatorDaemon::OnWorkerForgotten(const std::string& worker_id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    failed_workers_.erase(std::remove(failed_workers_.begin(), failed_workers_.end(), worker_id),
                          failed_workers_.end());
    states_.erase(worker_id);
  }
  drops_.Forget(worker_id);
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

StatusOr<std::pair<ParallelConfig, std::vector<RankPlacement>>> CoordinatorDaemon::ProposeAutoPlan(
    Objective objective, std::optional<PlanResult>* planned) const {
  const std::vector<std::string> usable = UsableWorkers();
  if (usable.empty()) return InvalidArgument("auto: no usable worker (alive, not drained)");
  auto cluster = BuildWorkerCluster(WorkerInfos(usable));
  if (!cluster.ok()) return InvalidArgument("auto: " + cluster.status().message());
  auto topology = BuildClusterModel(cluster->topology);
  if (!topology.ok()) return InvalidArgument("auto: " + topology.status().message());
  // The auto-mode options (whatever parallel.mode says) with the asked objective.
  PlanOptions o = PlanOptionsFor(cluster->cpu);
  const PlanOptions free_layout;
  o.fixed_tp = free_layout.fixed_tp;
  o.fixed_pp = free_layout.fixed_pp;
  o.fixed_layers_per_stage = free_layout.fixed_layers_per_stage;
  o.allow_cross_node_tp = free_layout.allow_cross_node_tp;
  o.objective = objective;
  auto result = planner_->Plan(model_, *topology, o);
  if (!result.ok())
    return InvalidArgument("auto: no layout fits the " + std::to_string(usable.size()) +
                           " usable worker(s): " + result.status().message());
  if (result->plan.replicas.empty()) return Internal("auto: the planner placed no replica");
  auto parallel = result->plan.ParallelConfigOf(model_, 0);
  if (!parallel.ok()) return InvalidArgument("auto: " + parallel.status().message());
  const PlannedReplica& rep = result->plan.replicas[0];
  std::vector<RankPlacement> ranks;
  for (int s = 0; s < rep.pp(); ++s)
    for (int i = 0; i < rep.stages[s].tp; ++i) {
      const GpuRef& ref = rep.stages[s].gpus[i];
      RankPlacement r = RankSlice(*parallel, parallel->WorldRank(s, i));
      r.worker_id = cluster->workers[ref.node][ref.gpu];
      ranks.push_back(r);
    }
  TESSERA_LOG_INFO("coordinator", "auto plan ({}): {}\n{}", ObjectiveName(objective),
                   parallel->ToString(), result->ToText());
  if (planned) *planned = std::move(*result);
  return std::make_pair(*parallel, std::move(ranks));
}

StatusOr<std::pair<ParallelConfig, std::vector<RankPlacement>>> CoordinatorDaemon::ProposePlan(
    const PlanRequest& request, std::optional<PlanResult>* planned) const {
  if (request.auto_plan) return ProposeAutoPlan(request.objective, planned);
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
  std::optional<PlanResult> planned;
  auto proposal = ProposePlan(*parsed, &planned);
  if (!proposal.ok()) {
    res->SendError(
        400, proposal.status().message(), std::nullopt,
        proposal.status().code() == StatusCode::kUnimplemented ? "not_supported" : "invalid_plan");
    return;
  }
  // The query is checked as strictly as the body: a misspelt dry run must
  // not apply the plan.
  bool dry_run = false;
  for (const auto& [key, value] : req.query) {
    if (key != "dry_run") {
      res->SendError(400, "unknown query parameter '" + key + "' (POST /admin/plan takes dry_run)",
                     key, "invalid_plan");
      return;
    }
    if (value.empty() || value == "true" || value == "1") {
      dry_run = true;
    } else if (value != "false" && value != "0") {
      res->SendError(400, "dry_run: expected true, false, 1 or 0, got '" + value + "'",
                     std::string("dry_run"), "invalid_plan");
      return;
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (dry_run) {
    std::vector<std::string> from;
    for (const Assignment& a : assignments_) from.push_back(a.worker_id);
    json j = PlanChangeJson(serving_ ? &parallel_ : nullptr, proposal->first, proposal->second,
                            from, plan_version_ + 1);
    j["dry_run"] = true;
    j["drain_timeout_seconds"] = config_.scheduler.drain_timeout_seconds;
    if (planned) j["planner_text"] = planned->ToText();  // why the planner chose it
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
  job.reason =
      std::string("POST /admin/plan ") + (planned ? "auto " : "") + proposal->first.ToString();
  if (planned) {
    job.ranks = proposal->second;
    job.planned = std::move(planned);
  }
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

namespace {

const char* StateName(control::WorkerState s) {
  switch (s) {
    case control::WORKER_STATE_IDLE:
      return "idle";
    case control::WORKER_STATE_LOADING:
      return "loading";
    case control::WORKER_STATE_READY:
      return "ready";
    case control::WORKER_STATE_DRAINING:
      return "draining";
    case control::WORKER_STATE_FAILED:
      return "failed";
    default:
      return "unknown";
  }
}

json StageJson(const PlannedStage& st, const std::vector<std::string>& workers) {
  json gpus = json::array();
  for (const GpuRef& g : st.gpus) gpus.push_back({g.node, g.gpu});
  return {{"tp", st.tp},
          {"hosts", st.hosts},
          {"workers", workers},
          {"devices", gpus},
          {"device_name", st.gpu_name},
          {"layers", {st.first_layer, st.end_layer}},
          {"embedding", st.embedding},
          {"lm_head", st.lm_head},
          {"tp_link", st.tp_link},
          {"predicted_weight_bytes", st.weight_bytes},
          {"predicted_kv_pool_bytes", st.kv_bytes},
          {"predicted_activation_bytes", st.activation_bytes},
          {"usable_bytes", st.usable_bytes},
          {"predicted_decode_seconds", st.decode_seconds}};
}

}  // namespace

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
      devices.push_back({{"index", d.index()},
                         {"name", d.name()},
                         {"kind", d.kind() == control::DEVICE_KIND_CPU ? "cpu" : "cuda"},
                         {"memory_bytes", d.total_memory_bytes()}});
    json role = nullptr;
    for (const Assignment& a : assignments_)
      if (a.worker_id == w.worker_id)
        role = {{"world_rank", a.world_rank}, {"stage", a.stage}, {"tp_rank", a.tp_rank}};
    auto st = states_.find(w.worker_id);
    workers.push_back({{"id", w.worker_id},
                       {"host", w.registration.host()},
                       {"pid", w.registration.pid()},
                       {"data_address", w.registration.data_address()},
                       {"devices", devices},
                       {"curve_public_key", w.curve_public_key},
                       {"state", failed || !w.alive ? "failed"
                                 : drained          ? "drained"
                                                    : "alive"},
                       {"worker_state", st == states_.end() ? "registered" : StateName(st->second)},
                       {"rank", role},
                       {"in_plan", in_plan && w.alive},
                       {"seconds_since_last_message", w.seconds_since_last_message}});
  }
  json queue = nullptr;
  if (ready_.load() && scheduler_)
    queue = {{"waiting", scheduler_->waiting()}, {"running", scheduler_->running()}};
  return json{{"workers", workers},
              {"ready", ready_.load()},
              {"degraded", degraded_.empty() ? json(nullptr) : json(degraded_)},
              {"plan_version", plan_version_},
              {"queue", queue},
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
                     {"host", a.host},
                     {"device", a.device_index},
                     {"world_rank", a.world_rank},
                     {"stage", a.stage},
                     {"tp_rank", a.tp_rank},
                     {"layers", {parallel_.FirstLayer(a.stage), parallel_.EndLayer(a.stage)}},
                     {"predicted_weight_bytes", a.predicted_weight_bytes},
                     {"shard_weight_bytes", a.shard_weight_bytes},
                     {"weight_bytes", a.loaded_weight_bytes},
                     {"reused_weight_bytes", a.reused_weight_bytes},
                     {"predicted_kv_bytes", a.predicted_kv_bytes},
                     {"kv_bytes", a.kv_bytes},
                     {"load_seconds", a.load_seconds},
                     {"load_bytes_done", a.load_bytes_done},
                     {"load_bytes_total", a.load_bytes_total}});
  }
  json out = {{"plan_version", plan_version_},
              {"mode", ParallelModeName(config_.parallel.mode)},
              {"ready", ready_.load()},
              {"ranks", ranks}};
  if (!placement_status_.ok()) out["error"] = placement_status_.ToString();
  if (assignments_.empty()) {
    if (placement_status_.ok()) out["waiting_for_workers"] = expected_workers_;
    return out.dump();
  }
  out["tp"] = parallel_.tp;  // 0 when stages differ in tp
  out["tp_per_stage"] = parallel_.TpPerStage();
  out["pp"] = parallel_.pp;
  out["layers_per_stage"] = parallel_.layers_per_stage;
  out["kv_blocks"] = kv_blocks_;
  out["kv_block_size"] = config_.kv_cache.block_size;
  out["wanted"] = LayoutJson(wanted_);
  out["history"] = history_;
  if (!plan_result_) return out.dump();  // an explicit tp per stage: no planner run
  const PlanResult& r = *plan_result_;
  const PlannedReplica& rep = r.plan.replicas[0];
  json stages = json::array();
  for (int s = 0; s < rep.pp(); ++s) {
    std::vector<std::string> ws;
    for (const Assignment& a : assignments_)
      if (a.stage == s) ws.push_back(a.worker_id);
    stages.push_back(StageJson(rep.stages[s], ws));
  }
  json top = json::array();
  for (const CandidateSummary& c : r.explanation.top)
    top.push_back({{"layout", c.layout},
                   {"pp", c.pp},
                   {"replicas", c.replicas},
                   {"devices_used", c.gpus_used},
                   {"decode_latency_s", c.decode_latency_s},
                   {"throughput_tokens_per_s", c.throughput_tokens_per_s},
                   {"peak_device_bytes", c.peak_gpu_bytes},
                   {"usable_device_bytes", c.usable_gpu_bytes},
                   {"note", c.note}});
  json rejected = json::array();
  for (const Rejection& x : r.explanation.rejected)
    rejected.push_back({{"layout", x.what}, {"why", x.why}});
  out["planner"] = {{"objective", ObjectiveName(r.plan.objective)},
                    {"layout", r.plan.layout},
                    {"devices_used", r.plan.gpus_used},
                    {"devices_total", r.plan.gpus_total},
                    {"decode_latency_s", rep.decode_latency_s},
                    {"throughput_tokens_per_s", rep.throughput_tokens_per_s},
                    {"kv_tokens", rep.kv_tokens},
                    {"hop_links", rep.hop_links},
                    {"hop_seconds", rep.hop_seconds},
                    {"stages", stages},
                    {"candidates_evaluated", r.explanation.candidates_evaluated},
                    {"candidates_fitting", r.explanation.candidates_fitting},
                    {"top", top},
                    {"rejected", rejected},
                    {"notes", r.explanation.notes},
                    {"text", r.ToText()}};
  return out.dump();
}

}  // namespace tessera
