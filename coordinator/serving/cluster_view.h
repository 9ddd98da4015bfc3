// ClusterView: the coordinator's status documents, read from the cluster
// state: GET /admin/cluster (workers, their state and rank, the queue, the
// re-plan counters), GET /admin/plan (the running plan, its ranks' load
// results, the planner's explanation, the history of changes) and /readyz's
// reason when not ready. Implements ClusterStatus for coordinator/api/.
//
// Thread-safety: safe from any thread.
#pragma once

#include <string>

#include "common/config/daemon_config.h"
#include "coordinator/api/plan_control.h"
#include "coordinator/control/control_server.h"
#include "coordinator/serving/cluster_state.h"
#include "coordinator/serving/plan_runner.h"
#include "coordinator/serving/serving_loop.h"

namespace tessera {

class ClusterView : public ClusterStatus {
 public:
  // All outlive the view. `expected_workers`: how many the first placement
  // waits for.
  ClusterView(const DaemonConfig* config, int expected_workers, const ClusterState* state,
              const ControlServer* control, const ServingLoop* loop, const PlanRunner* runner)
      : config_(*config),
        expected_workers_(expected_workers),
        state_(*state),
        control_(control),
        loop_(loop),
        runner_(runner) {}

  bool ready() const override { return state_.ready.load(); }
  std::string NotReadyJson() const override EXCLUDES(state_.mu);
  std::string ClusterJson() const override EXCLUDES(state_.mu);
  std::string PlanJson() const override EXCLUDES(state_.mu);

 private:
  const DaemonConfig& config_;
  const int expected_workers_;
  const ClusterState& state_;
  const ControlServer* const control_;
  const ServingLoop* const loop_;
  const PlanRunner* const runner_;
};

}  // namespace tessera
