// Per-replica layouts end to end (parallel.replica_override): tessera-
// coordinator and five tessera-worker processes on loopback serving two
// replicas of the fixture model llama_gqa_f32, replica 0 tp=1 x pp=2
// ([parallel]'s layout) and replica 1 tp=2 x pp=1 (its override); the fifth
// worker is a spare.
//
//  - /admin/cluster, /admin/plan and `tessera plan --cluster` show each
//    replica's own layout;
//  - concurrent greedy requests (half streamed) reach both replicas and each
//    output equals the single-process engine's (LocalModel, tp=1 x pp=1);
//  - every worker's step series carry the `replica` label of the replica
//    /admin/cluster says it serves (AssignShard.replica), the spare none;
//  - kill -9 a worker of replica 1: it re-plans onto its survivor and the
//    spare, keeping its override's layout (tp=2 x pp=1, not the shrunken
//    tp=1), replica 0 keeps its plan, the outputs are unchanged and the
//    spare's series now say replica 1.
// And a coordinator with an override the model cannot take (tp=3 over 4
// attention heads) refuses to start, naming the entry's key and line:col.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/net/http_client.h"
#include "common/tokenizer/tokenizer.h"
#include "support/daemon_cluster.h"
#include "support/model_harness.h"
#include "support/test_util.h"

namespace tessera {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr const char* kToken = "s3cret";
constexpr int kRequests = 12;
constexpr int kMaxTokens = 24;

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

std::vector<int32_t> Prompt(int i) { return {5 + 7 * i, 17, 42, 3 + i}; }

json Request(int i, bool stream) {
  return {{"model", "llama_gqa_f32"}, {"prompt", Prompt(i)}, {"max_tokens", kMaxTokens},
          {"temperature", 0},         {"ignore_eos", true},  {"stream", stream}};
}

json Get(int port, const std::string& path) {
  auto r = HttpCall(port, "GET", path, "", kToken);
  EXPECT_EQ(r.status, 200) << path << ": " << r.body;
  return json::parse(r.body, nullptr, false);
}

// The single-process engine's greedy text of every request.
std::vector<std::string> EngineReference() {
  const std::string model = ::tessera::testing::FixturePath("models/llama_gqa_f32");
  auto local = ::tessera::testing::LocalModel::Load(model);
  EXPECT_TRUE(local.ok()) << local.status().ToString();
  auto tok = Tokenizer::Load(model);
  EXPECT_TRUE(tok.ok()) << tok.status().ToString();
  if (!local.ok() || !tok.ok()) return {};
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < kRequests; ++i) prompts.push_back(Prompt(i));
  auto ids = (*local)->Greedy(prompts, kMaxTokens);
  EXPECT_TRUE(ids.ok()) << ids.status().ToString();
  if (!ids.ok()) return {};
  std::vector<std::string> out;
  for (const auto& seq : *ids) out.push_back((*tok)->Decode(seq, true));
  return out;
}

// The texts of kRequests requests sent at once (every odd one streamed).
std::vector<std::string> RunConcurrently(int port) {
  std::vector<std::string> bodies;
  for (int i = 0; i < kRequests; ++i) bodies.push_back(Request(i, i % 2 == 1).dump());
  return ::tessera::testing::ConcurrentCompletionTexts(port, bodies);
}

// Waits (bounded) until /admin/cluster reports every replica ready and not
// re-planning, and `done` (if given) holds for it; returns it.
json WaitForReplicas(int port, size_t replicas, double seconds,
                     const std::function<bool(const json&)>& done = {}) {
  const auto t0 = Clock::now();
  json last;
  while (Since(t0) < seconds) {
    auto r = HttpCall(port, "GET", "/admin/cluster", "", kToken);
    last = json::parse(r.body, nullptr, false);
    bool ok = r.status == 200 && !last.is_discarded() && last.contains("replicas") &&
              last["replicas"].size() == replicas;
    if (ok)
      for (const json& rep : last["replicas"])
        ok = ok && rep.value("ready", false) && !rep.value("reconfiguring", true);
    if (ok && (!done || done(last))) return last;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ADD_FAILURE() << "replicas not ready within " << seconds
                << " s; last /admin/cluster: " << last.dump();
  return last;
}

// Worker id -> the `replica` label values of its tessera_step_tokens_total
// series, from the /metrics of each started worker but the one of pid `dead`.
std::map<std::string, std::set<std::string>> StepSeriesReplicas(
    const ::tessera::testing::DaemonCluster& c, pid_t dead = -1) {
  std::map<std::string, std::set<std::string>> out;
  const std::regex info("tessera_worker_info\\{[^}]*worker_id=\"([^\"]+)\"");
  const std::regex step("tessera_step_tokens_total\\{replica=\"([0-9]+)\",");
  for (int i = 0; i < c.workers_started(); ++i) {
    if (c.worker_pid(i) == dead) continue;
    auto r = HttpCall(c.metrics_port(i), "GET", "/metrics");
    EXPECT_EQ(r.status, 200) << "worker " << i;
    std::smatch m;
    if (!std::regex_search(r.body, m, info)) {
      ADD_FAILURE() << "worker " << i << " has no tessera_worker_info:\n" << r.body;
      continue;
    }
    std::set<std::string>& labels = out[m[1].str()];
    for (auto it = std::sregex_iterator(r.body.begin(), r.body.end(), step);
         it != std::sregex_iterator(); ++it)
      labels.insert((*it)[1].str());
  }
  return out;
}

// Worker id -> its replica per /admin/cluster ("" for a spare).
std::map<std::string, std::string> ReplicaOfWorkers(const json& cluster) {
  std::map<std::string, std::string> out;
  for (const json& w : cluster["workers"])
    if (w.value("state", "") == "alive")
      out[w["id"].get<std::string>()] = w["replica"].is_null() ? "" : w["replica"].dump();
  return out;
}

TEST(ReplicaLayouts, EachReplicaRunsItsOwnLayoutAndKeepsItAfterALoss) {
  const std::vector<std::string> want = EngineReference();
  ASSERT_EQ(want.size(), static_cast<size_t>(kRequests));
  for (const std::string& w : want) ASSERT_FALSE(w.empty());

  ::tessera::testing::DaemonClusterOptions o;
  o.temp_prefix = "tessera-replica-override";
  o.model_toml = "";
  o.parallel_toml =
      "tp = 1\npp = 2\nreplicas = 2\n"
      "[[parallel.replica_override]]\nreplica = 1\ntp = 2\npp = 1\n";
  o.admin_toml = fmt::format("port = 0\ntoken = \"{}\"\n", kToken);
  // A lost worker is noticed within 3 s: loose enough that a worker starved
  // of CPU (2 cores, tests in parallel) is not declared lost.
  o.heartbeat_toml = "interval_seconds = 0.2\ntimeout_seconds = 3.0\n";
  o.workers = 5;  // 2 + 2, and a spare
  o.worker_metrics = true;
  o.worker_timeout_seconds = 3.0;
  o.ready_timeout_seconds = 90;
  o.stop_grace_seconds = 3.0;
  ::tessera::testing::DaemonCluster c(std::move(o));
  const Status started = c.Start();
  ASSERT_TRUE(started.ok()) << started.ToString();
  const int port = c.api_port();
  json cluster = WaitForReplicas(port, 2, 90);

  // Each replica's own layout.
  ASSERT_EQ(cluster["replicas"].size(), 2u) << cluster.dump();
  EXPECT_EQ(cluster["replicas"][0]["layout"]["tp"], 1) << cluster.dump();
  EXPECT_EQ(cluster["replicas"][0]["layout"]["pp"], 2) << cluster.dump();
  EXPECT_EQ(cluster["replicas"][1]["layout"]["tp"], 2) << cluster.dump();
  EXPECT_EQ(cluster["replicas"][1]["layout"]["pp"], 1) << cluster.dump();
  json plan = Get(port, "/admin/plan");
  ASSERT_EQ(plan["replicas"].size(), 2u) << plan.dump();
  std::set<std::string> in_plans;
  for (const json& r : plan["replicas"]) {
    ASSERT_EQ(r["ranks"].size(), 2u) << r.dump();
    for (const json& k : r["ranks"]) in_plans.insert(k["worker"].get<std::string>());
  }
  EXPECT_EQ(in_plans.size(), 4u) << "each replica has its own workers";
  EXPECT_EQ(plan["replicas"][1]["tp"], 2);
  EXPECT_EQ(plan["replicas"][1]["pp"], 1);
  EXPECT_EQ(plan["replicas"][1]["wanted"]["tp"], 2);
  const auto tessera_plan = ::tessera::testing::RunCommand(
      ::tessera::testing::BinaryDir() +
      "/tessera plan --cluster 127.0.0.1:" + std::to_string(port) + " --token " + kToken + " 2>&1");
  EXPECT_EQ(tessera_plan.rc, 0) << tessera_plan.output;
  EXPECT_NE(tessera_plan.output.find("replica 0: placement: tp=1 pp=2"), std::string::npos)
      << tessera_plan.output;
  EXPECT_NE(tessera_plan.output.find("replica 1: placement: tp=2 pp=1"), std::string::npos)
      << tessera_plan.output;

  // Both replicas serve the engine's greedy outputs.
  std::vector<std::string> got = RunConcurrently(port);
  for (int i = 0; i < kRequests; ++i) EXPECT_EQ(got[i], want[i]) << "request " << i;
  cluster = Get(port, "/admin/cluster");
  for (const json& r : cluster["replicas"])
    EXPECT_GT(r["requests_finished_total"].get<int64_t>(), 0)
        << "replica " << r["replica"] << " got no request: " << cluster.dump();

  // The workers label their step series with their replica.
  std::map<std::string, std::string> replica_of = ReplicaOfWorkers(cluster);
  std::map<std::string, std::set<std::string>> labels = StepSeriesReplicas(c);
  ASSERT_EQ(labels.size(), 5u);
  int spares = 0;
  for (const auto& [id, values] : labels) {
    ASSERT_TRUE(replica_of.count(id)) << id << " " << cluster.dump();
    if (replica_of[id].empty()) {
      ++spares;
      EXPECT_TRUE(values.empty()) << "spare " << id << " has step series";
      continue;
    }
    EXPECT_EQ(values, std::set<std::string>{replica_of[id]}) << id;
  }
  EXPECT_EQ(spares, 1);

  // Kill a worker of replica 1: it re-plans onto its survivor and the
  // spare, with its own layout.
  const uint64_t version0 = plan["replicas"][0]["plan_version"].get<uint64_t>();
  const uint64_t version1 = plan["replicas"][1]["plan_version"].get<uint64_t>();
  const std::string victim = plan["replicas"][1]["ranks"][1]["worker"];
  pid_t pid = -1;
  for (const json& w : cluster["workers"])
    if (w["id"] == victim) pid = w["pid"].get<pid_t>();
  ASSERT_GT(pid, 0);
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  cluster = WaitForReplicas(port, 2, 60, [&](const json& cl) {
    return cl["replicas"][1]["plan_version"].get<uint64_t>() > version1;
  });
  EXPECT_EQ(cluster["replicas"][1]["layout"]["tp"], 2) << "the override is kept: " << cluster;
  EXPECT_EQ(cluster["replicas"][1]["layout"]["pp"], 1) << cluster.dump();
  EXPECT_GE(cluster["replicas"][1]["faults_total"].get<int64_t>(), 1) << cluster.dump();
  EXPECT_EQ(cluster["replicas"][0]["plan_version"].get<uint64_t>(), version0) << cluster.dump();
  EXPECT_EQ(cluster["replicas"][0]["faults_total"], 0) << cluster.dump();
  for (const json& w : cluster["replicas"][1]["workers"]) EXPECT_NE(w, victim);
  got = RunConcurrently(port);
  for (int i = 0; i < kRequests; ++i) EXPECT_EQ(got[i], want[i]) << "request " << i;
  // The former spare now serves replica 1, and says so.
  replica_of = ReplicaOfWorkers(cluster);
  labels = StepSeriesReplicas(c, pid);
  ASSERT_EQ(labels.size(), 4u);
  for (const auto& [id, values] : labels) {
    ASSERT_TRUE(replica_of.count(id)) << id;
    EXPECT_FALSE(replica_of[id].empty()) << id << " should serve a replica: " << cluster.dump();
    EXPECT_TRUE(values.count(replica_of[id])) << id;
  }
}

// An override the model cannot take stops the coordinator at start, before
// it waits for workers, naming the entry's key and where it was given.
TEST(ReplicaLayouts, ALayoutTheModelCannotTakeStopsTheCoordinator) {
  const std::string dir = ::tessera::testing::MakeTempDir("tessera-replica-override-bad");
  std::ofstream(dir + "/c.toml") << "[model]\npath = \""
                                 << ::tessera::testing::FixturePath("models/llama_gqa_f32")
                                 << "\"\n[parallel]\ntp = 2\nreplicas = 2\n"
                                    "[[parallel.replica_override]]\nreplica = 1\ntp = 3\n"
                                    "[server]\nport = 0\ncontrol_endpoint = "
                                    "\"tcp://127.0.0.1:0\"\n[control]\nallow_unauthenticated = "
                                    "true\n";
  const int rc = ::tessera::testing::RunDaemonUntilExit(
      "tessera-coordinator", {"--config", dir + "/c.toml"}, dir + "/coordinator.log", 60);
  const std::string log = ::tessera::testing::ReadFileOrDie(dir + "/coordinator.log");
  EXPECT_NE(rc, 0) << log;
  EXPECT_NE(rc, -1) << "the coordinator did not refuse: " << log;
  EXPECT_NE(log.find(dir + "/c.toml:8:6: parallel.replica_override[0].tp"), std::string::npos)
      << log;
  EXPECT_NE(log.find("tp=3"), std::string::npos) << log;
}

}  // namespace
}  // namespace tessera
