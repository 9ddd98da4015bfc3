// ServingLoop on the real CPU model (fixture llama_gqa_f32): requests
// submitted to an idle loop finish, a cancellation ends a request, a pause
// re-queues the running sequences and a swap + resume finishes them on a new
// executor with the same tokens, a broken executor ends a drain at once, and
// the commands answer false once the loop stopped.
#include "coordinator/serving/serving_loop.h"

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

#include "support/test_util.h"
#include "worker/exec/local_executor.h"
#include "worker/model/model_loader.h"

namespace tessera {
namespace {

constexpr int64_t kBlocks = 256;
constexpr int64_t kBlockSize = 4;

std::shared_ptr<LocalExecutor> MakeExecutor(ModelConfig* config) {
  const std::string dir = ::tessera::testing::FixturePath("models/llama_gqa_f32");
  auto par = ParallelConfig::Make(*LoadModelConfig(dir), 1, 1);
  auto loaded = LoadModel(dir, *par, 0, nullptr);
  TESSERA_CHECK(loaded.ok());
  if (config) *config = loaded->config;
  const StageLayout lay = loaded->model->layout();
  auto cache = std::make_unique<KvCache>(lay.num_layers(), kBlocks, kBlockSize, lay.kv_heads_local,
                                         loaded->config.head_dim);
  return std::make_shared<LocalExecutor>(std::move(loaded->model), std::move(cache));
}

// A real LocalExecutor whose Collect the test can hold (`Hold`, then one
// `Grant` per step) or break (the steps in flight and later fail, as a lost
// worker fails a RemoteExecutor's).
class GatedExecutor : public StepExecutor {
 public:
  explicit GatedExecutor(std::shared_ptr<LocalExecutor> inner) : inner_(std::move(inner)) {}

  Status Submit(const StepBatch& batch) override { return inner_->Submit(batch); }
  StatusOr<std::vector<SampledToken>> Collect() override {
    {
      std::unique_lock<std::mutex> lock(mu_);
      ++blocked_;
      cv_.notify_all();
      cv_.wait(lock, [&] { return !held_ || permits_ > 0 || broken_; });
      --blocked_;
      if (broken_) {
        (void)inner_->Collect();  // the step ran; its tokens are lost
        return Unavailable("worker lost");
      }
      if (held_) --permits_;
    }
    return inner_->Collect();
  }
  int max_in_flight() const override { return inner_->max_in_flight(); }
  int64_t vocab_size() const override { return inner_->vocab_size(); }

  Status health() const {
    std::lock_guard<std::mutex> lock(mu_);
    return broken_ ? Unavailable("worker lost") : Status::Ok();
  }
  void Hold() {
    std::lock_guard<std::mutex> lock(mu_);
    held_ = true;
    permits_ = 0;
  }
  void Break() {
    std::lock_guard<std::mutex> lock(mu_);
    broken_ = true;
    cv_.notify_all();
  }
  void Grant() {
    std::lock_guard<std::mutex> lock(mu_);
    ++permits_;
    cv_.notify_all();
  }
  // Waits until a Collect is held, or `done()` (checked under the lock; a
  // caller's flag set with Notify).
  bool WaitHeldOr(const std::function<bool()>& done) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(60),
                        [&] { return done() || (blocked_ > 0 && permits_ == 0); });
  }
  void Notify() {
    std::lock_guard<std::mutex> lock(mu_);
    cv_.notify_all();
  }
  std::mutex& mu() { return mu_; }

 private:
  std::shared_ptr<LocalExecutor> inner_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool held_ = false;
  int permits_ = 0;
  int blocked_ = 0;  // Collect calls waiting
  bool broken_ = false;
};

ServingLoop::Health Healthy() {
  return [] { return Status::Ok(); };
}

GenerationRequest Req(std::vector<int32_t> prompt, int max_tokens) {
  GenerationRequest g;
  g.prompt_ids = std::move(prompt);
  g.max_tokens = max_tokens;
  g.ignore_eos = true;
  return g;
}

// What one request's callbacks saw (they run on the loop thread).
struct Outcome {
  std::mutex mu;
  std::condition_variable cv;
  int tokens = 0;  // on_token calls with a token
  bool finished = false;
  GenerationResult result;

  RequestCallbacks Callbacks() {
    RequestCallbacks cb;
    cb.on_token = [this](const std::string&, int32_t token, const SampledToken*) {
      std::lock_guard<std::mutex> lock(mu);
      if (token >= 0) ++tokens;
      cv.notify_all();
    };
    cb.on_finish = [this](const GenerationResult& r) {
      std::lock_guard<std::mutex> lock(mu);
      result = r;
      finished = true;
      cv.notify_all();
    };
    return cb;
  }
  bool WaitTokens(int n) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, std::chrono::seconds(60), [&] { return tokens >= n || finished; });
  }
  bool WaitFinished() {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, std::chrono::seconds(60), [&] { return finished; });
  }
};

struct Rig {
  ModelConfig config;
  MetricsRegistry metrics;
  std::unique_ptr<ServingLoop> loop;
  std::atomic<int> step_failures{0};

  std::shared_ptr<GatedExecutor> gate;

  Rig() {
    TESSERA_CHECK(metrics.FromCatalog("coordinator").ok());
    gate = std::make_shared<GatedExecutor>(MakeExecutor(&config));
    SchedulerOptions o;
    o.max_context = config.max_position_embeddings;
    o.requeue_on_executor_error = true;  // as the coordinator runs it
    loop = std::make_unique<ServingLoop>(config, nullptr, kBlockSize, o, &metrics,
                                         [this](const Status&) { ++step_failures; });
    loop->Start(
        gate, [g = gate.get()] { return g->health(); }, kBlocks, 1);
  }
};

// The tokens of `prompt` run alone to the end on a fresh loop.
std::vector<int32_t> Reference(const std::vector<int32_t>& prompt, int max_tokens) {
  Outcome out;  // outlives the loop: its last callbacks run at Stop
  Rig rig;
  std::vector<GenerationRequest> reqs;
  reqs.push_back(Req(prompt, max_tokens));
  std::vector<RequestCallbacks> cbs;
  cbs.push_back(out.Callbacks());
  EXPECT_TRUE(rig.loop->Submit(std::move(reqs), std::move(cbs)).ok());
  EXPECT_TRUE(out.WaitFinished());
  return out.result.tokens;
}

TEST(ServingLoop, SubmitBeforeStartIsUnavailable) {
  ModelConfig config;
  MetricsRegistry metrics;
  ServingLoop loop(config, nullptr, kBlockSize, SchedulerOptions{}, &metrics, nullptr);
  std::vector<GenerationRequest> reqs;
  reqs.push_back(Req({1, 2, 3}, 4));
  std::vector<RequestCallbacks> cbs(1);
  auto ids = loop.Submit(std::move(reqs), std::move(cbs));
  ASSERT_FALSE(ids.ok());
  EXPECT_EQ(ids.status().code(), StatusCode::kUnavailable);
  EXPECT_FALSE(loop.Pause(0).has_value());
  EXPECT_FALSE(loop.Resume());
}

TEST(ServingLoop, RequestsSubmittedToAnIdleLoopFinish) {
  Rig rig;
  // Two rounds: the second arrives while the loop sleeps (nothing to do).
  for (int round = 0; round < 2; ++round) {
    Outcome a, b;
    std::vector<GenerationRequest> reqs;
    reqs.push_back(Req({5, 17, 42, 9, 11}, 8));
    reqs.push_back(Req({100, 7}, 5));
    std::vector<RequestCallbacks> cbs;
    cbs.push_back(a.Callbacks());
    cbs.push_back(b.Callbacks());
    auto ids = rig.loop->Submit(std::move(reqs), std::move(cbs));
    ASSERT_TRUE(ids.ok()) << ids.status().ToString();
    ASSERT_EQ(ids->size(), 2u);
    ASSERT_TRUE(a.WaitFinished());
    ASSERT_TRUE(b.WaitFinished());
    EXPECT_EQ(a.result.finish_reason, FinishReason::kLength);
    EXPECT_EQ(a.result.tokens.size(), 8u);
    EXPECT_EQ(b.result.tokens.size(), 5u);
  }
  // (running() drops to 0 at the loop's next iteration, after the last
  // on_finish; waiting() is exact.)
  EXPECT_EQ(rig.loop->waiting(), 0u);
  EXPECT_EQ(rig.step_failures.load(), 0);
}

TEST(ServingLoop, CancelEndsARunningRequest) {
  Outcome out;  // outlives the loop: its last callbacks run at Stop
  Rig rig;
  std::vector<GenerationRequest> reqs;
  reqs.push_back(Req({3, 3, 3, 3}, 100));
  std::vector<RequestCallbacks> cbs;
  cbs.push_back(out.Callbacks());
  auto ids = rig.loop->Submit(std::move(reqs), std::move(cbs));
  ASSERT_TRUE(ids.ok());
  ASSERT_TRUE(out.WaitTokens(2));
  rig.loop->Cancel(*ids);
  ASSERT_TRUE(out.WaitFinished());
  EXPECT_EQ(out.result.finish_reason, FinishReason::kCancelled);
  EXPECT_LT(out.result.tokens.size(), 100u);
}

// Pauses `rig`'s loop while its one sequence runs: holds the executor, posts
// Pause(drain_seconds) from another thread, and lets one step through at a
// time until the loop took the command. Returns Pause's answer.
std::optional<int> PauseWhileRunning(Rig& rig, double drain_seconds) {
  rig.gate->Hold();
  EXPECT_TRUE(rig.gate->WaitHeldOr([] { return false; }));
  std::optional<int> requeued;
  bool done = false;
  std::thread pauser([&] {
    std::optional<int> r = rig.loop->Pause(drain_seconds);
    {
      std::lock_guard<std::mutex> lock(rig.gate->mu());
      requeued = r;
      done = true;
    }
    rig.gate->Notify();
  });
  // The loop is held in a step: let it go on only once the command is
  // posted (the pauser thread may start late on a busy machine; steps
  // granted before would run the sequence on, and the last grant would come
  // before the command, leaving the loop held forever).
  const auto t0 = std::chrono::steady_clock::now();
  while (rig.loop->pending_commands() == 0 &&
         std::chrono::steady_clock::now() - t0 < std::chrono::seconds(60))
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_GT(rig.loop->pending_commands(), 0u);
  for (int step = 0; step < 50; ++step) {
    rig.gate->Notify();
    if (rig.gate->WaitHeldOr([&] { return done; }) && done) break;
    rig.gate->Grant();  // one more step, then the loop looks at its commands
  }
  rig.gate->Notify();
  pauser.join();
  EXPECT_TRUE(done);
  return requeued;
}

TEST(ServingLoop, PauseRequeuesAndSwapResumeFinishesWithTheSameTokens) {
  const std::vector<int32_t> prompt = {250, 251, 252};
  const int max_tokens = 60;
  const std::vector<int32_t> want = Reference(prompt, max_tokens);
  ASSERT_EQ(want.size(), static_cast<size_t>(max_tokens));

  Outcome out;  // outlives the loop: its last callbacks run at Stop
  Rig rig;
  std::vector<GenerationRequest> reqs;
  reqs.push_back(Req(prompt, max_tokens));
  std::vector<RequestCallbacks> cbs;
  cbs.push_back(out.Callbacks());
  ASSERT_TRUE(rig.loop->Submit(std::move(reqs), std::move(cbs)).ok());
  ASSERT_TRUE(out.WaitTokens(3));
  // No drain time: the running sequence is re-queued at once.
  std::optional<int> requeued = PauseWhileRunning(rig, 0.0);
  ASSERT_TRUE(requeued.has_value());
  {
    std::lock_guard<std::mutex> lock(out.mu);
    ASSERT_FALSE(out.finished);
  }
  EXPECT_EQ(*requeued, 1);
  EXPECT_EQ(rig.loop->running(), 0u);
  EXPECT_EQ(rig.loop->waiting(), 1u);
  // A new executor (a new plan) with an empty KV cache: the sequence resumes
  // by recomputing prompt + generated tokens.
  ASSERT_TRUE(rig.loop->SwapExecutor(MakeExecutor(nullptr), Healthy(), 2));
  ASSERT_TRUE(rig.loop->Resume());
  ASSERT_TRUE(out.WaitFinished());
  EXPECT_EQ(out.result.finish_reason, FinishReason::kLength);
  EXPECT_EQ(out.result.tokens, want);
  // The next pause counts only what was re-queued since this one.
  requeued = rig.loop->Pause(0.0);
  ASSERT_TRUE(requeued.has_value());
  EXPECT_EQ(*requeued, 0);
  EXPECT_TRUE(rig.loop->Resume());
  EXPECT_EQ(rig.step_failures.load(), 0);
}

TEST(ServingLoop, AFailedStepReportsAndABrokenExecutorEndsTheDrainAtOnce) {
  Outcome out;  // outlives the loop: its last callbacks run at Stop
  Rig rig;
  std::vector<GenerationRequest> reqs;
  reqs.push_back(Req({77, 78, 79, 80}, 100));
  std::vector<RequestCallbacks> cbs;
  cbs.push_back(out.Callbacks());
  ASSERT_TRUE(rig.loop->Submit(std::move(reqs), std::move(cbs)).ok());
  ASSERT_TRUE(out.WaitTokens(2));
  rig.gate->Hold();
  ASSERT_TRUE(rig.gate->WaitHeldOr([] { return false; }));
  rig.gate->Break();  // the held step fails: the loop reports it and waits
  // An hour to drain, but the executor is broken: the pause does not wait.
  const auto t0 = std::chrono::steady_clock::now();
  std::optional<int> requeued = rig.loop->Pause(3600.0);
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(requeued.has_value());
  EXPECT_LT(waited, 60.0);
  // By the executor error (again for each step the loop retried in the
  // second it waits for the pause).
  EXPECT_GE(*requeued, 1);
  EXPECT_GE(rig.step_failures.load(), 1);
  EXPECT_EQ(rig.loop->running(), 0u);
  EXPECT_EQ(rig.loop->waiting(), 1u);
  std::lock_guard<std::mutex> lock(out.mu);
  EXPECT_FALSE(out.finished);
}

TEST(ServingLoop, CommandsAfterStopAnswerFalse) {
  Rig rig;
  rig.loop->Stop();
  EXPECT_FALSE(rig.loop->Pause(0.0).has_value());
  EXPECT_FALSE(rig.loop->Resume());
  EXPECT_FALSE(rig.loop->SwapExecutor(MakeExecutor(nullptr), Healthy(), 2));
}

}  // namespace
}  // namespace tessera
