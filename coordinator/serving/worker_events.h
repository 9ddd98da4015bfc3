// WorkerEvents: what the coordinator does with the control plane's messages
// and losses (the ControlServer's on_message, on_worker_lost and
// on_worker_forgotten callbacks, run on its thread):
//
//   StepResult     to the running plan's executor (refused ones are counted
//                  in tessera_control_messages_dropped_total);
//   Register       clears a lost mark; a worker joining a degraded or shrunk
//                  cluster triggers a re-plan;
//   Heartbeat      the worker's state (stale ones ignored);
//   LoadProgress,
//   Loaded         the rank's load progress and result;
//   Error          from a rank of the plan: while loading, fails the load;
//                  while serving, fails the steps and re-plans (an idle
//                  worker's Error is dropped);
//   lost           fails the steps, re-plans when it held a rank.
//
// Thread-safety: called from the control server's thread; takes the cluster
// state's mutexes itself.
#pragma once

#include <string>

#include "common/wire/control.pb.h"
#include "coordinator/control/control_plane_guard.h"
#include "coordinator/control/control_server.h"
#include "coordinator/serving/cluster_state.h"
#include "coordinator/serving/plan_runner.h"
#include "coordinator/serving/serving_loop.h"

namespace tessera {

class WorkerEvents {
 public:
  // All outlive this object.
  WorkerEvents(ClusterState* state, ServingLoop* loop, PlanRunner* runner, ControlDrops* drops)
      : state_(*state), loop_(loop), runner_(runner), drops_(drops) {}

  void OnMessage(const ControlPeer& peer, const control::Envelope& envelope) EXCLUDES(state_.mu);
  void OnWorkerLost(const std::string& worker_id) EXCLUDES(state_.mu);
  // The control server dropped a lost worker's record: so does the
  // coordinator.
  void OnWorkerForgotten(const std::string& worker_id) EXCLUDES(state_.mu);

 private:
  void OnStepResult(const ControlPeer& peer, const control::StepResult& result);
  void OnRegister(const ControlPeer& peer, const control::Register& reg) EXCLUDES(state_.mu);
  void OnError(const ControlPeer& peer, const control::Error& error) EXCLUDES(state_.mu);

  ClusterState& state_;
  ServingLoop* const loop_;
  PlanRunner* const runner_;
  ControlDrops* const drops_;
};

}  // namespace tessera
