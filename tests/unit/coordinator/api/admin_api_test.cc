// The admin API's POST /admin/plan over a real loopback HttpServer: the
// typed PlanApplyResult that PlanControl::Apply completes with (on another
// thread, as the plan runner does) becomes 200 with the change's report, or
// 503 naming why; a refused Apply becomes 409. The typed status documents
// (ClusterStatus) and the dry run become the JSON of docs/operations.md. GET
// /admin/plan's history and the plan runner's own path are covered by
// tests/integration/reconfigure_test.cc.
#include "coordinator/api/admin_api.h"

#include <gtest/gtest.h>

#include <future>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "common/net/http_client.h"
#include "common/net/http_server.h"

namespace tessera {
namespace {

using nlohmann::json;

// A PlanControl that hands each accepted Apply's completion to the test.
class FakePlans : public PlanControl {
 public:
  StatusOr<PlanProposal> Propose(const PlanRequest& request) const override {
    PlanProposal p;
    p.parallel.tp = request.tp;
    p.parallel.pp = request.pp;
    return p;
  }
  PlanDryRun DryRun(const PlanProposal& proposal) const override {
    PlanDryRun d;
    RankPlacement rank;
    rank.worker_id = "w0";
    rank.tp = proposal.parallel.tp;
    rank.first_layer = 0;
    rank.end_layer = 4;
    rank.reused_first = 0;
    rank.reused_end = 3;
    d.change = DescribePlanChange(nullptr, proposal.parallel, {rank}, {"w0", "w9"}, 5);
    d.drain_timeout_seconds = 2.5;
    return d;
  }
  Status Apply(PlanProposal proposal, PlanApplyDone done) override {
    if (!refusal.ok()) return refusal;
    applied_tp = proposal.parallel.tp;
    done_promise.set_value(std::move(done));
    return Status::Ok();
  }
  DrainOutcome SetDrained(const std::string&, bool) override { return {}; }

  Status refusal = Status::Ok();
  int applied_tp = 0;
  std::promise<PlanApplyDone> done_promise;
};

// A ClusterStatus that answers the documents the test sets.
class FakeStatus : public ClusterStatus {
 public:
  bool ready() const override { return true; }
  NotReadyStatus NotReady() const override { return {}; }
  ClusterDocument Cluster(const ClusterPage& page) const override {
    ClusterDocument d = cluster;
    d.page = page;
    return d;
  }
  PlanDocument Plan() const override { return plan; }

  ClusterDocument cluster;
  PlanDocument plan;
};

class AdminApiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    HttpServerOptions options;
    options.bind_address = "127.0.0.1";
    options.port = 0;
    server_ = std::make_unique<HttpServer>(options);
    RegisterAdminRoutes(*server_, "tok", &plans_, &status_);
    ASSERT_TRUE(server_->Start().ok());
  }
  void TearDown() override { server_->Stop(); }

  // POSTs a plan change and completes it with `result` from this thread
  // once the fake holds the completion; returns the reply.
  HttpReply ApplyWith(const PlanApplyResult& result) {
    auto reply = std::async(std::launch::async, [port = server_->port()] {
      return HttpCall(port, "POST", "/admin/plan", R"({"tp": 2, "pp": 1})", "tok");
    });
    std::future<PlanApplyDone> done = plans_.done_promise.get_future();
    EXPECT_EQ(done.wait_for(std::chrono::seconds(30)), std::future_status::ready);
    done.get()(result);
    return reply.get();
  }

  FakePlans plans_;
  FakeStatus status_;
  std::unique_ptr<HttpServer> server_;
};

TEST_F(AdminApiTest, AnAppliedChangeAnswers200WithItsReport) {
  PlanApplyResult result;
  result.outcome = PlanApplyResult::Outcome::kApplied;
  PlanChangeReport& r = result.report;
  r.plan_version = 7;
  r.reason = "POST /admin/plan tp2 x pp1";
  r.replica = 1;
  r.layout.tp = 2;
  r.layout.pp = 1;
  r.layout.layers_per_stage = {4};
  r.workers = {"w0", "w1"};
  r.load_seconds = 1.5;
  r.weight_bytes = 1000;
  r.reused_weight_bytes = 600;
  r.unix_time = 1700000000;
  r.replan = ReplanFigures{0.25, std::nullopt, 3, 0, 2.0};
  const HttpReply reply = ApplyWith(result);
  ASSERT_EQ(reply.status, 200) << reply.body;
  EXPECT_EQ(plans_.applied_tp, 2);
  const json body = json::parse(reply.body);
  EXPECT_EQ(body["plan_version"], 7);
  EXPECT_EQ(body["reason"], "POST /admin/plan tp2 x pp1");
  EXPECT_EQ(body["replica"], 1);
  EXPECT_EQ(body["layout"]["tp"], 2);
  EXPECT_EQ(body["layout"]["pp"], 1);
  EXPECT_EQ(body["workers"], json::array({"w0", "w1"}));
  EXPECT_EQ(body["load_seconds"], 1.5);
  EXPECT_EQ(body["weight_bytes"], 1000);
  EXPECT_EQ(body["reused_weight_bytes"], 600);
  EXPECT_EQ(body["unix_time"], 1700000000);
  EXPECT_EQ(body["drain_seconds"], 0.25);
  EXPECT_EQ(body["requeued_requests"], 3);
  EXPECT_EQ(body["handed_off_requests"], 0);
  EXPECT_EQ(body["total_seconds"], 2.0);
  // Not a fault: no detection time.
  EXPECT_FALSE(body.contains("detect_seconds")) << reply.body;
}

TEST_F(AdminApiTest, AFailedChangeAnswers503NamingWhy) {
  PlanApplyResult result;
  result.outcome = PlanApplyResult::Outcome::kFailed;
  result.error = "worker w1 was lost while loading plan 8";
  const HttpReply reply = ApplyWith(result);
  ASSERT_EQ(reply.status, 503) << reply.body;
  EXPECT_NE(reply.body.find("applying the plan failed: worker w1 was lost while loading plan 8; "
                            "re-planning the previous layout"),
            std::string::npos)
      << reply.body;
}

TEST_F(AdminApiTest, AChangeTheStopOvertookAnswers503) {
  PlanApplyResult result;
  result.outcome = PlanApplyResult::Outcome::kStopping;
  const HttpReply reply = ApplyWith(result);
  ASSERT_EQ(reply.status, 503) << reply.body;
  EXPECT_NE(reply.body.find("the coordinator is stopping"), std::string::npos) << reply.body;
}

TEST_F(AdminApiTest, ARefusedApplyAnswers409) {
  plans_.refusal = FailedPrecondition("a reconfiguration is in progress; retry when it is done");
  const HttpReply reply =
      HttpCall(server_->port(), "POST", "/admin/plan", R"({"tp": 2, "pp": 1})", "tok");
  ASSERT_EQ(reply.status, 409) << reply.body;
  EXPECT_NE(reply.body.find("a reconfiguration is in progress"), std::string::npos) << reply.body;
  EXPECT_NE(reply.body.find("conflict"), std::string::npos) << reply.body;
}

// A body the parser refuses answers 400 whose error names the request field in "param" (the
// OpenAI error shape), or null when the body as a whole is wrong; nothing is applied.
TEST_F(AdminApiTest, ABadBodyAnswers400NamingTheField) {
  const struct {
    const char* body;
    json param;
  } cases[] = {
      {R"({"tp": 0, "pp": 1})", "tp"},
      {R"({"tp": [2, 0], "pp": 2})", "tp[1]"},
      {R"({"tp": 1, "pp": 2, "layers_per_stage": "3,3"})", "layers_per_stage"},
      {R"({"tp": 1, "replica": -1})", "replica"},
      {R"({"tp": 1, "tpp": 2})", "tpp"},
      {R"({"auto": "yes"})", "auto"},
      {R"({"auto": true, "objective": "cost"})", "objective"},
      {R"({"tp": 2})", "pp"},
      {R"([1, 2])", nullptr},
      {R"({"tp": )", nullptr},
  };
  for (const auto& c : cases) {
    const HttpReply reply = HttpCall(server_->port(), "POST", "/admin/plan", c.body, "tok");
    ASSERT_EQ(reply.status, 400) << c.body << ": " << reply.body;
    const json error = json::parse(reply.body)["error"];
    EXPECT_EQ(error["param"], c.param) << c.body << ": " << reply.body;
    EXPECT_EQ(error["code"], "invalid_plan") << reply.body;
  }
  EXPECT_EQ(plans_.applied_tp, 0);
}

TEST_F(AdminApiTest, ADryRunAnswersTheTypedChangeAsJson) {
  const HttpReply reply =
      HttpCall(server_->port(), "POST", "/admin/plan?dry_run=true", R"({"tp": 2, "pp": 1})", "tok");
  ASSERT_EQ(reply.status, 200) << reply.body;
  const json body = json::parse(reply.body);
  EXPECT_EQ(body["dry_run"], true);
  EXPECT_EQ(body["drain_timeout_seconds"], 2.5);
  EXPECT_TRUE(body["from"].is_null());
  EXPECT_EQ(body["to"]["tp"], 2);
  EXPECT_EQ(body["plan_version"], 5);
  EXPECT_EQ(body["ranks"][0]["worker"], "w0");
  EXPECT_EQ(body["ranks"][0]["reused_layers"], json::array({0, 3}));
  EXPECT_EQ(body["ranks"][0]["loads_layers"], 1);
  EXPECT_EQ(body["workers_released"], json::array({"w9"}));
  EXPECT_EQ(body["layers_reused"], 3);
  EXPECT_EQ(body["layers_loaded"], 1);
  EXPECT_FALSE(body.contains("planner_text")) << reply.body;
}

TEST_F(AdminApiTest, TheClusterDocumentRendersItsTypedFields) {
  WorkerStatus w;
  w.id = "w0";
  w.host = "h";
  w.pid = 42;
  w.devices.push_back({0, "cpu0", true, 1 << 20});
  w.health = WorkerHealth::kExcluded;
  w.exclusion = WorkerExclusionStatus{true, "load timed out", "load_timeout", 2, 1.5};
  w.reported = WorkerReportedState::kLoading;
  w.rank = WorkerRankStatus{1, 0, 1, 3};
  w.replica = 3;
  status_.cluster.workers.push_back(w);
  WorkerStatus lost;
  lost.id = "w1";
  lost.health = WorkerHealth::kFailed;
  lost.reported = WorkerReportedState::kLost;
  status_.cluster.workers.push_back(lost);
  ReplicaStatus r;
  r.replica = 3;
  r.degraded = "short of workers";
  r.live = ReplicaStatus::Live{true, {}};
  r.live->load.free_kv_blocks = 9;
  status_.cluster.replicas.push_back(r);
  status_.cluster.queue = ClusterDocument::Queue{4, 2};
  status_.cluster.workers_total = 2;
  status_.cluster.pages = 1;
  const HttpReply reply = HttpCall(server_->port(), "GET", "/admin/cluster?page_size=7", "", "tok");
  ASSERT_EQ(reply.status, 200) << reply.body;
  const json body = json::parse(reply.body);
  const json& w0 = body["workers"][0];
  EXPECT_EQ(w0["state"], "excluded");
  EXPECT_EQ(w0["worker_state"], "loading");
  EXPECT_EQ(w0["exclusion"]["kind"], "load_timeout");
  EXPECT_EQ(w0["exclusion"]["seconds_left"], 1.5);
  EXPECT_EQ(w0["rank"]["tp_rank"], 1);
  EXPECT_EQ(w0["replica"], 3);
  EXPECT_EQ(w0["devices"][0]["kind"], "cpu");
  EXPECT_EQ(w0["devices"][0]["memory_bytes"], 1 << 20);
  const json& w1 = body["workers"][1];
  EXPECT_EQ(w1["state"], "failed");
  EXPECT_EQ(w1["worker_state"], "lost");
  EXPECT_TRUE(w1["exclusion"].is_null());
  EXPECT_TRUE(w1["rank"].is_null());
  EXPECT_TRUE(w1["replica"].is_null());
  EXPECT_EQ(body["replicas"][0]["degraded"], "short of workers");
  EXPECT_EQ(body["replicas"][0]["reconfiguring"], true);
  EXPECT_EQ(body["replicas"][0]["load"]["free_kv_blocks"], 9);
  EXPECT_EQ(body["queue"]["waiting"], 4);
  EXPECT_TRUE(body["degraded"].is_null());
  EXPECT_EQ(body["page_size"], 7);
}

TEST_F(AdminApiTest, ThePlanDocumentBeforeAPlacementSaysWhatItWaitsFor) {
  status_.plan.waiting_for_workers = 4;
  HttpReply reply = HttpCall(server_->port(), "GET", "/admin/plan", "", "tok");
  ASSERT_EQ(reply.status, 200) << reply.body;
  json body = json::parse(reply.body);
  EXPECT_EQ(body["plan_version"], 0);
  EXPECT_EQ(body["mode"], "explicit");
  EXPECT_EQ(body["waiting_for_workers"], 4);
  EXPECT_FALSE(body.contains("error"));
  EXPECT_EQ(body["replicas"], json::array());
  status_.plan.error = "placement failed: no fit";
  reply = HttpCall(server_->port(), "GET", "/admin/plan", "", "tok");
  body = json::parse(reply.body);
  EXPECT_EQ(body["error"], "placement failed: no fit");
  EXPECT_FALSE(body.contains("waiting_for_workers"));
}

}  // namespace
}  // namespace tessera
