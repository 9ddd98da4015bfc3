// parallel.mode = "auto" with real daemons: the coordinator builds its
// cluster model from the workers' registration topology reports and places
// the model with the topology-aware planner; /admin/plan explains the
// choice; `tessera plan --cluster` prints it; a cluster nothing fits on is
// refused with the planner's reasons before any worker loads anything.
//
// The workers report a topology file (worker.topology_file) describing a
// small CPU-only host, so the planner's memory limits bite on any machine.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "common/net/http_client.h"
#include "common/tokenizer/tokenizer.h"
#include "common/topology/report.h"
#include "coordinator/placement/planner.h"
#include "support/daemon_cluster.h"
#include "support/small_host.h"
#include "support/test_util.h"

namespace tessera {
namespace {

using nlohmann::json;

using ::tessera::testing::MemoryNeedingTwoRanks;
using ::tessera::testing::SmallHost;

// The cluster of these tests: auto placement over `workers` workers that
// report the host `host_file` describes.
::tessera::testing::DaemonClusterOptions AutoOptions(const std::string& dir, int workers,
                                                     const std::string& host_file) {
  ::tessera::testing::DaemonClusterOptions o;
  o.dir = dir;
  o.parallel_toml =
      "mode = \"auto\"\nworkers = " + std::to_string(workers) + "\nobjective = \"latency\"\n";
  o.admin_toml = "port = 0\ntoken = \"auto-token\"\n";
  o.heartbeat_toml = "interval_seconds = 0.2\ntimeout_seconds = 2.0\n";
  o.kv_cache_toml = "block_size = 4\nmemory_fraction = 0.9\n";
  o.scheduler_toml =
      "max_context = 128\nmax_sequences = 8\nmax_batch_tokens = 64\nprefill_chunk_tokens = 32\n";
  o.workers = workers;
  o.worker_args = {"--set", "worker.topology_file=" + host_file};
  o.wait_ready = false;  // WaitReady tells a placement refusal from readiness
  return o;
}

class AutoPlacement : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::tessera::testing::MakeTempDir("tessera-auto");
    model_ = ::tessera::testing::FixturePath("models/llama_gqa_f32");
  }
  void TearDown() override {
    if (cluster_) cluster_->Stop();
  }
  // Starts the coordinator and `workers` workers reporting a host of
  // `memory` bytes.
  void Start(int workers, int64_t memory) {
    std::ofstream(dir_ + "/host.json") << TopologyReportToJson(SmallHost(memory));
    cluster_ = std::make_unique<::tessera::testing::DaemonCluster>(
        AutoOptions(dir_, workers, dir_ + "/host.json"));
    const Status started = cluster_->Start();
    ASSERT_TRUE(started.ok()) << started.ToString();
    port_ = cluster_->api_port();
  }
  // The reason of a 503 from /readyz ("" for another reply).
  static std::string Reason(const HttpReply& r) {
    if (r.status != 503) return "";
    const json j = json::parse(r.body, nullptr, false);
    return j.is_object() ? j.value("reason", "") : r.body;
  }
  // Waits until /readyz answers 200 (true) or a placement failure (false).
  bool WaitReady(std::string* reason) {
    HttpReply last;
    const Status ready = cluster_->WaitReady(
        60,
        [](const HttpReply& r) { return r.status == 503 && Reason(r) != "waiting for workers"; },
        &last);
    if (ready.ok()) return true;
    *reason = last.status == 503 ? Reason(last) : ready.ToString();
    return false;
  }
  std::string Log(const std::string& name) {
    return ::tessera::testing::ReadFileOrDie(dir_ + "/" + name);
  }

  std::unique_ptr<::tessera::testing::DaemonCluster> cluster_;
  std::string dir_, model_;
  int port_ = 0;
};

TEST_F(AutoPlacement, PlansFromTheWorkersReportsServesAndExplains) {
  auto model = LoadModelConfig(model_);
  ASSERT_TRUE(model.ok());
  // The options the coordinator derives from AutoConfig.
  PlanOptions o;
  o.max_context = o.min_kv_tokens = 128;
  o.gpu_memory_fraction = 0.9;
  o.weight_dtype = o.kv_dtype = DType::kF32;
  o.prefill_chunk_tokens = 32;
  o.max_batch = 8;
  const int64_t memory = MemoryNeedingTwoRanks(*model, 3, o);
  ASSERT_GT(memory, 0) << "no memory size separates one rank from two";
  // Three workers on one (reported) host: the planner needs two of them.
  Start(3, memory);
  std::string reason;
  ASSERT_TRUE(WaitReady(&reason)) << reason << "\n" << Log("coordinator.log");

  auto plan_reply = HttpCall(port_, "GET", "/admin/plan", "", "auto-token");
  ASSERT_EQ(plan_reply.status, 200) << plan_reply.body;
  const json plan = json::parse(plan_reply.body);
  EXPECT_EQ(plan["mode"], "auto");
  const int tp = plan["tp"].get<int>(), pp = plan["pp"].get<int>();
  EXPECT_EQ(tp * pp, 2) << plan.dump(2);
  ASSERT_EQ(plan["ranks"].size(), 2u);
  // The explanation: the chosen layout first, candidates with predicted
  // memory, latency and throughput, and the layouts rejected with reasons
  // (one rank cannot hold the model).
  const json& p = plan["planner"];
  EXPECT_EQ(p["objective"], "latency");
  ASSERT_GE(p["top"].size(), 1u);
  EXPECT_EQ(p["top"][0]["layout"], p["layout"]);
  for (const json& c : p["top"]) {
    EXPECT_GT(c["decode_latency_s"].get<double>(), 0) << c.dump();
    EXPECT_GT(c["throughput_tokens_per_s"].get<double>(), 0) << c.dump();
    EXPECT_GT(c["peak_device_bytes"].get<double>(), 0) << c.dump();
    EXPECT_LE(c["peak_device_bytes"].get<double>(), c["usable_device_bytes"].get<double>());
  }
  // ("tp=1 pp=1", or "tp=1 pp=1..2" when two stages of one rank do not fit
  // either.)
  bool single_rank_rejected = false;
  for (const json& r : p["rejected"])
    single_rank_rejected |= r["layout"].get<std::string>().rfind("tp=1 pp=1", 0) == 0 &&
                            r["why"].get<std::string>().find("does not fit") != std::string::npos;
  EXPECT_TRUE(single_rank_rejected) << p["rejected"].dump(2);
  EXPECT_NE(p["text"].get<std::string>().find("Why:"), std::string::npos);
  ASSERT_EQ(p["stages"].size(), static_cast<size_t>(pp));
  EXPECT_EQ(p["stages"][0]["device_name"], "CPU rank (Test CPU)");
  // Predicted vs actual bytes per rank: the cost model's weight bytes are
  // within 10% of what the worker loaded; the KV cache is what was sized.
  for (const json& r : plan["ranks"]) {
    const double loaded = r["weight_bytes"].get<double>(),
                 predicted = r["predicted_weight_bytes"].get<double>();
    EXPECT_GT(loaded, 0) << r.dump();
    EXPECT_NEAR(predicted / loaded, 1.0, 0.1) << r.dump();
    EXPECT_EQ(r["shard_weight_bytes"].get<double>(), loaded) << r.dump();
    EXPECT_EQ(r["kv_bytes"], r["predicted_kv_bytes"]) << r.dump();
  }
  // KV capacity: what fits on the tightest rank, in blocks of 4 tokens, and
  // at most what 8 sequences of 128 tokens use.
  EXPECT_LE(plan["kv_blocks"].get<int64_t>(), p["kv_tokens"].get<int64_t>() / 4);
  EXPECT_LE(plan["kv_blocks"].get<int64_t>(), 8 * 32);
  EXPECT_GE(plan["kv_blocks"].get<int64_t>(), 32);

  // The third worker is idle: registered, never assigned.
  auto cluster = HttpCall(port_, "GET", "/admin/cluster", "", "auto-token");
  ASSERT_EQ(cluster.status, 200);
  int idle = 0;
  const json cj = json::parse(cluster.body);
  for (const json& w : cj["workers"]) {
    EXPECT_EQ(w["host"], "small-box");
    if (w["rank"].is_null()) {
      ++idle;
      EXPECT_EQ(w["worker_state"], "idle") << w.dump();
    } else {
      EXPECT_EQ(w["worker_state"], "ready") << w.dump();
    }
  }
  EXPECT_EQ(idle, 1) << cluster.body;

  // Greedy outputs equal the reference.
  const json ref = json::parse(::tessera::testing::ReadFileOrDie(model_ + "/reference.json"));
  auto tok = Tokenizer::Load(model_);
  ASSERT_TRUE(tok.ok());
  for (const json& pr : ref["prompts"]) {
    json req = {{"model", "llama_gqa_f32"},
                {"prompt", pr["ids"]},
                {"max_tokens", 16},
                {"temperature", 0},
                {"ignore_eos", true}};
    auto r = HttpCall(port_, "POST", "/v1/completions", req.dump());
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(json::parse(r.body)["choices"][0]["text"].get<std::string>(),
              (*tok)->Decode(pr["greedy"].get<std::vector<int32_t>>(), true));
  }

  // `tessera plan --cluster` prints the same plan and reasoning.
  const std::string out_file = dir_ + "/plan.out";
  const std::string cmd = ::tessera::testing::BinaryDir() +
                          "/tessera plan --cluster http://127.0.0.1:" + std::to_string(port_) +
                          " --token auto-token >" + out_file + " 2>&1";
  const int st = std::system(cmd.c_str());
  const std::string out = Log("plan.out");
  EXPECT_EQ(WEXITSTATUS(st), 0) << out;
  EXPECT_NE(out.find("Plan (objective: latency): " + p["layout"].get<std::string>()),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("Why:"), std::string::npos) << out;
  EXPECT_NE(out.find("Rejected:"), std::string::npos) << out;
  EXPECT_NE(out.find("placement: tp=" + std::to_string(tp) + " pp=" + std::to_string(pp)),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("(predicted)"), std::string::npos) << out;
  // Without the token: refused, exit 1.
  const int unauth = std::system((::tessera::testing::BinaryDir() +
                                  "/tessera plan --cluster 127.0.0.1:" + std::to_string(port_) +
                                  " >/dev/null 2>&1")
                                     .c_str());
  EXPECT_EQ(WEXITSTATUS(unauth), 1);
}

TEST_F(AutoPlacement, RefusesAClusterNothingFitsBeforeAnyWorkerLoads) {
  Start(2, 256 << 10);  // 256 KiB for two ranks: not even one layer fits
  std::string reason;
  ASSERT_FALSE(WaitReady(&reason));
  EXPECT_NE(reason.find("placement refused"), std::string::npos) << reason;
  EXPECT_NE(reason.find("does not fit"), std::string::npos) << reason;
  EXPECT_NE(reason.find("no worker was assigned anything"), std::string::npos) << reason;
  auto plan = HttpCall(port_, "GET", "/admin/plan", "", "auto-token");
  ASSERT_EQ(plan.status, 200);
  const json pj = json::parse(plan.body);
  EXPECT_TRUE(pj["ranks"].empty()) << plan.body;
  EXPECT_NE(pj["error"].get<std::string>().find("does not fit"), std::string::npos) << plan.body;
  // Both workers registered and stay idle (their heartbeats say so): no
  // AssignShard reached them.
  json c;
  for (int i = 0; i < 50; ++i) {
    c = json::parse(HttpCall(port_, "GET", "/admin/cluster", "", "auto-token").body);
    bool heard = c["workers"].size() == 2;
    for (const json& w : c["workers"]) heard = heard && w["worker_state"] != "registered";
    if (heard) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_EQ(c["workers"].size(), 2u) << c.dump();
  for (const json& w : c["workers"]) {
    EXPECT_TRUE(w["rank"].is_null()) << w.dump();
    EXPECT_EQ(w["worker_state"], "idle") << w.dump();
  }
  for (int i = 0; i < 2; ++i)
    EXPECT_EQ(Log("worker" + std::to_string(i) + ".log").find("loaded"), std::string::npos);
  // Completions are refused with 503 while there is no plan; health is fine.
  EXPECT_EQ(HttpCall(port_, "POST", "/v1/completions",
                     R"({"model":"llama_gqa_f32","prompt":[1,2],"max_tokens":2})")
                .status,
            503);
  EXPECT_EQ(HttpCall(port_, "GET", "/healthz").status, 200);
  // `tessera plan --cluster` reports the refusal and exits 1.
  const std::string cmd = ::tessera::testing::BinaryDir() +
                          "/tessera plan --cluster http://127.0.0.1:" + std::to_string(port_) +
                          " --token auto-token >" + dir_ + "/plan.out 2>&1";
  const int st = std::system(cmd.c_str());
  EXPECT_EQ(WEXITSTATUS(st), 1);
  EXPECT_NE(Log("plan.out").find("placement failed"), std::string::npos) << Log("plan.out");
}

// An explicit layout that breaks the model's rules is refused when the
// coordinator starts, naming the rule, before it waits for any worker.
TEST_F(AutoPlacement, ExplicitInvalidLayoutIsRefusedAtStart) {
  std::ofstream(dir_ + "/bad.toml")
      << "[model]\npath = \"" << model_ << "\"\n"
      << "[parallel]\ntp = 3\npp = 1\n[server]\nport = 0"
      << "\ncontrol_endpoint = \"tcp://127.0.0.1:0\"\n[admin]\nport = 0\n";
  const int rc = ::tessera::testing::RunDaemonUntilExit(
      "tessera-coordinator", {"--config", dir_ + "/bad.toml"}, dir_ + "/bad.log", 60);
  EXPECT_NE(rc, 0);
  EXPECT_NE(rc, -1) << "still running after 60 s";
  const std::string log = Log("bad.log");
  EXPECT_NE(log.find("tp=3"), std::string::npos) << log;
  EXPECT_NE(log.find("num_attention_heads"), std::string::npos) << log;
}

}  // namespace
}  // namespace tessera
