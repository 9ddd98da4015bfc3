#include "coordinator/coordinator_daemon.h"

#include <algorithm>
#include <chrono>
#include <deque>

#include "common/base/logging.h"
#include "common/metrics/metric_catalog.h"
#include "common/net/curve_keys.h"
#include "common/net/endpoint.h"
#include "common/net/store_auth.h"
#include "common/topology/report.h"
#include "coordinator/api/api_routes.h"
#include "coordinator/control/registration_check.h"
#include "coordinator/control/worker_cluster.h"
#include "coordinator/placement/placement_planner.h"

namespace tessera {

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

namespace {

// How long Stop waits for the workers it told to shut down to go (close
// their control connections) before it closes the control plane.
constexpr std::chrono::milliseconds kShutdownGrace{200};

// `layout` against `model`; an error names the key of `prefix` it is about
// (pp=3 over 2 layers: <prefix>.pp), where it was set, and the model.
StatusOr<ParallelConfig> LayoutForModel(const DaemonConfig& config, const ModelConfig& model,
                                        const std::string& prefix, const LayoutSection& layout) {
  auto parallel =
      layout.tp_per_stage.empty()
          ? ParallelConfig::Make(model, layout.tp, layout.pp, layout.layers_per_stage)
          : ParallelConfig::MakePerStage(model, layout.tp_per_stage, layout.layers_per_stage);
  if (parallel.ok()) return parallel;
  std::string key = prefix + ".tp";
  switch (LayoutParamOfError(parallel.status())) {
    case LayoutParam::kPp:
      key = prefix + ".pp";
      break;
    case LayoutParam::kLayersPerStage:
      key = prefix + ".layers_per_stage";
      break;
    case LayoutParam::kModel:
      key = "model.path";
      break;
    case LayoutParam::kTp:
      break;
  }
  // A key the entry left out (its default) is named by the entry's place.
  std::string where = ConfigKeyContext(config, key);
  if (config.sources.count(key) == 0 && config.sources.count(prefix) > 0)
    where = config.sources.at(prefix) + ": " + key;
  return parallel.status().WithContext(where + " (model.path " + config.model.path + ")");
}

}  // namespace

Status CoordinatorDaemon::CheckLayout() {
  expected_workers_ = config_.parallel.ExpectedWorkers();
  if (config_.parallel.mode != ParallelMode::kExplicit) return Status::Ok();
  // The layouts' rules against the model, before any worker is waited for.
  TESSERA_ASSIGN_OR_RETURN(
      configured_, LayoutForModel(config_, model_, "parallel", config_.parallel.BaseLayout()));
  const auto& overrides = config_.parallel.replica_overrides;
  for (size_t i = 0; i < overrides.size(); ++i) {
    TESSERA_ASSIGN_OR_RETURN(
        overrides_[overrides[i].replica],
        LayoutForModel(config_, model_, "parallel.replica_override[" + std::to_string(i) + "]",
                       overrides[i].layout));
  }
  return Status::Ok();
}

Status CoordinatorDaemon::Start() {
  const std::string& dir = config_.model.path;
  // Errors found here name the config key (and its file:line:col) to fix.
  const std::string model_key = ConfigKeyContext(config_, "model.path");
  auto model = LoadModelConfig(dir);
  if (!model.ok()) return model.status().WithContext(model_key);
  model_ = std::move(model).value();
  // model.quantization = "fp8" quantizes a dense checkpoint at load (the
  // workers get it in AssignShard); the planner counts its FP8 bytes.
  if (config_.model.quantization == QuantMethod::kOnlineFp8 && !model_.quantization.quantized())
    model_.quantization = OnlineFp8Quantization();
  auto tokenizer = Tokenizer::Load(dir);
  if (!tokenizer.ok()) return tokenizer.status().WithContext(model_key);
  tokenizer_ = std::move(tokenizer).value();
  if (config_.model.chat_template) {
    TESSERA_ASSIGN_OR_RETURN(chat_template_,
                             ChatTemplate::FromName(ChatFormatName(*config_.model.chat_template)));
  } else if (!tokenizer_->chat_template().empty()) {
    // The checkpoint's own Jinja template; one the interpreter cannot run
    // exactly is refused here, naming the construct and its line.
    auto t = ChatTemplate::FromJinja(tokenizer_->chat_template(), tokenizer_->bos_token(),
                                     tokenizer_->eos_token());
    if (!t.ok()) return t.status().WithContext(model_key + " (chat template)");
    chat_template_ = std::move(t).value();
  }  // else no template: chat requests get a 400 naming model.chat_template
  TESSERA_RETURN_IF_ERROR(CheckLayout());
  planner_ = std::make_unique<PlacementPlanner>();
  const ContextLimit limit = ModelContextLimit(model_);  // common/format/model_config.h
  max_context_ =
      config_.scheduler.max_context > 0 ? config_.scheduler.max_context : limit.default_tokens;
  if (max_context_ > limit.max_tokens)
    return InvalidArgument(ConfigKeyContext(config_, "scheduler.max_context") + ": " +
                           std::to_string(max_context_) + " exceeds the model's " + limit.bound);
  model_name_ = ServedModelName(config_.model);

  sched_.max_batch_tokens = config_.scheduler.max_batch_tokens;
  sched_.max_sequences = config_.scheduler.max_sequences;
  sched_.queue_limit = config_.scheduler.queue_limit;
  sched_.max_context = max_context_;
  sched_.prefill_chunk_tokens = config_.scheduler.prefill_chunk_tokens;
  sched_.prefill_chunk_budget = config_.scheduler.prefill_chunk_budget;
  sched_.requeue_on_executor_error = true;  // a re-plan finishes them
  sched_.prefix_caching = config_.kv_cache.prefix_caching;
  sched_.model_id = config_.model.path;
  // The store first: the control plane's callbacks need the replica set,
  // which needs the store; no worker is heard before the control plane binds.
  TESSERA_RETURN_IF_ERROR(StartStore());
  TESSERA_RETURN_IF_ERROR(StartControlPlane());
  TESSERA_RETURN_IF_ERROR(StartHttp());
  TESSERA_LOG_INFO("coordinator", "listening: api {}:{}, admin {}:{}, control {}, store {}",
                   config_.server.host, api_port(),
                   admin_ ? config_.admin.host : config_.server.host, admin_port(),
                   control_endpoint_, store_->port());
  std::string overridden;  // the replicas with a layout of their own
  for (const auto& [replica, layout] : overrides_)
    overridden += ", replica " + std::to_string(replica) + ": " + layout.ToString();
  TESSERA_LOG_INFO(
      "coordinator", "serving {} on http://{}:{}, control {}, waiting for {} workers ({}, {})",
      model_name_, config_.server.host, api_port(), control_endpoint_, expected_workers_,
      config_.parallel.mode == ParallelMode::kExplicit
          ? configured_.ToString() + overridden
          : std::string("auto placement, objective ") +
                ParallelObjectiveName(config_.parallel.objective),
      config_.parallel.replicas == 0 ? std::string("as many replicas as fit")
                                     : std::to_string(config_.parallel.replicas) + " replica(s)");
  replicas_->Start();
  return Status::Ok();
}

Status CoordinatorDaemon::StartStore() {
  // The rendezvous store listens on the control plane's host (every
  // interface for a wildcard endpoint; workers then use the address they
  // reach the control plane at).
  std::string store_host = "127.0.0.1";
  const std::string& ep = config_.server.control_endpoint;
  if (auto p = ParseTcpEndpoint(ep, EndpointUse::kBind); p.ok()) store_host = p->host;
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
  return Status::Ok();
}

Status CoordinatorDaemon::StartControlPlane() {
  ControlServerOptions co;
  co.heartbeat_interval =
      std::chrono::milliseconds(static_cast<int64_t>(config_.heartbeat.interval_seconds * 1000));
  co.heartbeat_miss_limit = std::max(
      1, static_cast<int>(config_.heartbeat.timeout_seconds / config_.heartbeat.interval_seconds));
  co.on_message = [this](const ControlPeer& p, control::Envelope& e) { events_->OnMessage(p, e); };
  co.on_worker_lost = [this](const std::string& id, const ControlWorkerLoss& loss) {
    events_->OnWorkerLost(id, loss);
  };
  co.on_worker_forgotten = [this](const std::string& id) { events_->OnWorkerForgotten(id); };
  co.on_dropped = [this](const ControlPeer&, const Status& why) { drops_.CountServerDrop(why); };
  // The planner needs a readable, plausible topology report and device
  // (coordinator/control/registration_check.h); a broken or impossible one
  // is refused at registration, naming the field. The GPUs of one host send
  // the same report, and a fleet registers thousands at once: reports
  // already found valid are not parsed again (the last kCheckedReports,
  // owner thread of the control plane only).
  co.accept_register = [checked = std::make_shared<std::deque<std::string>>(),
                        backend = config_.worker.backend](const ControlPeer&,
                                                          const control::Register& reg) -> Status {
    constexpr size_t kCheckedReports = 64;
    const std::string& json = reg.topology_json();
    if (json.empty() || std::find(checked->rbegin(), checked->rend(), json) != checked->rend())
      return CheckRegistrationPlausible(reg, backend, nullptr);
    TESSERA_ASSIGN_OR_RETURN(TopologyReport report,
                             TopologyReportFromJson(json, "Register.topology_json"));
    TESSERA_RETURN_IF_ERROR(CheckRegistrationPlausible(reg, backend, &report));
    checked->push_back(json);
    if (checked->size() > kCheckedReports) checked->pop_front();
    return Status::Ok();
  };
  TESSERA_RETURN_IF_ERROR(ConfigureControlSecurity(config_, &co));
  control_ = std::make_unique<ControlServer>(co);
  ReplicaSet::Context rc;
  rc.config = &config_;
  rc.model = &model_;
  rc.tokenizer = tokenizer_.get();
  rc.configured = configured_;
  rc.overrides = overrides_;
  rc.expected_workers = expected_workers_;
  rc.max_context = max_context_;
  rc.scheduler = sched_;
  rc.control = control_.get();
  rc.store = store_.get();
  rc.store_secret = store_secret_;
  rc.metrics = &metrics_;
  rc.planner = planner_.get();
  rc.state = &state_;
  replicas_ = std::make_unique<ReplicaSet>(std::move(rc));
  events_ = std::make_unique<WorkerEvents>(&state_, replicas_.get(), &drops_);
  TESSERA_ASSIGN_OR_RETURN(control_endpoint_, control_->Start(config_.server.control_endpoint));
  return Status::Ok();
}

Status CoordinatorDaemon::StartHttp() {
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
  // The API listener's stream writes, sampled at each scrape (the server
  // counts them; common/net knows no metrics).
  metrics_.AddCollectHook([this] {
    const HttpServer::StreamStats s = api_->stream_stats();
    Counter& events = metrics_.Counter(metric::kHttpStreamEventsTotal).WithLabels({});
    events.Inc(static_cast<double>(s.events) - events.value());
    Counter& writes = metrics_.Counter(metric::kHttpStreamWritesTotal).WithLabels({});
    writes.Inc(static_cast<double>(s.writes) - writes.value());
  });
  if (config_.admin.port != 0 || config_.admin.pick_port) {
    HttpServerOptions ao = ho;
    ao.bind_address = config_.admin.host;
    ao.port = config_.admin.pick_port ? 0 : config_.admin.port;
    admin_ = std::make_unique<HttpServer>(ao);
  }
  view_ = std::make_unique<ClusterView>(&config_, expected_workers_, &state_, control_.get(),
                                        replicas_.get(), &model_, model_.quantization.Describe());
  cluster_metrics_ = std::make_unique<ClusterMetrics>(&metrics_, &state_, control_.get(),
                                                      store_.get(), replicas_.get());
  cluster_metrics_->Install();
  request_metrics_ = std::make_unique<RequestMetrics>(metrics_);
  openai_ = std::make_unique<OpenAIFrontend>(&config_, model_name_, max_context_, tokenizer_.get(),
                                             chat_template_, replicas_.get(), view_.get(),
                                             request_metrics_.get());
  RegisterRoutes(*api_, admin_.get(), config_.admin.effective_token, &metrics_, openai_.get(),
                 replicas_.get(), view_.get());
  TESSERA_RETURN_IF_ERROR(api_->Start());
  if (admin_) TESSERA_RETURN_IF_ERROR(admin_->Start());
  return Status::Ok();
}

void CoordinatorDaemon::Stop() {
  {
    MutexLock lock(&state_.mu);
    if (state_.stopping) return;
    state_.stopping = true;
    state_.NotifyAll();
  }
  // The waits on the control server's events (placement, a re-plan's
  // liveness checks) look at `stopping` too.
  if (control_) control_->activity().Notify();
  // The loops first (a plan change waiting for its pause returns), then the
  // runners.
  if (replicas_) replicas_->Stop();
  if (control_) {
    // Every live worker, assigned or idle, exits.
    std::vector<std::string> ids;
    for (const ControlWorkerInfo& w : control_->Workers())
      if (w.alive) ids.push_back(w.worker_id);
    WorkerActivity& activity = control_->activity();
    uint64_t seen = activity.generation();
    for (const std::string& id : ids) {
      control::Envelope e;
      e.mutable_shutdown()->set_reason("coordinator stopping");
      control_->Send(id, std::move(e)).IgnoreError();
    }
    // Until they went (each closed its connection, or was declared lost), at
    // most kShutdownGrace: a closed connection is an event of the control
    // server, so this returns as soon as the last one exits.
    const auto deadline = std::chrono::steady_clock::now() + kShutdownGrace;
    while (!ids.empty()) {
      std::vector<std::string> staying;
      for (const ControlWorkerInfo& w : control_->WorkersOf(ids))
        if (w.alive && !w.connection_closed) staying.push_back(w.worker_id);
      ids.swap(staying);
      if (ids.empty() || std::chrono::steady_clock::now() >= deadline) break;
      seen = activity.WaitChange(seen, deadline);
    }
  }
  if (api_) api_->Stop();
  if (admin_) admin_->Stop();
  if (openai_) openai_->Stop();  // the requests being prepared, after the listeners
  if (control_) control_->Stop();
}

Status CoordinatorDaemon::WaitReady(double timeout_seconds) {
  MutexLock lock(&state_.mu);
  state_.cv.wait_for(
      state_.mu, std::chrono::duration<double>(timeout_seconds), [&]() REQUIRES(state_.mu) {
        return state_.all_ready.load() || !state_.placement_status.ok() || state_.stopping;
      });
  if (!state_.placement_status.ok()) return state_.placement_status;
  if (!state_.all_ready.load())
    return DeadlineExceeded("not ready after " + std::to_string(timeout_seconds) + " s");
  return Status::Ok();
}

}  // namespace tessera
