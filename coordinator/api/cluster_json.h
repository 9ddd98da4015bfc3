// The JSON of the status documents (docs/operations.md): /readyz's 503 body
// ({"status": "not_ready" or "degraded", "reason"}), GET /admin/cluster
// and GET /admin/plan. The serving layer hands over typed documents
// (coordinator/serving/cluster_status.h); only this layer knows their JSON.
// The top-level plan fields of the cluster and plan documents are replica
// 0's (what a one-replica deployment reads); "replicas" lists every replica
// (of the page, for /admin/cluster).
//
// Thread-safety: pure functions.
#pragma once

#include <nlohmann/json.hpp>

#include "coordinator/serving/cluster_status.h"

namespace tessera {

nlohmann::json NotReadyJson(const NotReadyStatus& status);
nlohmann::json ClusterJson(const ClusterDocument& doc);
nlohmann::json PlanJson(const PlanDocument& doc);

}  // namespace tessera
