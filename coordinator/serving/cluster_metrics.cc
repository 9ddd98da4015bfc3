#include "coordinator/serving/cluster_metrics.h"

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "common/base/logging.h"
#include "common/metrics/metric_catalog.h"

namespace tessera {

void ClusterMetrics::Install() {
  TESSERA_CHECK(metrics_.FromCatalog("coordinator").ok());
  metrics_.Gauge(metric::kBuildInfo).WithLabels({TESSERA_VERSION}).Set(1);
  // The re-plan counters are scraped as 0 before the first re-plan.
  for (const char* name :
       {metric::kReconfigurationsTotal, metric::kFaultsTotal, metric::kRequeuedRequestsTotal})
    metrics_.Counter(name).WithLabels({});
  for (const char* reason : {"load_timeout", "load_error", "loaded_mismatch", "step_hung"})
    metrics_.Counter(metric::kWorkerExclusionsTotal).WithLabels({reason});
  for (const char* reason : {"auth", "connections"})
    metrics_.Counter(metric::kStoreRefusalsTotal).WithLabels({reason});
  metrics_.AddCollectHook([this] { Collect(); });
}

void ClusterMetrics::Collect() {
  MetricsRegistry& m = metrics_;
  m.Gauge(metric::kReady).WithLabels({}).Set(state_.ready.load() ? 1 : 0);
  std::vector<int64_t> capacity;  // per replica
  {
    MutexLock lock(&state_.mu);
    for (const ReplicaPlan& p : state_.replicas) capacity.push_back(p.kv_blocks);
  }
  std::vector<double> used_blocks;  // published by each serving loop after every iteration
  for (size_t r = 0; r < capacity.size(); ++r) {
    const std::string label = std::to_string(r);
    m.Gauge(metric::kKvCacheCapacityBlocks)
        .WithLabels({label})
        .Set(static_cast<double>(capacity[r]));
    if (static_cast<int>(r) < replicas_->size() &&
        replicas_->loop(static_cast<int>(r))->started()) {
      const ReplicaLoop* loop = replicas_->loop(static_cast<int>(r));
      m.Gauge(metric::kRunningSequences)
          .WithLabels({label})
          .Set(static_cast<double>(loop->running()));
      m.Gauge(metric::kWaitingSequences)
          .WithLabels({label})
          .Set(static_cast<double>(loop->waiting()));
    }
    used_blocks.push_back(m.Gauge(metric::kKvCacheUsedBlocks).WithLabels({label}).value());
  }
  std::map<std::string, int> states = {
      {"registered", 0}, {"loading", 0}, {"serving", 0}, {"failed", 0}};
  GaugeFamily& kv_used = m.Gauge(metric::kKvCacheUsedBytes);
  GaugeFamily& load_seconds = m.Gauge(metric::kRankLoadSeconds);
  GaugeFamily& load_bytes = m.Gauge(metric::kRankLoadBytes);
  kv_used.Clear();
  load_seconds.Clear();
  load_bytes.Clear();
  const std::vector<ControlWorkerInfo> workers =
      control_ ? control_->Workers() : std::vector<ControlWorkerInfo>();
  const StoreServerCore::Stats store = store_->stats();
  m.Gauge(metric::kStoreConnections).WithLabels({}).Set(static_cast<double>(store.connections));
  m.Gauge(metric::kStoreKeys).WithLabels({}).Set(static_cast<double>(store.keys));
  m.Gauge(metric::kStoreBytes).WithLabels({}).Set(static_cast<double>(store.bytes));
  MutexLock lock(&state_.mu);
  // The store counts since it started; the counters take what is new.
  m.Counter(metric::kStoreRefusalsTotal)
      .WithLabels({"auth"})
      .Inc(static_cast<double>(store.auth_failures - state_.store_seen.auth_failures));
  m.Counter(metric::kStoreRefusalsTotal)
      .WithLabels({"connections"})
      .Inc(static_cast<double>(store.refused_connections - state_.store_seen.refused_connections));
  state_.store_seen = store;
  // The plan version gauge (the newest plan of any replica) is also set by
  // ApplyPlan as a plan changes; the layout gauges are replica 0's.
  m.Gauge(metric::kPlanVersion).WithLabels({}).Set(static_cast<double>(state_.last_plan_version));
  if (!state_.replicas.empty()) {
    m.Gauge(metric::kPlanParallelSize).WithLabels({"tp"}).Set(state_.replicas[0].parallel.tp);
    m.Gauge(metric::kPlanParallelSize).WithLabels({"pp"}).Set(state_.replicas[0].parallel.pp);
  }
  for (const ControlWorkerInfo& w : workers) {
    const bool failed = !w.alive || state_.IsFailed(w.worker_id);
    const int r = state_.ReplicaOf(w.worker_id);
    static const std::vector<Assignment> kNone;
    const std::vector<Assignment>& plan =
        r >= 0 ? state_.replicas[static_cast<size_t>(r)].assignments : kNone;
    const int64_t kv_blocks = r >= 0 ? state_.replicas[static_cast<size_t>(r)].kv_blocks : 0;
    auto a = std::find_if(plan.begin(), plan.end(),
                          [&](const Assignment& x) { return x.worker_id == w.worker_id; });
    if (failed) {
      ++states["failed"];
    } else if (a == plan.end()) {
      ++states["registered"];
    } else {
      ++states[a->loaded_weight_bytes >= 0 ? "serving" : "loading"];
    }
    if (a == plan.end()) continue;
    const std::vector<std::string> labels = {
        std::to_string(r), w.registration->host(),
        std::to_string(w.registration->devices_size() ? w.registration->devices(0).index() : 0),
        std::to_string(a->stage), std::to_string(a->tp_rank)};
    if (a->kv_bytes >= 0 && kv_blocks > 0)
      kv_used.WithLabels(labels).Set(static_cast<double>(a->kv_bytes / kv_blocks) *
                                     used_blocks[static_cast<size_t>(r)]);
    load_seconds.WithLabels(labels).Set(a->load_seconds);
    load_bytes.WithLabels(labels).Set(static_cast<double>(
        a->loaded_weight_bytes >= 0 ? a->loaded_weight_bytes : a->load_bytes_done));
  }
  for (const auto& [state, n] : states) m.Gauge(metric::kWorkers).WithLabels({state}).Set(n);
}

}  // namespace tessera
