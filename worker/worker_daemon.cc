#include "worker/worker_daemon.h"

#include <unistd.h>

#include <chrono>
#include <memory>

#include "common/control_codec.h"
#include "common/logging.h"
#include "common/tcp_store.h"
#include "kernels/blas_threads.h"
#include "worker/control_client.h"
#include "worker/model_loader.h"
#include "worker/pipeline_executor.h"
#include "worker/process_group.h"

namespace tessera {

WorkerDaemon::WorkerDaemon(WorkerDaemonOptions options) : options_(std::move(options)) {}

void WorkerDaemon::OnMessage(const control::Envelope& envelope) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    inbox_.push_back(envelope);
  }
  cv_.notify_all();
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

namespace {

control::Envelope ErrorEnvelope(const Status& s) {
  control::Envelope e;
  *e.mutable_error() = StatusToError(s);
  return e;
}

}  // namespace

Status WorkerDaemon::Run() {
  ControlClientOptions copts;
  copts.on_message = [this](const control::Envelope& e) { OnMessage(e); };
  copts.curve_secret_key = options_.curve_secret_key;
  copts.curve_server_key = options_.curve_server_key;
  ControlClient client(copts);
  TESSERA_RETURN_IF_ERROR(client.Connect(options_.coordinator));
  control::Register reg;
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  reg.set_host(options_.host.empty() ? host : options_.host);
  reg.set_pid(static_cast<uint32_t>(getpid()));
  reg.set_build_version(TESSERA_VERSION);
  control::Device* dev = reg.add_devices();
  dev->set_index(static_cast<uint32_t>(options_.device));
  dev->set_kind(control::DEVICE_KIND_CPU);
  dev->set_name("cpu");
  TESSERA_RETURN_IF_ERROR(client.Register(reg, options_.worker_id));
  TESSERA_ASSIGN_OR_RETURN(std::string id,
                           client.WaitRegistered(std::chrono::milliseconds(
                               static_cast<int64_t>(options_.register_timeout_seconds * 1000))));
  TESSERA_LOG_INFO("worker", "registered as {} with {}", id, options_.coordinator);
  control::Heartbeat hb;
  hb.set_state(control::WORKER_STATE_IDLE);
  client.SetHeartbeat(hb);

  // Wait for the assignment (heartbeats keep us alive meanwhile).
  control::AssignShard assign;
  while (true) {
    TESSERA_ASSIGN_OR_RETURN(control::Envelope e, Next(3600.0));
    if (e.has_shutdown()) return Status::Ok();
    if (e.has_assign_shard()) {
      assign = e.assign_shard();
      break;
    }
  }
  const std::string who = "worker " + id + " (rank " + std::to_string(assign.world_rank()) +
                          ", stage " + std::to_string(assign.stage()) + ", tp_rank " +
                          std::to_string(assign.tp_rank()) + ")";
  auto fail = [&](const Status& s) {
    Status full = s.WithContext(who);
    client.Send(ErrorEnvelope(full)).IgnoreError();
    hb.set_state(control::WORKER_STATE_FAILED);
    client.SetHeartbeat(hb);
    return full;
  };
  hb.set_state(control::WORKER_STATE_LOADING);
  hb.set_plan_version(assign.plan_version());
  client.SetHeartbeat(hb);
  if (!assign.has_gloo()) return fail(InvalidArgument("AssignShard without a Gloo rendezvous"));
  kernels::SetBlasThreads(1);
  auto store =
      TcpStore::Connect(assign.gloo().store_host(), static_cast<int>(assign.gloo().store_port()),
                        options_.collective_timeout_seconds);
  if (!store.ok()) return fail(store.status());
  ProcessGroupOptions pgo;
  pgo.tp = static_cast<int>(assign.tp());
  pgo.pp = static_cast<int>(assign.pp());
  pgo.world_rank = static_cast<int>(assign.world_rank());
  pgo.timeout_seconds = options_.collective_timeout_seconds;
  pgo.connect_timeout_seconds = std::max(60.0, options_.collective_timeout_seconds);
  pgo.hostname = options_.gloo_host;
  pgo.key_prefix = assign.gloo().key_prefix();
  auto pg = ProcessGroup::Create(**store, pgo);
  if (!pg.ok()) return fail(pg.status());
  auto config = LoadModelConfig(assign.model_path());
  if (!config.ok()) return fail(config.status());
  std::vector<int> layers(assign.layers_per_stage().begin(), assign.layers_per_stage().end());
  auto parallel = ParallelConfig::Make(*config, pgo.tp, pgo.pp, layers);
  if (!parallel.ok()) return fail(parallel.status());
  const auto t0 = std::chrono::steady_clock::now();
  auto loaded =
      LoadModel(assign.model_path(), *parallel, pgo.world_rank, (*pg)->tp(),
                [&](int64_t done, int64_t total) {
                  control::Envelope e;
                  control::LoadProgress* p = e.mutable_load_progress();
                  p->set_plan_version(assign.plan_version());
                  p->set_bytes_done(static_cast<uint64_t>(done));
                  p->set_bytes_total(static_cast<uint64_t>(total));
                  p->set_seconds(
                      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
                  client.Send(std::move(e)).IgnoreError();
                });
  if (!loaded.ok()) return fail(loaded.status());
  const StageLayout lay = loaded->model->layout();
  const int64_t blocks = static_cast<int64_t>(assign.kv_num_blocks());
  const int64_t block_size = assign.kv_block_size();
  KvCache cache(lay.num_layers(), blocks, block_size, lay.kv_heads_local, config->head_dim);
  {
    control::Envelope e;
    control::Loaded* l = e.mutable_loaded();
    l->set_plan_version(assign.plan_version());
    l->set_weights_bytes(static_cast<uint64_t>(loaded->weight_bytes));
    l->set_kv_capacity_blocks(static_cast<uint64_t>(blocks));
    l->set_load_seconds(loaded->load_seconds);
    l->set_kv_bytes(static_cast<uint64_t>(cache.bytes()));
    TESSERA_RETURN_IF_ERROR(client.Send(std::move(e)));
  }
  hb.set_state(control::WORKER_STATE_READY);
  control::DeviceMemory* mem = hb.add_memory();
  mem->set_device_index(static_cast<uint32_t>(options_.device));
  mem->set_weights_bytes(static_cast<uint64_t>(loaded->weight_bytes));
  mem->set_kv_bytes(static_cast<uint64_t>(cache.bytes()));
  client.SetHeartbeat(hb);
  TESSERA_LOG_INFO("worker", "{} loaded layers [{}, {}): {:.1f} MB in {:.2f} s", who,
                   lay.first_layer, lay.end_layer, static_cast<double>(loaded->weight_bytes) / 1e6,
                   loaded->load_seconds);

  PipelineLinks links;
  links.pp = pgo.pp;
  links.stage = (*pg)->stage();
  links.tp_rank = (*pg)->tp_rank();
  links.tp = (*pg)->tp();
  links.prev = (*pg)->prev_stage();
  links.next = (*pg)->next_stage();
  links.ret = nullptr;  // tokens go to the coordinator
  // The micro-batch ids of the Steps in flight, oldest first: the pipeline is
  // FIFO, so the last stage answers them in order.
  uint64_t next_result = 0;
  auto send_result = [&](const StepBatch& batch, const std::vector<int32_t>& tokens) -> Status {
    control::Envelope e;
    control::StepResult* r = e.mutable_step_result();
    r->set_plan_version(assign.plan_version());
    r->set_micro_batch_id(next_result++);
    size_t k = 0;
    for (const SeqStep& s : batch.seqs) {
      if (!s.want_logits) continue;
      control::SampledToken* t = r->add_tokens();
      t->set_seq_id(s.seq_id);
      t->set_token_id(tokens[k++]);
    }
    return client.Send(std::move(e));
  };
  const bool last = links.stage == links.pp - 1;
  if (links.stage > 0) {
    Status s =
        ServeStage(*loaded->model, cache, links, {}, last ? TokenSink(send_result) : TokenSink());
    return s.ok() ? s : fail(s);
  }
  std::unique_ptr<AsyncSender> sender;
  if (links.pp > 1)
    sender = std::make_unique<AsyncSender>(links.next, 1, static_cast<size_t>(2 * links.pp + 2));
  SequenceSamplers samplers;
  while (true) {
    TESSERA_ASSIGN_OR_RETURN(control::Envelope e, Next(3600.0));
    if (e.has_shutdown() || e.has_drain()) {
      Status s = SendShutdownDownstream(sender.get());
      return s.ok() ? s : fail(s);
    }
    if (!e.has_step()) continue;
    if (e.step().plan_version() != assign.plan_version()) {
      TESSERA_LOG_WARN("worker", "{} dropped a Step of plan {} (loaded plan {})", who,
                       e.step().plan_version(), assign.plan_version());
      continue;
    }
    auto batch = StepBatchFromProto(e.step().batch());
    if (!batch.ok()) return fail(batch.status());
    auto tokens = RunFirstStage(*loaded->model, cache, links, *batch, sender.get(), samplers);
    if (!tokens.ok()) return fail(tokens.status());
    if (links.pp == 1 && links.tp_rank == 0) {
      next_result = e.step().micro_batch_id();
      TESSERA_RETURN_IF_ERROR(send_result(*batch, *tokens));
    }
  }
}

}  // namespace tessera
