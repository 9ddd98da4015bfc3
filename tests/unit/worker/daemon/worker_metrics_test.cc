// The worker's stage accounting (busy/idle, bubble ratio), step phases, and
// WorkerMetrics' series over a real registry.
#include "worker/daemon/worker_metrics.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "common/metrics/metric_catalog.h"

namespace tessera {
namespace {

SeqStep Seq(int64_t id, int32_t start_pos, int32_t num_tokens, int32_t prompt_len) {
  SeqStep s;
  s.seq_id = id;
  s.start_pos = start_pos;
  s.num_tokens = num_tokens;
  s.prompt_len = prompt_len;
  return s;
}

// Seconds since `t0` on the clock StageClock reads.
double Since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The periods are bracketed by readings taken just before and just after each state change,
// so the bounds hold however long a loaded machine takes to wake a sleeping thread (the
// sleeps only make the periods long enough to tell apart).
TEST(StageClock, SplitsTimeIntoBusyAndIdleAndReportsTheIdleShare) {
  Counter busy, idle;
  Gauge bubble;
  StageClock clock(busy, idle, bubble, /*window_seconds=*/3600);
  const auto before_idle = std::chrono::steady_clock::now();
  clock.Idle();
  const auto after_idle = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  const auto before_busy = std::chrono::steady_clock::now();
  clock.Busy();
  const auto after_busy = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const double busy_min = Since(after_busy);
  clock.Flush();  // the busy period so far is accounted without a state change
  const double busy_max = Since(before_busy);
  const auto after_flush = std::chrono::steady_clock::now();
  const double idle_min = std::chrono::duration<double>(before_busy - after_idle).count();
  const double idle_max = std::chrono::duration<double>(after_busy - before_idle).count();
  EXPECT_GE(idle.value(), idle_min);
  EXPECT_LE(idle.value(), idle_max);
  EXPECT_GE(busy.value(), busy_min);
  EXPECT_LE(busy.value(), busy_max);
  EXPECT_NEAR(bubble.value(), idle.value() / (idle.value() + busy.value()), 1e-9);
  const double idle_before = idle.value(), busy_before = busy.value();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const double more_busy = Since(after_flush);  // busy at least this much since Flush
  clock.Idle();
  EXPECT_EQ(idle.value(), idle_before) << "busy time does not go to idle";
  EXPECT_GE(busy.value(), busy_before + more_busy);
}

TEST(StageClock, StartsANewWindowAfterWindowSeconds) {
  Counter busy, idle;
  Gauge bubble;
  StageClock clock(busy, idle, bubble, /*window_seconds=*/0.1);
  const auto before_idle = std::chrono::steady_clock::now();
  clock.Idle();
  std::this_thread::sleep_for(std::chrono::milliseconds(120));
  clock.Busy();  // closes a window that was all idle
  EXPECT_EQ(bubble.value(), 1.0);
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  clock.Idle();  // every window since is all busy
  EXPECT_EQ(bubble.value(), 0.0);
  EXPECT_LE(idle.value() + busy.value(), Since(before_idle)) << "the counters keep everything";
  EXPECT_GE(idle.value() + busy.value(), 0.15) << "the counters keep everything";
}

TEST(StepPhase, PrefillWhenTheBatchHoldsPromptTokens) {
  StepBatch decode;
  decode.seqs.push_back(Seq(1, 7, 1, 4));
  decode.seqs.push_back(Seq(2, 4, 1, 4));
  EXPECT_STREQ(StepPhase(decode), "decode");
  StepBatch mixed = decode;
  mixed.seqs.push_back(Seq(3, 0, 5, 5));
  EXPECT_STREQ(StepPhase(mixed), "prefill");
  StepBatch last_prompt_token;  // a chunked prefill's final one-token chunk
  last_prompt_token.seqs.push_back(Seq(4, 8, 1, 9));
  EXPECT_STREQ(StepPhase(last_prompt_token), "prefill");
}

TEST(WorkerMetrics, ExportsTheRankSeriesOnceAssigned) {
  MetricsRegistry reg;
  auto m = WorkerMetrics::Create(&reg, "host-a", 3, nullptr);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  (*m)->SetWorker("worker-7", "0.1.0");
  std::string text = reg.Render();
  EXPECT_NE(
      text.find("tessera_worker_info{node=\"host-a\",gpu=\"3\",uuid=\"cpu\",worker_id=\"worker-7\","
                "device_kind=\"cpu\",version=\"0.1.0\"} 1"),
      std::string::npos)
      << text;
  EXPECT_EQ(text.find("tessera_gpu_memory_used_bytes{"), std::string::npos) << "no rank yet";
  (*m)->SetRank(2, 1, 0, 5);  // replica 2, stage 1, tp rank 0, plan 5
  (*m)->OnLoadProgress(50, 100);
  (*m)->OnLoaded(1000, 2000, 0.5, 300);
  StepBatch b;
  b.token_ids = {1, 2, 3};
  b.seqs.push_back(Seq(1, 0, 3, 3));
  (*m)->ObserveStep(b, 0.002);
  text = reg.Render();
  const std::string rank =
      "replica=\"2\",node=\"host-a\",gpu=\"3\",uuid=\"cpu\",stage=\"1\",tp_rank=\"0\"";
  const std::string l = "{" + rank + "}";
  for (const std::string& want : std::vector<std::string>{
           "tessera_gpu_weight_bytes" + l + " 1000",
           "tessera_gpu_weight_quantized_bytes" + l + " 300",
           "tessera_gpu_kv_cache_capacity_bytes" + l + " 2000",
           "tessera_worker_load_bytes" + l + " 50", "tessera_worker_load_total_bytes" + l + " 100",
           "tessera_worker_load_seconds" + l + " 0.5", "tessera_worker_plan_version" + l + " 5",
           "tessera_step_tokens_total{" + rank + ",phase=\"prefill\"} 3",
           "tessera_step_duration_seconds_count{" + rank + ",phase=\"decode\"} 0",
           "tessera_stage_busy_seconds_total" + l + " 0"})
    EXPECT_NE(text.find(want + "\n"), std::string::npos) << want << "\n" << text;
  // A CPU rank's memory is its resident set: more than its weights here.
  const size_t at = text.find("tessera_gpu_memory_used_bytes" + l + " ");
  ASSERT_NE(at, std::string::npos) << text;
  EXPECT_GT(std::stod(text.substr(at + l.size() + 30)), 1e6);
}

}  // namespace
}  // namespace tessera
