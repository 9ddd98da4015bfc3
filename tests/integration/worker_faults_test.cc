// Faults of workers that stay alive (issue #31), on real daemons with real
// CURVE keys: tessera-coordinator and tessera-worker processes on loopback,
// the fixture model llama_gqa_f32 at tp=2 x pp=2, short heartbeats (0.2 s,
// lost after 1 s). The faulty workers are tessera-worker-failpoints, the
// test build's worker (worker/daemon/worker_failpoints.h).
//
//  - A worker that registers (under an allowed key) and heartbeats but
//    never loads, registered before the real spare: after a kill -9 of a
//    serving worker, the first re-plan attempt gives it the lost rank; at
//    heartbeat.load_timeout_seconds it is named, excluded with a back-off
//    (/admin/cluster, tessera_worker_exclusions_total), and the next
//    attempt puts the rank on the spare: serving again within the load
//    deadline + the heartbeat timeout + 2 s, with the reference output.
//  - A lone worker (tp=1 x pp=1) whose step hangs is excluded and its
//    replica degraded; when the back-off ends the replica re-plans onto it
//    by itself and serves again.
//  - A first placement that fails (its worker never loads) re-plans like a
//    later fault: onto a spare that registered meanwhile, or, with no
//    spare, onto the same worker when its exclusion's back-off ends.
//  - Registrations no real host can make (a GPU of 1 TiB; a CUDA device in
//    a deployment of worker.backend = "cpu") are refused, naming the field,
//    and the cluster keeps serving.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <future>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>

#include "common/net/http_client.h"
#include "support/daemon_cluster.h"

namespace tessera {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;
using ::tessera::testing::DaemonCluster;
using ::tessera::testing::DaemonClusterOptions;
using ::tessera::testing::WorkerSpec;

constexpr const char* kToken = "s3cret";
constexpr double kHeartbeatTimeout = 1.0;
constexpr double kLoadTimeout = 4.0;

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

std::string Completion(int i) {
  return json{{"model", "llama_gqa_f32"},
              {"prompt", std::vector<int>{5 + 7 * i, 17, 42}},
              {"max_tokens", 8},
              {"temperature", 0},
              {"ignore_eos", true}}
      .dump();
}

class WorkerFaults : public ::testing::Test {
 protected:
  DaemonClusterOptions Options(int workers) {
    DaemonClusterOptions o;
    o.temp_prefix = "tessera-faults";
    o.model_toml = "";
    o.admin_toml = fmt::format("port = 0\ntoken = \"{}\"\n", kToken);
    o.heartbeat_toml =
        fmt::format("interval_seconds = 0.2\ntimeout_seconds = {}\nload_timeout_seconds = {}\n",
                    kHeartbeatTimeout, kLoadTimeout);
    o.workers = workers;
    o.spare_worker_keys = 4;
    o.worker_timeout_seconds = 3.0;
    o.ready_timeout_seconds = 60;
    o.stop_grace_seconds = 3.0;
    return o;
  }
  void Launch(DaemonClusterOptions o) {
    cluster_ = std::make_unique<DaemonCluster>(std::move(o));
    const Status started = cluster_->Start();
    port_ = cluster_->api_port();
    ASSERT_TRUE(started.ok()) << started.ToString();
  }
  void TearDown() override {
    if (cluster_) cluster_->Stop();
  }
  json Get(const std::string& path) const {
    auto r = HttpCall(port_, "GET", path, "", kToken);
    EXPECT_EQ(r.status, 200) << path << ": " << r.body;
    return json::parse(r.body, nullptr, false);
  }
  // The /admin/cluster record of the worker process `pid` (null when none).
  json WorkerOfPid(pid_t pid) const {
    for (const json& w : json(Get("/admin/cluster")["workers"]))
      if (w["pid"].get<pid_t>() == pid) return w;
    return nullptr;
  }
  // Waits until worker process `pid` is registered and alive; its id.
  std::string AwaitRegistered(pid_t pid) const {
    const auto t0 = Clock::now();
    while (Since(t0) < 30) {
      const json w = WorkerOfPid(pid);
      if (!w.is_null() && w["state"] == "alive") return w["id"];
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ADD_FAILURE() << "worker pid " << pid << " did not register\n" << cluster_->CoordinatorLog();
    return "";
  }
  std::string WorkerOfRank(int world_rank) const {
    for (const json& r : json(Get("/admin/plan")["ranks"]))
      if (r["world_rank"] == world_rank) return r["worker"];
    return "";
  }
  std::string Text(int i) const {
    auto r = HttpCall(port_, "POST", "/v1/completions", Completion(i));
    EXPECT_EQ(r.status, 200) << r.body;
    const json j = json::parse(r.body, nullptr, false);
    if (j.is_discarded() || !j.contains("choices")) return "";
    return j["choices"][0]["text"];
  }

  std::unique_ptr<DaemonCluster> cluster_;
  int port_ = 0;
};

TEST_F(WorkerFaults, WorkerThatNeverLoadsIsExcludedAndTheSpareTakesTheRank) {
  Launch(Options(4));
  const std::string want = Text(0);
  ASSERT_FALSE(want.empty());
  // The stale key's process registers first, then the real spare.
  WorkerSpec stale;
  stale.program = "tessera-worker-failpoints";
  stale.env = {"TESSERA_FAILPOINT_IGNORE_ASSIGN=1"};
  const pid_t stale_pid = cluster_->StartWorker(stale);
  const std::string stale_id = AwaitRegistered(stale_pid);
  const pid_t spare_pid = cluster_->StartWorker();
  const std::string spare_id = AwaitRegistered(spare_pid);
  ASSERT_FALSE(stale_id.empty());
  ASSERT_FALSE(spare_id.empty());

  const std::string victim = WorkerOfRank(3);
  pid_t pid = -1;
  for (const json& w : json(Get("/admin/cluster")["workers"]))
    if (w["id"] == victim) pid = w["pid"].get<pid_t>();
  ASSERT_GT(pid, 0);
  const auto killed = Clock::now();
  kill(pid, SIGKILL);

  // Serving again on the spare: the re-plan's first attempt waits the load
  // deadline on the stale worker, the second loads on the spare.
  const double bound = kLoadTimeout + kHeartbeatTimeout + 2.0;
  double serving_after = -1;
  json plan;
  while (Since(killed) < bound + 20) {
    plan = Get("/admin/plan");
    bool replaced = plan.contains("ranks") && plan["ranks"].size() == 4;
    for (const json& r : plan.value("ranks", json::array())) replaced &= r["worker"] != victim;
    if (replaced && HttpCall(port_, "GET", "/readyz").status == 200) {
      serving_after = Since(killed);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const std::string log = cluster_->CoordinatorLog();
  ASSERT_GT(serving_after, 0) << "not serving again; plan " << plan.dump() << "\n" << log;
  std::printf("serving again %.2f s after the kill (bound %.1f s)\n", serving_after, bound);
  EXPECT_LE(serving_after, bound) << log;
  EXPECT_EQ(WorkerOfRank(3), spare_id) << plan.dump();
  EXPECT_EQ(Text(0), want);

  // The stale worker is named, and excluded with its reason.
  const json stale_record = WorkerOfPid(stale_pid);
  ASSERT_FALSE(stale_record.is_null());
  ASSERT_TRUE(stale_record["exclusion"].is_object()) << stale_record.dump();
  EXPECT_EQ(stale_record["exclusion"]["kind"], "load_timeout") << stale_record.dump();
  EXPECT_EQ(stale_record["exclusion"]["count"], 1) << stale_record.dump();
  const std::string reason = stale_record["exclusion"]["reason"];
  EXPECT_NE(reason.find("worker " + stale_id + " (rank 3) did not join its groups"),
            std::string::npos)
      << reason;
  EXPECT_NE(reason.find("heartbeat.load_timeout_seconds"), std::string::npos) << reason;
  EXPECT_NE(log.find("worker " + stale_id + " left out of placement"), std::string::npos) << log;
  // Nobody else is blamed: the healthy workers have no exclusion.
  for (const json& w : json(Get("/admin/cluster")["workers"])) {
    if (w["id"] != stale_id) {
      EXPECT_TRUE(w["exclusion"].is_null()) << w.dump();
    }
  }
  const auto metrics = HttpCall(port_, "GET", "/metrics", "", kToken);
  EXPECT_NE(metrics.body.find("tessera_worker_exclusions_total{reason=\"load_timeout\"} 1\n"),
            std::string::npos)
      << metrics.body;
}

// A stage-0 rank's step hangs (the failpoint sleeps 120 s in its compute;
// its heartbeats go on) while the collectives' own timeout (60 s) is far
// off: the step deadline (heartbeat.step_timeout_seconds = 3) finds it, the
// worker still computing is named and excluded, and the replica re-plans
// onto the spare; the requests caught in the hung step complete there with
// the reference output.
TEST_F(WorkerFaults, HungStepIsDetectedAndItsWorkerReplaced) {
  constexpr double kStepTimeout = 3.0;
  DaemonClusterOptions o = Options(4);
  o.heartbeat_toml += fmt::format("step_timeout_seconds = {}\n", kStepTimeout);
  o.worker_timeout_seconds = 60.0;
  o.dir = ::tessera::testing::MakeTempDir("tessera-faults");
  const std::string trigger = o.dir + "/hang";
  for (int i = 0; i < 4; ++i) {
    WorkerSpec w;
    w.program = "tessera-worker-failpoints";
    w.env = {"TESSERA_FAILPOINT_STEP_SLEEP=1:120:" + trigger};
    o.worker_specs.push_back(w);
  }
  Launch(std::move(o));
  std::vector<std::string> requests;
  for (int i = 0; i < 4; ++i) requests.push_back(Completion(i));
  const std::vector<std::string> want =
      ::tessera::testing::ConcurrentCompletionTexts(port_, requests);
  const std::string spare_id = AwaitRegistered(cluster_->StartWorker());
  const std::string hung = WorkerOfRank(1);
  ASSERT_FALSE(hung.empty());
  // Armed: the next step of rank 1 hangs, so these requests' first step does.
  std::ofstream(trigger) << "hang\n";
  for (std::string& r : requests) {
    json j = json::parse(r);
    j["stream"] = true;
    r = j.dump();
  }
  const auto t0 = Clock::now();
  const std::vector<std::string> got =
      ::tessera::testing::ConcurrentCompletionTexts(port_, requests);
  const double seconds = Since(t0);
  std::remove(trigger.c_str());
  const std::string log = cluster_->CoordinatorLog();
  std::printf("requests caught in the hung step completed in %.2f s (step deadline %.1f s)\n",
              seconds, kStepTimeout);
  EXPECT_EQ(got, want) << log;
  EXPECT_LE(seconds, kStepTimeout + 10.0) << log;
  EXPECT_EQ(WorkerOfRank(1), spare_id) << log;
  json excluded;
  for (const json& w : json(Get("/admin/cluster")["workers"])) {
    if (w["id"] == hung) {
      excluded = w["exclusion"];
    } else {
      EXPECT_TRUE(w["exclusion"].is_null()) << w.dump();
    }
  }
  ASSERT_TRUE(excluded.is_object()) << log;
  EXPECT_EQ(excluded["kind"], "step_hung");
  const std::string reason = excluded["reason"];
  EXPECT_NE(reason.find("worker " + hung + " (rank 1) was still computing one step"),
            std::string::npos)
      << reason;
  EXPECT_NE(reason.find("heartbeat.step_timeout_seconds"), std::string::npos) << reason;
  EXPECT_NE(log.find("step hung: worker " + hung), std::string::npos) << log;
  const auto metrics = HttpCall(port_, "GET", "/metrics", "", kToken);
  EXPECT_NE(metrics.body.find("tessera_worker_exclusions_total{reason=\"step_hung\"} 1\n"),
            std::string::npos)
      << metrics.body;
}

// One worker and no spare (tp=1 x pp=1): its step hangs (the failpoint
// sleeps past heartbeat.step_timeout_seconds; its heartbeats go on), so the
// step deadline names and excludes it (step_hung) and the re-plan, with no
// usable worker, leaves the replica degraded (/readyz 503). When the
// back-off (heartbeat.load_timeout_seconds) ends, the replica re-plans onto
// the same worker process by itself (no restart, no registration): the
// request caught in the hung step and a new one complete with the reference
// output, /readyz is 200 and /admin/cluster shows the exclusion over.
TEST_F(WorkerFaults, ALoneWorkerServesAgainWhenItsStepHungExclusionEnds) {
  constexpr double kStepTimeout = 2.0;
  constexpr double kBackoff = 4.0;  // the first exclusion's: load_timeout_seconds
  constexpr double kSlack = 5.0;    // from the back-off's end to serving, on a loaded machine
  DaemonClusterOptions o = Options(1);
  o.parallel_toml = "tp = 1\npp = 1\n";
  o.heartbeat_toml = fmt::format(
      "interval_seconds = 0.2\ntimeout_seconds = {}\nload_timeout_seconds = {}\n"
      "step_timeout_seconds = {}\n",
      kHeartbeatTimeout, kBackoff, kStepTimeout);
  o.worker_timeout_seconds = 60.0;
  o.dir = ::tessera::testing::MakeTempDir("tessera-faults");
  const std::string trigger = o.dir + "/hang";
  WorkerSpec w;
  w.program = "tessera-worker-failpoints";
  // Asleep past the step deadline, awake again before the back-off ends.
  w.env = {fmt::format("TESSERA_FAILPOINT_STEP_SLEEP=0:{}:{}", kStepTimeout + 1.0, trigger)};
  o.worker_specs.push_back(w);
  Launch(std::move(o));
  const std::string want = Text(0);
  ASSERT_FALSE(want.empty());
  const pid_t pid = cluster_->worker_pid(0);
  const std::string id = WorkerOfRank(0);
  ASSERT_FALSE(id.empty());

  std::ofstream(trigger) << "hang\n";
  // Caught in the hung step: re-queued, it waits for the replica to serve.
  std::future<std::string> caught = std::async(std::launch::async, [&] { return Text(0); });
  // Excluded, and the replica degraded: /readyz says so (asked first, so its
  // answer falls within the exclusion /admin/cluster then shows running).
  json record, cluster;
  HttpReply readyz;
  Clock::time_point asked;  // when the /admin/cluster call that saw it began
  auto record_of = [&](const json& c) {
    for (const json& w : c["workers"])
      if (w["pid"].get<pid_t>() == pid) return w;
    return json(nullptr);
  };
  const auto t0 = Clock::now();
  while (Since(t0) < 60) {
    readyz = cluster_->Readyz();
    asked = Clock::now();
    cluster = Get("/admin/cluster");
    record = record_of(cluster);
    if (readyz.status == 503 && readyz.body.find("degraded") != std::string::npos &&
        record.is_object() && record["exclusion"].is_object() &&
        record["exclusion"]["excluded"] == true)
      break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const auto seen = Clock::now();
  ASSERT_TRUE(record.is_object() && record["exclusion"].is_object() &&
              record["exclusion"]["excluded"] == true)
      << cluster.dump() << "\n"
      << cluster_->CoordinatorLog();
  EXPECT_EQ(readyz.status, 503) << readyz.body;
  EXPECT_NE(readyz.body.find("degraded"), std::string::npos) << readyz.body;
  EXPECT_FALSE(cluster["degraded"].is_null()) << cluster.dump();
  EXPECT_EQ(record["exclusion"]["kind"], "step_hung") << record.dump();
  EXPECT_EQ(record["exclusion"]["count"], 1) << record.dump();
  EXPECT_EQ(record["state"], "excluded") << record.dump();
  // The back-off ends between these two (seconds_left was computed while
  // the call ran).
  const auto left = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(record["exclusion"]["seconds_left"].get<double>()));
  const Clock::time_point ends_earliest = asked + left, ends_latest = seen + left;

  // Serving again once the back-off ends, without anything else happening.
  std::optional<Clock::time_point> served;  // when /readyz first answered 200
  while (Since(ends_latest) < kSlack + 60) {
    if (cluster_->Readyz().status == 200) {
      served = Clock::now();
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::string log = cluster_->CoordinatorLog();
  ASSERT_TRUE(served.has_value()) << "still not serving\n" << log;
  const double after_end = std::chrono::duration<double>(*served - ends_earliest).count();
  std::printf("serving again at most %.2f s after the %.1f s back-off ended (slack %.1f s)\n",
              after_end, kBackoff, kSlack);
  EXPECT_GE(*served, ends_earliest) << "served before the back-off ended\n" << log;
  EXPECT_LE(std::chrono::duration<double>(*served - ends_latest).count(), kSlack) << log;
  EXPECT_EQ(caught.get(), want) << log;
  EXPECT_EQ(Text(0), want);

  // The same process, never restarted nor declared lost, serves rank 0.
  EXPECT_EQ(kill(pid, 0), 0);
  EXPECT_EQ(cluster_->workers_started(), 1);
  EXPECT_EQ(WorkerOfRank(0), id);
  cluster = Get("/admin/cluster");
  EXPECT_TRUE(cluster["degraded"].is_null()) << cluster.dump();
  EXPECT_EQ(cluster["ready"], true) << cluster.dump();
  record = WorkerOfPid(pid);
  ASSERT_TRUE(record.is_object() && record["exclusion"].is_object()) << cluster.dump();
  EXPECT_EQ(record["state"], "alive") << record.dump();
  EXPECT_EQ(record["exclusion"]["excluded"], false) << record.dump();
  EXPECT_EQ(record["exclusion"]["seconds_left"], 0.0) << record.dump();
  EXPECT_EQ(record["exclusion"]["count"], 1) << record.dump();
  log = cluster_->CoordinatorLog();
  EXPECT_NE(log.find("re-plan: worker " + id + "'s exclusion (step_hung) ended"), std::string::npos)
      << log;
  const json history = Get("/admin/plan")["history"];
  ASSERT_TRUE(history.is_array() && !history.empty()) << history.dump();
  EXPECT_EQ(history.back()["reason"], "worker " + id + "'s exclusion (step_hung) ended")
      << history.dump();
  EXPECT_EQ(log.find("worker " + id + " lost"), std::string::npos) << log;
  EXPECT_EQ(log.find("registered again"), std::string::npos) << log;
  const auto metrics = HttpCall(port_, "GET", "/metrics", "", kToken);
  EXPECT_NE(metrics.body.find("tessera_worker_exclusions_total{reason=\"step_hung\"} 1\n"),
            std::string::npos)
      << metrics.body;
  std::remove(trigger.c_str());
}

// A lone worker frozen by SIGSTOP sends no heartbeats either, so its last
// report shows no long computation: the step deadline names it as the worker
// silent through the step and excludes it as step_hung (not "a hang in
// communication" that names nobody), well before the 30 s heartbeat timeout.
// Resumed, it serves again when the back-off ends, never declared lost.
TEST_F(WorkerFaults, AFrozenLoneWorkerIsNamedAtTheStepDeadlineAndServesAgain) {
  constexpr double kStepTimeout = 1.5;
  DaemonClusterOptions o = Options(1);
  o.parallel_toml = "tp = 1\npp = 1\n";
  o.heartbeat_toml = fmt::format(
      "interval_seconds = 0.2\ntimeout_seconds = 30\nload_timeout_seconds = 3\n"
      "step_timeout_seconds = {}\n",
      kStepTimeout);
  o.worker_timeout_seconds = 60.0;
  Launch(std::move(o));
  const std::string want = Text(0);
  ASSERT_FALSE(want.empty());
  const pid_t pid = cluster_->worker_pid(0);
  const std::string id = WorkerOfRank(0);
  ASSERT_FALSE(id.empty());

  ASSERT_EQ(kill(pid, SIGSTOP), 0);
  const auto stopped = Clock::now();
  std::future<std::string> caught = std::async(std::launch::async, [&] { return Text(0); });
  json record;
  while (Since(stopped) < 60) {
    record = WorkerOfPid(pid);
    if (record.is_object() && record["exclusion"].is_object() &&
        record["exclusion"]["excluded"] == true)
      break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const double named_after = Since(stopped);
  kill(pid, SIGCONT);
  std::string log = cluster_->CoordinatorLog();
  ASSERT_TRUE(record.is_object() && record["exclusion"].is_object() &&
              record["exclusion"]["excluded"] == true)
      << record.dump() << "\n"
      << log;
  std::printf("frozen worker excluded %.2f s after SIGSTOP (step timeout %.1f s)\n", named_after,
              kStepTimeout);
  EXPECT_EQ(record["exclusion"]["kind"], "step_hung") << record.dump();
  EXPECT_NE(log.find("worker " + id + " (rank 0) sent nothing for"), std::string::npos) << log;
  EXPECT_LT(named_after, 30.0) << "named by the heartbeat timeout, not the step deadline";

  std::optional<double> served;
  while (Since(stopped) < 90) {
    if (cluster_->Readyz().status == 200) {
      served = Since(stopped);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  log = cluster_->CoordinatorLog();
  ASSERT_TRUE(served.has_value()) << "still not serving\n" << log;
  std::printf("serving again %.2f s after SIGSTOP\n", *served);
  EXPECT_EQ(caught.get(), want) << log;
  EXPECT_EQ(Text(0), want);
  EXPECT_EQ(cluster_->workers_started(), 1);
  EXPECT_EQ(log.find("worker " + id + " lost"), std::string::npos) << log;
}

// The replica's first plan (tp=1 x pp=1) goes to the first worker to
// register, which never loads it (a stale key's process); the real spare
// registers while that load waits. At heartbeat.load_timeout_seconds the
// stale worker is excluded and the replica, degraded meanwhile, re-plans
// like after any later fault: it serves on the spare within the load
// deadline + the heartbeat timeout + 2 s of the stale worker's registration.
TEST_F(WorkerFaults, AFirstPlacementThatNeverLoadsMovesToTheSpare) {
  DaemonClusterOptions o = Options(1);
  o.parallel_toml = "tp = 1\npp = 1\n";
  o.wait_ready = false;
  WorkerSpec stale;
  stale.program = "tessera-worker-failpoints";
  stale.env = {"TESSERA_FAILPOINT_IGNORE_ASSIGN=1"};
  o.worker_specs.push_back(stale);
  Launch(std::move(o));
  const pid_t stale_pid = cluster_->worker_pid(0);
  const std::string stale_id = AwaitRegistered(stale_pid);
  const auto registered = Clock::now();
  const std::string spare_id = AwaitRegistered(cluster_->StartWorker());
  ASSERT_FALSE(stale_id.empty());
  ASSERT_FALSE(spare_id.empty());
  std::printf("spare registered %.2f s after the stale worker\n", Since(registered));

  const double bound = kLoadTimeout + kHeartbeatTimeout + 2.0;
  std::optional<double> serving_after;
  while (Since(registered) < bound + 30) {
    if (cluster_->Readyz().status == 200) {
      serving_after = Since(registered);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const std::string log = cluster_->CoordinatorLog();
  ASSERT_TRUE(serving_after.has_value()) << "never served\n" << log;
  std::printf("serving %.2f s after the stale worker registered (bound %.1f s)\n", *serving_after,
              bound);
  EXPECT_LE(*serving_after, bound) << log;
  EXPECT_EQ(WorkerOfRank(0), spare_id) << log;
  EXPECT_FALSE(Text(0).empty());
  const json record = WorkerOfPid(stale_pid);
  ASSERT_TRUE(record.is_object() && record["exclusion"].is_object()) << record.dump() << log;
  EXPECT_EQ(record["exclusion"]["kind"], "load_timeout") << record.dump();
  EXPECT_EQ(record["exclusion"]["count"], 1) << record.dump();
  EXPECT_NE(log.find("first placement failed"), std::string::npos) << log;
  EXPECT_TRUE(Get("/admin/cluster")["degraded"].is_null());
}

// One worker, whose first load hangs (it ignores its first AssignShard,
// then takes the later ones), and no spare: at heartbeat.load_timeout_seconds
// it is excluded and the replica, which never served, is degraded, saying
// why in /readyz and /admin/cluster. When the back-off ends the replica
// re-plans onto the same worker by itself and serves.
TEST_F(WorkerFaults, AFirstPlacementThatFailsOnceServesWhenTheBackOffEnds) {
  constexpr double kSlack = 5.0;  // from the back-off's end to serving, on a loaded machine
  DaemonClusterOptions o = Options(1);
  o.parallel_toml = "tp = 1\npp = 1\n";
  o.wait_ready = false;
  WorkerSpec once;
  once.program = "tessera-worker-failpoints";
  once.env = {"TESSERA_FAILPOINT_IGNORE_ASSIGN=first"};
  o.worker_specs.push_back(once);
  Launch(std::move(o));
  const pid_t pid = cluster_->worker_pid(0);
  const std::string id = AwaitRegistered(pid);
  ASSERT_FALSE(id.empty());

  // Excluded, and the replica degraded with the reason.
  json record, cluster;
  HttpReply readyz;
  const auto t0 = Clock::now();
  while (Since(t0) < 60) {
    readyz = cluster_->Readyz();
    cluster = Get("/admin/cluster");
    record = WorkerOfPid(pid);
    if (readyz.status == 503 &&
        readyz.body.find("no layout of the model fits") != std::string::npos &&
        record.is_object() && record["exclusion"].is_object() &&
        record["exclusion"]["excluded"] == true)
      break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const auto seen = Clock::now();
  ASSERT_TRUE(record.is_object() && record["exclusion"].is_object() &&
              record["exclusion"]["excluded"] == true)
      << cluster.dump() << "\n"
      << cluster_->CoordinatorLog();
  EXPECT_EQ(readyz.status, 503) << readyz.body;
  const json reply = json::parse(readyz.body, nullptr, false);
  ASSERT_TRUE(reply.is_object()) << readyz.body;
  EXPECT_EQ(reply["status"], "degraded") << readyz.body;
  const std::string reason = reply["reason"];
  EXPECT_EQ(reason.rfind("degraded: no layout of the model fits 0 usable worker(s)", 0), 0)
      << reason;
  EXPECT_FALSE(cluster["degraded"].is_null()) << cluster.dump();
  EXPECT_EQ(record["exclusion"]["kind"], "load_timeout") << record.dump();
  EXPECT_EQ(record["exclusion"]["count"], 1) << record.dump();
  const auto left = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(record["exclusion"]["seconds_left"].get<double>()));

  std::optional<Clock::time_point> served;
  while (Since(seen + left) < kSlack + 60) {
    if (cluster_->Readyz().status == 200) {
      served = Clock::now();
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const std::string log = cluster_->CoordinatorLog();
  ASSERT_TRUE(served.has_value()) << "never served\n" << log;
  const double after_end = std::chrono::duration<double>(*served - (seen + left)).count();
  std::printf("serving %.2f s after the back-off ended (slack %.1f s)\n", after_end, kSlack);
  EXPECT_LE(after_end, kSlack) << log;
  EXPECT_EQ(WorkerOfRank(0), id);
  EXPECT_FALSE(Text(0).empty());
  EXPECT_TRUE(Get("/admin/cluster")["degraded"].is_null());
  EXPECT_NE(log.find("re-plan: worker " + id + "'s exclusion (load_timeout) ended"),
            std::string::npos)
      << log;
  EXPECT_EQ(log.find("degraded: degraded:"), std::string::npos) << log;
  EXPECT_EQ(kill(pid, 0), 0);
  EXPECT_EQ(cluster_->workers_started(), 1);
}

// A topology file of one host with `gpus` GPUs of `gib` GiB each.
std::string WriteHost(const std::string& dir, const std::string& name, int gpus, double gib) {
  const std::string path = dir + "/" + name + ".toml";
  std::ofstream(path) << fmt::format(
      "[[nodes]]\nhostname = \"{}\"\nhost_memory_gib = 64\n\n[[nodes.gpus]]\ncount = {}\n"
      "name = \"NVIDIA H100 80GB HBM3\"\nmemory_gib = {}\ncompute_capability = \"9.0\"\n",
      name, gpus, gib);
  return path;
}

// A spare whose Loaded contradicts its registration (it reports a host of
// 4 KiB, then holds more than that in weights and KV cache) is excluded when
// it loads the lost rank; the replica serves on without it (the 3 survivors
// run tp=2 x pp=1). Smaller than wanted, the replica tries the worker again
// when its back-off ends; it fails the same way, is excluded for twice as
// long, and the replica serves tp=2 x pp=1 again.
TEST_F(WorkerFaults, ALoadedThatContradictsTheRegistrationExcludesTheWorker) {
  Launch(Options(4));
  const std::string want = Text(2);
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  const std::string topology = cluster_->dir() + "/tiny.toml";
  std::ofstream(topology) << fmt::format("[[nodes]]\nhostname = \"{}\"\nhost_memory_bytes = 4096\n",
                                         host);
  WorkerSpec tiny;
  tiny.args = {"--set", "worker.topology_file=" + topology, "--set", "worker.backend=cpu"};
  const pid_t tiny_pid = cluster_->StartWorker(tiny);
  const std::string tiny_id = AwaitRegistered(tiny_pid);
  ASSERT_FALSE(tiny_id.empty());
  const std::string victim = WorkerOfRank(3);
  for (const json& w : json(Get("/admin/cluster")["workers"]))
    if (w["id"] == victim) kill(w["pid"].get<pid_t>(), SIGKILL);
  json record;
  const auto t0 = Clock::now();
  while (Since(t0) < 30) {
    record = WorkerOfPid(tiny_pid);
    if (record.is_object() && record["exclusion"].is_object() &&
        HttpCall(port_, "GET", "/readyz").status == 200)
      break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const std::string log = cluster_->CoordinatorLog();
  ASSERT_TRUE(record.is_object() && record["exclusion"].is_object()) << record.dump() << log;
  EXPECT_EQ(record["exclusion"]["kind"], "loaded_mismatch") << record.dump();
  const std::string reason = record["exclusion"]["reason"];
  EXPECT_NE(reason.find("worker " + tiny_id + " (rank 3): Loaded reports"), std::string::npos)
      << reason;
  EXPECT_NE(reason.find("devices[0].total_memory_bytes"), std::string::npos) << reason;

  // The back-off's end re-plans (the replica runs 2 of the 4 ranks it
  // wants); the worker is excluded again, for 2 x heartbeat.load_timeout_seconds.
  const auto t1 = Clock::now();
  while (Since(t1) < 60) {
    record = WorkerOfPid(tiny_pid);
    if (record.is_object() && record["exclusion"].is_object() &&
        record["exclusion"]["count"] == 2 && HttpCall(port_, "GET", "/readyz").status == 200)
      break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const std::string log2 = cluster_->CoordinatorLog();
  ASSERT_TRUE(record.is_object() && record["exclusion"].is_object()) << log2;
  EXPECT_EQ(record["exclusion"]["count"], 2) << record.dump() << log2;
  EXPECT_EQ(record["exclusion"]["kind"], "loaded_mismatch") << record.dump();
  EXPECT_GT(record["exclusion"]["seconds_left"].get<double>(), kLoadTimeout) << record.dump();
  EXPECT_NE(log2.find("re-plan: worker " + tiny_id + "'s exclusion (loaded_mismatch) ended"),
            std::string::npos)
      << log2;
  const json plan = Get("/admin/plan");
  for (const json& r : plan["ranks"]) EXPECT_NE(r["worker"], tiny_id) << plan.dump();
  EXPECT_EQ(plan["ranks"].size(), 2u) << plan.dump();
  EXPECT_EQ(Text(2), want) << log2;
}

TEST_F(WorkerFaults, ImpossibleRegistrationsAreRefusedNamingTheField) {
  DaemonClusterOptions o = Options(4);
  o.extra_toml = "[worker]\nbackend = \"cpu\"\n";
  Launch(std::move(o));
  const std::string want = Text(1);
  struct Case {
    const char* name;
    int gpus;
    double gib;
    const char* field;
  };
  for (const Case& c : {Case{"huge-gpus", 8, 1024, "devices[0].total_memory_bytes"},
                        Case{"cuda-host", 8, 80, "devices[0].kind"}}) {
    WorkerSpec spec;
    spec.args = {
        "--set", "worker.topology_file=" + WriteHost(cluster_->dir(), c.name, c.gpus, c.gib),
        "--set", "worker.backend=cuda",
        "--set", "worker.host=" + std::string(c.name)};
    const pid_t pid = cluster_->StartWorker(spec);
    const int index = cluster_->workers_started() - 1;
    const std::optional<int> status = cluster_->WaitForExit(pid, 30);
    ASSERT_TRUE(status.has_value()) << c.name << " still runs\n" << cluster_->WorkerLog(index);
    EXPECT_NE(::tessera::testing::ExitCodeOf(*status), 0) << c.name;
    const std::string wlog = cluster_->WorkerLog(index);
    EXPECT_NE(wlog.find("refused the registration"), std::string::npos) << wlog;
    EXPECT_NE(wlog.find(c.field), std::string::npos) << c.name << ": " << wlog;
    EXPECT_TRUE(WorkerOfPid(pid).is_null()) << c.name;
  }
  const std::string wlog = cluster_->WorkerLog(cluster_->workers_started() - 1);
  EXPECT_NE(wlog.find("worker.backend = \"cpu\""), std::string::npos) << wlog;
  // Still serving, with the same output.
  EXPECT_EQ(HttpCall(port_, "GET", "/readyz").status, 200);
  EXPECT_EQ(Text(1), want);
}

}  // namespace
}  // namespace tessera
