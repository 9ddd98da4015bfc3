// ClusterView: the coordinator's status documents (typed,
// coordinator/serving/cluster_status.h), read from the cluster state: GET
// /admin/cluster (workers, their state, replica and rank, the queue, the
// re-plan counters, and per replica its load), GET /admin/plan (each
// replica's running plan, its ranks' load results, the planner's
// explanation, the history of changes) and /readyz's reason when not ready.
// Implements ClusterStatus; coordinator/api/cluster_json.h renders them.
//
// Thread-safety: safe from any thread.
#pragma once

#include <string>

#include "common/config/daemon_config.h"
#include "coordinator/control/control_server.h"
#include "coordinator/serving/cluster_state.h"
#include "coordinator/serving/cluster_status.h"
#include "coordinator/serving/replica_set.h"

namespace tessera {

class ClusterView : public ClusterStatus {
 public:
  // All outlive the view. `expected_workers`: how many the first placement
  // waits for. `model` (optional) gives an MoE model's expert placement.
  // `quantization`: how the served model's weights are stored
  // (QuantizationConfig::Describe), reported as /admin/plan's "quantization".
  ClusterView(const DaemonConfig* config, int expected_workers, const ClusterState* state,
              const ControlServer* control, const ReplicaSet* replicas,
              const ModelConfig* model = nullptr, std::string quantization = "none")
      : quantization_(std::move(quantization)),
        config_(*config),
        model_(model),
        expected_workers_(expected_workers),
        state_(*state),
        control_(control),
        replicas_(replicas) {}

  bool ready() const override { return state_.ready.load(); }
  NotReadyStatus NotReady() const override EXCLUDES(state_.mu);
  ClusterDocument Cluster(const ClusterPage& page) const override EXCLUDES(state_.mu);
  PlanDocument Plan() const override EXCLUDES(state_.mu);

 private:
  // This page's worker `w` (GET /admin/cluster's "workers" entry).
  WorkerStatus Worker(const ControlWorkerInfo& w) const REQUIRES(state_.mu);
  // Replica r's plan document (GET /admin/plan's body for one replica).
  ReplicaPlanStatus ReplicaPlanOf(size_t r) const REQUIRES(state_.mu);

 private:
  const std::string quantization_;
  const DaemonConfig& config_;
  const ModelConfig* const model_;
  const int expected_workers_;
  const ClusterState& state_;
  const ControlServer* const control_;
  const ReplicaSet* const replicas_;
};

}  // namespace tessera
