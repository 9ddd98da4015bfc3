#include "coordinator/coordinator_daemon.h"

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>

#include "common/control_codec.h"
#include "common/curve_keys.h"
#include "common/logging.h"
#include "common/metric_catalog.h"
#include "common/shard_spec.h"
#include "coordinator/cluster_model.h"
#include "coordinator/cost_model.h"
#include "coordinator/openai_api.h"
#include "coordinator/placement_planner.h"
#include "coordinator/worker_cluster.h"
#include "worker/worker_registration.h"

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
  if (config_.parallel.mode == ParallelMode::kExplicit) {
    // The layout's rules against the model, before any worker is waited for.
    TESSERA_ASSIGN_OR_RETURN(
        parallel_, config_.parallel.tp_per_stage.empty()
                       ? ParallelConfig::Make(model_, config_.parallel.tp, config_.parallel.pp,
                                              config_.parallel.layers_per_stage)
                       : ParallelConfig::MakePerStage(model_, config_.parallel.tp_per_stage,
                                                      config_.parallel.layers_per_stage));
    expected_workers_ = parallel_.world_size();
  } else {
    expected_workers_ = std::max(1, config_.parallel.workers);
  }
  planner_ = std::make_unique<PlacementPlanner>();
  max_context_ = config_.scheduler.max_context > 0 ? config_.scheduler.max_context
                                                   : model_.max_position_embeddings;
  if (max_context_ > model_.max_position_embeddings)
    return InvalidArgument("scheduler.max_context " + std::to_string(max_context_) +
                           " exceeds the model's max_position_embeddings " +
                           std::to_string(model_.max_position_embeddings));
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
  co.accept_register = [](const ControlPeer&, const control::Register& reg) -> Status {
    // The planner needs a readable topology report; refuse a broken one now.
    if (reg.topology_json().empty()) return Status::Ok();
    return TopologyReportFromJson(reg.topology_json(), "Register.topology_json").status();
  };
  if (!config_.control.coordinator_secret_key_file.empty()) {
    auto keys = LoadCurveSecretKeyFile(config_.control.coordinator_secret_key_file);
    if (!keys.ok()) return keys.status().WithContext("control.coordinator_secret_key_file");
    co.curve_secret_key = keys->secret_key;
    co.curve_allowed_public_keys = config_.control.worker_public_keys;
  }
  control_ = std::make_unique<ControlServer>(co);
  TESSERA_ASSIGN_OR_RETURN(control_endpoint_, control_->Start(config_.server.control_endpoint));
  // The rendezvous store listens on the control plane's host (every
  // interface for a wildcard endpoint; workers then use the address they
  // reach the control plane at).
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
  ho.max_header_count = static_cast<size_t>(config_.server.max_header_count);
  ho.tls_cert_file = config_.server.tls_cert;  // the admin listener (ao = ho) too
  ho.tls_key_file = config_.server.tls_key;
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
  const ModelSizes sizes = ModelSizes::From(model_, DType::kF32, DType::kF32);
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
      StageShape shape;
      shape.tp = par.tp;
      shape.layers = st.layers();
      a.predicted_kv_bytes = static_cast<int64_t>(static_cast<double>(blocks * block) *
                                                  KvBytesPerTokenPerGpu(sizes, shape));
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
  // 1. Wait for the workers.
  std::vector<ControlWorkerInfo> workers;
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (cv_.wait_for(lock, std::chrono::milliseconds(100), [&] { return stopping_; })) return;
    }
    workers.clear();
    for (const ControlWorkerInfo& w : control_->Workers())
      if (w.alive) workers.push_back(w);
    if (static_cast<int>(workers.size()) >= expected_workers_) break;
  }
  workers.resize(static_cast<size_t>(expected_workers_));
  // 2. Plan; nothing is assigned unless a layout fits.
  if (Status st = Plan(workers); !st.ok()) return fail(st);
  std::vector<Assignment> plan;
  ParallelConfig parallel;
  int64_t kv_blocks = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    plan = assignments_;
    parallel = parallel_;
    kv_blocks = kv_blocks_;
    TESSERA_LOG_INFO(
        "coordinator", "plan {}: {} on {} of {} workers\n{}", plan_version_, parallel.ToString(),
        plan.size(), workers.size(),
        plan_result_ ? plan_result_->ToText() : std::string("(explicit tp per stage)"));
  }
  for (const Assignment& a : plan) {
    control::Envelope e;
    control::AssignShard* s = e.mutable_assign_shard();
    s->set_plan_version(plan_version_);
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
    s->set_kv_num_blocks(static_cast<uint64_t>(kv_blocks));
    s->set_device_index(a.device_index);
    control::GlooRendezvous* g = s->mutable_gloo();
    g->set_store_host(StoreHostFor(a.data_address));
    g->set_store_port(static_cast<uint32_t>(store_->port()));
    g->set_key_prefix("plan" + std::to_string(plan_version_) + "/");
    {
      std::lock_guard<std::mutex> lock(mu_);
      states_[a.worker_id] = control::WORKER_STATE_LOADING;
    }
    Status st = control_->Send(a.worker_id, std::move(e));
    if (!st.ok()) return fail(st.WithContext("assigning rank " + std::to_string(a.world_rank)));
  }
  // 3. Wait for every Loaded.
  while (true) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, std::chrono::milliseconds(100));
    if (stopping_) return;
    if (!failed_workers_.empty())
      return lock.unlock(),
             fail(Unavailable("worker " + failed_workers_.front() + " failed while loading"));
    if (std::all_of(assignments_.begin(), assignments_.end(),
                    [](const Assignment& a) { return a.loaded_weight_bytes >= 0; }))
      break;
  }
  std::vector<std::string> first, all;
  for (const Assignment& a : plan) {
    all.push_back(a.worker_id);
    if (a.stage == 0) first.push_back(a.worker_id);
  }
  executor_ =
      std::make_unique<RemoteExecutor>(control_.get(), plan_version_, first, all, parallel.pp,
                                       model_.vocab_size, config_.heartbeat.timeout_seconds + 30.0);
  allocator_ = std::make_unique<BlockAllocator>(kv_blocks);
  SchedulerOptions so;
  so.max_batch_tokens = config_.scheduler.max_batch_tokens;
  so.max_sequences = config_.scheduler.max_sequences;
  so.queue_limit = config_.scheduler.queue_limit;
  so.max_context = max_context_;
  so.prefill_chunk_tokens = config_.scheduler.prefill_chunk_tokens;
  scheduler_ = std::make_unique<Scheduler>(model_, executor_.get(), allocator_.get(),
                                           config_.kv_cache.block_size, tokenizer_.get(), so);
  scheduler_thread_ = std::thread([this] { SchedulerLoop(); });
  ready_.store(true);
  cv_.notify_all();
  TESSERA_LOG_INFO("coordinator", "plan {} loaded on {} workers; serving", plan_version_,
                   plan.size());
}

void CoordinatorDaemon::SchedulerLoop() {
  while (true) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return;
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
      TESSERA_LOG_ERROR("coordinator", "step failed: {}", progressed.status().ToString());
      ready_.store(false);
      continue;  // requests in flight were failed back; new ones fail at Submit
    }
    if (!*progressed) {
      std::unique_lock<std::mutex> lock(work_mu_);
      work_cv_.wait_for(lock, std::chrono::milliseconds(20));
    }
  }
}

void CoordinatorDaemon::OnControlMessage(const ControlPeer& peer, const control::Envelope& e) {
  if (e.has_step_result()) {
    if (executor_) executor_->OnStepResult(peer.worker_id, e.step_result());
    return;
  }
  std::lock_guard<std::mutex> lock(mu_);
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
    for (Assignment& a : assignments_) {
      if (a.worker_id != peer.worker_id) continue;
      a.load_bytes_done = static_cast<int64_t>(e.load_progress().bytes_done());
      a.load_bytes_total = static_cast<int64_t>(e.load_progress().bytes_total());
    }
  } else if (e.has_loaded()) {
    states_[peer.worker_id] = control::WORKER_STATE_READY;
    for (Assignment& a : assignments_) {
      if (a.worker_id != peer.worker_id) continue;
      a.loaded_weight_bytes = static_cast<int64_t>(e.loaded().weights_bytes());
      a.kv_bytes = static_cast<int64_t>(e.loaded().kv_bytes());
      a.load_seconds = e.loaded().load_seconds();
    }
  } else if (e.has_error()) {
    states_[peer.worker_id] = control::WORKER_STATE_FAILED;
    TESSERA_LOG_ERROR("coordinator", "worker {}: {}", peer.worker_id, e.error().message());
    failed_workers_.push_back(peer.worker_id);
    if (executor_) executor_->OnWorkerFailed(peer.worker_id, ErrorToStatus(e.error()));
    ready_.store(false);
  }
  cv_.notify_all();
}

void CoordinatorDaemon::OnWorkerLost(const std::string& worker_id) {
  TESSERA_LOG_ERROR("coordinator", "worker {} missed its heartbeats: marked failed", worker_id);
  {
    std::lock_guard<std::mutex> lock(mu_);
    failed_workers_.push_back(worker_id);
    cv_.notify_all();
  }
  if (executor_) executor_->OnWorkerFailed(worker_id, Unavailable("missed heartbeats"));
  bool in_plan = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const Assignment& a : assignments_) in_plan |= a.worker_id == worker_id;
  }
  if (in_plan) ready_.store(false);
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
                       {"state", failed || !w.alive ? "failed" : "alive"},
                       {"worker_state", st == states_.end() ? "registered" : StateName(st->second)},
                       {"rank", role},
                       {"seconds_since_last_message", w.seconds_since_last_message}});
  }
  json queue = nullptr;
  if (ready_.load() && scheduler_)
    queue = {{"waiting", scheduler_->waiting()}, {"running", scheduler_->running()}};
  return json{{"workers", workers},
              {"ready", ready_.load()},
              {"plan_version", plan_version_},
              {"queue", queue}}
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
