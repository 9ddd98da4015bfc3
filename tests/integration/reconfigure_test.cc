// Live reconfiguration and fault tolerance end to end: tessera-coordinator and
// tessera-worker processes on loopback (real ZeroMQ, Gloo and HTTP), the
// fixture model llama_gqa_f32 (2 layers), short heartbeats (0.2 s, lost
// after 1 s) and a 3 s collective timeout.
//
// Every test runs greedy requests undisturbed first (the reference), then
// the same requests as streams while the cluster is disturbed (a worker
// SIGKILLed or SIGSTOPped, POST /admin/plan, a worker drained), and checks
// that every stream completes with exactly the reference text: no request
// lost, no token missing or repeated. The timings (time to detect, to
// re-plan and reload, requests re-queued) are printed.
#include <arpa/inet.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>

#include "common/net/http_client.h"
#include "support/daemon_cluster.h"
#include "support/raw_sse_stream.h"

namespace tessera {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr const char* kToken = "s3cret";
constexpr int kRequests = 6;
constexpr int kMaxTokens = 100;  // prompt 3 + 100 <= max_context 128
// CURVE keys made beyond a cluster's first workers, for workers a test adds.
constexpr int kSpareWorkerKeys = 6;

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

json Request(int i, bool stream) {
  return {{"model", "llama_gqa_f32"}, {"prompt", std::vector<int>{5 + 7 * i, 17, 42}},
          {"max_tokens", kMaxTokens}, {"temperature", 0},
          {"ignore_eos", true},       {"stream", stream}};
}

using Stream = ::tessera::testing::RawSseStream;

class Cluster : public ::testing::Test {
 protected:
  // Heartbeats every `heartbeat_interval` s, a worker lost after
  // `heartbeat_timeout` s of silence; `worker_timeout` bounds every
  // collective (tessera-worker --timeout).
  void Launch(int tp, int pp, int workers, double drain_timeout, double heartbeat_interval = 0.2,
              double heartbeat_timeout = 1.0, double worker_timeout = 3.0) {
    ::tessera::testing::DaemonClusterOptions o;
    o.temp_prefix = "tessera-reconf";
    o.model_toml = "";
    o.parallel_toml = fmt::format("tp = {}\npp = {}\n", tp, pp);
    o.admin_toml = fmt::format("port = 0\ntoken = \"{}\"\n", kToken);
    o.heartbeat_toml = fmt::format("interval_seconds = {}\ntimeout_seconds = {}\n",
                                   heartbeat_interval, heartbeat_timeout);
    o.scheduler_toml += fmt::format("drain_timeout_seconds = {}\n", drain_timeout);
    o.workers = workers;
    o.spare_worker_keys = kSpareWorkerKeys;  // for the workers a test starts later
    o.worker_timeout_seconds = worker_timeout;
    o.ready_timeout_seconds = 60;
    o.stop_grace_seconds = 3.0;
    cluster_ = std::make_unique<::tessera::testing::DaemonCluster>(std::move(o));
    const auto t0 = Clock::now();
    const Status started = cluster_->Start();
    port_ = cluster_->api_port();
    ASSERT_TRUE(started.ok()) << started.ToString();
    std::printf("cluster tp=%d pp=%d with %d workers ready in %.2f s\n", tp, pp, workers,
                Since(t0));
  }

  void TearDown() override {
    if (cluster_) cluster_->Stop();
  }

  std::string CoordinatorLog() const { return cluster_->CoordinatorLog(); }
  json Get(const std::string& path) const {
    auto r = HttpCall(port_, "GET", path, "", kToken);
    EXPECT_EQ(r.status, 200) << path << ": " << r.body;
    return json::parse(r.body, nullptr, false);
  }
  HttpReply Post(const std::string& path, const json& body) const {
    return HttpCall(port_, "POST", path, body.dump(), kToken);
  }
  pid_t PidOfRank(int world_rank) const {
    const json plan = Get("/admin/plan");
    std::string id;
    for (const json& r : plan["ranks"])
      if (r["world_rank"] == world_rank) id = r["worker"];
    for (const json& w : json(Get("/admin/cluster")["workers"]))
      if (w["id"] == id && w["state"] == "alive") return w["pid"].get<pid_t>();
    return -1;
  }
  // Seconds from `since` until /admin/cluster shows worker `id` failed, or
  // -1 when it does not within `limit` seconds.
  double SecondsUntilFailed(const std::string& id, Clock::time_point since, double limit) const {
    while (Since(since) < limit) {
      for (const json& w : json(Get("/admin/cluster")["workers"]))
        if (w["id"] == id && w["state"] == "failed") return Since(since);
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return -1;
  }
  std::string WorkerOfRank(int world_rank) const {
    for (const json& r : json(Get("/admin/plan")["ranks"]))
      if (r["world_rank"] == world_rank) return r["worker"];
    return "";
  }
  // Waits until GET /admin/plan shows at least `version` with the cluster
  // ready; returns the plan. The plan is read between two /admin/cluster
  // reads that both show no re-plan running and the same count of them, so
  // it is not a snapshot taken mid re-plan: a re-plan bumps plan_version
  // when it starts loading and writes its report (history) when it ends.
  json WaitForPlan(uint64_t version, double seconds = 40) const {
    const auto t0 = Clock::now();
    json plan;
    while (Since(t0) < seconds) {
      const json before = Get("/admin/cluster");
      if (!before["reconfiguring"].get<bool>() && HttpCall(port_, "GET", "/readyz").status == 200) {
        plan = Get("/admin/plan");
        const json after = Get("/admin/cluster");
        if (plan["plan_version"].get<uint64_t>() >= version &&
            !after["reconfiguring"].get<bool>() &&
            after["reconfigurations_total"] == before["reconfigurations_total"])
          return plan;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    ADD_FAILURE() << "plan " << version << " not serving after " << seconds
                  << " s; last: " << plan.dump() << "\n"
                  << CoordinatorLog();
    return plan;
  }

  // The undisturbed greedy outputs.
  std::vector<std::string> Reference() const {
    std::vector<std::string> want(kRequests);
    std::vector<std::thread> ts;
    for (int i = 0; i < kRequests; ++i)
      ts.emplace_back([&, i] {
        auto r = HttpCall(port_, "POST", "/v1/completions", Request(i, false).dump());
        EXPECT_EQ(r.status, 200) << r.body;
        const json j = json::parse(r.body, nullptr, false);
        if (!j.is_discarded() && j.contains("choices"))
          want[static_cast<size_t>(i)] = j["choices"][0]["text"];
      });
    for (auto& t : ts) t.join();
    return want;
  }

  void StartStreams() {
    for (int i = 0; i < kRequests; ++i) {
      streams_[i] = std::make_unique<Stream>();
      Stream* s = streams_[i].get();
      const int port = port_;
      s->thread = std::thread([s, port, i] { s->Run(port, Request(i, true).dump()); });
    }
  }
  // Waits until every stream has `n` token events; false if one ended first.
  bool StreamsHaveTokens(int n) const {
    const auto t0 = Clock::now();
    while (Since(t0) < 30) {
      bool all = true;
      for (const auto& s : streams_) all &= s->events.load() >= n;
      if (all) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return false;
  }
  // Joins the streams and checks each against the reference.
  void ExpectStreamsMatch(const std::vector<std::string>& want) {
    for (int i = 0; i < kRequests; ++i) {
      Stream& s = *streams_[i];
      s.thread.join();
      EXPECT_EQ(s.error, "") << "request " << i;
      EXPECT_EQ(s.done_markers, 1) << "request " << i;
      EXPECT_EQ(s.finish_reason, "length") << "request " << i;
      EXPECT_EQ(s.text, want[static_cast<size_t>(i)]) << "request " << i;
    }
  }
  static void PrintReplan(const char* what, const json& report) {
    std::printf(
        "%s: plan %d %s; time to detect %.2f s, drain %.2f s, re-plan and reload %.2f s "
        "(total %.2f s), requests re-queued %d, weights reused %lld of %lld bytes\n",
        what, report.value("plan_version", 0), report["layout"].dump().c_str(),
        report.value("detect_seconds", 0.0), report.value("drain_seconds", 0.0),
        report.value("load_seconds", 0.0),
        report.value("total_seconds", report.value("load_seconds", 0.0)),
        report.value("requeued_requests", 0),
        static_cast<long long>(report.value("reused_weight_bytes", int64_t{0})),
        static_cast<long long>(report.value("weight_bytes", int64_t{0})));
    std::fflush(stdout);
  }

  std::unique_ptr<::tessera::testing::DaemonCluster> cluster_;
  int port_ = 0;  // the coordinator's API port (a restarted one's once restarted)
  std::unique_ptr<Stream> streams_[kRequests];
};

// kill -9 a worker mid-generation at tp=2 x pp=2 with a spare: the spare
// takes its rank, the survivors keep (and reuse) theirs, every stream
// completes exactly.
TEST_F(Cluster, KilledWorkerIsReplacedBySpareAndStreamsContinueExactly) {
  Launch(2, 2, 5, 10.0);
  const std::vector<std::string> want = Reference();
  const std::string victim = WorkerOfRank(3);
  const pid_t pid = PidOfRank(3);
  ASSERT_GT(pid, 0);
  StartStreams();
  ASSERT_TRUE(StreamsHaveTokens(3));
  const auto killed = Clock::now();
  kill(pid, SIGKILL);
  ExpectStreamsMatch(want);
  std::printf("streams completed %.2f s after the kill\n", Since(killed));
  const json plan = WaitForPlan(2);
  EXPECT_EQ(plan["tp"], 2);
  EXPECT_EQ(plan["pp"], 2);
  ASSERT_EQ(plan["ranks"].size(), 4u);
  for (const json& r : plan["ranks"]) EXPECT_NE(r["worker"], victim);
  const json report = plan["history"].back();
  PrintReplan("kill -9 rank 3 (spare available)", report);
  EXPECT_GT(report["requeued_requests"].get<int>(), 0) << report.dump();
  EXPECT_LT(report["detect_seconds"].get<double>(), 3.0) << report.dump();
  // Three ranks stayed on their workers and reused every slice.
  EXPECT_GE(report["reused_weight_bytes"].get<int64_t>(), report["weight_bytes"].get<int64_t>() / 2)
      << report.dump();
  bool failed = false;
  for (const json& w : json(Get("/admin/cluster")["workers"])) {
    if (w["id"] != victim) continue;
    failed = w["state"] == "failed";
    // Not the "ready" it last reported: it reports nothing any more.
    EXPECT_EQ(w["worker_state"], "lost") << w.dump();
  }
  EXPECT_TRUE(failed);
  // Still serving.
  auto r = HttpCall(port_, "POST", "/v1/completions", Request(0, false).dump());
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(json::parse(r.body)["choices"][0]["text"], want[0]);
}

// kill -9 with no spare: the re-plan shrinks to what the 3 survivors can run
// (tp=2 x pp=1, docs/operations.md), the streams complete exactly; a
// restarted worker re-registers and the next re-plan restores tp=2 x pp=2.
TEST_F(Cluster, KilledWorkerShrinksThePlanAndARestartedWorkerRestoresIt) {
  Launch(2, 2, 4, 10.0);
  const std::vector<std::string> want = Reference();
  const pid_t pid = PidOfRank(1);
  ASSERT_GT(pid, 0);
  StartStreams();
  ASSERT_TRUE(StreamsHaveTokens(3));
  kill(pid, SIGKILL);
  ExpectStreamsMatch(want);
  json plan = WaitForPlan(2);
  EXPECT_EQ(plan["tp"], 2);
  EXPECT_EQ(plan["pp"], 1);
  EXPECT_EQ(plan["wanted"]["pp"], 2);
  PrintReplan("kill -9 rank 1 (no spare)", plan["history"].back());
  EXPECT_GT(plan["history"].back()["requeued_requests"].get<int>(), 0);
  // Restart: the new worker registers and the layout grows back.
  const auto restarted = Clock::now();
  cluster_->StartWorker();
  plan = WaitForPlan(plan["plan_version"].get<uint64_t>() + 1);
  EXPECT_EQ(plan["tp"], 2);
  EXPECT_EQ(plan["pp"], 2);
  std::printf("restarted worker in the plan after %.2f s\n", Since(restarted));
  PrintReplan("worker restarted", plan["history"].back());
  auto r = HttpCall(port_, "POST", "/v1/completions", Request(2, false).dump());
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(json::parse(r.body)["choices"][0]["text"], want[2]);
}

// Worker ids are "<host>:<device>" (tessera-worker --device), whatever the
// order the workers register in, and a worker restarted on the same device
// gets its id back: /admin/cluster lists it once, alive, under that id.
TEST_F(Cluster, AWorkerIsNamedByHostAndDeviceAndARestartKeepsItsId) {
  Launch(1, 2, 2, 10.0);
  ::tessera::testing::WorkerSpec spare;
  spare.device = 7;  // registers third, on device 7
  const pid_t spare_pid = cluster_->StartWorker(spare);
  // Polls /admin/cluster until `done` holds for its workers, up to 30 s.
  auto wait_workers = [&](const std::function<bool(const json&)>& done) {
    const auto t0 = Clock::now();
    json workers;
    while (Since(t0) < 30) {
      workers = Get("/admin/cluster")["workers"];
      if (done(workers)) return workers;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ADD_FAILURE() << "/admin/cluster: " << workers.dump() << "\n" << CoordinatorLog();
    return workers;
  };
  json workers = wait_workers([&](const json& ws) {
    for (const json& w : ws)
      if (w["pid"] == spare_pid && w["worker_state"] != "registered") return true;
    return false;
  });
  ASSERT_EQ(workers.size(), 3u) << workers.dump();
  for (const json& w : workers) {
    const std::string host = w["host"];
    EXPECT_EQ(w["id"], host + ":" + std::to_string(w["devices"][0]["index"].get<int>()))
        << w.dump();
  }

  const std::string victim = WorkerOfRank(1);
  const pid_t pid = PidOfRank(1);
  int index = -1;  // the victim's worker index (its device and its key)
  for (int i = 0; i < cluster_->workers_started(); ++i)
    if (cluster_->worker_pid(i) == pid) index = i;
  ASSERT_GE(index, 0);
  kill(pid, SIGKILL);
  ASSERT_GE(SecondsUntilFailed(victim, Clock::now(), 30), 0) << CoordinatorLog();
  WaitForPlan(2);

  ::tessera::testing::WorkerSpec again;
  again.device = index;
  again.key = index;  // its CURVE key is free once it was declared lost
  const pid_t restarted = cluster_->StartWorker(again);
  workers = wait_workers([&](const json& ws) {
    for (const json& w : ws)
      if (w["pid"] == restarted && w["state"] == "alive") return true;
    return false;
  });
  int listed = 0;
  for (const json& w : workers) {
    if (w["id"] != victim) continue;
    ++listed;
    EXPECT_EQ(w["pid"], restarted) << w.dump();
    EXPECT_EQ(w["state"], "alive") << w.dump();
  }
  EXPECT_EQ(listed, 1) << workers.dump();
  EXPECT_EQ(workers.size(), 3u) << workers.dump();
}

// SIGSTOP a worker: its heartbeats stop, it is declared failed within the
// heartbeat timeout, and the plan moves to the spare.
TEST_F(Cluster, StoppedWorkerIsDetectedAsHungAndReplaced) {
  Launch(2, 2, 5, 10.0);
  const std::vector<std::string> want = Reference();
  const std::string victim = WorkerOfRank(1);
  const pid_t pid = PidOfRank(1);
  ASSERT_GT(pid, 0);
  StartStreams();
  ASSERT_TRUE(StreamsHaveTokens(3));
  const auto stopped = Clock::now();
  kill(pid, SIGSTOP);
  double detected = -1;
  while (Since(stopped) < 10 && detected < 0) {
    for (const json& w : json(Get("/admin/cluster")["workers"]))
      if (w["id"] == victim && w["state"] == "failed") detected = Since(stopped);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::printf("SIGSTOPped worker declared failed after %.2f s (heartbeat timeout 1.0 s)\n",
              detected);
  ASSERT_GE(detected, 0) << CoordinatorLog();
  EXPECT_LT(detected, 1.0 + 2.0);  // the timeout plus scheduling slack on a loaded host
  ExpectStreamsMatch(want);
  const json plan = WaitForPlan(2);
  for (const json& r : plan["ranks"]) EXPECT_NE(r["worker"], victim);
  const json report = plan["history"].back();
  PrintReplan("SIGSTOP rank 1 (spare available)", report);
  // Detected by its silence: the time to detect runs from its last message,
  // so it is at least the heartbeat timeout (it read ~0 when measured from
  // the declaration).
  EXPECT_GE(report["detect_seconds"].get<double>(), 1.0) << report.dump();
  // (Its last heartbeat came up to an interval before the stop; the re-plan
  // starts a moment after the test saw the loss.)
  EXPECT_LE(report["detect_seconds"].get<double>(), detected + 2.0) << report.dump();
  // The spare takes rank 1; the three others keep their ranks and weights.
  EXPECT_GE(report["reused_weight_bytes"].get<int64_t>(), report["weight_bytes"].get<int64_t>() / 2)
      << report.dump();
}

// POST /admin/plan: dry run, refusals (400, running plan untouched), a
// change under load with the streams continuing exactly, 409 for a
// concurrent change, and full weight reuse when the layout stays.
TEST_F(Cluster, AdminPlanChangesTheLayoutUnderLoad) {
  Launch(2, 2, 4, 0.3);
  const std::vector<std::string> want = Reference();
  // Dry run: what would happen, nothing done.
  auto dry = Post("/admin/plan?dry_run=true", {{"tp", 1}, {"pp", 2}});
  ASSERT_EQ(dry.status, 200) << dry.body;
  const json d = json::parse(dry.body);
  EXPECT_TRUE(d["dry_run"].get<bool>());
  EXPECT_EQ(d["to"]["tp"], 1);
  EXPECT_EQ(d["from"]["tp"], 2);
  EXPECT_EQ(d["ranks"].size(), 2u);
  EXPECT_EQ(d["plan_version"], 2);
  EXPECT_EQ(d["workers_released"].size(), 2u);
  EXPECT_EQ(Get("/admin/plan")["plan_version"], 1);
  // Refusals name the reason; the plan stays.
  struct Bad {
    json body;
    int status;
    const char* says;
  };
  for (const Bad& b : std::vector<Bad>{
           {{{"tp", 3}, {"pp", 1}}, 400, "tp"},
           {{{"tp", 1}, {"pp", 2}, {"layers_per_stage", {2, 1}}}, 400, "layers_per_stage"},
           {{{"tp", {2, 1}}, {"pp", 3}}, 400, "pp"},
           {{{"tp", {3, 1}}}, 400, "stage 0"},
           {{{"tp", 4}, {"pp", 2}}, 400, "needs 8 workers"},
           {{{"auto", true}, {"objective", "cost"}}, 400, "objective"}}) {
    auto r = Post("/admin/plan", b.body);
    EXPECT_EQ(r.status, b.status) << b.body.dump() << ": " << r.body;
    EXPECT_NE(r.body.find(b.says), std::string::npos) << b.body.dump() << ": " << r.body;
  }
  // A misspelt dry run is refused, never applied; a bare ?dry_run is one.
  for (const char* target : {"/admin/plan?dry_run=yes", "/admin/plan?dryrun=true"}) {
    auto r = Post(target, {{"tp", 1}, {"pp", 2}});
    EXPECT_EQ(r.status, 400) << target << ": " << r.body;
    EXPECT_NE(r.body.find("dry"), std::string::npos) << target << ": " << r.body;
  }
  auto bare = Post("/admin/plan?dry_run", {{"tp", 1}, {"pp", 2}});
  ASSERT_EQ(bare.status, 200) << bare.body;
  EXPECT_TRUE(json::parse(bare.body)["dry_run"].get<bool>());
  EXPECT_EQ(HttpCall(port_, "POST", "/admin/plan", R"({"tp":1,"pp":2})").status, 401);
  json plan = Get("/admin/plan");
  EXPECT_EQ(plan["plan_version"], 1);
  EXPECT_EQ(plan["tp"], 2);
  // The change under load; a second request meanwhile gets 409.
  StartStreams();
  ASSERT_TRUE(StreamsHaveTokens(3));
  HttpReply change;
  std::thread admin([&] {
    change = Post("/admin/plan", {{"tp", 1}, {"pp", 2}, {"layers_per_stage", {1, 1}}});
  });
  const auto asked = Clock::now();
  while (Since(asked) < 10 && !Get("/admin/cluster")["reconfiguring"].get<bool>())
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  auto conflict = Post("/admin/plan", {{"tp", 2}, {"pp", 1}});
  EXPECT_EQ(conflict.status, 409) << conflict.body;
  admin.join();
  ASSERT_EQ(change.status, 200) << change.body << CoordinatorLog();
  const json report = json::parse(change.body);
  PrintReplan("POST /admin/plan tp=2 pp=2 -> tp=1 pp=2 under load", report);
  EXPECT_EQ(report["plan_version"], 2);
  ExpectStreamsMatch(want);
  plan = Get("/admin/plan");
  EXPECT_EQ(plan["tp"], 1);
  EXPECT_EQ(plan["pp"], 2);
  EXPECT_EQ(plan["ranks"].size(), 2u);
  // The prediction for the new layout's KV share is made too, and is what
  // each rank allocated.
  for (const json& rank : plan["ranks"]) {
    EXPECT_GT(rank["predicted_kv_bytes"].get<int64_t>(), 0) << rank.dump();
    EXPECT_EQ(rank["predicted_kv_bytes"], rank["kv_bytes"]) << rank.dump();
  }
  // The same layout again: every slice is reused, nothing read.
  auto same = Post("/admin/plan", {{"tp", 1}, {"pp", 2}});
  ASSERT_EQ(same.status, 200) << same.body;
  const json again = json::parse(same.body);
  PrintReplan("POST /admin/plan tp=1 pp=2 again", again);
  EXPECT_EQ(again["reused_weight_bytes"], again["weight_bytes"]);
  EXPECT_GT(again["weight_bytes"].get<int64_t>(), 0);
  auto r = HttpCall(port_, "POST", "/v1/completions", Request(4, false).dump());
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(json::parse(r.body)["choices"][0]["text"], want[4]);
  // A tp per stage: tp=[2,1] on 3 of the 4 workers gives the same tokens.
  auto mixed = Post("/admin/plan", {{"tp", {2, 1}}});
  ASSERT_EQ(mixed.status, 200) << mixed.body << CoordinatorLog();
  const json mixed_report = json::parse(mixed.body);
  PrintReplan("POST /admin/plan tp=1 pp=2 -> tp=[2,1]", mixed_report);
  EXPECT_EQ(mixed_report["layout"]["tp_per_stage"], json::array({2, 1}));
  plan = Get("/admin/plan");
  EXPECT_EQ(plan["plan_version"], 4);
  EXPECT_EQ(plan["tp"], 0);
  EXPECT_EQ(plan["tp_per_stage"], json::array({2, 1}));
  EXPECT_EQ(plan["wanted"]["tp_per_stage"], json::array({2, 1}));
  EXPECT_EQ(plan["ranks"].size(), 3u);
  r = HttpCall(port_, "POST", "/v1/completions", Request(4, false).dump());
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(json::parse(r.body)["choices"][0]["text"], want[4]);
  // {"auto": true}: the placement planner chooses over the 4 workers' topology
  // reports; the dry run names its layout, the change runs it and
  // /admin/plan explains it.
  auto auto_dry = Post("/admin/plan?dry_run=true", {{"auto", true}, {"objective", "throughput"}});
  ASSERT_EQ(auto_dry.status, 200) << auto_dry.body << CoordinatorLog();
  const json planned = json::parse(auto_dry.body)["to"];
  auto automatic = Post("/admin/plan", {{"auto", true}, {"objective", "throughput"}});
  ASSERT_EQ(automatic.status, 200) << automatic.body << CoordinatorLog();
  plan = Get("/admin/plan");
  EXPECT_EQ(plan["plan_version"], 5);
  EXPECT_EQ(plan["tp_per_stage"], planned["tp_per_stage"]) << plan.dump();
  EXPECT_EQ(plan["layers_per_stage"], planned["layers_per_stage"]);
  ASSERT_TRUE(plan.contains("planner")) << plan.dump();
  EXPECT_EQ(plan["planner"]["objective"], "throughput");
  int ranks = 0;
  for (const json& t : planned["tp_per_stage"]) ranks += t.get<int>();
  EXPECT_EQ(plan["ranks"].size(), static_cast<size_t>(ranks));
  r = HttpCall(port_, "POST", "/v1/completions", Request(4, false).dump());
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(json::parse(r.body)["choices"][0]["text"], want[4]);
  // The same auto plan again, dry: the planner, deterministic over the same workers, picks the
  // running layout on the same workers, so the dry run says every layer is kept (the auto path
  // filled in no reuse before, so it said 0 kept and everything loaded).
  auto auto_again = Post("/admin/plan?dry_run=true", {{"auto", true}, {"objective", "throughput"}});
  ASSERT_EQ(auto_again.status, 200) << auto_again.body;
  const json again_change = json::parse(auto_again.body);
  EXPECT_EQ(again_change["to"], planned) << auto_again.body;
  ASSERT_EQ(again_change["ranks"].size(), plan["ranks"].size()) << auto_again.body;
  int layers = 0;
  for (size_t i = 0; i < plan["ranks"].size(); ++i) {
    const json& proposed = again_change["ranks"][i];
    EXPECT_EQ(proposed["worker"], plan["ranks"][i]["worker"]) << auto_again.body;
    EXPECT_EQ(proposed["reused_layers"], proposed["layers"]) << auto_again.body;
    layers += proposed["layers"][1].get<int>() - proposed["layers"][0].get<int>();
  }
  EXPECT_EQ(again_change["layers_reused"], layers) << auto_again.body;
  EXPECT_EQ(again_change["layers_loaded"], 0) << auto_again.body;
  // An explicit layout afterwards drops the planner's explanation.
  ASSERT_EQ(Post("/admin/plan", {{"tp", {2, 1}}}).status, 200);
  EXPECT_FALSE(Get("/admin/plan").contains("planner"));
  // The metrics follow the changes: plan 6, five re-plans, no fault, the
  // re-queued sequences as /admin/cluster counts them.
  const json cluster = Get("/admin/cluster");
  auto metrics = HttpCall(port_, "GET", "/metrics", "");
  ASSERT_EQ(metrics.status, 200);
  EXPECT_NE(metrics.body.find("\ntessera_plan_version 6\n"), std::string::npos) << metrics.body;
  EXPECT_NE(metrics.body.find("\ntessera_reconfigurations_total 5\n"), std::string::npos)
      << metrics.body;
  EXPECT_NE(metrics.body.find("\ntessera_faults_total 0\n"), std::string::npos) << metrics.body;
  EXPECT_NE(metrics.body.find("\ntessera_requeued_requests_total " +
                              std::to_string(cluster["requeued_requests_total"].get<int>()) + "\n"),
            std::string::npos)
      << metrics.body;
}

// Drain / undrain: a drained worker leaves the placement (the spare takes
// its rank); two drained shrink the layout; undraining grows it back.
TEST_F(Cluster, DrainAndUndrainWorkers) {
  Launch(2, 2, 5, 1.0);
  const std::vector<std::string> want = Reference();
  EXPECT_EQ(Post("/admin/workers/nobody/drain", json::object()).status, 404);
  const std::string b = WorkerOfRank(1);
  auto r = Post("/admin/workers/" + b + "/drain", json::object());
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_TRUE(json::parse(r.body)["replan"].get<bool>());
  json plan = WaitForPlan(2);
  for (const json& x : plan["ranks"]) EXPECT_NE(x["worker"], b);
  EXPECT_EQ(plan["ranks"].size(), 4u);
  bool drained = false;
  for (const json& w : json(Get("/admin/cluster")["workers"]))
    drained |= w["id"] == b && w["state"] == "drained";
  EXPECT_TRUE(drained);
  PrintReplan("drain a worker of the plan", plan["history"].back());
  // A second drained worker leaves 3: tp=2 x pp=1.
  const std::string c = WorkerOfRank(2);
  ASSERT_EQ(Post("/admin/workers/" + c + "/drain", json::object()).status, 200);
  plan = WaitForPlan(3);
  EXPECT_EQ(plan["pp"], 1);
  // Undrain it: 4 usable again, the wanted tp=2 x pp=2 comes back.
  ASSERT_EQ(Post("/admin/workers/" + c + "/undrain", json::object()).status, 200);
  plan = WaitForPlan(4);
  EXPECT_EQ(plan["tp"], 2);
  EXPECT_EQ(plan["pp"], 2);
  // Undraining b changes nothing: every rank is placed already.
  ASSERT_EQ(Post("/admin/workers/" + b + "/undrain", json::object()).status, 200);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  EXPECT_EQ(Get("/admin/plan")["plan_version"], 4);
  for (const json& w : json(Get("/admin/cluster")["workers"]))
    if (w["id"] == b) {
      EXPECT_EQ(w["state"], "alive");
    }
  auto done = HttpCall(port_, "POST", "/v1/completions", Request(1, false).dump());
  ASSERT_EQ(done.status, 200) << done.body;
  EXPECT_EQ(json::parse(done.body)["choices"][0]["text"], want[1]);
}

// Restart the coordinator under load: the workers register again with the
// shard they hold and the new coordinator adopts that plan (the layout set
// through the admin API, not the config's; the same ranks, version + 1), so
// no worker reads its weights again. Requests in flight on the killed
// coordinator die with their HTTP connections; later ones match the
// reference.
TEST_F(Cluster, RestartedCoordinatorAdoptsThePlanTheWorkersHold) {
  Launch(2, 2, 4, 10.0);
  const std::vector<std::string> want = Reference();
  auto change = Post("/admin/plan", {{"tp", 1}, {"pp", 2}});
  ASSERT_EQ(change.status, 200) << change.body;
  const json before = Get("/admin/plan");
  StartStreams();
  ASSERT_TRUE(StreamsHaveTokens(3));
  cluster_->KillCoordinator();
  int cut = 0;
  for (auto& st : streams_) {
    st->thread.join();
    cut += st->done_markers == 0;
  }
  std::printf("requests cut off with the coordinator: %d of %d\n", cut, kRequests);
  const auto restarted = Clock::now();
  // The workers reconnect to the control port they know: the new
  // coordinator binds that one (the API port it may pick anew).
  const Status ready = cluster_->RestartCoordinatorAndWaitReady(30);
  ASSERT_TRUE(ready.ok()) << ready.ToString();
  port_ = cluster_->api_port();
  std::printf("restarted coordinator serving after %.2f s\n", Since(restarted));
  const json plan = Get("/admin/plan");
  EXPECT_EQ(plan["plan_version"], before["plan_version"].get<uint64_t>() + 1);
  EXPECT_EQ(plan["tp"], 1);
  EXPECT_EQ(plan["pp"], 2);
  ASSERT_EQ(plan["ranks"].size(), before["ranks"].size());
  for (size_t i = 0; i < plan["ranks"].size(); ++i)
    EXPECT_EQ(plan["ranks"][i]["worker"], before["ranks"][i]["worker"]);
  ASSERT_EQ(plan["history"].size(), 1u);
  const json report = plan["history"][0];
  PrintReplan("coordinator restarted", report);
  EXPECT_NE(report["reason"].get<std::string>().find("adopted"), std::string::npos);
  EXPECT_EQ(report["reused_weight_bytes"], report["weight_bytes"]);
  EXPECT_EQ(Reference(), want);
}

// SIGSTOP a stage-0 worker, then SIGCONT it just after it was declared lost
// (the resumed worker still runs the old plan and keeps its next stage's
// receive alive with keepalives): the lost worker is fenced, every receive
// wakes on the plan change, the spare takes the rank, and the cluster serves
// again within the heartbeat timeout + 3 s with every stream exact.
TEST_F(Cluster, AStoppedWorkerThatResumesAfterBeingDeclaredLostIsFenced) {
  // The timings of the acceptance run: lost after 3 s, collectives bounded at
  // 5 s, so the resumed worker's keepalives reach its next stage before that
  // stage's receive times out.
  const double heartbeat_timeout = 3.0;
  Launch(2, 2, 5, 10.0, 0.5, heartbeat_timeout, 5.0);
  const std::vector<std::string> want = Reference();
  const std::string victim = WorkerOfRank(1);  // stage 0, tp_rank 1
  const pid_t pid = PidOfRank(1);
  ASSERT_GT(pid, 0);
  StartStreams();
  ASSERT_TRUE(StreamsHaveTokens(3));
  const auto stopped = Clock::now();
  kill(pid, SIGSTOP);
  ASSERT_GE(SecondsUntilFailed(victim, stopped, heartbeat_timeout + 5), 0) << CoordinatorLog();
  // Resume it half a second later, as the acceptance run did (SIGCONT at
  // 3.5 s): the re-plan has placed the spare by then, and the resumed worker
  // still runs the old plan.
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  kill(pid, SIGCONT);
  std::printf("SIGCONT %.2f s after SIGSTOP, just after the worker was declared lost\n",
              Since(stopped));
  // Serving again: a new plan without the victim, within heartbeat timeout
  // + 3 s of the stop.
  const json plan = WaitForPlan(2, 90);
  const double serving = Since(stopped);
  std::printf("serving plan %d again %.2f s after SIGSTOP\n", plan.value("plan_version", 0),
              serving);
  for (const json& r : plan["ranks"]) EXPECT_NE(r["worker"], victim) << CoordinatorLog();
  EXPECT_LE(serving, heartbeat_timeout + 3.0) << CoordinatorLog();
  ExpectStreamsMatch(want);
  EXPECT_EQ(Reference(), want);
}

// kill -9 a worker with a long heartbeat timeout (6 s): its peers see the
// connection break within milliseconds and say so in their Errors, so it is
// declared lost (within 1 s) and the spare takes its rank long before its
// heartbeats would have timed out, and the re-plan after the fault waits for
// nothing. (With 3 s, the spare's load alone took 3.0-3.1 s on a 2-core
// machine at load 12.)
TEST_F(Cluster, AKilledWorkerIsDeclaredLostWhenItsPeersSeeItsConnectionBreak) {
  const double heartbeat_timeout = 6.0;
  Launch(2, 2, 5, 10.0, 0.5, heartbeat_timeout, 5.0);
  const std::vector<std::string> want = Reference();
  const std::string victim = WorkerOfRank(3);  // stage 1, tp_rank 1
  const pid_t pid = PidOfRank(3);
  ASSERT_GT(pid, 0);
  StartStreams();
  ASSERT_TRUE(StreamsHaveTokens(3));
  const auto killed = Clock::now();
  kill(pid, SIGKILL);
  const double declared = SecondsUntilFailed(victim, killed, heartbeat_timeout + 5);
  std::printf("killed worker declared lost after %.2f s (heartbeat timeout %.1f s)\n", declared,
              heartbeat_timeout);
  ASSERT_GE(declared, 0) << CoordinatorLog();
  EXPECT_LT(declared, 1.0) << CoordinatorLog();
  const json plan = WaitForPlan(2, 60);
  const double serving = Since(killed);
  std::printf("serving plan %d again %.2f s after kill -9\n", plan.value("plan_version", 0),
              serving);
  EXPECT_LT(serving, heartbeat_timeout) << CoordinatorLog();
  for (const json& r : plan["ranks"]) EXPECT_NE(r["worker"], victim);
  const json report = plan["history"].back();
  PrintReplan("kill -9 rank 3 (6 s heartbeat timeout)", report);
  EXPECT_LT(report.value("drain_seconds", 99.0), 0.1) << report.dump();
  ExpectStreamsMatch(want);
}

// kill -9 the last pipeline stage's worker while the cluster is idle, with a
// long heartbeat timeout (6 s): no peer waits on a receive from the last
// stage (its tokens go to the coordinator), so no survivor reports it at
// once; the coordinator sees its control connection close and declares it
// lost after the 0.2 s grace (the replica stops being ready), the spare
// takes the stage, and the time to detect is measured from the close. (It
// took the heartbeat timeout, or stage 0's next keepalive, before, and
// detect_seconds read ~0 after a heartbeat loss.)
TEST_F(Cluster, AKilledLastStageWorkerIsDeclaredLostWhenItsConnectionCloses) {
  const double heartbeat_timeout = 6.0;
  // The workers' default collective timeout (30 s): an idle stage 0 sends
  // its keepalive down the pipeline every 10 s, and only a send that fails
  // could have named the dead stage before.
  Launch(1, 2, 3, 10.0, 0.5, heartbeat_timeout, 30.0);
  const std::vector<std::string> want = Reference();
  const std::string victim = WorkerOfRank(1);  // stage 1 of 2
  const pid_t pid = PidOfRank(1);
  ASSERT_GT(pid, 0);
  ASSERT_EQ(HttpCall(port_, "GET", "/readyz").status, 200);
  const auto killed = Clock::now();
  kill(pid, SIGKILL);
  const double declared = SecondsUntilFailed(victim, killed, heartbeat_timeout + 5);
  std::printf("killed last-stage worker declared lost after %.2f s (heartbeat timeout %.1f s)\n",
              declared, heartbeat_timeout);
  ASSERT_GE(declared, 0) << CoordinatorLog();
  EXPECT_LT(declared, 1.0) << CoordinatorLog();
  const json plan = WaitForPlan(2, 60);
  const double serving = Since(killed);
  std::printf("serving plan %d again %.2f s after kill -9\n", plan.value("plan_version", 0),
              serving);
  EXPECT_LT(serving, heartbeat_timeout) << CoordinatorLog();
  for (const json& r : plan["ranks"]) EXPECT_NE(r["worker"], victim);
  const json report = plan["history"].back();
  PrintReplan("kill -9 the last stage (6 s heartbeat timeout)", report);
  // From the connection closing to the loss: at least the grace, and far
  // from the heartbeat timeout a loss by silence would count.
  EXPECT_GE(report["detect_seconds"].get<double>(), 0.15) << report.dump();
  EXPECT_LT(report["detect_seconds"].get<double>(), heartbeat_timeout / 2) << report.dump();
  EXPECT_NE(CoordinatorLog().find("worker " + victim + " lost (its control connection closed)"),
            std::string::npos)
      << CoordinatorLog();
  EXPECT_EQ(Reference(), want);
}

}  // namespace
}  // namespace tessera
