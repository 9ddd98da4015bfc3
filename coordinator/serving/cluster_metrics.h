// ClusterMetrics: the coordinator's part of GET /metrics
// (common/metrics/metric_catalog.h). Install registers the coordinator's
// families (build info; the re-plan and store-refusal counters at 0 before
// the first event) and a collect hook that refreshes, on every scrape, the
// readiness, KV-cache, queue, plan, store and per-worker gauges from the
// cluster state. (The serving loop keeps tessera_preemptions_total and
// tessera_kv_cache_used_blocks; the plan runner the re-plan counters.)
//
// Thread-safety: Install once, before the metrics are served; the hook runs
// on the scraping thread.
#pragma once

#include "common/metrics/metrics_registry.h"
#include "common/net/tcp_store.h"
#include "coordinator/control/control_server.h"
#include "coordinator/serving/cluster_state.h"
#include "coordinator/serving/replica_set.h"

namespace tessera {

class ClusterMetrics {
 public:
  // All outlive this object (the registry keeps its hook).
  ClusterMetrics(MetricsRegistry* metrics, ClusterState* state, const ControlServer* control,
                 const TcpStoreServer* store, const ReplicaSet* replicas)
      : metrics_(*metrics), state_(*state), control_(control), store_(store), replicas_(replicas) {}

  void Install();

 private:
  void Collect() EXCLUDES(state_.mu);

  MetricsRegistry& metrics_;
  ClusterState& state_;
  const ControlServer* const control_;
  const TcpStoreServer* const store_;
  const ReplicaSet* const replicas_;
};

}  // namespace tessera
