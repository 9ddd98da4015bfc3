#include "coordinator/api/api_routes.h"

#include <memory>

#include "common/metrics/metric_catalog.h"
#include "coordinator/api/admin_api.h"
#include "coordinator/api/cluster_json.h"

namespace tessera {

void RegisterRoutes(HttpServer& api, HttpServer* admin, const std::string& admin_token,
                    MetricsRegistry* metrics, OpenAIFrontend* openai, PlanControl* plans,
                    const ClusterStatus* status) {
  // Prometheus scrapes the API listener; the metrics hold no secrets.
  api.Handle("GET", "/metrics", [metrics](const HttpRequest&, std::shared_ptr<Responder> res) {
    res->Send(200, kPrometheusContentType, metrics->Render());
  });
  openai->Register(api);
  api.Handle("GET", "/healthz", [](const HttpRequest&, std::shared_ptr<Responder> res) {
    res->Send(200, "application/json", R"({"status":"ok"})");
  });
  api.Handle("GET", "/readyz", [status](const HttpRequest&, std::shared_ptr<Responder> res) {
    if (status->ready()) {
      res->Send(200, "application/json", R"({"status":"ready"})");
    } else {
      res->Send(503, "application/json", NotReadyJson(status->NotReady()).dump());
    }
  });
  RegisterAdminRoutes(admin ? *admin : api, admin_token, plans, status);
}

}  // namespace tessera
