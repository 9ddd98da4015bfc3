// WorkerEvents: what the coordinator does with the control plane's messages
// and losses (the ControlServer's on_message, on_worker_lost and
// on_worker_forgotten callbacks, run on its thread):
//
//   StepResult     to the executor of the replica running its plan version
//                  (refused ones are counted in
//                  tessera_control_messages_dropped_total);
//   RequestUpdates to the LeaderLoop of the replica running its plan
//                  version, from that plan's leader only (others dropped
//                  and counted, reason not_leader);
//   Register       clears a lost mark; a worker joining while a replica is
//                  degraded or shrunk triggers that replica's re-plan (the
//                  first such replica's);
//   Heartbeat      the worker's state (stale ones ignored);
//   LoadProgress,
//   Loaded         the rank's load progress and result;
//   Error          from a rank of a replica's plan: while loading, fails the
//                  load; while serving, fails the replica's steps and
//                  re-plans it (an idle worker's Error is dropped);
//   lost           fails the steps of its replica and re-plans that one
//                  replica when it held a rank; the others keep serving.
//
// Thread-safety: called from the control server's thread; takes the cluster
// state's mutexes itself.
#pragma once

#include <string>

#include "common/wire/control.pb.h"
#include "coordinator/control/control_plane_guard.h"
#include "coordinator/control/control_server.h"
#include "coordinator/serving/cluster_state.h"
#include "coordinator/serving/replica_set.h"

namespace tessera {

class WorkerEvents {
 public:
  // All outlive this object.
  WorkerEvents(ClusterState* state, ReplicaSet* replicas, ControlDrops* drops)
      : state_(*state), replicas_(replicas), drops_(drops) {}

  // `envelope`'s bodies may be moved from (a leader's updates are).
  void OnMessage(const ControlPeer& peer, control::Envelope& envelope) EXCLUDES(state_.mu);
  void OnWorkerLost(const std::string& worker_id, const ControlWorkerLoss& loss)
      EXCLUDES(state_.mu);
  // The control server dropped a lost worker's record: so does the
  // coordinator.
  void OnWorkerForgotten(const std::string& worker_id) EXCLUDES(state_.mu);

 private:
  void OnStepResult(const ControlPeer& peer, const control::StepResult& result);
  void OnRequestUpdates(const ControlPeer& peer, control::RequestUpdates&& updates)
      EXCLUDES(state_.mu);
  void OnRegister(const ControlPeer& peer, const control::Register& reg) EXCLUDES(state_.mu);
  void OnError(const ControlPeer& peer, const control::Error& error) EXCLUDES(state_.mu);

  ClusterState& state_;
  ReplicaSet* const replicas_;
  ControlDrops* const drops_;
};

}  // namespace tessera
