// The admin API: GET /admin/cluster, GET /admin/plan, POST /admin/plan
// (?dry_run) and POST /admin/workers/<id>/drain|undrain (docs/operations.md).
// The handlers see only PlanControl (coordinator/serving/plan_control.h)
// and ClusterStatus (coordinator/serving/cluster_status.h), and render
// their typed results as JSON (plan_json.h, cluster_json.h).
//
// Responses: 200 with JSON; 400 for a bad plan request or query ("code":
// "invalid_plan", "not_supported"), 404 for an unknown worker
// ("unknown_worker"), 409 while a change is in progress ("conflict"); an
// applied plan answers when it serves (200, the change's report) or fails
// (503).
//
// Thread-safety: the handlers run on the HTTP server's threads.
#pragma once

#include <string>

#include "common/net/http_server.h"
#include "coordinator/serving/cluster_status.h"
#include "coordinator/serving/plan_control.h"

namespace tessera {

// Registers the admin routes on `server`, each behind RequireBearerToken
// when `token` is not empty. `plans` and `status` outlive the server.
void RegisterAdminRoutes(HttpServer& server, const std::string& token, PlanControl* plans,
                         const ClusterStatus* status);

}  // namespace tessera
