#include "worker/daemon/worker_daemon.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <thread>
#include <utility>

#include "common/base/load_progress.h"
#include "common/base/logging.h"
#include "common/net/endpoint.h"
#include "common/net/tcp_store.h"
#include "common/wire/control_codec.h"
#include "common/wire/step_codec.h"
#include "kernels/blas_threads.h"
#include "worker/comm/process_group.h"
#include "worker/daemon/control_client.h"
#include "worker/daemon/worker_registration.h"
#include "worker/exec/pipeline_executor.h"
#include "worker/exec/rank_device.h"
#include "worker/model/kv_cache_scales.h"
#include "worker/model/model_loader.h"
#include "worker/topology/topology_discovery.h"

namespace tessera {

WorkerDaemon::WorkerDaemon(WorkerDaemonOptions options) : options_(std::move(options)) {}

void WorkerDaemon::OnMessage(const control::Envelope& envelope) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    const bool again = envelope.has_register_ack() && !envelope.register_ack().accepted() &&
                       envelope.register_ack().reason().rfind(kRegisterAgainPrefix, 0) == 0;
    if (again) {
      // The coordinator no longer knows this worker (it declared it lost, or
      // restarted): drop the plan now. The control client registers again.
      if (watch_.version != 0 && !watch_.fenced) {
        watch_.fenced = true;
        if (!watch_.end_requested) {
          watch_.end_requested = true;
          watch_.end_requested_at = std::chrono::steady_clock::now();
        }
        control::Envelope drain;
        drain.mutable_drain()->set_reason("fenced: " + envelope.register_ack().reason());
        inbox_.push_front(std::move(drain));  // wakes a stage-0 loop waiting in Next
      }
    } else {
      NotePlanEndLocked(envelope);
      inbox_.push_back(envelope);
    }
  }
  cv_.notify_all();
}

void WorkerDaemon::NotePlanEndLocked(const control::Envelope& e) {
  if (watch_.version == 0 || watch_.end_requested) return;
  const bool ends = e.has_drain() || e.has_shutdown() ||
                    (e.has_assign_shard() && e.assign_shard().plan_version() != watch_.version);
  if (!ends) return;
  watch_.end_requested = true;
  watch_.end_requested_at = std::chrono::steady_clock::now();
}

void WorkerDaemon::WatchPlanEnds() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    if (watch_.version == 0 || !watch_.end_requested || watch_.interrupted) {
      cv_.wait(lock);
      continue;
    }
    const auto due = watch_.fenced
                         ? watch_.end_requested_at
                         : watch_.end_requested_at +
                               std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                   std::chrono::duration<double>(kPlanEndGraceSeconds));
    if (std::chrono::steady_clock::now() < due) {
      cv_.wait_until(lock, due);
      continue;
    }
    const std::string why =
        "plan " + std::to_string(watch_.version) +
        (watch_.fenced ? " was dropped: the coordinator declared this worker lost"
                       : " was ended by the coordinator");
    for (Communicator* c : watch_.comms) c->Interrupt(why);
    watch_.interrupted = true;
    TESSERA_LOG_INFO("worker", "{}: interrupted {} communicator(s)", why, watch_.comms.size());
  }
}

StatusOr<control::Envelope> WorkerDaemon::Next(double timeout_seconds) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, std::chrono::duration<double>(timeout_seconds),
                    [&] { return !inbox_.empty(); }))
    return DeadlineExceeded("no message from the coordinator within " +
                            std::to_string(timeout_seconds) + " s");
  control::Envelope e = std::move(inbox_.front());
  inbox_.pop_front();
  return e;
}

void WorkerDaemon::PushFront(control::Envelope envelope) {
  std::lock_guard<std::mutex> lock(mu_);
  inbox_.push_front(std::move(envelope));
}

namespace {

control::Envelope ErrorEnvelope(const Status& s, uint64_t plan_version,
                                const std::vector<int>& lost_peers = {}) {
  control::Envelope e;
  *e.mutable_error() = StatusToError(s);
  e.mutable_error()->set_plan_version(plan_version);
  for (int r : lost_peers) {
    if (e.error().lost_peer_world_ranks_size() >= kMaxLostPeers) break;
    e.mutable_error()->add_lost_peer_world_ranks(static_cast<uint32_t>(r));
  }
  return e;
}

}  // namespace

Status WorkerDaemon::Run() {
  ControlClientOptions copts;
  copts.on_message = [this](const control::Envelope& e) { OnMessage(e); };
  copts.heartbeat_hook = [this](control::Heartbeat* hb) {
    hb->set_step_compute_seconds(step_watch_.ComputeSeconds());
  };
  copts.curve_secret_key = options_.curve_secret_key;
  copts.curve_server_key = options_.curve_server_key;
  ControlClient client(copts);
  TESSERA_RETURN_IF_ERROR(client.Connect(options_.coordinator));
  // Interrupts the receives of a plan the coordinator ended (see Fencing).
  std::thread watcher([this] { WatchPlanEnds(); });
  struct StopWatcher {
    WorkerDaemon* self;
    std::thread& thread;
    ~StopWatcher() {
      {
        std::lock_guard<std::mutex> lock(self->mu_);
        self->stopping_ = true;
      }
      self->cv_.notify_all();
      thread.join();
    }
  } stop_watcher{this, watcher};
  // What this worker offers: its device (a GPU when the backend is "cuda",
  // or "auto" and GPU `device` is visible) and the host's topology report
  // (worker/daemon/worker_registration.h), and the address its Gloo device uses.
  TESSERA_ASSIGN_OR_RETURN(RankBackend backend_choice, ParseRankBackend(options_.backend));
  on_gpu_ = backend_choice == RankBackend::kCuda ||
            (backend_choice == RankBackend::kAuto && CudaDeviceVisible(options_.device));
  std::optional<TopologyReport> report = options_.topology;
  if (!report) {
    TESSERA_ASSIGN_OR_RETURN(report, DiscoverTopology());
  }
  std::string data_address = options_.gloo_host;
  if (data_address.empty()) {
    TESSERA_ASSIGN_OR_RETURN(data_address, LocalAddressToward(options_.coordinator));
  }
  TESSERA_ASSIGN_OR_RETURN(
      control::Register reg,
      BuildRegistration(*report, {options_.device, !on_gpu_, options_.host, data_address}));
  registration_ = reg;
  // Asked for by host and device (DefaultWorkerId), so a restarted worker
  // keeps its id.
  TESSERA_RETURN_IF_ERROR(client.Register(reg, options_.worker_id.empty()
                                                   ? DefaultWorkerId(reg.host(), options_.device)
                                                   : options_.worker_id));
  TESSERA_ASSIGN_OR_RETURN(std::string id,
                           client.WaitRegistered(std::chrono::milliseconds(
                               static_cast<int64_t>(options_.register_timeout_seconds * 1000))));
  TESSERA_LOG_INFO("worker", "registered as {} with {}", id, options_.coordinator);
  if (options_.metrics) {
    std::unique_ptr<NvmlProbe> nvml;
    if (options_.nvml_metrics) {
      auto probe = NvmlProbe::Load();
      if (probe.ok()) {
        nvml = std::move(*probe);
      } else {
        TESSERA_LOG_WARN("worker", "device metrics from process memory: {}",
                         probe.status().ToString());
      }
    }
    TESSERA_ASSIGN_OR_RETURN(metrics_, WorkerMetrics::Create(options_.metrics, reg.host(),
                                                             options_.device, std::move(nvml)));
    metrics_->SetWorker(id, TESSERA_VERSION);
  }
  control::Heartbeat hb;
  hb.set_state(control::WORKER_STATE_IDLE);
  client.SetHeartbeat(hb);
  kernels::SetBlasThreads(1);

  // Serve plan after plan until a Shutdown (heartbeats keep us alive while idle).
  while (true) {
    auto next = Next(3600.0);
    if (!next.ok()) continue;  // idle: nothing to do
    const control::Envelope& e = *next;
    if (e.has_shutdown()) {
      TESSERA_LOG_INFO("worker", "worker {}: shutdown ({})", id, e.shutdown().reason());
      return Status::Ok();
    }
    if (!e.has_assign_shard()) continue;  // a Drain while idle, or a stale Step
    if (options_.failpoints.ignore_assignments ||
        std::exchange(options_.failpoints.ignore_first_assignment, false)) {
      TESSERA_LOG_WARN("worker", "failpoint: ignoring AssignShard of plan {}",
                       e.assign_shard().plan_version());
      continue;
    }
    Status s = ServePlan(client, hb, e.assign_shard(), id);
    hb.clear_memory();
    hb.set_state(control::WORKER_STATE_IDLE);
    client.SetHeartbeat(hb);
    if (!s.ok())
      TESSERA_LOG_ERROR("worker", "{}; waiting for the coordinator to re-plan", s.ToString());
  }
}

void WorkerDaemon::StepSleepFailpoint(int world_rank) {
  const WorkerFailpoints& f = options_.failpoints;
  if (f.step_sleep_rank != world_rank || step_sleep_done_ ||
      access(f.step_sleep_trigger.c_str(), F_OK) != 0)
    return;
  step_sleep_done_ = true;
  TESSERA_LOG_WARN("worker", "failpoint: rank {} sleeps {} s in its step", world_rank,
                   f.step_sleep_seconds);
  std::this_thread::sleep_for(std::chrono::duration<double>(f.step_sleep_seconds));
}

Status WorkerDaemon::ServePlan(ControlClient& client, control::Heartbeat& hb,
                               const control::AssignShard& assign, const std::string& id) {
  const std::string who = "worker " + id + " (plan " + std::to_string(assign.plan_version()) +
                          ", rank " + std::to_string(assign.world_rank()) + ", stage " +
                          std::to_string(assign.stage()) + ", tp_rank " +
                          std::to_string(assign.tp_rank()) + ")";
  // The plan is watched (see Fencing) from here to the end of ServePlan.
  {
    std::lock_guard<std::mutex> lock(mu_);
    watch_ = PlanWatch();
    watch_.version = assign.plan_version();
    for (const control::Envelope& e : inbox_) NotePlanEndLocked(e);
  }
  struct Unwatch {
    WorkerDaemon* self;
    ~Unwatch() {
      std::lock_guard<std::mutex> lock(self->mu_);
      self->watch_ = PlanWatch();
    }
  } unwatch{this};
  // True once the coordinator ended the plan and its communicators were
  // interrupted, or it declared this worker lost: a failure then is the end
  // of the plan, not a fault to report.
  auto ended_by_coordinator = [&] {
    std::lock_guard<std::mutex> lock(mu_);
    return watch_.interrupted || watch_.fenced;
  };
  auto fail = [&](const Status& s) {
    Status full = s.WithContext(who);
    if (ended_by_coordinator()) {
      TESSERA_LOG_INFO("worker", "{}: plan ended by the coordinator ({})", who, full.ToString());
      return Status::Ok();
    }
    // Peers whose connection broke: the coordinator may declare them lost
    // at once (a killed rank) instead of waiting for their heartbeats.
    std::vector<int> lost_peers;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const Communicator* c : watch_.comms)
        for (int r : c->LostPeerWorldRanks())
          if (std::find(lost_peers.begin(), lost_peers.end(), r) == lost_peers.end())
            lost_peers.push_back(r);
    }
    client.Send(ErrorEnvelope(full, assign.plan_version(), lost_peers)).IgnoreError();
    hb.set_state(control::WORKER_STATE_FAILED);
    client.SetHeartbeat(hb);
    return full;
  };
  SetLogRank(static_cast<int>(assign.world_rank()), static_cast<int>(assign.stage()),
             static_cast<int>(assign.tp_rank()));
  if (metrics_)
    metrics_->SetRank(static_cast<int>(assign.replica()), static_cast<int>(assign.stage()),
                      static_cast<int>(assign.tp_rank()), assign.plan_version());
  hb.set_state(control::WORKER_STATE_LOADING);
  hb.set_plan_version(assign.plan_version());
  client.SetHeartbeat(hb);
  if (!assign.has_gloo()) return fail(InvalidArgument("AssignShard without a Gloo rendezvous"));
  // This rank's own store key, good for this plan's keys only.
  StoreCredentials credentials{
      StoreRankIdentity(assign.plan_version(), static_cast<int>(assign.world_rank())),
      assign.gloo().store_key()};
  auto store =
      TcpStore::Connect(assign.gloo().store_host(), static_cast<int>(assign.gloo().store_port()),
                        options_.collective_timeout_seconds, std::move(credentials));
  if (!store.ok()) return fail(store.status());
  ProcessGroupOptions pgo;
  pgo.tp = static_cast<int>(assign.tp());
  pgo.pp = static_cast<int>(assign.pp());
  pgo.tp_per_stage.assign(assign.tp_per_stage().begin(), assign.tp_per_stage().end());
  pgo.world_rank = static_cast<int>(assign.world_rank());
  pgo.timeout_seconds = options_.collective_timeout_seconds;
  pgo.connect_timeout_seconds = std::max(60.0, options_.collective_timeout_seconds);
  pgo.hostname = registration_.data_address();  // what Run() registered
  pgo.key_prefix = assign.gloo().key_prefix();
  auto pg = ProcessGroup::Create(**store, pgo);
  if (!pg.ok()) return fail(pg.status());
  {
    // The watcher may interrupt these until `unwatch_comms` (declared after
    // `pg`, so it runs before they are freed) takes them back.
    std::lock_guard<std::mutex> lock(mu_);
    if ((*pg)->tp()) watch_.comms.push_back((*pg)->tp());
    if ((*pg)->prev_stage()) watch_.comms.push_back((*pg)->prev_stage());
    for (Communicator* c : (*pg)->next_stage_links()) watch_.comms.push_back(c);
    for (Communicator* c : (*pg)->return_links()) watch_.comms.push_back(c);
  }
  struct UnwatchComms {
    WorkerDaemon* self;
    ~UnwatchComms() {
      std::lock_guard<std::mutex> lock(self->mu_);
      self->watch_.comms.clear();
    }
  } unwatch_comms{this};
  auto config = LoadModelConfig(assign.model_path());
  if (!config.ok()) return fail(config.status());
  auto dtype = ParseRuntimeDType(assign.dtype(), *config);
  if (!dtype.ok()) return fail(dtype.status().WithContext("AssignShard.dtype"));
  auto online = ParseOnlineQuantization(assign.quantization());
  if (!online.ok()) return fail(online.status().WithContext("AssignShard.quantization"));
  auto kv_dtype = ParseKvCacheDType(assign.kv_cache_dtype(), "AssignShard.kv_cache_dtype");
  if (!kv_dtype.ok()) return fail(kv_dtype.status());
  // The backend, and the weights it holds, carry over from the last plan
  // while the rank's backend and compute dtype stay the same; the held
  // weights also need the same model. Otherwise they are dropped (before the
  // old backend, so their memory goes back first) and a new backend is made.
  const bool same_backend = device_ && device_->cuda() == on_gpu_ &&
                            (!on_gpu_ || device_->backend->compute_dtype() == *dtype);
  if (!same_backend || held_model_path_ != assign.model_path() ||
      held_quantization_ != assign.quantization())
    held_.clear();
  if (!same_backend) {
    device_.reset();
    auto rank_device =
        MakeRankDevice(on_gpu_ ? RankBackend::kCuda : RankBackend::kCpu, options_.device, *dtype);
    if (!rank_device.ok()) return fail(rank_device.status());
    device_ = std::move(*rank_device);
  }
  kernels::Backend& backend = *device_->backend;
  std::vector<int> layers(assign.layers_per_stage().begin(), assign.layers_per_stage().end());
  auto parallel =
      pgo.tp_per_stage.empty()
          ? ParallelConfig::Make(*config, pgo.tp, pgo.pp, layers, assign.expert_parallel())
          : ParallelConfig::MakePerStage(*config, pgo.tp_per_stage, layers,
                                         assign.expert_parallel());
  if (!parallel.ok()) return fail(parallel.status());
  // Communicators, metered when metrics are on (the model keeps the tp one).
  // A CUDA rank's tp group all-reduces device buffers over NCCL (a new
  // communicator per plan: the plan's tp group, under its key prefix).
  Communicator* tp_comm = (*pg)->tp();
  std::unique_ptr<Communicator> nccl_tp;
  if (device_->cuda() && parallel->TpOfStage((*pg)->stage()) > 1) {
    auto c = MakeNcclTpCommunicator(**store, pgo.key_prefix, (*pg)->stage(), (*pg)->tp_rank(),
                                    parallel->TpOfStage((*pg)->stage()),
                                    options_.collective_timeout_seconds, backend);
    if (!c.ok()) return fail(c.status());
    nccl_tp = std::move(*c);
    tp_comm = nccl_tp.get();
  }
  Communicator* prev_comm = (*pg)->prev_stage();
  if (metrics_) {
    tp_comm = metrics_->Wrap(tp_comm);
    prev_comm = metrics_->WrapPrevLink(prev_comm);
  }
  // Waits on the tp group and the previous stage are not compute (step_watch.h).
  std::unique_ptr<StepWatchCommunicator> watched_tp, watched_prev;
  if (tp_comm) {
    watched_tp = std::make_unique<StepWatchCommunicator>(tp_comm, &step_watch_);
    tp_comm = watched_tp.get();
  }
  if (prev_comm) {
    watched_prev = std::make_unique<StepWatchCommunicator>(prev_comm, &step_watch_);
    prev_comm = watched_prev.get();
  }
  const auto t0 = std::chrono::steady_clock::now();
  // The previous plan's tensors: slices this rank still needs are reused.
  HeldWeights held = std::move(held_);
  held_.clear();
  LoadProgressLog progress_log("worker " + id + " rank " + std::to_string(pgo.world_rank));
  auto loaded = LoadModel(
      assign.model_path(), *parallel, pgo.world_rank, tp_comm,
      [&](int64_t done, int64_t total) {
        if (metrics_) metrics_->OnLoadProgress(done, total);
        progress_log.Update(done, total);
        control::Envelope e;
        control::LoadProgress* p = e.mutable_load_progress();
        p->set_plan_version(assign.plan_version());
        p->set_bytes_done(static_cast<uint64_t>(done));
        p->set_bytes_total(static_cast<uint64_t>(total));
        p->set_seconds(
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        client.Send(std::move(e)).IgnoreError();
      },
      &backend, &held, *online);
  if (!loaded.ok()) {
    held_ = std::move(held);  // still held: a later plan may reuse it
    return fail(loaded.status());
  }
  held.clear();  // what was not reused is freed here
  held_ = loaded->held;
  held_model_path_ = assign.model_path();
  held_quantization_ = assign.quantization();
  const StageLayout lay = loaded->model->layout();
  const int64_t blocks = static_cast<int64_t>(assign.kv_num_blocks());
  const int64_t block_size = assign.kv_block_size();
  auto kv = MakeStageKvCache(backend, assign.model_path(), lay, blocks, block_size,
                             config->head_dim, *kv_dtype);
  if (!kv.ok()) return fail(kv.status());
  KvCache& cache = **kv;
  // The metrics first: a scrape after the coordinator is ready sees the load.
  if (metrics_) {
    metrics_->OnLoaded(loaded->weight_bytes, cache.bytes(), loaded->load_seconds,
                       loaded->quantized_bytes);
    metrics_->SetMoeCounts(loaded->model->moe_token_counts());
  }
  {
    control::Envelope e;
    control::Loaded* l = e.mutable_loaded();
    l->set_plan_version(assign.plan_version());
    l->set_weights_bytes(static_cast<uint64_t>(loaded->weight_bytes));
    l->set_kv_capacity_blocks(static_cast<uint64_t>(blocks));
    l->set_load_seconds(loaded->load_seconds);
    l->set_kv_bytes(static_cast<uint64_t>(cache.bytes()));
    l->set_reused_bytes(static_cast<uint64_t>(loaded->reused_bytes));
    l->set_reused_tensors(static_cast<uint32_t>(loaded->reused_tensors));
    TESSERA_RETURN_IF_ERROR(client.Send(std::move(e)));
  }
  // Should the coordinator restart, this worker re-registers with the shard
  // it holds, and the new coordinator can adopt the plan.
  *registration_.mutable_held_shard() = assign;
  client.UpdateRegistration(registration_).IgnoreError();
  hb.set_state(control::WORKER_STATE_READY);
  hb.clear_memory();
  control::DeviceMemory* mem = hb.add_memory();
  mem->set_device_index(static_cast<uint32_t>(options_.device));
  mem->set_weights_bytes(static_cast<uint64_t>(loaded->weight_bytes));
  mem->set_kv_bytes(static_cast<uint64_t>(cache.bytes()));
  client.SetHeartbeat(hb);
  TESSERA_LOG_INFO(
      "worker", "{} loaded layers [{}, {}) on {} ({}): {:.1f} MB ({:.1f} MB reused) in {:.2f} s",
      who, lay.first_layer, lay.end_layer, backend.name(), DTypeName(backend.compute_dtype()),
      static_cast<double>(loaded->weight_bytes) / 1e6,
      static_cast<double>(loaded->reused_bytes) / 1e6, loaded->load_seconds);

  PipelineLinks links;
  links.pp = pgo.pp;
  links.stage = (*pg)->stage();
  links.tp_rank = (*pg)->tp_rank();
  links.tp = tp_comm;
  links.prev = prev_comm;
  links.next = (*pg)->next_stage_links();
  if (metrics_)
    for (Communicator*& c : links.next) c = metrics_->Wrap(c);
  // Tokens go to the coordinator, or with pp > 1 in a replica that schedules itself from
  // last-stage tp rank 0 to the leader (AssignShard.tokens_to_leader): the leader receives
  // them on its return link; its tp peers need none (they run what it broadcasts).
  const bool leads = assign.has_leader() && links.stage == 0 && links.tp_rank == 0;
  if (links.pp > 1 && leads) links.ret = (*pg)->return_links();
  // The micro-batch ids of the Steps in flight, oldest first: the pipeline is
  // FIFO, so the last stage answers them in order.
  uint64_t next_result = 0;
  auto send_result = [&](const StepBatch& batch,
                         const std::vector<SampledToken>& tokens) -> Status {
    control::Envelope e;
    control::StepResult* r = e.mutable_step_result();
    r->set_plan_version(assign.plan_version());
    r->set_micro_batch_id(next_result++);
    SampledTokensToProto(batch, tokens, r);
    return client.Send(std::move(e));
  };
  const bool last = links.stage == links.pp - 1;
  // Structured outputs: the sampling rank loads LLGuidance and this model's
  // vocabulary when the first sequence with a grammar arrives.
  GrammarSource grammar = ModelGrammarSource(held_model_path_, loaded->model->config().vocab_size,
                                             options_.grammar_library);
  if (links.stage > 0) {
    // A replica that schedules itself with pp > 1: the sampling rank returns each
    // micro-batch's tokens to the leader (stage 0, tp rank 0), the first receiver of its
    // return links (stage_handoff.h: receiver 0 hears from sender 0), as an Envelope with a
    // StepResult.
    std::unique_ptr<AsyncSender> to_leader;
    TokenSink sink = last ? TokenSink(send_result) : TokenSink();
    if (last && assign.tokens_to_leader()) {
      sink = [](const StepBatch&, const std::vector<SampledToken>&) { return Status::Ok(); };
      const std::vector<Communicator*> ret = (*pg)->return_links();
      if (links.tp_rank == 0) {
        if (ret.empty()) return fail(Internal(who + ": no return link to the replica's leader"));
        to_leader = std::make_unique<AsyncSender>(std::vector<Communicator*>{ret.front()}, 0,
                                                  static_cast<size_t>(links.pp + 2));
        sink = [&](const StepBatch& batch, const std::vector<SampledToken>& tokens) -> Status {
          control::Envelope e;
          e.set_protocol_version(kControlProtocolVersion);
          e.set_worker_id(id);
          control::StepResult* r = e.mutable_step_result();
          r->set_plan_version(assign.plan_version());
          r->set_micro_batch_id(next_result++);
          SampledTokensToProto(batch, tokens, r);
          TESSERA_ASSIGN_OR_RETURN(std::string bytes, EncodeEnvelope(e));
          return to_leader->Enqueue(std::vector<uint8_t>(bytes.begin(), bytes.end()))
              .WithContext("tokens to the replica's leader");
        };
      }
    }
    // Returns OK when stage 0 passes the end of the plan down the pipeline.
    step_watch_.BeginStep();  // waiting in its receive between micro-batches
    Status s = ServeStage(*loaded->model, cache, links, {}, sink, grammar);
    step_watch_.EndStep();
    // The leader takes every micro-batch's tokens before it ends the plan.
    if (s.ok() && to_leader) s = to_leader->Flush().WithContext("tokens to the replica's leader");
    return s.ok() ? s : fail(s);
  }
  SequenceSamplers samplers(grammar);
  if (assign.has_leader()) {
    const LeaderServe serve{client, assign,   who,  *loaded->model,      cache,
                            links,  samplers, fail, ended_by_coordinator};
    return links.tp_rank == 0 ? ServeAsLeader(serve) : ServeAsLeaderPeer(serve);
  }
  std::unique_ptr<AsyncSender> sender;
  if (links.pp > 1)
    sender = std::make_unique<AsyncSender>(links.next, 1, static_cast<size_t>(2 * links.pp + 2));
  const double keepalive_seconds = options_.collective_timeout_seconds / 3.0;
  while (true) {
    if (metrics_) metrics_->clock().Idle();
    auto next = Next(keepalive_seconds);
    if (!next.ok()) {
      // Idle: keep the later stages' receives from timing out.
      if (sender) {
        Status s = sender->Enqueue(EncodeKeepalive());
        if (!s.ok()) return fail(s.WithContext("keepalive to stage 1"));
      }
      continue;
    }
    control::Envelope& e = *next;
    if (e.has_shutdown() || e.has_drain() || e.has_assign_shard()) {
      const bool drain = e.has_drain();
      if (!drain) PushFront(std::move(e));  // the outer loop acts on it
      if (ended_by_coordinator()) {
        // Declared lost: the old plan's peers have moved on; send them nothing.
        TESSERA_LOG_WARN("worker",
                         "{}: dropped the plan: the coordinator declared this worker "
                         "lost",
                         who);
        return Status::Ok();
      }
      Status s = SendShutdownDownstream(sender.get());
      if (!s.ok()) return fail(s.WithContext("ending the plan down the pipeline"));
      TESSERA_LOG_INFO("worker", "{}: plan ended{}", who, drain ? " (drain)" : "");
      return Status::Ok();
    }
    if (!e.has_step()) continue;
    if (e.step().plan_version() != assign.plan_version()) {
      TESSERA_LOG_WARN("worker", "{} dropped a Step of plan {} (loaded plan {})", who,
                       e.step().plan_version(), assign.plan_version());
      continue;
    }
    auto batch = StepBatchFromProto(e.step().batch());
    if (!batch.ok()) return fail(batch.status());
    const auto step_start = std::chrono::steady_clock::now();
    if (metrics_) metrics_->clock().Busy();
    step_watch_.BeginStep();
    StepSleepFailpoint(static_cast<int>(assign.world_rank()));
    auto tokens = RunFirstStage(*loaded->model, cache, links, *batch, sender.get(), samplers);
    step_watch_.EndStep();
    if (!tokens.ok()) return fail(tokens.status());
    if (metrics_)
      metrics_->ObserveStep(
          *batch,
          std::chrono::duration<double>(std::chrono::steady_clock::now() - step_start).count());
    if (links.pp == 1 && links.tp_rank == 0) {
      next_result = e.step().micro_batch_id();
      TESSERA_RETURN_IF_ERROR(send_result(*batch, *tokens));
    }
  }
}

}  // namespace tessera
