// The admin API's POST /admin/plan over a real loopback HttpServer: the
// typed PlanApplyResult that PlanControl::Apply completes with (on another
// thread, as the plan runner does) becomes 200 with the change's report, or
// 503 naming why; a refused Apply becomes 409. GET /admin/plan's history and
// the plan runner's own path are covered by tests/integration/reconfigure_test.cc.
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
  std::string DryRunJson(const PlanProposal&) const override { return "{\"dry_run\":true}"; }
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

class NoStatus : public ClusterStatus {
 public:
  bool ready() const override { return true; }
  std::string NotReadyJson() const override { return "{}"; }
  std::string ClusterJson(const ClusterPage&) const override { return "{}"; }
  std::string PlanJson() const override { return "{}"; }
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
  NoStatus status_;
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

}  // namespace
}  // namespace tessera
