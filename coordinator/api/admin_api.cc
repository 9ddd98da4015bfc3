#include "coordinator/api/admin_api.h"

#include <algorithm>
#include <charconv>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include "coordinator/api/cluster_json.h"
#include "coordinator/api/plan_json.h"

namespace tessera {

using nlohmann::json;

namespace {

// GET /admin/cluster's query: page and page_size, decimal integers.
StatusOr<ClusterPage> ParseClusterPage(const HttpRequest& req) {
  ClusterPage page;
  for (const auto& [key, value] : req.query) {
    int64_t* field = key == "page" ? &page.page : key == "page_size" ? &page.page_size : nullptr;
    if (!field)
      return InvalidArgument("unknown query parameter '" + key +
                             "' (GET /admin/cluster takes page and page_size)");
    const int64_t lo = key == "page" ? 0 : 1;
    const int64_t hi = key == "page" ? int64_t{1} << 40 : kMaxClusterPageSize;
    int64_t v = 0;
    const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
    if (value.empty() || ec != std::errc() || end != value.data() + value.size() || v < lo ||
        v > hi)
      return InvalidArgument(key + ": expected an integer in " + std::to_string(lo) + ".." +
                             std::to_string(hi) + ", got '" + value + "'");
    *field = v;
  }
  return page;
}

// An applied change's answer: 200 with its report, or 503 naming why it
// failed (the replica then re-plans its previous layout) or that the
// coordinator stopped first.
void SendPlanApplyResult(Responder& res, const PlanApplyResult& result) {
  switch (result.outcome) {
    case PlanApplyResult::Outcome::kApplied:
      res.SendJson(200, PlanChangeReportJson(result.report).dump());
      return;
    case PlanApplyResult::Outcome::kFailed:
      res.SendError(
          503, "applying the plan failed: " + result.error + "; re-planning the previous layout");
      return;
    case PlanApplyResult::Outcome::kStopping:
      res.SendError(503, "the coordinator is stopping");
      return;
  }
}

void HandlePlanPost(PlanControl& plans, const HttpRequest& req, std::shared_ptr<Responder> res) {
  auto parsed = ParsePlanRequest(req.body);
  if (!parsed.ok()) {
    const PlanRequestError& refused = parsed.error();
    res->SendError(
        400, refused.status.message(), refused.param,
        refused.status.code() == StatusCode::kUnimplemented ? "not_supported" : "invalid_plan");
    return;
  }
  auto proposal = plans.Propose(*parsed);
  if (!proposal.ok()) {
    res->SendError(
        400, proposal.status().message(), std::nullopt,
        proposal.status().code() == StatusCode::kUnimplemented ? "not_supported" : "invalid_plan");
    return;
  }
  // The query is checked as strictly as the body: a misspelt dry run must
  // not apply the plan.
  bool dry_run = false;
  for (const auto& [key, value] : req.query) {
    if (key != "dry_run") {
      res->SendError(400, "unknown query parameter '" + key + "' (POST /admin/plan takes dry_run)",
                     key, "invalid_plan");
      return;
    }
    if (value.empty() || value == "true" || value == "1") {
      dry_run = true;
    } else if (value != "false" && value != "0") {
      res->SendError(400, "dry_run: expected true, false, 1 or 0, got '" + value + "'",
                     std::string("dry_run"), "invalid_plan");
      return;
    }
  }
  if (dry_run) {
    res->SendJson(200, PlanDryRunJson(plans.DryRun(*proposal)).dump());
    return;
  }
  // Answered once the change serves or fails (on the replica's plan thread).
  Status queued = plans.Apply(std::move(proposal).value(), [res](const PlanApplyResult& result) {
    SendPlanApplyResult(*res, result);
  });
  if (!queued.ok()) res->SendError(409, queued.message(), std::nullopt, "conflict");
}

void HandleWorkerDrain(PlanControl& plans, const HttpRequest& req, std::shared_ptr<Responder> res,
                       bool drain) {
  const std::string id = req.path_params.empty() ? "" : req.path_params[0];
  const PlanControl::DrainOutcome out = plans.SetDrained(id, drain);
  if (!out.known) {
    res->SendError(404, "no worker '" + id + "' has registered", std::nullopt, "unknown_worker");
    return;
  }
  res->SendJson(
      200,
      json{{"worker", id}, {"drained", drain}, {"changed", out.changed}, {"replan", out.replan}}
          .dump());
}

void HandleReplicaDrain(PlanControl& plans, const HttpRequest& req, std::shared_ptr<Responder> res,
                        bool drain) {
  const std::string arg = req.path_params.empty() ? "" : req.path_params[0];
  int replica = -1;
  if (!arg.empty() && arg.size() <= 6 &&
      std::all_of(arg.begin(), arg.end(), [](char ch) { return ch >= '0' && ch <= '9'; }))
    replica = std::stoi(arg);
  if (replica < 0) {
    res->SendError(400, "replica: expected a replica index (0, 1, ...), got '" + arg + "'",
                   std::string("replica"), "invalid_replica");
    return;
  }
  auto changed = plans.SetReplicaDrained(replica, drain);
  if (!changed.ok()) {
    res->SendError(404, changed.status().message(), std::nullopt, "unknown_replica");
    return;
  }
  res->SendJson(200, json{{"replica", replica}, {"drained", drain}, {"changed", *changed}}.dump());
}

}  // namespace

void RegisterAdminRoutes(HttpServer& admin, const std::string& token, PlanControl* plans,
                         const ClusterStatus* status) {
  // No token: the config only allows that when the admin listener is on
  // loopback (ValidateDaemonConfig), so the endpoints are open to this host.
  auto guard = [token](HttpServer::Handler h) {
    return token.empty() ? h : RequireBearerToken(token, std::move(h));
  };
  admin.Handle("GET", "/admin/cluster",
               guard([status](const HttpRequest& r, std::shared_ptr<Responder> res) {
                 auto page = ParseClusterPage(r);
                 if (!page.ok()) {
                   res->SendError(400, page.status().message(), std::nullopt, "invalid_query");
                   return;
                 }
                 res->Send(200, "application/json", ClusterJson(status->Cluster(*page)).dump());
               }));
  admin.Handle("GET", "/admin/plan",
               guard([status](const HttpRequest&, std::shared_ptr<Responder> res) {
                 res->Send(200, "application/json", PlanJson(status->Plan()).dump());
               }));
  admin.Handle("POST", "/admin/plan",
               guard([plans](const HttpRequest& r, std::shared_ptr<Responder> res) {
                 HandlePlanPost(*plans, r, std::move(res));
               }));
  admin.Handle("POST", "/admin/workers/*/drain",
               guard([plans](const HttpRequest& r, std::shared_ptr<Responder> res) {
                 HandleWorkerDrain(*plans, r, std::move(res), true);
               }));
  admin.Handle("POST", "/admin/workers/*/undrain",
               guard([plans](const HttpRequest& r, std::shared_ptr<Responder> res) {
                 HandleWorkerDrain(*plans, r, std::move(res), false);
               }));
  admin.Handle("POST", "/admin/replicas/*/drain",
               guard([plans](const HttpRequest& r, std::shared_ptr<Responder> res) {
                 HandleReplicaDrain(*plans, r, std::move(res), true);
               }));
  admin.Handle("POST", "/admin/replicas/*/undrain",
               guard([plans](const HttpRequest& r, std::shared_ptr<Responder> res) {
                 HandleReplicaDrain(*plans, r, std::move(res), false);
               }));
}

}  // namespace tessera
