#include "coordinator/serving/plan_runner.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <map>

#include "common/base/logging.h"
#include "common/metrics/metric_catalog.h"

namespace tessera {

namespace {

double SecondsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// Consecutive failed re-fits before the cluster is reported degraded.
constexpr int kMaxFitAttempts = 3;
// A worker a survivor saw disconnect is declared lost unless it is heard
// from within this long (a live rank that broke its own communicator reports
// its own Error at once; a killed one says nothing).
constexpr double kAccusedSilenceSeconds = 0.2;

}  // namespace

PlanRunner::PlanRunner(Context c)
    : config_(*c.config),
      model_(*c.model),
      replica_(c.replica),
      placer_(*c.placer),
      control_(c.control),
      store_(c.store),
      store_secret_(c.store_secret),
      metrics_(c.metrics),
      planner_(c.planner),
      state_(*c.state),
      loop_(c.loop),
      leader_(std::move(c.leader)),
      hand_off_(std::move(c.hand_off)) {}

PlanRunner::~PlanRunner() { Stop(); }

void PlanRunner::Start(ReplicaStart first) {
  thread_ = std::thread([this, first = std::move(first)]() mutable { Serve(std::move(first)); });
}

void PlanRunner::Stop() {
  if (thread_.joinable()) thread_.join();
}

void PlanRunner::SetReady(bool ready) {
  MutexLock lock(&state_.mu);
  state_.SetReplicaReady(replica_, ready);
  state_.cv.notify_all();  // WaitReady
}

void PlanRunner::Serve(ReplicaStart first) {
  {
    MutexLock lock(&state_.mu);
    rep().parallel = rep().wanted = first.parallel;
    rep().kv_blocks = first.kv_blocks;
    if (first.adopted_version > 0) {
      // The adopted version: the next plan (ApplyPlan) gets a newer one.
      rep().plan_version = first.adopted_version;
      TESSERA_LOG_INFO("coordinator", "replica {}: {}: {}", replica_, first.reason,
                       first.parallel.ToString());
    } else {
      // The planner's text covers every replica of its run: logged once,
      // by the replica it placed first (a fleet has hundreds).
      const bool whole_plan = first.planned && first.planned_index == 0;
      TESSERA_LOG_INFO("coordinator", "replica {}: placing {} on {} workers{}{}", replica_,
                       first.parallel.ToString(), first.ranks.size(), whole_plan ? "\n" : "",
                       whole_plan      ? first.planned->ToText()
                       : first.planned ? std::string(" (planned with replica 0)")
                                       : std::string(" (explicit tp per stage)"));
    }
  }
  PlanChangeReport report;
  Status applied = ApplyPlan(first.parallel, first.ranks, first.reason, report,
                             std::move(first.planned), &first.predicted);
  if (applied.ok()) {
    {
      MutexLock lock(&state_.mu);
      rep().plan_result_replica = first.planned_index;
    }
    StartServing();
    SetReady(true);
  } else {
    // Like a later fault: the replica is degraded, its re-plan is queued
    // at once (the workers at fault were excluded), and while no layout
    // fits it waits in the plan loop for a worker to register or an
    // exclusion to end.
    TESSERA_LOG_ERROR("coordinator", "replica {}: first placement failed: {}; re-planning",
                      replica_, applied.ToString());
    {
      MutexLock lock(&state_.mu);
      rep().degraded = "first placement failed: " + applied.message();
      state_.NotifyReplica(replica_);
    }
    RequestReplan("first placement failed: " + applied.message(), /*fault=*/true,
                  /*culprit_known=*/true);
  }
  // 4. Re-plan on demand.
  PlanLoop();
}

void PlanRunner::StartServing() {
  // 3. Serve.
  int64_t kv_blocks = 0;
  {
    MutexLock lock(&state_.mu);
    kv_blocks = rep().kv_blocks;
  }
  std::shared_ptr<RemoteExecutor> executor = state_.Executor(replica_);
  loop_->Start(
      executor, [executor] { return executor->health(); }, kv_blocks, executor->plan_version());
  MutexLock lock(&state_.mu);
  rep().serving = true;
}

void PlanRunner::RequestReplan(
    const std::string& reason, bool fault, bool culprit_known,
    std::vector<std::pair<std::string, std::chrono::steady_clock::time_point>> accused,
    std::optional<std::chrono::steady_clock::time_point> fault_at) {
  const auto now = std::chrono::steady_clock::now();
  const auto first_sign = std::min(fault_at.value_or(now), now);
  MutexLock lock(&state_.mu);
  if (state_.stopping) return;
  // One pending re-fit covers every fault reported before it runs.
  for (PlanJob& j : jobs_)
    if (!j.target && !j.done) {
      j.reason += "; " + reason;
      if (fault) j.raised = j.fault ? std::min(j.raised, first_sign) : first_sign;
      j.fault |= fault;
      j.culprit_known |= culprit_known;
      for (auto& a : accused) j.accused.push_back(std::move(a));
      return;
    }
  PlanJob job;
  job.reason = reason;
  job.fault = fault;
  job.culprit_known = culprit_known;
  job.accused = std::move(accused);
  job.plan_version = rep().plan_version;
  job.raised = first_sign;
  jobs_.push_back(std::move(job));
  state_.NotifyReplica(replica_);
}

void PlanRunner::OnStepFailed(const Status& failed) {
  SetReady(false);
  std::shared_ptr<RemoteExecutor> ex = state_.Executor(replica_);
  if (!ex || !ex->step_timed_out()) {
    // A step failed on a worker declared lost: its detection is timed from
    // the loss's first sign, even when this request runs ahead of the loss's
    // own (OnWorkerLost marks the worker failed, which fails this step,
    // before it requests its re-plan; CI saw 0.16 s for a SIGSTOPped worker).
    std::optional<std::chrono::steady_clock::time_point> lost;
    {
      MutexLock lock(&state_.mu);
      lost = state_.EarliestLoss(rep().assignments);
    }
    RequestReplan("step failed: " + failed.message(), true, /*culprit_known=*/lost.has_value(), {},
                  lost);
    return;
  }
  const double deadline = ex->step_timeout_seconds();
  // A frozen worker (SIGSTOP, a stalled host) sends no heartbeats, so its
  // last report shows no long computation: it is the one silent through most
  // of the step, longer than two heartbeat intervals.
  const double silent_bound = std::max(deadline / 2, 2 * config_.heartbeat.interval_seconds);
  std::map<std::string, double> silent;
  for (const ControlWorkerInfo& w : control_->Workers())
    if (w.alive && w.seconds_since_last_message >= silent_bound)
      silent[w.worker_id] = w.seconds_since_last_message;
  std::string culprit, why;
  bool again = false;  // a later step of the same hang: named, not excluded twice
  {
    MutexLock lock(&state_.mu);
    double longest = 0;
    int rank = -1;
    for (const Assignment& a : rep().assignments) {
      auto it = state_.step_compute_seconds.find(a.worker_id);
      if (it == state_.step_compute_seconds.end() || it->second <= longest) continue;
      longest = it->second;
      culprit = a.worker_id;
      rank = a.world_rank;
    }
    if (longest < deadline / 2) culprit.clear();
    if (!culprit.empty()) {
      why = fmt::format(
          "worker {} (rank {}) was still computing one step {:.1f} s into it, past "
          "heartbeat.step_timeout_seconds = {:g} s{}",
          culprit, rank, longest, deadline,
          rep().assignments.size() > 1 ? " (its peers were waiting on it)" : "");
    } else {
      double quiet = 0;
      for (const Assignment& a : rep().assignments) {
        auto it = silent.find(a.worker_id);
        if (it == silent.end() || it->second <= quiet) continue;
        quiet = it->second;
        culprit = a.worker_id;
        rank = a.world_rank;
      }
      if (!culprit.empty())
        why = fmt::format(
            "worker {} (rank {}) sent nothing for {:.1f} s while one step ran past "
            "heartbeat.step_timeout_seconds = {:g} s (frozen: no heartbeats either)",
            culprit, rank, quiet, deadline);
    }
    if (!culprit.empty()) {
      again = state_.IsExcluded(culprit);
      if (!again) state_.Exclude(culprit, "step_hung", why, config_.heartbeat.load_timeout_seconds);
    }
  }
  if (culprit.empty()) {
    RequestReplan(
        "step hung: " + failed.message() + "; no rank was computing (a hang in communication)",
        true);
    return;
  }
  if (!again) {
    metrics_->Counter(metric::kWorkerExclusionsTotal).WithLabels({"step_hung"}).Inc();
    TESSERA_LOG_ERROR("coordinator", "replica {}: step hung: {}; worker {} left out of placement",
                      replica_, why, culprit);
  }
  RequestReplan("step hung: " + why, true, /*culprit_known=*/true);
}

bool PlanRunner::reconfiguring() const {
  MutexLock lock(&state_.mu);
  return job_running_ || !jobs_.empty();
}

ParallelConfig PlanRunner::Wanted() const {
  MutexLock lock(&state_.mu);
  return rep().wanted;
}

Status PlanRunner::Apply(PlanProposal proposal, PlanApplyDone done) {
  MutexLock lock(&state_.mu);
  if (!rep().serving || job_running_ || !jobs_.empty())
    return FailedPrecondition(
        rep().serving            ? "a reconfiguration is in progress; retry when it is done"
        : rep().degraded.empty() ? "the initial placement is in progress; retry when serving"
                                 : "the replica has not served yet (degraded: " + rep().degraded +
                                       "); retry when serving");
  PlanJob job;
  job.target = proposal.parallel;
  job.reason = std::string("POST /admin/plan ") + (proposal.planned ? "auto " : "") +
               proposal.parallel.ToString();
  if (proposal.planned) {
    job.ranks = std::move(proposal.ranks);
    job.planned = std::move(proposal.planned);
  }
  job.done = std::move(done);
  jobs_.push_back(std::move(job));
  state_.NotifyReplica(replica_);
  return Status::Ok();
}

PlanControl::DrainOutcome PlanRunner::SetDrained(const std::string& id, bool drain) {
  DrainOutcome out;
  for (const ControlWorkerInfo& w : control_->Workers()) out.known |= w.worker_id == id;
  if (!out.known) return out;
  bool in_plan = false;
  {
    MutexLock lock(&state_.mu);
    auto it = std::find(state_.drained_workers.begin(), state_.drained_workers.end(), id);
    if (drain && it == state_.drained_workers.end()) {
      state_.drained_workers.push_back(id);
      out.changed = true;
    } else if (!drain && it != state_.drained_workers.end()) {
      state_.drained_workers.erase(it);
      out.changed = true;
    }
    in_plan = rep().InPlan(id);
  }
  TESSERA_LOG_INFO("coordinator", "worker {} {} by the admin API", id,
                   drain ? "drained" : "undrained");
  // Draining a worker of the plan moves its ranks; undraining re-plans so
  // the worker is used again (a no-op layout change reuses every slice).
  out.replan = out.changed && (drain ? in_plan : true);
  if (out.replan) RequestReplan(std::string(drain ? "drain" : "undrain") + " worker " + id, false);
  return out;
}

void PlanRunner::PlanLoop() {
  while (true) {
    PlanJob job;
    bool exclusion_ended = false;
    {
      MutexLock lock(&state_.mu);
      exclusion_ended = AwaitJobOrExclusionEnd();
      if (state_.stopping) {
        for (PlanJob& j : jobs_)
          if (j.done) j.done({PlanApplyResult::Outcome::kStopping, "", {}});
        jobs_.clear();
        return;
      }
      if (!exclusion_ended) {
        job = std::move(jobs_.front());
        jobs_.pop_front();
        job_running_ = true;
        last_job_start_ = std::chrono::steady_clock::now();
      }
    }
    if (exclusion_ended) {
      ReplanForEndedExclusions();
      continue;
    }
    RunJob(std::move(job));
    {
      MutexLock lock(&state_.mu);
      job_running_ = false;
    }
    ReleaseReturningWorkers();
  }
}

bool PlanRunner::AwaitJobOrExclusionEnd() {
  // No polling: the wait's deadline is the end of an exclusion, and
  // anything else this waits for notifies `cv` (a job queued, stopping, a
  // new exclusion).
  while (!state_.stopping && jobs_.empty()) {
    const std::optional<std::chrono::steady_clock::time_point> due =
        rep().NeedsWorkers() ? state_.NextExclusionEnd(replica_, last_job_start_) : std::nullopt;
    if (!due) {
      state_.ReplicaCv(replica_).wait(state_.mu);
    } else if (std::chrono::steady_clock::now() < *due) {
      state_.ReplicaCv(replica_).wait_until(state_.mu, *due);
    } else {
      return true;
    }
  }
  return false;
}

void PlanRunner::ReplanForEndedExclusions() {
  // Ended by `now`: then UsableWorkers (whose exclusion check is later) no
  // longer leaves them out for their exclusion.
  const auto now = std::chrono::steady_clock::now();
  const std::vector<std::string> usable = UsableWorkers();
  std::vector<std::pair<std::string, WorkerExclusion>> ended;
  bool replan = false;
  {
    MutexLock lock(&state_.mu);
    ended = state_.ClaimEndedExclusions(replica_, last_job_start_, now);
    replan = rep().NeedsWorkers();
  }
  std::string reason;
  for (const auto& [id, e] : ended) {
    const bool is_usable = std::find(usable.begin(), usable.end(), id) != usable.end();
    TESSERA_LOG_INFO("coordinator", "replica {}: worker {}'s exclusion {} ({}) ended{}", replica_,
                     id, e.count, e.kind,
                     is_usable ? "" : "; it is not usable (not registered or lost)");
    if (is_usable)
      reason +=
          fmt::format("{}worker {}'s exclusion ({}) ended", reason.empty() ? "" : "; ", id, e.kind);
  }
  if (replan && !reason.empty()) RequestReplan(reason, false);
}

void PlanRunner::ReleaseReturningWorkers() {
  std::vector<std::string> returned;
  bool replan = false;
  {
    MutexLock lock(&state_.mu);
    if (!jobs_.empty() || state_.returning_workers.empty()) return;
    returned.swap(state_.returning_workers);
    for (const std::string& id : returned)
      state_.failed_workers.erase(
          std::remove(state_.failed_workers.begin(), state_.failed_workers.end(), id),
          state_.failed_workers.end());
    replan = rep().NeedsWorkers();
  }
  for (const std::string& id : returned)
    TESSERA_LOG_INFO("coordinator", "worker {} (declared lost, registered again) is usable", id);
  if (replan) RequestReplan("worker " + returned.front() + " registered again", false);
}

bool PlanRunner::SettleAccusations(const PlanJob& job) {
  bool declared = false;
  WorkerActivity& activity = control_->activity();
  for (const auto& [worker, at] : job.accused) {
    const auto deadline = at + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                   std::chrono::duration<double>(kAccusedSilenceSeconds));
    // Its next message, or its loss, is an event of the control server: the
    // wait below ends on it, or at the deadline (the stop notifies too).
    control_->Watch({worker});
    bool spoke = false, known = false;
    while (true) {
      const uint64_t seen = activity.generation();  // before the check: no event is missed
      const double since_accused =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - at).count();
      known = false;
      for (const ControlWorkerInfo& w : control_->WorkersOf({worker})) {
        if (!w.alive) continue;
        known = true;
        spoke = w.seconds_since_last_message < since_accused;
      }
      {
        MutexLock lock(&state_.mu);
        // An Error of its own (state failed) says it is alive and broke its
        // communicator itself, whenever that Error arrived.
        auto st = state_.states.find(worker);
        spoke |= st != state_.states.end() && st->second == control::WORKER_STATE_FAILED;
        if (!known || spoke || std::chrono::steady_clock::now() >= deadline || state_.stopping)
          break;
      }
      activity.WaitChange(seen, deadline);
    }
    if (!known || spoke) continue;  // lost already, or alive
    const std::string reason = "a survivor saw its connection break and it stayed silent";
    if (!control_->DeclareLost(worker, reason)) continue;
    TESSERA_LOG_ERROR("coordinator", "worker {} lost ({}): marked failed", worker, reason);
    state_.MarkFailed(worker, Unavailable(reason));  // this job re-plans around it
    loop_->Wake();
    declared = true;
  }
  return declared;
}

void PlanRunner::AwaitLiveness(std::chrono::steady_clock::time_point since) {
  // A worker that died may not be declared lost yet: wait until every worker
  // has been heard from after `since`, or was declared lost (at most one
  // heartbeat timeout), so the re-plan does not place a rank on a dead one.
  const double limit = config_.heartbeat.timeout_seconds + 2 * config_.heartbeat.interval_seconds;
  const auto deadline = since + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                    std::chrono::duration<double>(limit));
  WorkerActivity& activity = control_->activity();
  // The live workers not heard from since `since`, watched: the next message
  // of each, and any loss, is an event, so this waits on events, and each
  // check reads only the workers still awaited.
  std::vector<std::string> pending;
  {
    const double elapsed = SecondsSince(since);
    for (const ControlWorkerInfo& w : control_->Workers())
      if (w.alive && w.seconds_since_last_message >= elapsed) pending.push_back(w.worker_id);
  }
  control_->Watch(pending);
  while (!pending.empty()) {
    const uint64_t seen = activity.generation();  // before the check: no event is missed
    const double elapsed = SecondsSince(since);
    std::vector<std::string> silent;
    for (const ControlWorkerInfo& w : control_->WorkersOf(pending))
      if (w.alive && w.seconds_since_last_message >= elapsed) silent.push_back(w.worker_id);
    pending.swap(silent);
    if (pending.empty() || elapsed >= limit) return;
    {
      MutexLock lock(&state_.mu);
      if (state_.stopping) return;
    }
    activity.WaitChange(seen, deadline);
  }
}

void PlanRunner::RunJob(PlanJob job) {
  const auto t0 = std::chrono::steady_clock::now();
  const bool admin = job.target.has_value();
  if (job.fault) {
    bool superseded;
    {
      MutexLock lock(&state_.mu);
      superseded = job.plan_version < rep().plan_version && rep().degraded.empty();
    }
    std::shared_ptr<RemoteExecutor> ex = state_.Executor(replica_);
    if (superseded && ex && ex->health().ok()) {
      TESSERA_LOG_INFO("coordinator", "fault already handled by a later plan: {}", job.reason);
      return;
    }
  } else if (!admin) {
    // Drain / undrain / a registration: nothing to do when the fitted layout
    // and its placement are the running ones.
    auto fit = FitLayout(model_, Wanted(), static_cast<int>(UsableWorkers().size()));
    if (fit.ok()) {
      auto placed = PlaceRanks(*fit, UsableWorkers(), HeldSlices());
      if (placed.ok() && PlanUnchanged(*fit, *placed)) {
        TESSERA_LOG_INFO("coordinator", "re-plan not needed ({}): the placement is unchanged",
                         job.reason);
        return;
      }
    }
  }
  {
    MutexLock lock(&state_.mu);
    ++rep().reconfigurations;
    if (job.fault) ++rep().faults;
  }
  metrics_->Counter(metric::kReconfigurationsTotal).WithLabels({}).Inc();
  if (job.fault) metrics_->Counter(metric::kFaultsTotal).WithLabels({}).Inc();
  TESSERA_LOG_INFO("coordinator", "replica {}: re-plan: {}", replica_, job.reason);
  // A fault breaks the running plan: the replica is not ready (the router
  // sends it nothing; /readyz answers 503 when no replica is) from here
  // until the new plan serves, whoever reported the fault.
  if (job.fault) SetReady(false);
  // Drain: no admission; in-flight sequences get the deadline (none after a
  // fault: the plan is broken), the rest are re-queued.
  const int requeued =
      loop_->Pause(job.fault ? 0.0 : config_.scheduler.drain_timeout_seconds).value_or(0);
  const double drain_seconds = SecondsSince(t0);
  // A broken replica's queue (its re-queued sequences included) goes to the
  // replicas that serve: they finish those requests while this one
  // re-plans.
  const int handed_off = job.fault && hand_off_ ? hand_off_() : 0;
  if (handed_off > 0)
    TESSERA_LOG_INFO("coordinator", "replica {}: {} request(s) moved to the other replicas",
                     replica_, handed_off);
  // A known culprit (declared lost by its heartbeats, or a silent worker a
  // survivor saw disconnect) needs no wait; otherwise (a timeout) wait until
  // every worker was heard from, so no rank lands on a dead one.
  const bool culprit = SettleAccusations(job) || job.culprit_known;
  if (job.fault && !culprit) AwaitLiveness(job.raised);
  const double detect_seconds = SecondsSince(job.raised);
  {
    MutexLock lock(&state_.mu);
    rep().requeued_total += requeued;
  }
  metrics_->Counter(metric::kRequeuedRequestsTotal)
      .WithLabels({})
      .Inc(static_cast<double>(requeued));
  Status result = Status::Ok();
  PlanChangeReport report;
  for (int attempt = 1;; ++attempt) {
    ParallelConfig target;
    std::vector<RankPlacement> ranks;
    std::vector<std::string> usable = UsableWorkers();
    if (job.target) {
      target = *job.target;
    } else {
      auto fit = FitLayout(model_, Wanted(), static_cast<int>(usable.size()));
      if (!fit.ok()) {
        result = fit.status();
        break;
      }
      target = *fit;
    }
    // The planner's workers when it chose them and they are all still usable.
    const bool keep = !job.ranks.empty() &&
                      std::all_of(job.ranks.begin(), job.ranks.end(), [&](const RankPlacement& r) {
                        return std::find(usable.begin(), usable.end(), r.worker_id) != usable.end();
                      });
    auto placed = keep ? StatusOr<std::vector<RankPlacement>>(job.ranks)
                       : PlaceRanks(target, usable, HeldSlices());
    if (!placed.ok()) {
      result = placed.status();
      break;
    }
    result = ApplyPlan(target, *placed, job.reason, report, keep ? job.planned : nullptr);
    if (result.ok() || job.target || attempt >= kMaxFitAttempts) break;
    TESSERA_LOG_WARN("coordinator", "re-plan attempt {} failed: {}; retrying", attempt,
                     result.ToString());
    {
      MutexLock lock(&state_.mu);
      if (state_.stopping) return;
    }
  }
  if (result.ok()) {
    {
      MutexLock lock(&state_.mu);
      rep().degraded.clear();
      if (admin) rep().wanted = *job.target;
      ReplanFigures& figures = report.replan.emplace();
      figures.drain_seconds = drain_seconds;
      if (job.fault) figures.detect_seconds = detect_seconds;
      figures.requeued_requests = requeued;
      figures.handed_off_requests = handed_off;
      figures.total_seconds = SecondsSince(t0);
      if (!rep().history.empty()) rep().history.back() = report;
    }
    bool serving = false;
    {
      MutexLock lock(&state_.mu);
      serving = rep().serving;
    }
    // The replica's first plan that loaded (its first placement failed)
    // starts the serving loop.
    if (serving)
      loop_->Resume();
    else
      StartServing();
    SetReady(true);
    TESSERA_LOG_INFO(
        "coordinator", "re-plan done in {:.2f} s ({}drain {:.2f} s, {} requests re-queued): {}",
        SecondsSince(t0),
        job.fault ? fmt::format("detected {:.2f} s after its first sign, ", detect_seconds)
                  : std::string(),
        drain_seconds, requeued, job.reason);
    if (job.done) job.done({PlanApplyResult::Outcome::kApplied, "", std::move(report)});
    return;
  }
  TESSERA_LOG_ERROR("coordinator", "re-plan failed: {}", result.ToString());
  if (admin) {
    // The new layout could not be loaded: fall back to the wanted layout on
    // the usable workers, so the cluster serves again.
    if (job.done) job.done({PlanApplyResult::Outcome::kFailed, result.message(), {}});
    RequestReplan("recovering after a failed reconfiguration", true);
    return;
  }
  {
    MutexLock lock(&state_.mu);
    rep().degraded = result.message();
  }
  SetReady(false);
  TESSERA_LOG_ERROR("coordinator", "replica {}: degraded: {}; waiting for workers", replica_,
                    result.message());
}

}  // namespace tessera
