// The coordinator's route table: which handler serves which path on which
// listener.
//
//   API listener     GET /metrics (Prometheus; no secrets), GET /healthz,
//                    GET /readyz (200, or 503 with the reason), and the
//                    OpenAI endpoints (openai_frontend.h)
//   admin listener   /admin/* (admin_api.h); the API listener when no
//                    admin listener is configured
//
// Thread-safety: call before the servers start.
#pragma once

#include <string>

#include "common/metrics/metrics_registry.h"
#include "common/net/http_server.h"
#include "coordinator/api/openai_frontend.h"
#include "coordinator/serving/cluster_status.h"
#include "coordinator/serving/plan_control.h"

namespace tessera {

// Everything passed outlives the servers. `admin`: null to serve the admin
// routes on `api`. `admin_token`: the bearer token the admin routes require
// ("" = none).
void RegisterRoutes(HttpServer& api, HttpServer* admin, const std::string& admin_token,
                    MetricsRegistry* metrics, OpenAIFrontend* openai, PlanControl* plans,
                    const ClusterStatus* status);

}  // namespace tessera
