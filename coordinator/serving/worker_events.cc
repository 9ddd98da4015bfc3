#include "coordinator/serving/worker_events.h"

#include <algorithm>
#include <chrono>
#include <utility>
#include <vector>

#include "common/base/logging.h"
#include "common/wire/control_codec.h"

namespace tessera {

void WorkerEvents::OnMessage(const ControlPeer& peer, const control::Envelope& e) {
  if (e.has_step_result()) return OnStepResult(peer, e.step_result());
  if (e.has_register_worker()) return OnRegister(peer, e.register_worker());
  if (e.has_error()) return OnError(peer, e.error());
  MutexLock lock(&state_.mu);
  if (e.has_heartbeat()) {
    // A heartbeat written before the worker took in its assignment (or its
    // Loaded) is stale: the coordinator already knows better.
    for (const Assignment& a : state_.assignments) {
      if (a.worker_id != peer.worker_id) continue;
      if (e.heartbeat().plan_version() != state_.plan_version) return;
      if (a.loaded_weight_bytes >= 0 && e.heartbeat().state() == control::WORKER_STATE_LOADING)
        return;
    }
    state_.states[peer.worker_id] = e.heartbeat().state();
    return;
  }
  if (e.has_load_progress()) {
    if (e.load_progress().plan_version() != state_.plan_version) return;
    for (Assignment& a : state_.assignments) {
      if (a.worker_id != peer.worker_id) continue;
      a.load_bytes_done = static_cast<int64_t>(e.load_progress().bytes_done());
      a.load_bytes_total = static_cast<int64_t>(e.load_progress().bytes_total());
    }
  } else if (e.has_loaded()) {
    if (e.loaded().plan_version() != state_.plan_version) return;
    state_.states[peer.worker_id] = control::WORKER_STATE_READY;
    for (Assignment& a : state_.assignments) {
      if (a.worker_id != peer.worker_id) continue;
      a.loaded_weight_bytes = static_cast<int64_t>(e.loaded().weights_bytes());
      a.reused_weight_bytes = static_cast<int64_t>(e.loaded().reused_bytes());
      a.kv_bytes = static_cast<int64_t>(e.loaded().kv_bytes());
      a.load_seconds = e.loaded().load_seconds();
    }
  }
  state_.cv.notify_all();
}

void WorkerEvents::OnStepResult(const ControlPeer& peer, const control::StepResult& result) {
  std::shared_ptr<RemoteExecutor> ex = state_.Executor();
  if (!ex) {
    drops_->Drop(peer.worker_id, "no_plan",
                 "StepResult for plan " + std::to_string(result.plan_version()) +
                     " while no plan is serving");
    return;
  }
  const StepResultVerdict verdict = ex->OnStepResult(peer.worker_id, result);
  if (!verdict.accepted()) drops_->Drop(peer.worker_id, verdict.reason, verdict.detail);
}

void WorkerEvents::OnRegister(const ControlPeer& peer, const control::Register& reg) {
  bool replan = false, returning = false;
  const bool reconfiguring = runner_->reconfiguring();
  {
    MutexLock lock(&state_.mu);
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
      // A worker joining a degraded cluster, or one running a smaller layout
      // than wanted, is used at once.
      replan = state_.serving && (!state_.degraded.empty() ||
                                  state_.parallel.world_size() < state_.wanted.world_size());
    }
    state_.cv.notify_all();
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
  if (replan) runner_->RequestReplan("worker " + peer.worker_id + " registered", false);
}

void WorkerEvents::OnError(const ControlPeer& peer, const control::Error& error) {
  std::string outside;  // the drop's detail for an Error from outside the plan
  // Peers whose connection to it broke: suspects, declared lost unless they
  // speak at once (PlanRunner::SettleAccusations).
  std::vector<std::pair<std::string, std::chrono::steady_clock::time_point>> accused;
  {
    MutexLock lock(&state_.mu);
    const uint64_t v = error.plan_version();
    if (v != 0 && v != state_.plan_version) {
      TESSERA_LOG_INFO("coordinator", "worker {} (plan {}, superseded): {}", peer.worker_id, v,
                       error.message());
      return;
    }
    if (!state_.InPlan(peer.worker_id)) {
      // Only a rank of the plan can break it: an idle worker's Error
      // neither fails steps nor forces a re-plan.
      outside = "Error from a worker outside plan " + std::to_string(state_.plan_version) + ": " +
                error.message();
    } else {
      state_.states[peer.worker_id] = control::WORKER_STATE_FAILED;
      TESSERA_LOG_ERROR("coordinator", "worker {}: {}", peer.worker_id, error.message());
      const bool loading =
          std::any_of(state_.assignments.begin(), state_.assignments.end(),
                      [](const Assignment& a) { return a.loaded_weight_bytes < 0; });
      if (loading) {
        state_.load_error = "worker " + peer.worker_id + ": " + error.message();
        state_.cv.notify_all();
        return;
      }
      const auto now = std::chrono::steady_clock::now();
      for (uint32_t r : error.lost_peer_world_ranks())
        for (const Assignment& a : state_.assignments)
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
  runner_->RequestReplan("worker " + peer.worker_id + " reported: " + error.message(), true,
                         /*culprit_known=*/false, std::move(accused));
  {
    MutexLock lock(&state_.exec_mu);
    if (state_.executor) state_.executor->OnWorkerFailed(peer.worker_id, ErrorToStatus(error));
  }
  loop_->Wake();  // a draining loop re-checks the executor's health
}

void WorkerEvents::OnWorkerForgotten(const std::string& worker_id) {
  {
    MutexLock lock(&state_.mu);
    state_.failed_workers.erase(
        std::remove(state_.failed_workers.begin(), state_.failed_workers.end(), worker_id),
        state_.failed_workers.end());
    state_.states.erase(worker_id);
  }
  drops_->Forget(worker_id);
}

void WorkerEvents::OnWorkerLost(const std::string& worker_id) {
  TESSERA_LOG_ERROR("coordinator", "worker {} missed its heartbeats: marked failed", worker_id);
  const bool in_plan = state_.MarkFailed(worker_id, Unavailable("missed heartbeats"));
  loop_->Wake();  // a draining loop re-checks the executor's health
  if (in_plan) {
    state_.ready.store(false);
    runner_->RequestReplan("worker " + worker_id + " lost (missed heartbeats)", true,
                           /*culprit_known=*/true);
  }
}

}  // namespace tessera
