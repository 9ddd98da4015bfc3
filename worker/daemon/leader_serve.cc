// WorkerDaemon::ServeAsLeader: the loop of a replica's leader (AssignShard.
// leader; worker/daemon/replica_leader.h). It runs on the worker's main
// thread, which owns the model and the KV cache.
#include <chrono>
#include <deque>
#include <memory>
#include <utility>

#include "common/base/logging.h"
#include "common/tokenizer/tokenizer.h"
#include "worker/daemon/control_client.h"
#include "worker/daemon/replica_leader.h"
#include "worker/daemon/worker_daemon.h"

namespace tessera {
namespace {

// Stage 0 of a tp 1 x pp 1 replica run in this process: each micro-batch
// runs and samples in Submit (RunFirstStage), with the worker's step
// metrics and step watch around it.
class FirstStageExecutor : public StepExecutor {
 public:
  FirstStageExecutor(LlamaModel& model, KvCache& cache, const PipelineLinks& links,
                     SequenceSamplers& samplers, WorkerMetrics* metrics, StepWatch& watch,
                     std::function<void()> before_step)
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
    before_step_();
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
  std::function<void()> before_step_;
  std::deque<std::vector<SampledToken>> done_;
};

}  // namespace

Status WorkerDaemon::ServeAsLeader(const LeaderServe& s) {
  const control::AssignShard& assign = s.assign;
  if (s.links.pp != 1 || assign.tp() != 1 || assign.tp_per_stage_size() > 0)
    return s.fail(FailedPrecondition(
        "AssignShard.leader: a replica schedules itself at tp 1 x pp 1 only in this "
        "version; plan " +
        std::to_string(assign.plan_version()) + " is tp " + std::to_string(assign.tp()) + " x pp " +
        std::to_string(assign.pp())));
  // Detokenization and stop strings need the model's tokenizer; without one
  // the leader refuses stop strings (the coordinator checks them first).
  std::unique_ptr<Tokenizer> tokenizer;
  if (auto t = Tokenizer::Load(assign.model_path()); t.ok()) {
    tokenizer = std::move(*t);
  } else {
    TESSERA_LOG_WARN("worker", "{}: leader without a tokenizer: {}", s.who, t.status().ToString());
  }
  FirstStageExecutor executor(s.model, s.cache, s.links, s.samplers, metrics_.get(), step_watch_,
                              [&] { StepSleepFailpoint(static_cast<int>(assign.world_rank())); });
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
        TESSERA_LOG_INFO("worker", "{}: plan ended{}", s.who, drain ? " (drain)" : "");
        return Status::Ok();
      }
      leader.Handle(e);
      continue;
    }
    if (!leader.busy()) continue;
    auto ran = leader.Step();
    if (!ran.ok()) return s.fail(ran.status());
  }
}

}  // namespace tessera
