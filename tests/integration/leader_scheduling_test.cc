// Replicas that schedule themselves ([scheduler] runs_on = "leader", issue
// #33) end to end: tessera-coordinator and tessera-worker processes on
// loopback (real ZeroMQ with CURVE, Gloo and HTTP), the fixture model
// llama_gqa_f32.
//
//  - The same requests (greedy completions, streamed and not, a stop
//    string, log-probabilities, n = 2 choices, chat) give the same answers
//    when the coordinator schedules and when each replica's leader does.
//  - At tp 2 the leader sends each micro-batch to its tp peer, with the
//    same answers as the coordinator's scheduling.
//  - At pp 2 and tp 2 x pp 2 the leader drives the pipeline and the tokens
//    return to it from the last stage, with the same answers (streamed and
//    not, log-probabilities included) as the coordinator's scheduling; a
//    pp 2 replica's leader or last stage killed under streams is replaced
//    as above.
//  - A leader killed (SIGKILL) or stopped (SIGSTOP: it stops heartbeating,
//    its sockets stay open) under streams: its replica re-plans onto the
//    spare, and every stream completes with exactly the undisturbed text
//    (the coordinator re-sends each request with the tokens it delivered).
//    A stopped leader that resumes afterwards is fenced: what it sends for
//    its old plan changes no answer.
//  - A coordinator killed and restarted adopts the leader's plan; no KV block
//    stays taken.
//  - Chunks by cost (scheduler.prefill_chunk_budget) answer as fixed chunks.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/net/http_client.h"
#include "support/daemon_cluster.h"
#include "support/raw_sse_stream.h"
#include "support/scheduling_requests.h"

namespace tessera {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr const char* kToken = ::tessera::testing::SchedulingApi::kAdminToken;
constexpr int kStreams = 4;

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

using ::tessera::testing::Completion;
using ::tessera::testing::Essence;

class LeaderScheduling : public ::testing::Test, protected ::tessera::testing::SchedulingApi {
 protected:
  void Launch(bool on_leader, int replicas, int workers, int tp = 1,
              const std::string& scheduler_toml = "", int pp = 1) {
    ::tessera::testing::DaemonClusterOptions o;
    o.temp_prefix = "tessera-leader";
    o.parallel_toml = fmt::format("tp = {}\npp = {}\nreplicas = {}\n", tp, pp, replicas);
    o.admin_toml = fmt::format("port = 0\ntoken = \"{}\"\n", kToken);
    o.heartbeat_toml = "interval_seconds = 0.2\ntimeout_seconds = 1.0\n";
    o.scheduler_toml += fmt::format("runs_on = \"{}\"\n", on_leader ? "leader" : "coordinator");
    o.scheduler_toml += scheduler_toml;
    o.workers = workers;
    o.worker_metrics = true;
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
  void KillUnderStreams(int tp, int victim_rank, int signal = SIGKILL, int pp = 1);
  void ComparePipelined(int tp);
  // The prefill steps worker 0 ran (tessera_step_duration_seconds_count, phase "prefill",
  // scraped from its /metrics), or -1 when the series is missing.
  int PrefillSteps() const {
    auto r = HttpCall(cluster_->metrics_port(0), "GET", "/metrics", "");
    EXPECT_EQ(r.status, 200) << r.body;
    std::istringstream lines(r.body);
    for (std::string line; std::getline(lines, line);)
      if (line.rfind("tessera_step_duration_seconds_count{", 0) == 0 &&
          line.find("phase=\"prefill\"") != std::string::npos)
        return std::stoi(line.substr(line.rfind(' ') + 1));
    return -1;
  }
  // The texts of the kStreams 100-token completions the stream tests send, answered whole.
  std::vector<std::string> StreamAnswers() const {
    std::vector<std::string> want;
    for (int i = 0; i < kStreams; ++i)
      want.push_back(Answer(Completion(i, 100, false))["choices"][0]["text"]);
    return want;
  }
  // Starts those completions streamed, one thread each, and waits (up to 30 s) until every
  // stream has 3 events. False when one has not.
  bool StartStreams(::tessera::testing::RawSseStream (&streams)[kStreams]) const {
    for (int i = 0; i < kStreams; ++i) {
      auto* s = &streams[i];
      const int port = port_;
      s->thread = std::thread([s, port, i] { s->Run(port, Completion(i, 100, true).dump()); });
    }
    const auto t0 = Clock::now();
    auto all_have = [&](int n) {
      for (auto& s : streams)
        if (s.events.load() < n) return false;
      return true;
    };
    while (!all_have(3) && Since(t0) < 30)
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    return all_have(3);
  }
  pid_t PidOfWorker(const std::string& id) const {
    for (const json& w : json(Get("/admin/cluster")["workers"]))
      if (w["id"] == id && w["state"] == "alive") return w["pid"].get<pid_t>();
    return -1;
  }

  std::unique_ptr<::tessera::testing::DaemonCluster> cluster_;
};

TEST_F(LeaderScheduling, AnswersEqualThoseOfTheCoordinatorsScheduling) {
  const std::vector<json> requests = ::tessera::testing::ComparableRequests();
  std::vector<json> want;
  std::vector<std::string> want_streams;
  Launch(/*on_leader=*/false, 1, 1);
  for (const json& r : requests) want.push_back(Answer(r));
  for (int i = 0; i < 2; ++i) want_streams.push_back(StreamText(Completion(i, 24, true)));
  cluster_->Stop();

  Launch(/*on_leader=*/true, 2, 2);
  for (size_t i = 0; i < requests.size(); ++i)
    EXPECT_EQ(Answer(requests[i]), want[i]) << requests[i].dump();
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(StreamText(Completion(i, 24, true)), want_streams[static_cast<size_t>(i)]);
    // Streamed and not, the same text.
    EXPECT_EQ(want_streams[static_cast<size_t>(i)],
              want[static_cast<size_t>(i)]["choices"][0]["text"]);
  }
  // Both replicas' leaders served: the router spread the requests.
  const json cluster = Get("/admin/cluster");
  ASSERT_EQ(cluster["replicas"].size(), 2u) << cluster.dump();
  for (const json& r : cluster["replicas"]) {
    EXPECT_GT(r["requests_routed_total"].get<int64_t>(), 0) << r.dump();
    // Every request finished: none counted as waiting or running.
    EXPECT_EQ(r["load"]["waiting"], 0) << r.dump();
    EXPECT_EQ(r["load"]["running"], 0) << r.dump();
  }
  // Bad input is still refused before anything is sent: a 400 naming it.
  json bad = Completion(0, 200, false);
  auto r = HttpCall(port_, "POST", "/v1/completions", bad.dump());
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_NE(r.body.find("max"), std::string::npos) << r.body;
}

// The leader's scheduler counters reach the coordinator's /metrics with its
// load (LeaderLoad): a prompt sent twice is found in the leader's prefix
// cache the second time (blocks of 4 tokens: 20 of its 22 tokens), and the
// coordinator counts the tokens looked up and found, as for its own
// scheduling (prefix_cache_daemon_test.cc).
TEST_F(LeaderScheduling, TheLeadersPrefixCacheCountsReachTheMetrics) {
  Launch(/*on_leader=*/true, 1, 1);
  const auto counter = [this](const std::string& name) {
    auto r = HttpCall(port_, "GET", "/metrics");
    EXPECT_EQ(r.status, 200);
    const std::string key = name + "{replica=\"0\"} ";
    const size_t at = r.body.find("\n" + key);
    if (at == std::string::npos) return -1.0;
    return std::stod(r.body.substr(at + 1 + key.size()));
  };
  std::vector<int> prompt;
  for (int i = 0; i < 22; ++i) prompt.push_back((i * 17 + 3) % 250 + 1);
  const json req = {{"model", "llama_gqa_f32"},
                    {"prompt", prompt},
                    {"max_tokens", 4},
                    {"temperature", 0},
                    {"ignore_eos", true}};
  const json first = Answer(req);
  const json second = Answer(req);
  EXPECT_EQ(second["choices"], first["choices"]);
  EXPECT_EQ(first["usage"]["prompt_tokens_details"]["cached_tokens"], 0) << first;
  EXPECT_EQ(second["usage"]["prompt_tokens_details"]["cached_tokens"], 20) << second;
  // The finish's update carries the load of the iteration that ended it.
  EXPECT_EQ(counter("tessera_prefix_cache_queries_tokens_total"), 22 + 22);
  EXPECT_EQ(counter("tessera_prefix_cache_hits_tokens_total"), 20);
  EXPECT_EQ(counter("tessera_scheduler_preemptions_total"), 0);
}

// tp 2: the leader broadcasts each micro-batch to its stage-0 tp peer; the
// answers equal the coordinator's scheduling of the same layout.
TEST_F(LeaderScheduling, ATp2ReplicaAnswersAsTheCoordinatorsDoes) {
  const std::vector<json> requests = ::tessera::testing::ComparableRequests();
  std::vector<json> want;
  Launch(/*on_leader=*/false, 1, 2, /*tp=*/2);
  for (const json& r : requests) want.push_back(Answer(r));
  const std::string want_stream = StreamText(Completion(1, 24, true));
  cluster_->Stop();

  Launch(/*on_leader=*/true, 1, 2, /*tp=*/2);
  for (size_t i = 0; i < requests.size(); ++i)
    EXPECT_EQ(Answer(requests[i]), want[i]) << requests[i].dump();
  EXPECT_EQ(StreamText(Completion(1, 24, true)), want_stream);
}

// pp 2: the leader drives both stages; the last stage's sampling rank returns each
// micro-batch's tokens (with their log-probabilities) to it. With tp 2 x pp 2 its stage-0 tp
// peer passes its hidden states on to its own stage-1 rank. The answers, streamed and not,
// equal the coordinator's scheduling of the same layout.
void LeaderScheduling::ComparePipelined(int tp) {
  const std::vector<json> requests = ::tessera::testing::ComparableRequests();
  std::vector<json> want;
  std::vector<std::string> want_streams;
  Launch(/*on_leader=*/false, 1, 2 * tp, tp, "", /*pp=*/2);
  for (const json& r : requests) want.push_back(Answer(r));
  for (int i = 0; i < 2; ++i) want_streams.push_back(StreamText(Completion(i, 24, true)));
  cluster_->Stop();

  Launch(/*on_leader=*/true, 1, 2 * tp, tp, "", /*pp=*/2);
  const json plan = Get("/admin/plan");
  EXPECT_EQ(plan["ranks"].size(), static_cast<size_t>(2 * tp)) << plan.dump();
  for (size_t i = 0; i < requests.size(); ++i)
    EXPECT_EQ(Answer(requests[i]), want[i]) << requests[i].dump();
  for (int i = 0; i < 2; ++i)
    EXPECT_EQ(StreamText(Completion(i, 24, true)), want_streams[static_cast<size_t>(i)]);
  // Several requests at once: micro-batches overlap in the pipeline.
  const std::vector<std::string> streams = StreamAnswers();
  ::tessera::testing::RawSseStream running[kStreams];
  ASSERT_TRUE(StartStreams(running));
  for (int i = 0; i < kStreams; ++i) {
    running[i].thread.join();
    EXPECT_EQ(running[i].error, "") << "stream " << i;
    EXPECT_EQ(running[i].text, streams[static_cast<size_t>(i)]) << "stream " << i;
  }
  const json replica = Get("/admin/cluster")["replicas"][0];
  EXPECT_EQ(replica["load"]["waiting"], 0) << replica.dump();
  EXPECT_EQ(replica["load"]["running"], 0) << replica.dump();
}

TEST_F(LeaderScheduling, APp2ReplicaAnswersAsTheCoordinatorsDoes) { ComparePipelined(1); }

TEST_F(LeaderScheduling, ATp2Pp2ReplicaAnswersAsTheCoordinatorsDoes) { ComparePipelined(2); }

// One replica of `tp` and a spare; the worker of `victim_rank` gets `signal`
// (SIGKILL or SIGSTOP) under streams.
void LeaderScheduling::KillUnderStreams(int tp, int victim_rank, int signal, int pp) {
  Launch(/*on_leader=*/true, 1, tp * pp + 1, tp, "", pp);  // one replica and a spare
  const std::vector<std::string> want = StreamAnswers();
  const json plan = Get("/admin/plan");
  std::string victim;
  for (const json& r : plan["ranks"])
    if (r["world_rank"] == victim_rank) victim = r["worker"];
  const pid_t pid = PidOfWorker(victim);
  ASSERT_GT(pid, 0) << plan.dump();

  ::tessera::testing::RawSseStream streams[kStreams];
  ASSERT_TRUE(StartStreams(streams));
  const auto killed = Clock::now();
  kill(pid, signal);
  for (int i = 0; i < kStreams; ++i) {
    auto& s = streams[i];
    s.thread.join();
    EXPECT_EQ(s.error, "") << "stream " << i;
    EXPECT_EQ(s.done_markers, 1) << "stream " << i;
    EXPECT_EQ(s.finish_reason, "length") << "stream " << i;
    EXPECT_EQ(s.text, want[static_cast<size_t>(i)]) << "stream " << i;
  }
  std::printf("tp %d x pp %d: streams completed %.2f s after signal %d to rank %d\n", tp, pp,
              Since(killed), signal, victim_rank);
  // The spare took the victim's rank, and the new plan took over the
  // running requests.
  json after = Get("/admin/plan");
  for (int i = 0; i < 100 && after["history"].size() < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    after = Get("/admin/plan");
  }
  ASSERT_GE(after["history"].size(), 2u) << after.dump();
  EXPECT_GT(after["history"].back()["requeued_requests"].get<int>(), 0) << after.dump();
  EXPECT_GT(after["plan_version"].get<uint64_t>(), plan["plan_version"].get<uint64_t>());
  for (const json& r : after["ranks"]) EXPECT_NE(r["worker"], victim) << after.dump();
  // The resumed requests were counted out when they finished.
  const json replica = Get("/admin/cluster")["replicas"][0];
  EXPECT_EQ(replica["load"]["waiting"], 0) << replica.dump();
  EXPECT_EQ(replica["load"]["running"], 0) << replica.dump();
  if (signal == SIGSTOP) {
    // The stopped worker resumes with its old plan's sequences: it is fenced, and the new
    // leader answers as before.
    kill(pid, SIGCONT);
    for (int i = 0; i < kStreams; ++i)
      EXPECT_EQ(Answer(Completion(i, 100, false))["choices"][0]["text"],
                want[static_cast<size_t>(i)])
          << "request " << i << " after the stopped worker resumed";
    const json now = Get("/admin/plan");
    for (const json& r : now["ranks"]) EXPECT_NE(r["worker"], victim) << now.dump();
  }
}

TEST_F(LeaderScheduling, AKilledLeaderIsReplacedAndStreamsContinueExactly) {
  KillUnderStreams(/*tp=*/1, /*victim_rank=*/0);
}

// A stopped leader (no heartbeats, its connections open) is declared lost at the heartbeat
// timeout, and its requests resume on the spare.
TEST_F(LeaderScheduling, AStoppedLeaderIsReplacedAndStreamsContinueExactly) {
  KillUnderStreams(/*tp=*/1, /*victim_rank=*/0, SIGSTOP);
}

// scheduler.prefill_chunk_budget = "cost" through the daemons: a 120-token prompt in chunks that
// shrink with its context (K = 168 tokens for this fixture: 40, 33, 29, 18 against 40, 40, 40)
// gives the greedy text of fixed chunks, scheduled by the coordinator and by the leader (the
// budget travels in AssignShard.leader), and the worker counts the steps those chunks take.
TEST_F(LeaderScheduling, ChunksByCostAnswerAsFixedChunks) {
  json request = Completion(0, 8, false);
  std::vector<int> prompt;
  for (int i = 0; i < 120; ++i) prompt.push_back(3 + (i * 37) % 500);
  request["prompt"] = prompt;
  const std::string chunk = "prefill_chunk_tokens = 40\n";
  Launch(/*on_leader=*/false, 1, 1, 1, chunk + "prefill_chunk_budget = \"tokens\"\n");
  const json want = Answer(request);
  ASSERT_FALSE(want.is_null());
  EXPECT_EQ(PrefillSteps(), 3);
  cluster_->Stop();
  for (bool on_leader : {false, true}) {
    SCOPED_TRACE(on_leader ? "leader" : "coordinator");
    Launch(on_leader, 1, 1, 1, chunk + "prefill_chunk_budget = \"cost\"\n");
    EXPECT_EQ(Answer(request), want);
    EXPECT_EQ(PrefillSteps(), 4);
    cluster_->Stop();
  }
}

// kill -9 of the coordinator under 4 streams at runs_on = "leader": the streams die with their
// HTTP connections; the restarted coordinator adopts the plan the workers hold, serves new
// requests (the same answers as before) within 2 s of becoming ready, and the leader's KV
// blocks all come back: nothing of the cut-off requests stays running or holds a block.
TEST_F(LeaderScheduling, ARestartedCoordinatorAdoptsTheLeadersPlanAndNoKvBlockLeaks) {
  Launch(/*on_leader=*/true, 1, 1);
  const std::vector<std::string> want = StreamAnswers();
  const json before = Get("/admin/plan");
  ::tessera::testing::RawSseStream streams[kStreams];
  ASSERT_TRUE(StartStreams(streams));
  cluster_->KillCoordinator();
  for (auto& s : streams) s.thread.join();
  const auto restarted = Clock::now();
  const Status ready = cluster_->RestartCoordinatorAndWaitReady(30);
  ASSERT_TRUE(ready.ok()) << ready.ToString();
  port_ = cluster_->api_port();
  const auto serving = Clock::now();
  EXPECT_EQ(Answer(Completion(0, 100, false))["choices"][0]["text"], want[0]);
  const double first = Since(serving);
  std::printf("restarted coordinator ready after %.2f s, first answer %.2f s later\n",
              std::chrono::duration<double>(serving - restarted).count(), first);
  EXPECT_LE(first, 2.0);
  const json plan = Get("/admin/plan");
  EXPECT_EQ(plan["plan_version"], before["plan_version"].get<uint64_t>() + 1);
  ASSERT_EQ(plan["ranks"].size(), before["ranks"].size());
  EXPECT_EQ(plan["ranks"][0]["worker"], before["ranks"][0]["worker"]);
  for (int i = 1; i < kStreams; ++i)
    EXPECT_EQ(Answer(Completion(i, 100, false))["choices"][0]["text"],
              want[static_cast<size_t>(i)]);
  // Every KV block is free again once the leader reports after its last request.
  json load;
  for (int i = 0; i < 100; ++i) {
    load = Get("/admin/cluster")["replicas"][0]["load"];
    if (load["running"] == 0 && load["waiting"] == 0 && load["kv_blocks"].get<int64_t>() > 0 &&
        load["free_kv_blocks"] == load["kv_blocks"])
      break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(load["running"], 0) << load.dump();
  EXPECT_EQ(load["waiting"], 0) << load.dump();
  EXPECT_GT(load["kv_blocks"].get<int64_t>(), 0) << load.dump();
  EXPECT_EQ(load["free_kv_blocks"], load["kv_blocks"]) << load.dump();
}

// tp 2: the leader's tp peer dies; the leader's broadcast fails, the replica
// re-plans, and the leader's requests resume on the new plan.
TEST_F(LeaderScheduling, AKilledTpPeerIsReplacedAndStreamsContinueExactly) {
  KillUnderStreams(/*tp=*/2, /*victim_rank=*/1);
}

// pp 2: the leader dies, or the last stage that returns its tokens; either way the replica
// re-plans onto the spare and the leader's requests resume exactly.
TEST_F(LeaderScheduling, AKilledPp2LeaderIsReplacedAndStreamsContinueExactly) {
  KillUnderStreams(/*tp=*/1, /*victim_rank=*/0, SIGKILL, /*pp=*/2);
}

TEST_F(LeaderScheduling, AKilledLastStageOfAPp2ReplicaIsReplacedAndStreamsContinueExactly) {
  KillUnderStreams(/*tp=*/1, /*victim_rank=*/1, SIGKILL, /*pp=*/2);
}

}  // namespace
}  // namespace tessera
