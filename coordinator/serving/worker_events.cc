#include "coordinator/serving/worker_events.h"

#include <algorithm>
#include <chrono>
#include <utility>
#include <vector>

#include "common/base/logging.h"
#include "common/wire/control_codec.h"

namespace tessera {

void WorkerEvents::OnMessage(const ControlPeer& peer, control::Envelope& e) {
  if (e.has_step_result()) return OnStepResult(peer, e.step_result());
  if (e.has_request_updates())
    return OnRequestUpdates(peer, std::move(*e.mutable_request_updates()));
  if (e.has_register_worker()) return OnRegister(peer, e.register_worker());
  if (e.has_error()) return OnError(peer, e.error());
  MutexLock lock(&state_.mu);
  if (e.has_heartbeat()) {
    // A heartbeat written before the worker took in its assignment (or its
    // Loaded) is stale: the coordinator already knows better.
    const int r = state_.ReplicaOf(peer.worker_id);
    if (r >= 0) {
      const ReplicaPlan& rp = state_.replicas[static_cast<size_t>(r)];
      for (const Assignment& a : rp.assignments) {
        if (a.worker_id != peer.worker_id) continue;
        if (e.heartbeat().plan_version() != rp.plan_version) return;
        if (a.loaded_weight_bytes >= 0 && e.heartbeat().state() == control::WORKER_STATE_LOADING)
          return;
      }
    }
    state_.states[peer.worker_id] = e.heartbeat().state();
    state_.step_compute_seconds[peer.worker_id] = e.heartbeat().step_compute_seconds();
    return;
  }
  if (e.has_load_progress()) {
    const int r = state_.ReplicaOfPlan(e.load_progress().plan_version());
    if (r < 0) return;
    for (Assignment& a : state_.replicas[static_cast<size_t>(r)].assignments) {
      if (a.worker_id != peer.worker_id) continue;
      a.load_bytes_done = static_cast<int64_t>(e.load_progress().bytes_done());
      a.load_bytes_total = static_cast<int64_t>(e.load_progress().bytes_total());
    }
    // Progress is for /admin/cluster and the metrics: no waiter waits on it.
  } else if (e.has_loaded()) {
    const int r = state_.ReplicaOfPlan(e.loaded().plan_version());
    if (r < 0) return;
    state_.states[peer.worker_id] = control::WORKER_STATE_READY;
    for (Assignment& a : state_.replicas[static_cast<size_t>(r)].assignments) {
      if (a.worker_id != peer.worker_id) continue;
      a.loaded_weight_bytes = static_cast<int64_t>(e.loaded().weights_bytes());
      a.reused_weight_bytes = static_cast<int64_t>(e.loaded().reused_bytes());
      a.kv_bytes = static_cast<int64_t>(e.loaded().kv_bytes());
      a.load_seconds = e.loaded().load_seconds();
    }
    state_.NotifyReplica(r);  // its plan runner waits for every rank's Loaded
  }
}

void WorkerEvents::OnStepResult(const ControlPeer& peer, const control::StepResult& result) {
  std::shared_ptr<RemoteExecutor> ex = state_.ExecutorOfPlan(result.plan_version());
  if (!ex) {
    // No replica runs that version: its replica's executor says why (a
    // superseded plan).
    int r = -1;
    {
      MutexLock lock(&state_.mu);
      r = state_.ReplicaOf(peer.worker_id);
    }
    ex = state_.Executor(r < 0 ? 0 : r);
  }
  if (!ex) {
    drops_->Drop(peer.worker_id, "no_plan",
                 "StepResult for plan " + std::to_string(result.plan_version()) +
                     " while no plan is serving");
    return;
  }
  const StepResultVerdict verdict = ex->OnStepResult(peer.worker_id, result);
  if (!verdict.accepted()) drops_->Drop(peer.worker_id, verdict.reason, verdict.detail);
}

void WorkerEvents::OnRequestUpdates(const ControlPeer& peer, control::RequestUpdates&& updates) {
  int r = -1;
  {
    MutexLock lock(&state_.mu);
    r = state_.ReplicaOfPlan(updates.plan_version());
  }
  if (r >= 0 && replicas_->OnLeaderUpdates(r, peer.worker_id, std::move(updates))) return;
  drops_->Drop(peer.worker_id, "not_leader",
               "RequestUpdates for plan " + std::to_string(updates.plan_version()) +
                   " from a worker that does not lead a replica serving it");
}

void WorkerEvents::OnRegister(const ControlPeer& peer, const control::Register& reg) {
  bool returning = false;
  int replan = -1;  // the replica to re-plan
  const bool reconfiguring = replicas_->reconfiguring();
  {
    MutexLock lock(&state_.mu);
    // Its state is what it reports from now on, not what it last reported
    // before a loss or a restart.
    state_.states.erase(peer.worker_id);
    auto failed =
        std::find(state_.failed_workers.begin(), state_.failed_workers.end(), peer.worker_id);
    if (failed != state_.failed_workers.end() && reconfiguring) {
      // A lost worker back while the re-plan its loss started is pending or
      // running (a stopped worker resumed): that re-plan does not use it (a
      // spare takes its rank, or the layout shrinks); later plans may.
      returning = true;
      if (std::find(state_.returning_workers.begin(), state_.returning_workers.end(),
                    peer.worker_id) == state_.returning_workers.end())
        state_.returning_workers.push_back(peer.worker_id);
    } else {
      if (failed != state_.failed_workers.end()) state_.failed_workers.erase(failed);
      // A worker joining while a replica is degraded, or runs a smaller
      // layout than wanted, is used at once (by the first such replica).
      for (size_t r = 0; r < state_.replicas.size() && replan < 0; ++r) {
        if (state_.replicas[r].NeedsWorkers()) replan = static_cast<int>(r);
      }
    }
    // A worker back from the lost makes exclusion ends matter again.
    state_.NotifyAll();
  }
  if (returning) {
    TESSERA_LOG_INFO("coordinator",
                     "worker {} registered again after it was declared lost; the re-plan in "
                     "progress does not use it",
                     peer.worker_id);
    return;
  }
  TESSERA_LOG_INFO("coordinator", "worker {} registered ({}, pid {})", peer.worker_id, reg.host(),
                   reg.pid());
  if (replan >= 0 && replan < replicas_->size())
    replicas_->runner(replan)->RequestReplan("worker " + peer.worker_id + " registered", false);
}

void WorkerEvents::OnError(const ControlPeer& peer, const control::Error& error) {
  std::string outside;  // the drop's detail for an Error from outside the plan
  // Peers whose connection to it broke: suspects, declared lost unless they
  // speak at once (PlanRunner::SettleAccusations).
  std::vector<std::pair<std::string, std::chrono::steady_clock::time_point>> accused;
  int replica = -1;
  {
    MutexLock lock(&state_.mu);
    const uint64_t v = error.plan_version();
    replica = state_.ReplicaOf(peer.worker_id);
    const uint64_t running =
        replica >= 0 ? state_.replicas[static_cast<size_t>(replica)].plan_version : 0;
    if (v != 0 && v != running && state_.ReplicaOfPlan(v) < 0) {
      TESSERA_LOG_INFO("coordinator", "worker {} (plan {}, superseded): {}", peer.worker_id, v,
                       error.message());
      return;
    }
    if (replica < 0 || (v != 0 && v != running)) {
      // Only a rank of a replica's plan can break it: an idle worker's
      // Error neither fails steps nor forces a re-plan.
      outside = "Error from a worker outside plan " + std::to_string(v) + ": " + error.message();
    } else {
      ReplicaPlan& rp = state_.replicas[static_cast<size_t>(replica)];
      state_.states[peer.worker_id] = control::WORKER_STATE_FAILED;
      TESSERA_LOG_ERROR("coordinator", "worker {} (replica {}): {}", peer.worker_id, replica,
                        error.message());
      const bool loading =
          std::any_of(rp.assignments.begin(), rp.assignments.end(),
                      [](const Assignment& a) { return a.loaded_weight_bytes < 0; });
      if (loading) {
        rp.load_error = "worker " + peer.worker_id + ": " + error.message();
        rp.load_error_worker = peer.worker_id;
        rp.load_error_kind = "load_error";
        state_.NotifyReplica(replica);
        return;
      }
      const auto now = std::chrono::steady_clock::now();
      for (uint32_t r : error.lost_peer_world_ranks())
        for (const Assignment& a : rp.assignments)
          if (a.world_rank == static_cast<int>(r) && a.worker_id != peer.worker_id)
            accused.emplace_back(a.worker_id, now);
    }
  }
  if (!outside.empty()) {
    drops_->Drop(peer.worker_id, "not_in_plan", outside);
    return;
  }
  // A hung or broken collective: rebuild the plan's communicators. The
  // re-plan, with its accusations, is queued before the executor hears of the
  // failure: the failed step's own re-plan request (the serving loop's, "step
  // failed") then joins this job instead of running first without them and
  // waiting a heartbeat timeout for the lost worker (a race CI saw: a killed
  // worker declared lost after 6.01 s instead of within 0.2 s).
  if (replica >= replicas_->size()) return;  // placed, not started yet
  replicas_->runner(replica)->RequestReplan(
      "worker " + peer.worker_id + " reported: " + error.message(), true,
      /*culprit_known=*/false, std::move(accused));
  if (auto ex = state_.Executor(replica)) ex->OnWorkerFailed(peer.worker_id, ErrorToStatus(error));
  replicas_->loop(replica)->Wake();  // a draining loop re-checks the executor's health
}

void WorkerEvents::OnWorkerForgotten(const std::string& worker_id) {
  {
    MutexLock lock(&state_.mu);
    state_.failed_workers.erase(
        std::remove(state_.failed_workers.begin(), state_.failed_workers.end(), worker_id),
        state_.failed_workers.end());
    state_.states.erase(worker_id);
    state_.excluded_workers.erase(worker_id);
    state_.lost_since.erase(worker_id);
    state_.step_compute_seconds.erase(worker_id);
  }
  drops_->Forget(worker_id);
}

void WorkerEvents::OnWorkerLost(const std::string& worker_id, const ControlWorkerLoss& loss) {
  TESSERA_LOG_ERROR("coordinator", "worker {} lost ({}): marked failed", worker_id, loss.reason());
  const int replica = state_.MarkFailed(worker_id, Unavailable(loss.reason()), loss.since);
  if (replica < 0 || replica >= replicas_->size()) return;
  replicas_->loop(replica)->Wake();  // a draining loop re-checks the executor's health
  // Only its replica re-plans; the router sends that one nothing meanwhile.
  replicas_->runner(replica)->SetReady(false);
  // The time to detect runs from the loss's first sign, not from now.
  replicas_->runner(replica)->RequestReplan("worker " + worker_id + " lost (" + loss.reason() + ")",
                                            true, /*culprit_known=*/true, {}, loss.since);
}

}  // namespace tessera
