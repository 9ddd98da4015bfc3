// WorkerDaemon::ServeAsLeader and ServeAsLeaderPeer: the loops of a
// replica that schedules itself (AssignShard.leader, on every stage-0 rank;
// worker/daemon/replica_leader.h). tp rank 0 leads: it runs the scheduler
// and sends each micro-batch to its stage-0 tp peers (BroadcastBytes over
// the tp group: the step codec's message, or a keepalive while idle, or the
// end of the plan); the peers run what they are sent. Both run on the
// worker's main thread, which owns the model and the KV cache.
#include <chrono>
#include <deque>
#include <memory>
#include <utility>

#include "common/base/logging.h"
#include "common/tokenizer/tokenizer.h"
#include "common/wire/step_codec.h"
#include "worker/daemon/control_client.h"
#include "worker/daemon/replica_leader.h"
#include "worker/daemon/worker_daemon.h"
#include "worker/exec/rank_inputs.h"

namespace tessera {
namespace {

// Stage 0 of a pp 1 replica run in this process: each micro-batch goes to
// the stage-0 tp peers first (`before_step`), then runs and samples in
// Submit (RunFirstStage), with the worker's step metrics and step watch
// around it.
class FirstStageExecutor : public StepExecutor {
 public:
  FirstStageExecutor(LlamaModel& model, KvCache& cache, const PipelineLinks& links,
                     SequenceSamplers& samplers, WorkerMetrics* metrics, StepWatch& watch,
                     std::function<Status(const StepBatch&)> before_step)
      : model_(model),
        cache_(cache),
        links_(links),
        samplers_(samplers),
        metrics_(metrics),
        watch_(watch),
        before_step_(std::move(before_step)) {}

  Status Submit(const StepBatch& batch) override {
    const auto start = std::chrono::steady_clock::now();
    if (metrics_) metrics_->clock().Busy();
    watch_.BeginStep();
    Status sent = before_step_(batch);
    if (!sent.ok()) {
      watch_.EndStep();
      return sent;
    }
    auto tokens = RunFirstStage(model_, cache_, links_, batch, nullptr, samplers_);
    watch_.EndStep();
    if (metrics_) {
      metrics_->ObserveStep(
          batch, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      metrics_->clock().Idle();
    }
    if (!tokens.ok()) return tokens.status();
    done_.push_back(std::move(*tokens));
    return Status::Ok();
  }
  StatusOr<std::vector<SampledToken>> Collect() override {
    if (done_.empty()) return FailedPrecondition("collect: no step in flight");
    std::vector<SampledToken> tokens = std::move(done_.front());
    done_.pop_front();
    return tokens;
  }
  int max_in_flight() const override { return 1; }
  int64_t vocab_size() const override { return model_.config().vocab_size; }

 private:
  LlamaModel& model_;
  KvCache& cache_;
  const PipelineLinks& links_;
  SequenceSamplers& samplers_;
  WorkerMetrics* metrics_;
  StepWatch& watch_;
  std::function<Status(const StepBatch&)> before_step_;
  std::deque<std::vector<SampledToken>> done_;
};

}  // namespace

Status WorkerDaemon::ServeAsLeader(const LeaderServe& s) {
  const control::AssignShard& assign = s.assign;
  if (s.links.pp != 1)
    return s.fail(FailedPrecondition(
        "AssignShard.leader: a replica schedules itself at pp 1 only in this version; plan " +
        std::to_string(assign.plan_version()) + " has pp " + std::to_string(assign.pp())));
  Communicator* peers = s.links.tp && s.links.tp->size() > 1 ? s.links.tp : nullptr;
  kernels::Backend& backend = *device_->backend;
  auto to_peers = [&](std::vector<uint8_t> bytes) -> Status {
    if (!peers) return Status::Ok();
    return BroadcastBytes(*peers, backend, bytes).WithContext("to the stage-0 tp peers");
  };
  // Detokenization and stop strings need the model's tokenizer; without one
  // the leader refuses stop strings (the coordinator checks them first).
  std::unique_ptr<Tokenizer> tokenizer;
  if (auto t = Tokenizer::Load(assign.model_path()); t.ok()) {
    tokenizer = std::move(*t);
  } else {
    TESSERA_LOG_WARN("worker", "{}: leader without a tokenizer: {}", s.who, t.status().ToString());
  }
  FirstStageExecutor executor(s.model, s.cache, s.links, s.samplers, metrics_.get(), step_watch_,
                              [&](const StepBatch& batch) {
                                StepSleepFailpoint(static_cast<int>(assign.world_rank()));
                                return to_peers(EncodeStep(batch));
                              });
  ReplicaLeader leader(s.model.config(), tokenizer.get(), &executor,
                       static_cast<int64_t>(assign.kv_num_blocks()), assign.kv_block_size(),
                       LeaderSchedulerOptions(assign.leader(), assign.plan_version()),
                       [&s](control::Envelope e) { return s.client.Send(std::move(e)); });
  TESSERA_LOG_INFO("worker", "{}: leads its replica (plan {}): the scheduler runs here", s.who,
                   assign.plan_version());
  const double idle_wait = options_.collective_timeout_seconds / 3.0;
  while (true) {
    // Every message that is there is taken before the next step; an idle
    // leader sleeps until one comes.
    auto next = Next(leader.busy() ? 0.0 : idle_wait);
    if (next.ok()) {
      control::Envelope& e = *next;
      if (e.has_shutdown() || e.has_drain() || e.has_assign_shard()) {
        const bool drain = e.has_drain();
        if (!drain) PushFront(std::move(e));  // the outer loop acts on it
        // The peers leave their loop too (best effort: one declared lost
        // has its communicators interrupted by the watcher anyway).
        if (!s.ended()) to_peers(EncodeShutdown()).IgnoreError();
        TESSERA_LOG_INFO("worker", "{}: plan ended{}", s.who, drain ? " (drain)" : "");
        return Status::Ok();
      }
      leader.Handle(e);
      continue;
    }
    if (!leader.busy()) {
      // Idle: keep the peers' bounded receives from timing out.
      Status k = to_peers(EncodeKeepalive());
      if (!k.ok()) return s.fail(k);
      continue;
    }
    auto ran = leader.Step();
    if (!ran.ok()) return s.fail(ran.status());
  }
}

Status WorkerDaemon::ServeAsLeaderPeer(const LeaderServe& s) {
  if (s.links.pp != 1 || !s.links.tp)
    return s.fail(
        FailedPrecondition("AssignShard.leader: a stage-0 tp peer of a replica that "
                           "schedules itself needs pp 1 and a tp group"));
  kernels::Backend& backend = *device_->backend;
  TESSERA_LOG_INFO("worker", "{}: follows its replica's leader (plan {})", s.who,
                   s.assign.plan_version());
  while (true) {
    if (metrics_) metrics_->clock().Idle();
    std::vector<uint8_t> bytes;
    step_watch_.BeginStep();  // waiting in the receive is not compute (step_watch.h)
    Status got = BroadcastBytes(*s.links.tp, backend, bytes);
    step_watch_.EndStep();
    if (!got.ok()) return s.fail(got.WithContext("from the replica's leader"));
    auto message = DecodeStep(bytes);
    if (!message.ok()) return s.fail(message.status().WithContext("from the replica's leader"));
    if (message->kind == StepMessageKind::kShutdown) {
      TESSERA_LOG_INFO("worker", "{}: plan ended by its leader", s.who);
      return Status::Ok();
    }
    if (message->kind == StepMessageKind::kKeepalive) continue;
    const auto start = std::chrono::steady_clock::now();
    if (metrics_) metrics_->clock().Busy();
    step_watch_.BeginStep();
    StepSleepFailpoint(static_cast<int>(s.assign.world_rank()));
    auto tokens = RunFirstStage(s.model, s.cache, s.links, message->batch, nullptr, s.samplers);
    step_watch_.EndStep();
    if (!tokens.ok()) return s.fail(tokens.status());
    if (metrics_)
      metrics_->ObserveStep(
          message->batch,
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
}

}  // namespace tessera
