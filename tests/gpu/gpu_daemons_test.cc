// GPU tests (tessera_gpu_test, tests/gpu/gpu_test_util.h): the coordinator and GPU workers as real
// processes: completions against the single-process engine, plan changes and worker loss.
#include <memory>

#include "gpu/gpu_test_util.h"
#include "support/daemon_cluster.h"

namespace tessera {
namespace {

// ---------------------------------------------------------------------------
// The daemons on GPUs: tessera-coordinator and tessera-worker processes (one
// per GPU, NCCL for tp) answer a greedy completion with exactly the tokens
// of the single-process engine on the same GPU in the same dtype; a dense
// model, and a mixture of experts (whole experts per rank with
// parallel.expert_parallel, the grouped expert kernels on each GPU).

std::string SelfDir() {
  char exe[4096];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  TESSERA_CHECK(n > 0);
  exe[n] = '\0';
  return fs::path(exe).parent_path().string();
}

// The options of both tests: `model` in `dtype` on tp * pp CUDA workers
// (worker i on GPU i), run from beside this program (the GPU bundle).
testing::DaemonClusterOptions GpuOptions(const std::string& prefix, const std::string& model,
                                         const std::string& dtype, int tp, int pp,
                                         bool expert_parallel = false) {
  testing::DaemonClusterOptions o;
  o.temp_prefix = prefix;
  o.bin_dir = SelfDir();
  o.model_path = model;
  o.model_toml = "name = \"m\"\ndtype = \"" + dtype + "\"\nchat_template = \"chatml\"\n";
  o.parallel_toml = "tp = " + std::to_string(tp) + "\npp = " + std::to_string(pp) + "\n" +
                    (expert_parallel ? "expert_parallel = true\n" : "");
  o.admin_toml = "port = 0\n";
  o.heartbeat_toml = "";
  o.kv_cache_toml = "max_blocks = 512\nblock_size = 16\n";
  o.scheduler_toml = "max_context = 128\n";
  o.extra_toml = "[worker]\nbackend = \"cuda\"\n";
  o.workers = tp * pp;
  o.workers_read_config = true;
  o.worker_timeout_seconds = 20;
  o.ready_timeout_seconds = 90;
  return o;
}

// Starts a coordinator and tp * pp workers serving `model`
// in `dtype` ("float32", "bfloat16"), sends each prompt as a greedy
// completion of `n` tokens, and returns the completion texts. Logs of a
// failed start are printed.
std::vector<std::string> DaemonCompletions(const std::string& model, const std::string& dtype,
                                           int tp, int pp, bool expert_parallel,
                                           const std::vector<std::vector<int32_t>>& prompts,
                                           int n) {
  testing::DaemonCluster cluster(
      GpuOptions("tessera-gpu-daemons", model, dtype, tp, pp, expert_parallel));
  const Status started = cluster.Start();
  const bool ready = started.ok();
  const int port = cluster.api_port();
  std::vector<std::string> texts;
  if (ready) {
    for (const auto& p : prompts) {
      json req = {{"model", "m"},
                  {"prompt", p},
                  {"max_tokens", n},
                  {"temperature", 0},
                  {"ignore_eos", true}};
      auto r = HttpCall(port, "POST", "/v1/completions", req.dump());
      if (r.status != 200) {
        ADD_FAILURE() << "completion: HTTP " << r.status << " " << r.body;
        break;
      }
      texts.push_back(json::parse(r.body)["choices"][0]["text"].get<std::string>());
    }
  } else {
    ADD_FAILURE() << "daemons not ready within 90 s: " << started.ToString();
  }
  cluster.Stop();
  if (ready && texts.size() != prompts.size()) {
    for (const char* log : {"coordinator", "worker0", "worker1"})
      std::printf("---- %s.log\n%s\n", log, cluster.Log(std::string(log) + ".log").c_str());
  } else if (ready) {
    // Which backend the workers ran on, as they logged it.
    const std::string w0 = cluster.WorkerLog(0);
    const size_t at = w0.find(" loaded layers");
    if (at != std::string::npos)
      std::printf("  worker0:%s\n", w0.substr(at, w0.find('\n', at) - at).c_str());
  }
  return texts;
}

TEST(Daemons, GreedyCompletionOnGpusEqualsSingleProcessEngine) {
  struct Case {
    std::string model, dtype;
    DType dt;
    int tp, pp;
    bool ep = false;
  };
  const std::string fixture = g_fixtures + "/models/llama_gqa_f32";
  const std::string moe = g_fixtures + "/models/mixtral_moe_top3";
  std::vector<Case> cases = {{fixture, "float32", DType::kF32, 1, 1},
                             {moe, "float32", DType::kF32, 1, 1}};
  if (g_devices >= 2) {
    cases.push_back({fixture, "float32", DType::kF32, 2, 1});
    cases.push_back({fixture, "float32", DType::kF32, 1, 2});
    // 5 experts over 2 ranks: [0, 3) and [3, 5).
    cases.push_back({moe, "float32", DType::kF32, 2, 1, true});
  }
  for (const Case& c : cases) {
    auto local = testing::LocalModel::Load(c.model, 512, 16, &Gpu(c.dt));
    ASSERT_TRUE(local.ok()) << local.status().ToString();
    auto tok = Tokenizer::Load(c.model);
    ASSERT_TRUE(tok.ok()) << tok.status().ToString();
    std::mt19937 rng(11);
    std::vector<std::vector<int32_t>> prompts;
    for (int len : {5, 33}) {
      std::vector<int32_t> p(static_cast<size_t>(len));
      for (int32_t& t : p) t = static_cast<int32_t>(rng() % 200 + 3);
      prompts.push_back(p);
    }
    auto want = (*local)->Greedy(prompts, 16);  // one batch, EOS ignored
    ASSERT_TRUE(want.ok()) << want.status().ToString();
    const auto got = DaemonCompletions(c.model, c.dtype, c.tp, c.pp, c.ep, prompts, 16);
    ASSERT_EQ(got.size(), prompts.size()) << c.model << " tp=" << c.tp << " pp=" << c.pp;
    for (size_t i = 0; i < prompts.size(); ++i)
      EXPECT_EQ(got[i], (*tok)->Decode((*want)[i], true))
          << fs::path(c.model).filename() << " " << c.dtype << " tp=" << c.tp << " pp=" << c.pp
          << " prompt " << i;
    std::printf("  daemons %-24s %-8s tp=%d pp=%d%s: %zu greedy completions %s the engine's\n",
                fs::path(c.model).filename().c_str(), c.dtype.c_str(), c.tp, c.pp,
                c.ep ? " ep" : "", prompts.size(),
                ::testing::Test::HasFailure() ? "vs" : "equal to");
  }
}

// ---------------------------------------------------------------------------
// Plans changing on GPUs: two CUDA workers serve tp=2; POST /admin/plan moves
// them to tp=1 x pp=2 and back (weights held in device memory are reused
// where the slice is the same); then one worker is SIGSTOPped with a request
// in flight and killed: the coordinator detects it, re-plans onto the other
// GPU (the stuck NCCL all-reduce is aborted by the worker's watchdog), and the
// request completes with the engine's tokens.

struct GpuCluster {
  std::unique_ptr<testing::DaemonCluster> cluster;
  int port = 0;
  json Get(const std::string& path) const {
    auto r = HttpCall(port, "GET", path);
    return r.status == 200 ? json::parse(r.body, nullptr, false) : json();
  }
  bool WaitReady(double seconds) const { return cluster->WaitReady(seconds).ok(); }
  StatusOr<std::string> Complete(const std::vector<int32_t>& prompt, int n) const {
    json req = {{"model", "m"},
                {"prompt", prompt},
                {"max_tokens", n},
                {"temperature", 0},
                {"ignore_eos", true}};
    auto r = HttpCall(port, "POST", "/v1/completions", req.dump());
    if (r.status != 200)
      return Internal("completion: HTTP " + std::to_string(r.status) + " " + r.body);
    return json::parse(r.body)["choices"][0]["text"].get<std::string>();
  }
  void PrintLogs() const {
    for (const char* log : {"coordinator", "worker0", "worker1"})
      std::printf("---- %s.log (tail)\n%s\n", log,
                  Tail(cluster->Log(std::string(log) + ".log"), 4000).c_str());
  }
  static std::string Tail(const std::string& s, size_t n) {
    return s.size() > n ? s.substr(s.size() - n) : s;
  }
};

void PrintPlanChange(const char* what, const json& r) {
  std::printf(
      "  %s: plan %d %s; detect %.2f s, drain %.2f s, re-plan and load %.2f s (total %.2f s), "
      "re-queued %d, weights reused %lld of %lld bytes\n",
      what, r.value("plan_version", 0), r.value("layout", json()).dump().c_str(),
      r.value("detect_seconds", 0.0), r.value("drain_seconds", 0.0), r.value("load_seconds", 0.0),
      r.value("total_seconds", 0.0), r.value("requeued_requests", 0),
      static_cast<long long>(r.value("reused_weight_bytes", int64_t{0})),
      static_cast<long long>(r.value("weight_bytes", int64_t{0})));
}

TEST(Daemons, PlanChangesAndWorkerLossOnGpus) {
  if (g_devices < 2) GTEST_SKIP() << "needs two GPUs";
  const std::string model = g_fixtures + "/models/llama_gqa_f32";
  auto local = testing::LocalModel::Load(model, 512, 16, &Gpu(DType::kF32));
  ASSERT_TRUE(local.ok()) << local.status().ToString();
  auto tok = Tokenizer::Load(model);
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  const std::vector<int32_t> prompt = {17, 4, 99, 23, 150, 7, 61};
  auto want_tokens = (*local)->Greedy({prompt}, 96);
  ASSERT_TRUE(want_tokens.ok()) << want_tokens.status().ToString();
  const std::string want96 = (*tok)->Decode((*want_tokens)[0], true);
  const std::string want16 = (*tok)->Decode(
      std::vector<int32_t>((*want_tokens)[0].begin(), (*want_tokens)[0].begin() + 16), true);

  GpuCluster c;
  testing::DaemonClusterOptions o = GpuOptions("tessera-gpu-reconf", model, "float32", 2, 1);
  o.heartbeat_toml = "interval_seconds = 0.25\ntimeout_seconds = 1.0\n";
  o.scheduler_toml += "drain_timeout_seconds = 0\n";
  o.worker_timeout_seconds = 4;
  c.cluster = std::make_unique<testing::DaemonCluster>(std::move(o));
  const Status started = c.cluster->Start();
  c.port = c.cluster->api_port();
  ASSERT_TRUE(started.ok()) << started.ToString();
  auto text = c.Complete(prompt, 16);
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  EXPECT_EQ(*text, want16) << "tp=2";

  // Logprobs from the CUDA workers (the last stage copies the logits rows of
  // the sequences that ask to the host): the log-softmax of the engine's
  // logits on the same GPU, the greedy token the best alternative.
  {
    const int n = 8;
    json req = {{"model", "m"},     {"prompt", prompt},   {"max_tokens", n},
                {"temperature", 0}, {"ignore_eos", true}, {"logprobs", 3}};
    auto r = HttpCall(c.port, "POST", "/v1/completions", req.dump());
    ASSERT_EQ(r.status, 200) << r.body;
    const json lp = json::parse(r.body)["choices"][0]["logprobs"];
    ASSERT_EQ(lp["token_logprobs"].size(), static_cast<size_t>(n)) << r.body;
    std::vector<int32_t> seq = prompt;
    double max_diff = 0;
    for (int i = 0; i < n; ++i) {
      auto logits = (*local)->LastLogits(seq);
      ASSERT_TRUE(logits.ok()) << logits.status().ToString();
      const int32_t id = (*want_tokens)[0][static_cast<size_t>(i)];
      const double m = *std::max_element(logits->begin(), logits->end());
      double sum = 0;
      for (float l : *logits) sum += std::exp(l - m);
      const double want = (*logits)[static_cast<size_t>(id)] - m - std::log(sum);
      const double got = lp["token_logprobs"][i].get<double>();
      max_diff = std::max(max_diff, std::fabs(got - want));
      EXPECT_NEAR(got, want, 2e-3) << "token " << i;
      double best = -1e30;
      for (const auto& [key, value] : lp["top_logprobs"][i].items())
        best = std::max(best, value.get<double>());
      EXPECT_EQ(best, got) << "token " << i << ": " << lp["top_logprobs"][i];
      seq.push_back(id);
    }
    std::printf("  logprobs from CUDA workers at tp=2: %d tokens, max |diff| vs the engine %.2e\n",
                n, max_diff);
  }

  // tp=2 -> tp=1 x pp=2 -> tp=2, each answered with the change report.
  for (const json& layout : {json{{"tp", 1}, {"pp", 2}}, json{{"tp", 2}, {"pp", 1}}}) {
    auto r = HttpCall(c.port, "POST", "/admin/plan", layout.dump());
    if (r.status != 200) c.PrintLogs();
    ASSERT_EQ(r.status, 200) << layout.dump() << ": " << r.body;
    const json report = json::parse(r.body);
    PrintPlanChange(("POST /admin/plan " + layout.dump()).c_str(), report);
    EXPECT_GT(report.value("reused_weight_bytes", int64_t{0}), 0) << report.dump();
    ASSERT_TRUE(c.WaitReady(30));
    text = c.Complete(prompt, 16);
    ASSERT_TRUE(text.ok()) << text.status().ToString();
    EXPECT_EQ(*text, want16) << layout.dump();
  }

  // Worker 1 hangs with a request in flight, then dies: the request is
  // re-queued and completes on worker 0 alone with the same tokens.
  const pid_t worker1 = c.cluster->worker_pid(1);
  kill(worker1, SIGSTOP);
  StatusOr<std::string> in_flight = Internal("not run");
  std::thread client([&] { in_flight = c.Complete(prompt, 96); });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  kill(worker1, SIGKILL);
  c.cluster->WaitForExit(worker1, 10);  // reaped
  client.join();
  if (!in_flight.ok()) c.PrintLogs();
  ASSERT_TRUE(in_flight.ok()) << in_flight.status().ToString();
  EXPECT_EQ(*in_flight, want96) << "after the re-plan onto one GPU";
  const json plan = c.Get("/admin/plan");
  ASSERT_TRUE(plan.contains("history") && !plan["history"].empty()) << plan.dump();
  const json fault = plan["history"].back();
  PrintPlanChange("worker 1 SIGSTOPped then killed", fault);
  EXPECT_EQ(plan["ranks"].size(), 1u) << plan.dump();
  EXPECT_GT(fault.value("requeued_requests", 0), 0) << fault.dump();
  const json cluster = c.Get("/admin/cluster");
  int failed = 0;
  for (const json& w : cluster["workers"]) failed += w["state"] == "failed";
  EXPECT_EQ(failed, 1) << cluster.dump();
}

}  // namespace
}  // namespace tessera
