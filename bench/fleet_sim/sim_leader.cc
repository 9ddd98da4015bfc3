#include "bench/fleet_sim/sim_leader.h"

#include <chrono>
#include <utility>

#include "common/base/logging.h"
#include "common/engine/step_executor.h"
#include "common/format/model_config.h"
#include "common/tokenizer/tokenizer.h"
#include "common/wire/control_codec.h"
#include "worker/daemon/replica_leader.h"

namespace tessera::fleet_sim {

int32_t SimTokenAt(int64_t seq_id, int64_t pos, int32_t lo, int32_t hi) {
  const uint64_t h = static_cast<uint64_t>(seq_id) * 0x9E3779B97F4A7C15ull +
                     static_cast<uint64_t>(pos) * 0xC2B2AE3D27D4EB4Full;
  return lo + static_cast<int32_t>((h >> 17) % static_cast<uint64_t>(hi - lo));
}

namespace {

// A stage that samples the fleet's deterministic tokens (with the
// log-probabilities a sequence asks for) in the modeled step time.
class SimStage : public StepExecutor {
 public:
  SimStage(const control::AssignShard& assign, const StepModel* model, int64_t vocab, int32_t lo,
           int32_t hi, std::atomic<int64_t>* steps, std::atomic<int64_t>* tokens)
      : assign_(assign),
        model_(model),
        vocab_(vocab),
        lo_(lo),
        hi_(hi),
        steps_(steps),
        tokens_(tokens) {}

  Status Submit(const StepBatch& batch) override {
    std::vector<SampledToken> out;
    for (const SeqStep& s : batch.seqs) {
      if (!s.want_logits) continue;
      SampledToken t;
      t.token_id = SimTokenAt(s.seq_id, s.start_pos + s.num_tokens, lo_, hi_);
      if (s.sampling.logprobs >= 0) {
        t.has_logprobs = true;
        t.logprob = -0.5f;
        for (int32_t k = 0; k < s.sampling.logprobs; ++k)
          t.top.push_back({k == 0 ? t.token_id : lo_ + k, -0.5f - static_cast<float>(k)});
      }
      out.push_back(std::move(t));
    }
    control::StepBatch proto;
    StepBatchToProto(batch, &proto);
    const double seconds = model_->StepSeconds(assign_, proto);  // 0 with --time-scale 0
    if (seconds > 0) std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
    ++*steps_;
    *tokens_ += static_cast<int64_t>(out.size());
    done_.push_back(std::move(out));
    return Status::Ok();
  }
  StatusOr<std::vector<SampledToken>> Collect() override {
    if (done_.empty()) return FailedPrecondition("collect: no step in flight");
    std::vector<SampledToken> t = std::move(done_.front());
    done_.pop_front();
    return t;
  }
  int max_in_flight() const override { return 1; }
  int64_t vocab_size() const override { return vocab_; }

 private:
  const control::AssignShard assign_;
  const StepModel* model_;
  const int64_t vocab_;
  const int32_t lo_, hi_;
  std::atomic<int64_t>* steps_;
  std::atomic<int64_t>* tokens_;
  std::deque<std::vector<SampledToken>> done_;
};

}  // namespace

struct SimLeader::State {
  ModelConfig config;
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<SimStage> stage;
  std::unique_ptr<ReplicaLeader> leader;
};

StatusOr<std::unique_ptr<SimLeader>> SimLeader::Start(const control::AssignShard& assign,
                                                      const StepModel* model, int32_t token_lo,
                                                      int32_t token_hi, SendFn send,
                                                      std::atomic<int64_t>* steps,
                                                      std::atomic<int64_t>* tokens) {
  auto state = std::make_unique<State>();
  TESSERA_ASSIGN_OR_RETURN(state->config, LoadModelConfig(assign.model_path()));
  TESSERA_ASSIGN_OR_RETURN(state->tokenizer, Tokenizer::Load(assign.model_path()));
  state->stage = std::make_unique<SimStage>(assign, model, state->config.vocab_size, token_lo,
                                            token_hi, steps, tokens);
  state->leader = std::make_unique<ReplicaLeader>(
      state->config, state->tokenizer.get(), state->stage.get(),
      static_cast<int64_t>(assign.kv_num_blocks()), assign.kv_block_size(),
      LeaderSchedulerOptions(assign.leader(), assign.plan_version()),
      [send = std::move(send)](control::Envelope e) {
        send(std::move(e));
        return Status::Ok();
      });
  return std::unique_ptr<SimLeader>(new SimLeader(std::move(state)));
}

SimLeader::SimLeader(std::unique_ptr<State> state) : state_(std::move(state)) {
  thread_ = std::thread([this] { Loop(); });
}

SimLeader::~SimLeader() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void SimLeader::Post(control::Envelope envelope) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    inbox_.push_back(std::move(envelope));
  }
  cv_.notify_all();
}

void SimLeader::Loop() {
  ReplicaLeader& leader = *state_->leader;
  while (true) {
    std::deque<control::Envelope> in;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !inbox_.empty() || leader.busy(); });
      if (stop_) return;
      in.swap(inbox_);
    }
    for (const control::Envelope& e : in) leader.Handle(e);
    if (!leader.busy()) continue;
    auto ran = leader.Step();
    if (!ran.ok()) {
      TESSERA_LOG_ERROR("fleet-sim", "leader of plan {}: {}", leader.plan_version(),
                        ran.status().ToString());
      return;
    }
  }
}

}  // namespace tessera::fleet_sim
