#include "coordinator/coordinator_daemon.h"

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>

#include "common/control_codec.h"
#include "common/curve_keys.h"
#include "common/logging.h"
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
  TESSERA_ASSIGN_OR_RETURN(parallel_,
                           ParallelConfig::Make(model_, config_.parallel.tp, config_.parallel.pp,
                                                config_.parallel.layers_per_stage));
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
  if (!config_.control.coordinator_secret_key_file.empty()) {
    auto keys = LoadCurveSecretKeyFile(config_.control.coordinator_secret_key_file);
    if (!keys.ok()) return keys.status().WithContext("control.coordinator_secret_key_file");
    co.curve_secret_key = keys->secret_key;
    co.curve_allowed_public_keys = config_.control.worker_public_keys;
  }
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
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const Assignment& a : assignments_) ids.push_back(a.worker_id);
    }
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
    if (static_cast<int>(workers.size()) >= parallel_.world_size()) break;
  }
  workers.resize(static_cast<size_t>(parallel_.world_size()));
  // 2. Assign shards: world ranks in registration order.
  std::vector<Assignment> plan;
  for (int r = 0; r < parallel_.world_size(); ++r) {
    Assignment a;
    a.worker_id = workers[static_cast<size_t>(r)].worker_id;
    a.world_rank = r;
    a.stage = parallel_.StageOf(r);
    a.tp_rank = parallel_.TpRankOf(r);
    auto spec = ShardSpec::Make(model_, parallel_, r);
    if (!spec.ok()) return fail(spec.status());
    a.predicted_weight_bytes = spec->WeightBytes(DType::kF32);
    plan.push_back(a);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    assignments_ = plan;
  }
  for (const Assignment& a : plan) {
    control::Envelope e;
    control::AssignShard* s = e.mutable_assign_shard();
    s->set_plan_version(plan_version_);
    s->set_tp(static_cast<uint32_t>(parallel_.tp));
    s->set_pp(static_cast<uint32_t>(parallel_.pp));
    for (int n : parallel_.layers_per_stage) s->add_layers_per_stage(static_cast<uint32_t>(n));
    s->set_stage(static_cast<uint32_t>(a.stage));
    s->set_tp_rank(static_cast<uint32_t>(a.tp_rank));
    s->set_world_rank(static_cast<uint32_t>(a.world_rank));
    s->set_first_layer(static_cast<uint32_t>(parallel_.FirstLayer(a.stage)));
    s->set_end_layer(static_cast<uint32_t>(parallel_.EndLayer(a.stage)));
    s->set_model_path(config_.model.path);
    s->set_dtype("F32");
    s->set_kv_block_size(static_cast<uint32_t>(config_.kv_cache.block_size));
    s->set_kv_num_blocks(static_cast<uint64_t>(kv_blocks_));
    s->set_device_index(
        workers[static_cast<size_t>(a.world_rank)].registration.devices_size()
            ? workers[static_cast<size_t>(a.world_rank)].registration.devices(0).index()
            : 0);
    control::GlooRendezvous* g = s->mutable_gloo();
    g->set_store_host(store_->host() == "0.0.0.0" ? "127.0.0.1" : store_->host());
    g->set_store_port(static_cast<uint32_t>(store_->port()));
    g->set_key_prefix("plan" + std::to_string(plan_version_) + "/");
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
      std::make_unique<RemoteExecutor>(control_.get(), plan_version_, first, all, parallel_.pp,
                                       model_.vocab_size, config_.heartbeat.timeout_seconds + 30.0);
  allocator_ = std::make_unique<BlockAllocator>(kv_blocks_);
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
  if (e.has_loaded()) {
    for (Assignment& a : assignments_) {
      if (a.worker_id != peer.worker_id) continue;
      a.loaded_weight_bytes = static_cast<int64_t>(e.loaded().weights_bytes());
      a.kv_bytes = static_cast<int64_t>(e.loaded().kv_bytes());
      a.load_seconds = e.loaded().load_seconds();
    }
  } else if (e.has_error()) {
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

std::string CoordinatorDaemon::ClusterJson() const {
  json workers = json::array();
  std::lock_guard<std::mutex> lock(mu_);
  for (const ControlWorkerInfo& w : control_->Workers()) {
    const bool failed = std::find(failed_workers_.begin(), failed_workers_.end(), w.worker_id) !=
                        failed_workers_.end();
    json devices = json::array();
    for (const auto& d : w.registration.devices())
      devices.push_back({{"index", d.index()}, {"name", d.name()}});
    workers.push_back({{"id", w.worker_id},
                       {"host", w.registration.host()},
                       {"pid", w.registration.pid()},
                       {"devices", devices},
                       {"curve_public_key", w.curve_public_key},
                       {"state", failed || !w.alive ? "failed" : "alive"},
                       {"seconds_since_last_message", w.seconds_since_last_message}});
  }
  return json{{"workers", workers}, {"ready", ready_.load()}, {"plan_version", plan_version_}}
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
                     {"kv_bytes", a.kv_bytes},
                     {"load_seconds", a.load_seconds}});
  }
  return json{{"plan_version", plan_version_},
              {"tp", parallel_.tp},
              {"pp", parallel_.pp},
              {"layers_per_stage", parallel_.layers_per_stage},
              {"kv_blocks", kv_blocks_},
              {"kv_block_size", config_.kv_cache.block_size},
              {"ranks", ranks}}
      .dump();
}

}  // namespace tessera
