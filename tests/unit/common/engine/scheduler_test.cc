// Scheduler on the real CPU model (fixture llama_gqa_f32): continuous
// batching, preemption under KV-cache pressure, admission control and
// cancellation. Outputs must equal the unconstrained runs token for token.
#include "common/engine/scheduler.h"

#include <gtest/gtest.h>

#include <deque>

#include "support/model_harness.h"
#include "support/test_util.h"
#include "worker/exec/local_executor.h"
#include "worker/model/model_loader.h"

namespace tessera {
namespace {

struct Rig {
  ModelConfig config;
  std::unique_ptr<LocalExecutor> executor;
  std::unique_ptr<BlockAllocator> allocator;
  std::unique_ptr<Scheduler> scheduler;
};

Rig MakeRig(int64_t blocks, int64_t block_size, SchedulerOptions options) {
  Rig r;
  const std::string dir = ::tessera::testing::FixturePath("models/llama_gqa_f32");
  auto par = ParallelConfig::Make(*LoadModelConfig(dir), 1, 1);
  auto loaded = LoadModel(dir, *par, 0, nullptr);
  TESSERA_CHECK(loaded.ok());
  r.config = loaded->config;
  const StageLayout lay = loaded->model->layout();
  auto cache = std::make_unique<KvCache>(lay.num_layers(), blocks, block_size, lay.kv_heads_local,
                                         r.config.head_dim);
  r.executor = std::make_unique<LocalExecutor>(std::move(loaded->model), std::move(cache));
  r.allocator = std::make_unique<BlockAllocator>(blocks);
  r.scheduler = std::make_unique<Scheduler>(r.config, r.executor.get(), r.allocator.get(),
                                            block_size, nullptr, options);
  return r;
}

GenerationRequest Req(std::vector<int32_t> prompt, int max_tokens) {
  GenerationRequest g;
  g.prompt_ids = std::move(prompt);
  g.max_tokens = max_tokens;
  g.ignore_eos = true;
  return g;
}

// Runs until every request finished; returns tokens per request id.
std::map<int64_t, GenerationResult> Drain(Scheduler& s, std::map<int64_t, GenerationResult>& done) {
  for (int i = 0; i < 10000 && (s.running() || s.waiting()); ++i) {
    auto r = s.RunOnce();
    TESSERA_CHECK(r.ok());
  }
  return done;
}

RequestCallbacks Collect(std::map<int64_t, GenerationResult>& done, int64_t* id_slot) {
  RequestCallbacks cb;
  cb.on_finish = [&done, id_slot](const GenerationResult& r) { done[*id_slot] = r; };
  return cb;
}

std::vector<std::vector<int32_t>> Prompts() {
  return {{5, 17, 42, 9, 11}, {100, 7}, {3, 3, 3, 3, 3, 3, 3, 3, 3},
          {250, 251, 252},    {1, 2},   {77, 78, 79, 80}};
}

TEST(Scheduler, PreemptionUnderKvPressureKeepsOutputsIdentical) {
  // Reference: plenty of blocks.
  std::vector<std::vector<int32_t>> want;
  {
    Rig big = MakeRig(256, 4, SchedulerOptions{});
    std::map<int64_t, GenerationResult> done;
    std::vector<std::unique_ptr<int64_t>> ids;
    for (const auto& p : Prompts()) {
      ids.push_back(std::make_unique<int64_t>(-1));
      *ids.back() = *big.scheduler->Enqueue(Req(p, 20), Collect(done, ids.back().get()));
    }
    Drain(*big.scheduler, done);
    for (size_t i = 0; i < ids.size(); ++i) want.push_back(done[static_cast<int64_t>(i)].tokens);
    EXPECT_EQ(big.scheduler->stats().preemptions, 0);
  }
  // 16 blocks of 4 tokens = 64 token slots for 6 sequences of up to 29 tokens.
  Rig small = MakeRig(16, 4, SchedulerOptions{});
  std::map<int64_t, GenerationResult> done;
  std::vector<std::unique_ptr<int64_t>> ids;
  for (const auto& p : Prompts()) {
    ids.push_back(std::make_unique<int64_t>(-1));
    *ids.back() = *small.scheduler->Enqueue(Req(p, 20), Collect(done, ids.back().get()));
  }
  Drain(*small.scheduler, done);
  EXPECT_GT(small.scheduler->stats().preemptions, 0);
  ASSERT_EQ(done.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(done[static_cast<int64_t>(i)].tokens, want[i]) << "request " << i;
    EXPECT_EQ(done[static_cast<int64_t>(i)].finish_reason, FinishReason::kLength);
  }
  EXPECT_EQ(small.allocator->num_free(), 16);  // every block came back
}

// Log-probabilities ride along with their tokens, through preemption and
// recomputation: one entry per generated token for the requests that ask,
// handed to on_token with its token; none for the others.
TEST(Scheduler, LogprobsFollowTheirTokensThroughPreemption) {
  // 16 blocks of 4 tokens for 6 sequences of up to 29 tokens: preemptions.
  Rig small = MakeRig(16, 4, SchedulerOptions{});
  std::map<int64_t, GenerationResult> done;
  std::map<int64_t, std::vector<SampledToken>> streamed;
  std::map<int64_t, int> null_logprobs;
  std::vector<std::unique_ptr<int64_t>> ids;
  const auto prompts = Prompts();
  for (size_t i = 0; i < prompts.size(); ++i) {
    ids.push_back(std::make_unique<int64_t>(-1));
    GenerationRequest g = Req(prompts[i], 20);
    g.sampling.logprobs = i % 2 == 0 ? 3 : -1;  // even requests ask, with 3 alternatives
    RequestCallbacks cb = Collect(done, ids.back().get());
    int64_t* slot = ids.back().get();
    cb.on_token = [&, slot](const std::string&, int32_t token, const SampledToken* lp) {
      if (token < 0) return;
      if (lp) {
        EXPECT_EQ(lp->token_id, token);
        streamed[*slot].push_back(*lp);
      } else {
        ++null_logprobs[*slot];
      }
    };
    *ids.back() = *small.scheduler->Enqueue(g, std::move(cb));
  }
  Drain(*small.scheduler, done);
  EXPECT_GT(small.scheduler->stats().preemptions, 0);
  ASSERT_EQ(done.size(), prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    SCOPED_TRACE("request " + std::to_string(i));
    const int64_t id = static_cast<int64_t>(i);
    const GenerationResult& r = done[id];
    ASSERT_EQ(r.tokens.size(), 20u);
    if (i % 2 == 1) {
      EXPECT_TRUE(r.logprobs.empty());
      EXPECT_EQ(streamed.count(id), 0u);
      EXPECT_EQ(null_logprobs[id], 20);
      continue;
    }
    ASSERT_EQ(r.logprobs.size(), r.tokens.size());
    ASSERT_EQ(streamed[id].size(), r.tokens.size());
    for (size_t k = 0; k < r.tokens.size(); ++k) {
      const SampledToken& t = r.logprobs[k];
      EXPECT_EQ(t.token_id, r.tokens[k]);
      ASSERT_TRUE(t.has_logprobs);
      EXPECT_LE(t.logprob, 0.0f);
      ASSERT_EQ(t.top.size(), 3u);
      EXPECT_EQ(t.top[0].token_id, t.token_id);  // greedy
      EXPECT_EQ(t.top[0].logprob, t.logprob);
      EXPECT_GE(t.top[0].logprob, t.top[1].logprob);
      EXPECT_GE(t.top[1].logprob, t.top[2].logprob);
      EXPECT_EQ(streamed[id][k].logprob, t.logprob);
    }
  }
}

TEST(Scheduler, RequestsJoinWhileOthersRun) {
  Rig rig = MakeRig(64, 4, SchedulerOptions{});
  std::map<int64_t, GenerationResult> done;
  int64_t a = -1, b = -1;
  a = *rig.scheduler->Enqueue(Req({5, 17, 42, 9, 11}, 12), Collect(done, &a));
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(rig.scheduler->RunOnce().ok());
  EXPECT_EQ(rig.scheduler->running(), 1u);
  b = *rig.scheduler->Enqueue(Req({100, 7}, 12), Collect(done, &b));
  Drain(*rig.scheduler, done);
  ASSERT_EQ(done.size(), 2u);
  // Each equals its run alone.
  for (auto [id, prompt] : std::vector<std::pair<int64_t, std::vector<int32_t>>>{
           {a, {5, 17, 42, 9, 11}}, {b, {100, 7}}}) {
    Rig solo = MakeRig(64, 4, SchedulerOptions{});
    std::map<int64_t, GenerationResult> d;
    int64_t x = -1;
    x = *solo.scheduler->Enqueue(Req(prompt, 12), Collect(d, &x));
    Drain(*solo.scheduler, d);
    EXPECT_EQ(done[id].tokens, d[x].tokens);
  }
}

TEST(Scheduler, AdmissionControlAndCancellation) {
  SchedulerOptions o;
  o.queue_limit = 2;
  o.max_context = 32;
  Rig rig = MakeRig(64, 4, o);
  std::map<int64_t, GenerationResult> done;
  int64_t x = -1, y = -1;
  x = *rig.scheduler->Enqueue(Req({1, 2, 3}, 10), Collect(done, &x));
  y = *rig.scheduler->Enqueue(Req({4, 5, 6}, 10), Collect(done, &y));
  auto full = rig.scheduler->Enqueue(Req({7}, 10), {});
  EXPECT_EQ(full.status().code(), StatusCode::kResourceExhausted);
  auto too_long = rig.scheduler->Enqueue(Req(std::vector<int32_t>(30, 1), 10), {});
  EXPECT_EQ(too_long.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(too_long.status().message().find("maximum context of 32"), std::string::npos);
  auto bad_id = rig.scheduler->Enqueue(Req({1, 999999}, 1), {});
  EXPECT_NE(bad_id.status().message().find("position 1"), std::string::npos);
  ASSERT_TRUE(rig.scheduler->RunOnce().ok());
  rig.scheduler->Cancel(y);
  Drain(*rig.scheduler, done);
  EXPECT_EQ(done[x].finish_reason, FinishReason::kLength);
  EXPECT_EQ(done[x].tokens.size(), 10u);
  EXPECT_EQ(done[y].finish_reason, FinishReason::kCancelled);
  EXPECT_LT(done[y].tokens.size(), 10u);
  EXPECT_EQ(rig.allocator->num_free(), 64);
}

// EnqueueAll admits every request or none: with one place left in the queue,
// two requests are refused together, nothing joins the queue, and no callback
// runs (a refused API request must not take slots or count as cancelled).
TEST(Scheduler, EnqueueAllAdmitsEveryRequestOrNone) {
  SchedulerOptions o;
  o.queue_limit = 3;
  o.max_context = 32;
  Rig rig = MakeRig(64, 4, o);
  std::map<int64_t, GenerationResult> done;
  int64_t x = -1, y = -1;
  x = *rig.scheduler->Enqueue(Req({1, 2, 3}, 4), Collect(done, &x));
  int finished = 0;
  auto counting = [&finished] {
    RequestCallbacks cb;
    cb.on_finish = [&finished](const GenerationResult&) { ++finished; };
    return cb;
  };
  std::vector<GenerationRequest> three = {Req({4}, 2), Req({5}, 2), Req({6}, 2)};
  std::vector<RequestCallbacks> cbs;
  for (int i = 0; i < 3; ++i) cbs.push_back(counting());
  auto refused = rig.scheduler->EnqueueAll(three, std::move(cbs));
  ASSERT_EQ(refused.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(refused.status().message().find("room for 2 of 3"), std::string::npos)
      << refused.status().message();
  EXPECT_EQ(rig.scheduler->waiting(), 1u);
  // One invalid request refuses the whole set, naming it.
  std::vector<RequestCallbacks> cbs2;
  for (int i = 0; i < 2; ++i) cbs2.push_back(counting());
  auto invalid = rig.scheduler->EnqueueAll({Req({7}, 2), Req({1, 999999}, 2)}, std::move(cbs2));
  EXPECT_EQ(invalid.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(rig.scheduler->waiting(), 1u);
  // Two fit: both are admitted, in order.
  std::vector<RequestCallbacks> cbs3;
  for (int i = 0; i < 2; ++i) cbs3.push_back(counting());
  auto both = rig.scheduler->EnqueueAll({Req({8}, 2), Req({9}, 2)}, std::move(cbs3));
  ASSERT_TRUE(both.ok()) << both.status().ToString();
  ASSERT_EQ(both->size(), 2u);
  EXPECT_EQ((*both)[1], (*both)[0] + 1);
  y = (*both)[0];
  EXPECT_EQ(rig.scheduler->waiting(), 3u);
  Drain(*rig.scheduler, done);
  EXPECT_EQ(finished, 2);  // only the admitted pair; the refused ones never ran
  EXPECT_EQ(done[x].finish_reason, FinishReason::kLength);
  EXPECT_GE(y, 0);
  EXPECT_EQ(rig.allocator->num_free(), 64);
}

// Wraps an executor and fails every Collect after the first `ok_collects`,
// like a pipeline that lost a worker.
class BreakingExecutor : public StepExecutor {
 public:
  BreakingExecutor(StepExecutor* inner, int ok_collects) : inner_(inner), left_(ok_collects) {}
  Status Submit(const StepBatch& batch) override { return inner_->Submit(batch); }
  StatusOr<std::vector<SampledToken>> Collect() override {
    auto r = inner_->Collect();
    if (left_-- > 0) return r;
    return Unavailable("worker w-3 failed: missed heartbeats");
  }
  int max_in_flight() const override { return inner_->max_in_flight(); }
  int64_t vocab_size() const override { return inner_->vocab_size(); }

 private:
  StepExecutor* inner_;
  int left_;
};

std::vector<std::vector<int32_t>> Reference(int max_tokens) {
  Rig big = MakeRig(256, 4, SchedulerOptions{});
  std::map<int64_t, GenerationResult> done;
  std::vector<std::unique_ptr<int64_t>> ids;
  for (const auto& p : Prompts()) {
    ids.push_back(std::make_unique<int64_t>(-1));
    *ids.back() = *big.scheduler->Enqueue(Req(p, max_tokens), Collect(done, ids.back().get()));
  }
  Drain(*big.scheduler, done);
  std::vector<std::vector<int32_t>> want;
  for (size_t i = 0; i < ids.size(); ++i) want.push_back(done[static_cast<int64_t>(i)].tokens);
  return want;
}

// A re-plan: stop admitting, re-queue the running sequences mid-generation,
// move to a fresh executor (empty KV cache), resume. Every output equals the
// undisturbed run and every streamed token arrives exactly once.
TEST(Scheduler, RequeueOntoANewExecutorKeepsOutputsIdentical) {
  const auto want = Reference(20);
  Rig rig = MakeRig(256, 4, SchedulerOptions{});
  Rig next = MakeRig(256, 4, SchedulerOptions{});
  std::map<int64_t, GenerationResult> done;
  std::map<int64_t, std::vector<int32_t>> streamed;
  std::vector<std::unique_ptr<int64_t>> ids;
  for (const auto& p : Prompts()) {
    ids.push_back(std::make_unique<int64_t>(-1));
    RequestCallbacks cb = Collect(done, ids.back().get());
    int64_t* slot = ids.back().get();
    cb.on_token = [&streamed, slot](const std::string&, int32_t t, const SampledToken*) {
      if (t >= 0) streamed[*slot].push_back(t);
    };
    *ids.back() = *rig.scheduler->Enqueue(Req(p, 20), std::move(cb));
  }
  for (int i = 0; i < 6; ++i) ASSERT_TRUE(rig.scheduler->RunOnce().ok());
  rig.scheduler->set_admitting(false);
  ASSERT_TRUE(rig.scheduler->RunOnce().ok());
  ASSERT_TRUE(rig.scheduler->CollectInFlight().ok());
  EXPECT_EQ(rig.scheduler->in_flight(), 0u);
  const int moved = rig.scheduler->RequeueRunning();
  EXPECT_GT(moved, 0);
  EXPECT_EQ(rig.scheduler->running(), 0u);
  EXPECT_EQ(rig.allocator->num_free(), 256);
  EXPECT_EQ(rig.scheduler->stats().requeued, moved);
  rig.scheduler->SetExecutor(next.executor.get(), 2);
  rig.scheduler->set_admitting(true);
  Drain(*rig.scheduler, done);
  ASSERT_EQ(done.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(done[static_cast<int64_t>(i)].tokens, want[i]) << "request " << i;
    EXPECT_EQ(streamed[static_cast<int64_t>(i)], want[i]) << "request " << i;
    EXPECT_EQ(done[static_cast<int64_t>(i)].finish_reason, FinishReason::kLength);
  }
}

// requeue_on_executor_error: a failed step re-queues instead of failing the
// requests; after the executor is replaced they finish identically.
TEST(Scheduler, ExecutorErrorRequeuesWhenAsked) {
  const auto want = Reference(16);
  SchedulerOptions o;
  o.requeue_on_executor_error = true;
  Rig rig = MakeRig(256, 4, o);
  Rig next = MakeRig(256, 4, SchedulerOptions{});
  BreakingExecutor breaking(rig.executor.get(), 5);
  rig.scheduler->SetExecutor(&breaking, 2);
  std::map<int64_t, GenerationResult> done;
  std::vector<std::unique_ptr<int64_t>> ids;
  for (const auto& p : Prompts()) {
    ids.push_back(std::make_unique<int64_t>(-1));
    *ids.back() = *rig.scheduler->Enqueue(Req(p, 16), Collect(done, ids.back().get()));
  }
  Status failed;
  for (int i = 0; i < 50 && failed.ok(); ++i) {
    auto r = rig.scheduler->RunOnce();
    if (!r.ok()) failed = r.status();
  }
  EXPECT_EQ(failed.code(), StatusCode::kUnavailable);
  EXPECT_TRUE(done.empty());  // nothing failed back to the client
  EXPECT_EQ(rig.scheduler->running(), 0u);
  EXPECT_EQ(rig.scheduler->waiting(), Prompts().size());
  rig.scheduler->SetExecutor(next.executor.get(), 3);
  Drain(*rig.scheduler, done);
  ASSERT_EQ(done.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_EQ(done[static_cast<int64_t>(i)].tokens, want[i]) << "request " << i;
}

}  // namespace
}  // namespace tessera

namespace tessera {
namespace {

// Wraps an executor and turns the token sampled for `seq_id` into
// kNonFiniteLogitsToken from its `from`-th sampled token on, as a sampling
// rank does when that sequence's logits hold NaN or inf.
class NonFiniteExecutor : public StepExecutor {
 public:
  NonFiniteExecutor(StepExecutor* inner, int64_t seq_id, int from)
      : inner_(inner), seq_id_(seq_id), left_(from) {}
  Status Submit(const StepBatch& batch) override {
    std::vector<int64_t> ids;
    for (const SeqStep& s : batch.seqs)
      if (s.want_logits) ids.push_back(s.seq_id);
    submitted_.push_back(std::move(ids));
    return inner_->Submit(batch);
  }
  StatusOr<std::vector<SampledToken>> Collect() override {
    auto r = inner_->Collect();
    if (!r.ok()) return r;
    const std::vector<int64_t> ids = std::move(submitted_.front());
    submitted_.pop_front();
    for (size_t i = 0; i < ids.size() && i < r->size(); ++i)
      if (ids[i] == seq_id_ && left_-- <= 0) (*r)[i] = NonFinite();
    return r;
  }
  int max_in_flight() const override { return inner_->max_in_flight(); }
  int64_t vocab_size() const override { return inner_->vocab_size(); }

 private:
  static SampledToken NonFinite() {
    SampledToken t;
    t.token_id = kNonFiniteLogitsToken;
    return t;
  }
  StepExecutor* inner_;
  int64_t seq_id_;
  int left_;
  std::deque<std::vector<int64_t>> submitted_;
};

// Non-finite logits fail that sequence alone, with kDataLoss naming the
// cause, after the tokens it had; the other sequences of the same batches
// finish exactly as without it, and its KV blocks are freed.
TEST(Scheduler, NonFiniteLogitsFailOnlyThatSequence) {
  const auto want = Reference(20);
  Rig rig = MakeRig(256, 4, SchedulerOptions{});
  NonFiniteExecutor poisoned(rig.executor.get(), 2, 3);
  rig.scheduler->SetExecutor(&poisoned, 2);
  std::map<int64_t, GenerationResult> done;
  std::vector<std::unique_ptr<int64_t>> ids;
  for (const auto& p : Prompts()) {
    ids.push_back(std::make_unique<int64_t>(-1));
    *ids.back() = *rig.scheduler->Enqueue(Req(p, 20), Collect(done, ids.back().get()));
  }
  Drain(*rig.scheduler, done);
  ASSERT_EQ(done.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    SCOPED_TRACE(i);
    const GenerationResult& r = done[static_cast<int64_t>(i)];
    if (i == 2) {
      EXPECT_EQ(r.finish_reason, FinishReason::kError);
      EXPECT_EQ(r.error.code(), StatusCode::kDataLoss);
      EXPECT_NE(r.error.message().find("non-finite logits (NaN or inf)"), std::string::npos)
          << r.error.ToString();
      EXPECT_EQ(r.tokens, std::vector<int32_t>(want[i].begin(), want[i].begin() + 3));
    } else {
      EXPECT_EQ(r.finish_reason, FinishReason::kLength);
      EXPECT_EQ(r.tokens, want[i]);
    }
  }
  EXPECT_EQ(rig.allocator->num_free(), 256);
}

// Two schedulers sharing one OutputProcessor (the coordinator's replicas):
// requests started on one, re-queued mid-generation and moved to the other
// (TakeWaiting / AdoptWaiting) finish there with exactly the tokens of an
// undisturbed run, each token reaching on_token once, and ids unique over
// both schedulers.
TEST(Scheduler, WaitingRequestsMoveBetweenSchedulersSharingAnOutputProcessor) {
  std::vector<std::vector<int32_t>> want;
  {
    Rig ref = MakeRig(256, 4, SchedulerOptions{});
    std::map<int64_t, GenerationResult> done;
    std::vector<std::unique_ptr<int64_t>> ids;
    for (const auto& p : Prompts()) {
      ids.push_back(std::make_unique<int64_t>(-1));
      *ids.back() = *ref.scheduler->Enqueue(Req(p, 20), Collect(done, ids.back().get()));
    }
    Drain(*ref.scheduler, done);
    for (const auto& id : ids) want.push_back(done[*id].tokens);
  }
  SchedulerOptions o;
  o.output = std::make_shared<OutputProcessor>(nullptr);
  Rig a = MakeRig(256, 4, o);
  Rig b = MakeRig(256, 4, o);
  std::map<int64_t, GenerationResult> done;
  std::map<int64_t, int> streamed;  // on_token calls per request
  std::vector<std::unique_ptr<int64_t>> ids;
  for (const auto& p : Prompts()) {
    ids.push_back(std::make_unique<int64_t>(-1));
    RequestCallbacks cb = Collect(done, ids.back().get());
    int64_t* slot = ids.back().get();
    cb.on_token = [&streamed, slot](const std::string&, int32_t token, const SampledToken*) {
      if (token >= 0) ++streamed[*slot];
    };
    *ids.back() = *a.scheduler->Enqueue(Req(p, 20), std::move(cb));
  }
  // An id drawn on the other scheduler does not collide.
  int64_t other = -1;
  other = *b.scheduler->Enqueue(Req({1, 2, 3}, 2), Collect(done, &other));
  for (const auto& id : ids) EXPECT_NE(*id, other);
  Drain(*b.scheduler, done);
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(a.scheduler->RunOnce().ok());
  ASSERT_TRUE(a.scheduler->CollectInFlight().ok());
  EXPECT_GT(a.scheduler->RequeueRunning(), 0);
  std::vector<Scheduler::Migrant> moved = a.scheduler->TakeWaiting();
  ASSERT_EQ(moved.size(), Prompts().size());
  EXPECT_EQ(a.scheduler->waiting(), 0u);
  // A scheduler with its own processor refuses them and leaves them intact.
  Rig alone = MakeRig(256, 4, SchedulerOptions{});
  EXPECT_EQ(alone.scheduler->AdoptWaiting(&moved).code(), StatusCode::kFailedPrecondition);
  ASSERT_EQ(moved.size(), Prompts().size());
  ASSERT_TRUE(b.scheduler->AdoptWaiting(&moved).ok());
  EXPECT_TRUE(moved.empty());
  Drain(*b.scheduler, done);
  b.scheduler->WaitForOutput();
  for (size_t i = 0; i < ids.size(); ++i) {
    EXPECT_EQ(done[*ids[i]].tokens, want[i]) << "request " << i;
    EXPECT_EQ(streamed[*ids[i]], 20) << "request " << i;
  }
  EXPECT_EQ(a.scheduler->running(), 0u);
}

}  // namespace
}  // namespace tessera
