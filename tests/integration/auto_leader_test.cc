// Replicas that schedule themselves ([scheduler] runs_on = "leader") on the
// placement planner's layouts (parallel.mode = "auto"), end to end:
// tessera-coordinator and tessera-worker processes on loopback (ZeroMQ with
// CURVE, Gloo, HTTP), the fixture model llama_gqa_f32. The workers report a
// small CPU-only host (worker.topology_file) whose memory one rank cannot
// hold the model in, so the planner places a two-rank replica (tp 2 or pp 2,
// its choice) on two of the three workers; the third is a spare.
//
//  - The planner's layout is the same under either scheduler, and the same
//    requests (greedy completions streamed and not, a stop string,
//    log-probabilities, n = 2, chat, concurrent streams) give the same
//    answers when each replica's leader schedules as when the coordinator
//    does; the plan's rank 0 leads.
//  - A worker of the planned replica killed (SIGKILL) under streams, the
//    leader or its peer: the replica re-plans the planner's layout onto the
//    spare, a new leader where the old one died, and every stream completes
//    with exactly the undisturbed text.
//  - POST /admin/plan under streams to a tp per stage ([2, 1] over pp 2: the
//    leader's stage-0 tp peer feeds no stage-1 rank, the last stage's one
//    rank returns the tokens) and back to the planner's choice
//    ({"auto": true}): the streams resume on each new leader exactly.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "common/net/http_client.h"
#include "common/topology/report.h"
#include "coordinator/placement/planner.h"
#include "support/daemon_cluster.h"
#include "support/raw_sse_stream.h"
#include "support/scheduling_requests.h"
#include "support/small_host.h"
#include "support/test_util.h"

namespace tessera {
namespace {

using nlohmann::json;
using ::tessera::testing::Completion;
using ::tessera::testing::Essence;
using Clock = std::chrono::steady_clock;

constexpr const char* kToken = ::tessera::testing::SchedulingApi::kAdminToken;
constexpr int kWorkers = 3;  // a two-rank replica and a spare
constexpr int kStreams = 4;

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Where the workers run: three on one host, or each on a host of its own.
enum class Hosts { kOne, kApart };
const char* HostsName(Hosts h) { return h == Hosts::kOne ? "OneHost" : "HostsApart"; }
void PrintTo(Hosts h, std::ostream* os) { *os << HostsName(h); }

class AutoLeaderScheduling : public ::testing::TestWithParam<Hosts>,
                             protected ::tessera::testing::SchedulingApi {
 protected:
  static void SetUpTestSuite() {
    auto model = LoadModelConfig(::tessera::testing::FixturePath("models/llama_gqa_f32"));
    ASSERT_TRUE(model.ok()) << model.status().ToString();
    // The planning options the coordinator derives from the config Launch writes.
    PlanOptions o;
    o.max_context = o.min_kv_tokens = 128;
    o.gpu_memory_fraction = 0.9;
    o.weight_dtype = o.kv_dtype = DType::kF32;
    o.prefill_chunk_tokens = 32;
    o.max_batch = 8;
    memory_one_ = ::tessera::testing::MemoryNeedingTwoRanks(*model, kWorkers, o);
    memory_apart_ = ::tessera::testing::MemoryNeedingTwoRanks(*model, 1, o, kWorkers);
  }

  // The coordinator (scheduling every replica, or each replica's leader
  // scheduling it) and kWorkers workers reporting the small host.
  void Launch(bool on_leader) {
    const bool apart = GetParam() == Hosts::kApart;
    const int64_t memory = apart ? memory_apart_ : memory_one_;
    ASSERT_GT(memory, 0) << "no memory size separates one rank from two";
    ::tessera::testing::DaemonClusterOptions o;
    o.dir = ::tessera::testing::MakeTempDir("tessera-autoleader");
    std::ofstream(o.dir + "/host.json")
        << TopologyReportToJson(::tessera::testing::SmallHost(memory));
    o.parallel_toml =
        fmt::format("mode = \"auto\"\nworkers = {}\nobjective = \"latency\"\n", kWorkers);
    o.admin_toml = fmt::format("port = 0\ntoken = \"{}\"\n", kToken);
    // The faults here are SIGKILLs, found by the closed control connection within one interval;
    // a heartbeat timeout of 1 s lost live workers when the machine was loaded (a parallel
    // build: "no message for 1000 ms", then 503s), so the timeout only has to outlast a stall.
    o.heartbeat_toml = "interval_seconds = 0.2\ntimeout_seconds = 10.0\n";
    o.kv_cache_toml = "block_size = 4\nmemory_fraction = 0.9\n";
    // No drain wait: a plan change re-queues the running requests at once, so
    // they resume on the next plan's leader.
    o.scheduler_toml = fmt::format(
        "max_context = 128\nmax_sequences = 8\nmax_batch_tokens = 64\nprefill_chunk_tokens = "
        "32\ndrain_timeout_seconds = 0\nruns_on = \"{}\"\n",
        on_leader ? "leader" : "coordinator");
    o.workers = kWorkers;
    o.worker_args = {"--set", "worker.topology_file=" + o.dir + "/host.json"};
    for (int i = 0; apart && i < kWorkers; ++i) {
      ::tessera::testing::WorkerSpec w;
      w.args = {"--set", fmt::format("worker.host=small-box-{}", i)};
      o.worker_specs.push_back(w);
    }
    o.worker_timeout_seconds = 3.0;
    o.ready_timeout_seconds = 60;
    o.stop_grace_seconds = 3.0;
    cluster_ = std::make_unique<::tessera::testing::DaemonCluster>(std::move(o));
    const Status started = cluster_->Start();
    port_ = cluster_->api_port();
    ASSERT_TRUE(started.ok()) << started.ToString();
  }
  void TearDown() override {
    if (cluster_) cluster_->Stop();
  }

  // The texts of the kStreams 100-token completions the stream checks send, answered whole.
  std::vector<std::string> StreamAnswers() const {
    std::vector<std::string> want;
    for (int i = 0; i < kStreams; ++i)
      want.push_back(Answer(Completion(i, 100, false))["choices"][0]["text"]);
    return want;
  }
  // Starts those completions streamed, one thread each, and waits (up to 30 s)
  // until every stream has 3 events. False when one has not.
  bool StartStreams() {
    for (int i = 0; i < kStreams; ++i) {
      streams_[i] = std::make_unique<::tessera::testing::RawSseStream>();
      auto* s = streams_[i].get();
      const int port = port_;
      s->thread = std::thread([s, port, i] { s->Run(port, Completion(i, 100, true).dump()); });
    }
    const auto t0 = Clock::now();
    auto all_have = [&](int n) {
      for (auto& s : streams_)
        if (s->events.load() < n) return false;
      return true;
    };
    while (!all_have(3) && Since(t0) < 30)
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    return all_have(3);
  }
  // Joins the streams and checks each completed with `want`'s text.
  void ExpectStreams(const std::vector<std::string>& want) {
    for (int i = 0; i < kStreams; ++i) {
      auto& s = *streams_[i];
      s.thread.join();
      EXPECT_EQ(s.error, "") << "stream " << i;
      EXPECT_EQ(s.done_markers, 1) << "stream " << i;
      EXPECT_EQ(s.finish_reason, "length") << "stream " << i;
      EXPECT_EQ(s.text, want[static_cast<size_t>(i)]) << "stream " << i;
    }
  }
  // The worker of `plan`'s world rank `rank`.
  static std::string WorkerOf(const json& plan, int rank) {
    for (const json& r : plan["ranks"])
      if (r["world_rank"] == rank) return r["worker"];
    return "";
  }
  pid_t PidOfWorker(const std::string& id) const {
    for (const json& w : json(Get("/admin/cluster")["workers"]))
      if (w["id"] == id && w["state"] == "alive") return w["pid"].get<pid_t>();
    return -1;
  }
  // The workers whose logs say they lead their replica under plan `version`
  // (each worker's log line names its id).
  std::vector<std::string> LeadersOf(uint64_t version) const {
    std::vector<std::string> out;
    const std::string tail = fmt::format(": leads its replica (plan {})", version);
    for (int i = 0; i < kWorkers; ++i) {
      const std::string log = cluster_->WorkerLog(i);
      const size_t at = log.find(tail);
      if (at == std::string::npos) continue;
      const size_t line = log.rfind('\n', at) + 1;  // npos + 1 = 0 on the first line
      const size_t id = log.find("worker ", line);
      if (id == std::string::npos || id > at) continue;
      out.push_back(log.substr(id + 7, log.find(' ', id + 7) - id - 7));
    }
    return out;
  }
  // Waits (up to 20 s) until GET /admin/plan shows a plan newer than
  // `version` serving with no change running; returns it. The plan is read
  // between two /admin/cluster reads that show no change running and the
  // same count of changes, so it is no snapshot taken mid-change (a change
  // bumps plan_version as it starts loading and completes its history entry
  // as it ends).
  json PlanAfter(uint64_t version) const {
    const auto t0 = Clock::now();
    json plan;
    while (Since(t0) < 20) {
      const json before = Get("/admin/cluster");
      if (!before["reconfiguring"].get<bool>()) {
        plan = Get("/admin/plan");
        const json after = Get("/admin/cluster");
        if (plan["plan_version"].get<uint64_t>() > version && !after["reconfiguring"].get<bool>() &&
            after["reconfigurations_total"] == before["reconfigurations_total"])
          return plan;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ADD_FAILURE() << "no plan after " << version << " serves: " << plan.dump();
    return plan;
  }
  void ExpectIdle() const {
    const json replica = Get("/admin/cluster")["replicas"][0];
    EXPECT_EQ(replica["load"]["waiting"], 0) << replica.dump();
    EXPECT_EQ(replica["load"]["running"], 0) << replica.dump();
  }
  void KillUnderStreams(int victim_rank);

  // The host memory that needs two ranks: three workers on one host, or one on each.
  static int64_t memory_one_, memory_apart_;
  std::unique_ptr<::tessera::testing::DaemonCluster> cluster_;
  std::unique_ptr<::tessera::testing::RawSseStream> streams_[kStreams];
};

int64_t AutoLeaderScheduling::memory_one_ = -1;
int64_t AutoLeaderScheduling::memory_apart_ = -1;

// The fields of a plan that make its layout.
json Layout(const json& plan) {
  return {{"tp", plan["tp"]},
          {"pp", plan["pp"]},
          {"tp_per_stage", plan["tp_per_stage"]},
          {"layers_per_stage", plan["layers_per_stage"]}};
}

TEST_P(AutoLeaderScheduling, ThePlannersLayoutAnswersAsTheCoordinatorsSchedulingDoes) {
  const std::vector<json> requests = ::tessera::testing::ComparableRequests();
  Launch(/*on_leader=*/false);
  const json planned = Get("/admin/plan");
  ASSERT_EQ(planned["mode"], "auto") << planned.dump();
  ASSERT_EQ(planned["ranks"].size(), 2u) << planned.dump();
  std::vector<json> want;
  for (const json& r : requests) want.push_back(Answer(r));
  std::vector<std::string> want_streams;
  for (int i = 0; i < 2; ++i) want_streams.push_back(StreamText(Completion(i, 24, true)));
  const std::vector<std::string> want_long = StreamAnswers();
  cluster_->Stop();

  Launch(/*on_leader=*/true);
  const json plan = Get("/admin/plan");
  std::printf("the planner's layout: %s\n", Layout(plan).dump().c_str());
  EXPECT_EQ(Layout(plan), Layout(planned)) << plan.dump();
  ASSERT_EQ(plan["ranks"].size(), 2u) << plan.dump();
  // Rank 0 of the planner's placement leads; no other worker does.
  EXPECT_EQ(LeadersOf(plan["plan_version"].get<uint64_t>()),
            std::vector<std::string>{WorkerOf(plan, 0)});
  for (size_t i = 0; i < requests.size(); ++i)
    EXPECT_EQ(Answer(requests[i]), want[i]) << requests[i].dump();
  for (int i = 0; i < 2; ++i)
    EXPECT_EQ(StreamText(Completion(i, 24, true)), want_streams[static_cast<size_t>(i)]);
  // Several streams at once share the leader's batches.
  const auto t0 = Clock::now();
  ASSERT_TRUE(StartStreams());
  ExpectStreams(want_long);
  std::printf("%d streams of 100 tokens, undisturbed: %.2f s\n", kStreams, Since(t0));
  ExpectIdle();
}

// One worker of the planned replica gets SIGKILL under streams: the replica
// re-plans the wanted (planner's) layout onto the spare and the survivor, and
// the coordinator resumes every stream on the new plan's leader.
void AutoLeaderScheduling::KillUnderStreams(int victim_rank) {
  Launch(/*on_leader=*/true);
  const std::vector<std::string> want = StreamAnswers();
  const json plan = Get("/admin/plan");
  ASSERT_EQ(plan["ranks"].size(), 2u) << plan.dump();
  const uint64_t version = plan["plan_version"].get<uint64_t>();
  const std::string victim = WorkerOf(plan, victim_rank);
  const pid_t pid = PidOfWorker(victim);
  ASSERT_GT(pid, 0) << plan.dump();

  ASSERT_TRUE(StartStreams());
  const auto killed = Clock::now();
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  ExpectStreams(want);
  std::printf("%s: streams completed %.2f s after SIGKILL to rank %d\n",
              Layout(plan).dump().c_str(), Since(killed), victim_rank);
  const json after = PlanAfter(version);
  EXPECT_EQ(Layout(after), Layout(plan)) << after.dump();
  EXPECT_GT(after["history"].back()["requeued_requests"].get<int>(), 0) << after.dump();
  for (const json& r : after["ranks"]) EXPECT_NE(r["worker"], victim) << after.dump();
  // The new plan's rank 0 leads it (a new worker when the leader died).
  const std::string leader = WorkerOf(after, 0);
  EXPECT_EQ(LeadersOf(after["plan_version"].get<uint64_t>()), std::vector<std::string>{leader});
  if (victim_rank == 0) {
    EXPECT_NE(leader, victim);
  }
  ExpectIdle();
  EXPECT_EQ(Answer(Completion(0, 100, false))["choices"][0]["text"], want[0]);
}

TEST_P(AutoLeaderScheduling, AKilledLeaderIsReplacedAndStreamsContinueExactly) {
  KillUnderStreams(/*victim_rank=*/0);
}

TEST_P(AutoLeaderScheduling, AKilledPeerOfTheLeaderIsReplacedAndStreamsContinueExactly) {
  KillUnderStreams(/*victim_rank=*/1);
}

// POST /admin/plan under streams: to tp [2, 1] over pp 2 on all three
// workers, then back to the planner's choice; each change re-queues the
// running requests (no drain wait) and they resume on the new leader.
TEST_P(AutoLeaderScheduling, PlanChangesUnderStreamsResumeOnEachNewLeaderExactly) {
  Launch(/*on_leader=*/true);
  const std::vector<std::string> want = StreamAnswers();
  const json planned = Get("/admin/plan");
  struct Change {
    json body;
    json tp_per_stage;  // the layout it gives; null: the planner's
  };
  for (const Change& change : {Change{{{"tp", {2, 1}}, {"pp", 2}}, json::array({2, 1})},
                               Change{{{"auto", true}}, json()}}) {
    SCOPED_TRACE(change.body.dump());
    const uint64_t version = Get("/admin/plan")["plan_version"].get<uint64_t>();
    ASSERT_TRUE(StartStreams());
    auto r = HttpCall(port_, "POST", "/admin/plan", change.body.dump(), kToken);
    ASSERT_EQ(r.status, 200) << r.body << cluster_->CoordinatorLog();
    ExpectStreams(want);
    const json plan = PlanAfter(version);
    if (change.tp_per_stage.is_null()) {
      EXPECT_EQ(Layout(plan), Layout(planned)) << plan.dump();
      EXPECT_EQ(plan["ranks"].size(), 2u) << plan.dump();
    } else {
      EXPECT_EQ(plan["tp_per_stage"], change.tp_per_stage) << plan.dump();
      EXPECT_EQ(plan["ranks"].size(), 3u) << plan.dump();
    }
    EXPECT_GT(plan["history"].back()["requeued_requests"].get<int>(), 0) << plan.dump();
    EXPECT_EQ(LeadersOf(plan["plan_version"].get<uint64_t>()),
              std::vector<std::string>{WorkerOf(plan, 0)});
    ExpectIdle();
  }
}

INSTANTIATE_TEST_SUITE_P(Placements, AutoLeaderScheduling,
                         ::testing::Values(Hosts::kOne, Hosts::kApart),
                         [](const ::testing::TestParamInfo<Hosts>& p) {
                           return std::string(HostsName(p.param));
                         });

}  // namespace
}  // namespace tessera
