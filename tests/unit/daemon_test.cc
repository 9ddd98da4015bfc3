// The daemons end to end: tessera-coordinator and four tessera-worker
// processes (tp=2 x pp=2) on loopback, real ZeroMQ, Gloo and HTTP; and three
// workers with a different tp per stage (tp = [2, 1], pp = 2).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "common/tokenizer.h"
#include "coordinator/http_client.h"
#include "test_util.h"

namespace tessera {
namespace {

using nlohmann::json;

pid_t Spawn(const std::vector<std::string>& args, const std::string& log) {
  const pid_t pid = fork();
  if (pid == 0) {
    const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  return pid;
}

class Daemons : public ::testing::Test {
 protected:
  // The [parallel] keys and the worker count of the deployment.
  virtual std::string ParallelToml() const { return "tp = 2\npp = 2\n"; }
  virtual int Workers() const { return 4; }

  void SetUp() override {
    dir_ = ::tessera::testing::MakeTempDir("tessera-daemons");
    model_ = ::tessera::testing::FixturePath("models/llama_gqa_f32");
    port_ = ::tessera::testing::FreeTcpPort();
    const int control = ::tessera::testing::FreeTcpPort();
    std::ofstream(dir_ + "/c.toml")
        << "[model]\npath = \"" << model_ << "\"\nchat_template = \"chatml\"\n[parallel]\n"
        << ParallelToml() << "[server]\nport = " << port_
        << "\ncontrol_endpoint = \"tcp://127.0.0.1:" << control
        << "\"\n[admin]\nport = 0\ntoken = \"s3cret\"\n"
        << "[heartbeat]\ninterval_seconds = 0.2\ntimeout_seconds = 1.0\n"
        << "[kv_cache]\nmax_blocks = 256\nblock_size = 4\n"
        << "[scheduler]\nmax_context = 128\nqueue_limit = 40\nmax_sequences = 40\n";
    const std::string bin = ::tessera::testing::BinaryDir();
    pids_.push_back(Spawn({bin + "/tessera-coordinator", "--config", dir_ + "/c.toml"},
                          dir_ + "/coordinator.log"));
    for (int i = 0; i < Workers(); ++i)
      pids_.push_back(Spawn(
          {bin + "/tessera-worker", "--coordinator", "tcp://127.0.0.1:" + std::to_string(control),
           "--device", std::to_string(i), "--timeout", "5"},
          dir_ + "/worker" + std::to_string(i) + ".log"));
    for (int i = 0; i < 1200; ++i) {  // up to 2 minutes on a loaded 2-core machine
      if (HttpCall(port_, "GET", "/readyz").status == 200) return;
      if (waitpid(pids_[0], nullptr, WNOHANG) != 0) break;  // the coordinator died
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    FAIL() << "daemons not ready: " << ::tessera::testing::ReadFileOrDie(dir_ + "/coordinator.log");
  }
  void TearDown() override {
    for (pid_t p : pids_) kill(p, SIGTERM);
    for (pid_t p : pids_) {
      for (int i = 0; i < 50 && waitpid(p, nullptr, WNOHANG) == 0; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      kill(p, SIGKILL);
      waitpid(p, nullptr, 0);
    }
  }
  std::string Completion(const json& body) { return body.dump(); }

  std::string dir_, model_;
  int port_ = 0;
  std::vector<pid_t> pids_;
};

TEST_F(Daemons, GreedyTokenPromptsMatchTheReferenceAndStreamsComplete) {
  const json ref = json::parse(::tessera::testing::ReadFileOrDie(model_ + "/reference.json"));
  auto tok = Tokenizer::Load(model_);
  ASSERT_TRUE(tok.ok());
  for (const json& p : ref["prompts"]) {
    json req = {{"model", "llama_gqa_f32"},
                {"prompt", p["ids"]},
                {"max_tokens", 16},
                {"temperature", 0},
                {"ignore_eos", true}};
    auto r = HttpCall(port_, "POST", "/v1/completions", req.dump());
    ASSERT_EQ(r.status, 200) << r.body;
    const json body = json::parse(r.body);
    EXPECT_EQ(body["choices"][0]["text"].get<std::string>(),
              (*tok)->Decode(p["greedy"].get<std::vector<int32_t>>(), true));
    EXPECT_EQ(body["usage"]["completion_tokens"].get<int>(), 16);
  }
  // 32 concurrent streamed requests all complete with [DONE].
  std::atomic<int> ok{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 32; ++i) {
    threads.emplace_back([&, i] {
      json req = {{"model", "llama_gqa_f32"},
                  {"prompt", std::vector<int>{5 + i, 17, 42}},
                  {"max_tokens", 8},
                  {"temperature", 0.7},
                  {"seed", i},
                  {"stream", true},
                  {"ignore_eos", true}};
      auto r = HttpCall(port_, "POST", "/v1/completions", req.dump());
      if (r.status == 200 && !r.events.empty() && r.events.back() == "[DONE]") ++ok;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), 32);
}

TEST_F(Daemons, BadRequestsGet4xxAndTheDaemonKeepsServing) {
  EXPECT_EQ(HttpCall(port_, "POST", "/v1/completions", "{not json").status, 400);
  EXPECT_EQ(HttpCall(port_, "POST", "/v1/completions",
                     R"({"model":"llama_gqa_f32","prompt":"x","temperature":"hot"})")
                .status,
            400);
  EXPECT_EQ(HttpCall(port_, "POST", "/v1/completions",
                     R"({"model":"llama_gqa_f32","prompt":"x","top_p":7})")
                .status,
            400);
  auto unknown = HttpCall(port_, "POST", "/v1/completions", R"({"model":"gpt-9","prompt":"x"})");
  EXPECT_EQ(unknown.status, 404) << unknown.body;
  auto too_long = HttpCall(
      port_, "POST", "/v1/completions",
      json({{"model", "llama_gqa_f32"}, {"prompt", std::vector<int>(120, 3)}, {"max_tokens", 50}})
          .dump());
  EXPECT_EQ(too_long.status, 400);
  EXPECT_NE(too_long.body.find("128"), std::string::npos) << too_long.body;
  EXPECT_EQ(HttpCall(port_, "GET", "/admin/plan").status, 401);
  auto plan = HttpCall(port_, "GET", "/admin/plan", "", "s3cret");
  ASSERT_EQ(plan.status, 200);
  EXPECT_EQ(json::parse(plan.body)["ranks"].size(), 4u);
  // Still serving.
  auto r = HttpCall(port_, "POST", "/v1/completions",
                    R"({"model":"llama_gqa_f32","prompt":[1,2,3],"max_tokens":2})");
  EXPECT_EQ(r.status, 200) << r.body;
}

// The official `openai` Python package (installed by scripts/setup into its
// venv; scripts/test exports TESSERA_PYTHON) against the running daemons.
TEST_F(Daemons, OfficialOpenAIClientWorks) {
  const char* python = std::getenv("TESSERA_PYTHON");
  ASSERT_NE(python, nullptr) << "TESSERA_PYTHON is not set: run the tests through scripts/test";
  const std::string script = ::tessera::testing::FixturePath("../openai_client_check.py");
  const std::string cmd =
      std::string(python) + " " + script + " " + std::to_string(port_) + " llama_gqa_f32 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[512];
  while (fgets(buf, sizeof buf, p)) out += buf;
  const int status = pclose(p);
  EXPECT_EQ(WEXITSTATUS(status), 0) << out;
  EXPECT_NE(out.find("openai client checks passed"), std::string::npos) << out;
}

// A lost worker triggers a re-plan onto the survivors (tp=2 x pp=1 from 3
// workers): the request in flight completes instead of failing, and the
// worker is reported failed. tests/unit/reconfigure_test.cc covers faults in
// depth.
TEST_F(Daemons, KilledWorkerIsReportedAndItsRequestCompletesAfterAReplan) {
  HttpReply reply;
  std::thread client([&] {
    json req = {{"model", "llama_gqa_f32"}, {"prompt", std::vector<int>{5, 17}},
                {"max_tokens", 100},        {"stream", true},
                {"ignore_eos", true},       {"temperature", 0}};
    reply = HttpCall(port_, "POST", "/v1/completions", req.dump());
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  kill(pids_[3], SIGKILL);  // a worker of the plan
  client.join();
  EXPECT_EQ(reply.status, 200);
  EXPECT_EQ(reply.body.find("error"), std::string::npos) << reply.body;
  ASSERT_FALSE(reply.events.empty());
  EXPECT_EQ(reply.events.back(), "[DONE]");
  bool reported = false;
  for (int i = 0; i < 50 && !reported; ++i) {
    auto c = HttpCall(port_, "GET", "/admin/cluster", "", "s3cret");
    reported = c.body.find("\"failed\"") != std::string::npos;
    if (!reported) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(reported);
  bool ready = false;
  for (int i = 0; i < 300 && !ready; ++i) {
    ready = HttpCall(port_, "GET", "/readyz").status == 200;
    if (!ready) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(ready);
  EXPECT_EQ(HttpCall(port_, "GET", "/healthz").status, 200);
}

// Stage 0 at tp=2 feeds stage 1 at tp=1 (common/stage_handoff.h): stage 0's
// tp rank 1 sends nothing, the single last-stage rank returns the tokens.
class DaemonsPerStageTp : public Daemons {
 protected:
  std::string ParallelToml() const override { return "tp = [2, 1]\npp = 2\n"; }
  int Workers() const override { return 3; }
};

TEST_F(DaemonsPerStageTp, GreedyTokensMatchTheReferenceAndThePlanShowsEachStagesTp) {
  const json ref = json::parse(::tessera::testing::ReadFileOrDie(model_ + "/reference.json"));
  auto tok = Tokenizer::Load(model_);
  ASSERT_TRUE(tok.ok());
  for (const json& p : ref["prompts"]) {
    json req = {{"model", "llama_gqa_f32"},
                {"prompt", p["ids"]},
                {"max_tokens", 16},
                {"temperature", 0},
                {"ignore_eos", true}};
    auto r = HttpCall(port_, "POST", "/v1/completions", req.dump());
    ASSERT_EQ(r.status, 200) << r.body;
    const json body = json::parse(r.body);
    EXPECT_EQ(body["choices"][0]["text"].get<std::string>(),
              (*tok)->Decode(p["greedy"].get<std::vector<int32_t>>(), true));
  }
  // Concurrent streams keep the pipeline full (pp micro-batches in flight).
  std::atomic<int> ok{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&, i] {
      json req = {{"model", "llama_gqa_f32"},
                  {"prompt", std::vector<int>{5 + i, 17, 42}},
                  {"max_tokens", 8},
                  {"stream", true},
                  {"ignore_eos", true}};
      auto r = HttpCall(port_, "POST", "/v1/completions", req.dump());
      if (r.status == 200 && !r.events.empty() && r.events.back() == "[DONE]") ++ok;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), 8);
  auto plan = HttpCall(port_, "GET", "/admin/plan", "", "s3cret");
  ASSERT_EQ(plan.status, 200) << plan.body;
  const json pj = json::parse(plan.body);
  EXPECT_EQ(pj["tp"].get<int>(), 0);
  EXPECT_EQ(pj["tp_per_stage"].get<std::vector<int>>(), (std::vector<int>{2, 1}));
  EXPECT_EQ(pj["pp"].get<int>(), 2);
  ASSERT_EQ(pj["ranks"].size(), 3u);
  const int want[3][2] = {{0, 0}, {0, 1}, {1, 0}};  // (stage, tp_rank) of world ranks 0..2
  for (size_t r = 0; r < 3; ++r) {
    EXPECT_EQ(pj["ranks"][r]["world_rank"].get<int>(), static_cast<int>(r));
    EXPECT_EQ(pj["ranks"][r]["stage"].get<int>(), want[r][0]) << "rank " << r;
    EXPECT_EQ(pj["ranks"][r]["tp_rank"].get<int>(), want[r][1]) << "rank " << r;
  }
  // Each worker loaded the shard of its own stage's tp: what it reports
  // equals ShardSpec's prediction, and the two stage-0 halves are equal.
  for (size_t r = 0; r < 3; ++r) {
    EXPECT_EQ(pj["ranks"][r]["weight_bytes"].get<int64_t>(),
              pj["ranks"][r]["predicted_weight_bytes"].get<int64_t>())
        << "rank " << r;
  }
  EXPECT_EQ(pj["ranks"][0]["weight_bytes"].get<int64_t>(),
            pj["ranks"][1]["weight_bytes"].get<int64_t>());
}

}  // namespace
}  // namespace tessera
