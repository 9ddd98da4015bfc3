// WorkerDaemon::ServeAsLeader and ServeAsLeaderPeer: the loops of a
// replica that schedules itself (AssignShard.leader, on every stage-0 rank;
// worker/daemon/replica_leader.h). tp rank 0 leads: it runs the scheduler
// and sends each micro-batch to its stage-0 tp peers (BroadcastBytes over
// the tp group: the step codec's message, or a keepalive while idle, or the
// end of the plan); the peers run what they are sent. With pp > 1 every
// stage-0 rank passes its hidden states, keepalives and the end of the plan
// on to the stage-1 ranks it feeds, and the sampled tokens return to the
// leader alone (AssignShard.tokens_to_leader): the peers need none, so they
// have nothing to drain. Both run on the worker's main thread, which owns
// the model and the KV cache.
#include <chrono>
#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "common/base/logging.h"
#include "common/tokenizer/tokenizer.h"
#include "common/wire/control_codec.h"
#include "common/wire/step_codec.h"
#include "worker/comm/async_sender.h"
#include "worker/daemon/control_client.h"
#include "worker/daemon/replica_leader.h"
#include "worker/daemon/worker_daemon.h"
#include "worker/exec/rank_inputs.h"

namespace tessera {
namespace {

// Stage 0 of the replica run in this process: each micro-batch goes to the
// stage-0 tp peers first (`before_step`), then runs (RunFirstStage), with the
// worker's step metrics and step watch around it. At pp 1 it samples here; at
// pp > 1 the hidden states go on to stage 1 (an AsyncSender on links.next)
// and Collect takes the tokens the last stage's sampling rank returns over
// links.ret (an Envelope with a StepResult, log-probabilities included:
// AssignShard.tokens_to_leader), oldest micro-batch first, pp in flight.
class FirstStageExecutor : public StepExecutor {
 public:
  FirstStageExecutor(LlamaModel& model, KvCache& cache, const PipelineLinks& links,
                     SequenceSamplers& samplers, WorkerMetrics* metrics, StepWatch& watch,
                     uint64_t plan_version, std::function<Status(const StepBatch&)> before_step)
      : model_(model),
        cache_(cache),
        links_(links),
        samplers_(samplers),
        metrics_(metrics),
        watch_(watch),
        plan_version_(plan_version),
        before_step_(std::move(before_step)) {
    if (links_.pp > 1) {
      TESSERA_CHECK(links_.ret.size() == 1);
      // Two frames (meta, hidden) per micro-batch, pp micro-batches in flight.
      sender_ =
          std::make_unique<AsyncSender>(links_.next, 1, static_cast<size_t>(2 * links_.pp + 2));
    }
  }

  Status Submit(const StepBatch& batch) override {
    const auto start = std::chrono::steady_clock::now();
    if (metrics_) metrics_->clock().Busy();
    watch_.BeginStep();
    Status sent = before_step_(batch);
    if (!sent.ok()) {
      watch_.EndStep();
      return sent;
    }
    auto tokens = RunFirstStage(model_, cache_, links_, batch, sender_.get(), samplers_);
    watch_.EndStep();
    if (metrics_) {
      metrics_->ObserveStep(
          batch, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      metrics_->clock().Idle();
    }
    if (!tokens.ok()) return tokens.status();
    if (links_.pp > 1) {
      size_t wanted = 0;
      for (const SeqStep& s : batch.seqs) wanted += s.want_logits ? 1 : 0;
      wanted_.push_back(wanted);
    } else {
      done_.push_back(std::move(*tokens));
    }
    return Status::Ok();
  }
  StatusOr<std::vector<SampledToken>> Collect() override {
    if (links_.pp > 1) return Receive();
    if (done_.empty()) return FailedPrecondition("collect: no step in flight");
    std::vector<SampledToken> tokens = std::move(done_.front());
    done_.pop_front();
    return tokens;
  }
  int max_in_flight() const override { return links_.pp; }
  int64_t vocab_size() const override { return model_.config().vocab_size; }

  // Idle at pp > 1: keeps the later stages' bounded receives from timing out.
  Status Keepalive() {
    if (!sender_) return Status::Ok();
    return sender_->Enqueue(EncodeKeepalive()).WithContext("keepalive to stage 1");
  }
  // Ends the plan down the pipeline (pp > 1): the end follows the micro-batches in flight,
  // whose tokens are taken (and dropped: their sequences were re-queued or end with the
  // plan) so that the last stage's sends complete.
  Status EndPipeline() {
    if (!sender_) return Status::Ok();
    TESSERA_RETURN_IF_ERROR(SendShutdownDownstream(sender_.get()));
    while (!wanted_.empty()) TESSERA_RETURN_IF_ERROR(Receive().status());
    return Status::Ok();
  }

 private:
  // The oldest micro-batch's tokens from the last stage (pp > 1).
  StatusOr<std::vector<SampledToken>> Receive() {
    if (wanted_.empty()) return FailedPrecondition("collect: no step in flight");
    const size_t wanted = wanted_.front();
    wanted_.pop_front();
    const uint64_t id = next_result_++;
    const std::string what = "tokens of micro-batch " + std::to_string(id) +
                             " from the last stage to the replica's leader";
    std::vector<uint8_t> frame;
    Status got = RecvFrame(*links_.ret[0], 1, frame, kDefaultMaxControlMessageBytes);
    if (!got.ok()) return got.WithContext(what);
    auto e =
        DecodeEnvelope(std::string_view(reinterpret_cast<const char*>(frame.data()), frame.size()));
    if (!e.ok()) return e.status().WithContext(what);
    if (!e->has_step_result())
      return Internal(what + ": got " + EnvelopeBodyName(*e) + ", not a step_result");
    const control::StepResult& r = e->step_result();
    if (r.plan_version() != plan_version_ || r.micro_batch_id() != id)
      return Internal(what + ": got micro-batch " + std::to_string(r.micro_batch_id()) +
                      " of plan " + std::to_string(r.plan_version()) + " (leading plan " +
                      std::to_string(plan_version_) + ")");
    if (r.has_error()) return ErrorToStatus(r.error()).WithContext(what);
    auto tokens = SampledTokensFromProto(r, wanted, model_.config().vocab_size);
    if (!tokens.ok()) return tokens.status().WithContext(what);
    return tokens;
  }

  LlamaModel& model_;
  KvCache& cache_;
  const PipelineLinks& links_;
  SequenceSamplers& samplers_;
  WorkerMetrics* metrics_;
  StepWatch& watch_;
  const uint64_t plan_version_;
  std::function<Status(const StepBatch&)> before_step_;
  std::deque<std::vector<SampledToken>> done_;  // pp 1: the tokens of steps not collected
  std::unique_ptr<AsyncSender> sender_;         // pp > 1: to stage 1
  std::deque<size_t> wanted_;                   // pp > 1: want_logits count per batch in flight
  uint64_t next_result_ = 0;                    // pp > 1: the next micro-batch's id
};

}  // namespace

Status WorkerDaemon::ServeAsLeader(const LeaderServe& s) {
  const control::AssignShard& assign = s.assign;
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
                              assign.plan_version(), [&](const StepBatch& batch) {
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
        if (!s.ended()) {
          to_peers(EncodeShutdown()).IgnoreError();
          Status ended = executor.EndPipeline();
          if (!ended.ok()) return s.fail(ended.WithContext("ending the plan down the pipeline"));
        }
        TESSERA_LOG_INFO("worker", "{}: plan ended{}", s.who, drain ? " (drain)" : "");
        return Status::Ok();
      }
      leader.Handle(e);
      continue;
    }
    if (!leader.busy()) {
      // Idle: keep the peers' bounded receives from timing out.
      Status k = to_peers(EncodeKeepalive());
      if (k.ok()) k = executor.Keepalive();
      if (!k.ok()) return s.fail(k);
      continue;
    }
    auto ran = leader.Step();
    if (!ran.ok()) return s.fail(ran.status());
  }
}

Status WorkerDaemon::ServeAsLeaderPeer(const LeaderServe& s) {
  if (!s.links.tp)
    return s.fail(
        FailedPrecondition("AssignShard.leader: a stage-0 tp peer of a replica that "
                           "schedules itself needs a tp group"));
  kernels::Backend& backend = *device_->backend;
  // pp > 1: its hidden states go on to the stage-1 receivers it feeds (possibly none); the
  // tokens return to the leader alone.
  std::unique_ptr<AsyncSender> sender;
  if (s.links.pp > 1)
    sender =
        std::make_unique<AsyncSender>(s.links.next, 1, static_cast<size_t>(2 * s.links.pp + 2));
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
      Status ended = SendShutdownDownstream(sender.get());
      if (!ended.ok()) return s.fail(ended.WithContext("ending the plan down the pipeline"));
      TESSERA_LOG_INFO("worker", "{}: plan ended by its leader", s.who);
      return Status::Ok();
    }
    if (message->kind == StepMessageKind::kKeepalive) {
      if (sender) {
        Status k = sender->Enqueue(EncodeKeepalive());
        if (!k.ok()) return s.fail(k.WithContext("keepalive to stage 1"));
      }
      continue;
    }
    const auto start = std::chrono::steady_clock::now();
    if (metrics_) metrics_->clock().Busy();
    step_watch_.BeginStep();
    StepSleepFailpoint(static_cast<int>(s.assign.world_rank()));
    auto tokens =
        RunFirstStage(s.model, s.cache, s.links, message->batch, sender.get(), s.samplers);
    step_watch_.EndStep();
    if (!tokens.ok()) return s.fail(tokens.status());
    if (metrics_)
      metrics_->ObserveStep(
          message->batch,
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
}

}  // namespace tessera
