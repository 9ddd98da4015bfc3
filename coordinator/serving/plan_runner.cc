#include "coordinator/serving/plan_runner.h"

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>

#include "common/base/logging.h"
#include "common/metrics/metric_catalog.h"

namespace tessera {

using nlohmann::json;

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
      expected_workers_(c.expected_workers),
      configured_(c.configured),
      max_context_(c.max_context),
      control_(c.control),
      store_(c.store),
      store_secret_(c.store_secret),
      metrics_(c.metrics),
      planner_(c.planner),
      state_(*c.state),
      loop_(c.loop) {}

PlanRunner::~PlanRunner() { Stop(); }

void PlanRunner::Start() {
  thread_ = std::thread([this] { PlaceAndServe(); });
}

void PlanRunner::Stop() {
  if (thread_.joinable()) thread_.join();
}

void PlanRunner::PlaceAndServe() {
  auto fail = [&](const Status& s) {
    TESSERA_LOG_ERROR("coordinator", "placement failed: {}", s.ToString());
    MutexLock lock(&state_.mu);
    state_.placement_status = s;
    state_.cv.notify_all();
  };
  // 1. Wait for the workers: the layout's count (parallel.workers in auto
  //    mode), or (after a coordinator restart) workers re-registering with a
  //    complete plan they hold.
  std::vector<std::string> workers;
  std::optional<std::pair<ParallelConfig, std::vector<RankPlacement>>> adopted;
  uint64_t adopted_version = 0;
  int64_t adopted_kv_blocks = 0;
  while (true) {
    {
      MutexLock lock(&state_.mu);
      if (state_.cv.wait_for(state_.mu, std::chrono::milliseconds(100),
                             [&]() REQUIRES(state_.mu) { return state_.stopping; }))
        return;
    }
    workers = UsableWorkers();
    adopted = HeldPlan(workers, &adopted_version, &adopted_kv_blocks);
    if (adopted || static_cast<int>(workers.size()) >= expected_workers_) break;
  }
  // 2. Place: the adopted plan's ranks, or the planner's placement (nothing
  //    is assigned unless a layout fits); then apply: workers reuse the
  //    weights they hold.
  std::vector<RankPlacement> ranks;
  std::optional<PlanResult> planned;
  std::vector<Assignment> predicted;
  std::string reason = "initial placement";
  if (adopted) {
    MutexLock lock(&state_.mu);
    state_.parallel = state_.wanted = adopted->first;
    state_.plan_version = adopted_version;
    state_.kv_blocks = adopted_kv_blocks;
    ranks = adopted->second;
    reason = "adopted plan " + std::to_string(adopted_version) + " held by the workers";
    TESSERA_LOG_INFO("coordinator", "{}: {}", reason, state_.parallel.ToString());
  } else {
    std::vector<ControlWorkerInfo> infos = WorkerInfos(workers);
    infos.resize(static_cast<size_t>(expected_workers_));  // the rest are spares
    if (Status st = Plan(infos); !st.ok()) return fail(st);
    MutexLock lock(&state_.mu);
    state_.wanted = state_.parallel;
    predicted.swap(state_.assignments);  // ApplyPlan fills state_.assignments anew
    planned = std::move(state_.plan_result);
    state_.plan_result.reset();
    TESSERA_LOG_INFO("coordinator", "placing {} on {} of {} workers\n{}",
                     state_.parallel.ToString(), predicted.size(), workers.size(),
                     planned ? planned->ToText() : std::string("(explicit tp per stage)"));
    for (const Assignment& a : predicted) {
      RankPlacement r = RankSlice(state_.parallel, a.world_rank);
      r.worker_id = a.worker_id;
      ranks.push_back(r);
    }
  }
  json report;
  ParallelConfig layout;
  {
    MutexLock lock(&state_.mu);
    layout = state_.parallel;
  }
  Status applied = ApplyPlan(layout, ranks, reason, report, std::move(planned), &predicted);
  if (!applied.ok()) return fail(applied);
  // 3. Serve.
  int64_t kv_blocks = 0;
  {
    MutexLock lock(&state_.mu);
    kv_blocks = state_.kv_blocks;
  }
  std::shared_ptr<RemoteExecutor> executor = state_.Executor();
  loop_->Start(
      executor, [executor] { return executor->health(); }, kv_blocks, executor->plan_version());
  {
    MutexLock lock(&state_.mu);
    state_.serving = true;
  }
  state_.ready.store(true);
  state_.cv.notify_all();
  // 4. Re-plan on demand.
  PlanLoop();
}

void PlanRunner::RequestReplan(
    const std::string& reason, bool fault, bool culprit_known,
    std::vector<std::pair<std::string, std::chrono::steady_clock::time_point>> accused) {
  MutexLock lock(&state_.mu);
  if (state_.stopping) return;
  // One pending re-fit covers every fault reported before it runs.
  for (PlanJob& j : jobs_)
    if (!j.target && !j.res) {
      j.reason += "; " + reason;
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
  job.plan_version = state_.plan_version;
  job.raised = std::chrono::steady_clock::now();
  jobs_.push_back(std::move(job));
  state_.cv.notify_all();
}

bool PlanRunner::reconfiguring() const {
  MutexLock lock(&state_.mu);
  return job_running_ || !jobs_.empty();
}

ParallelConfig PlanRunner::Wanted() const {
  MutexLock lock(&state_.mu);
  return state_.wanted;
}

Status PlanRunner::Apply(PlanProposal proposal, std::shared_ptr<Responder> res) {
  MutexLock lock(&state_.mu);
  if (!state_.serving || job_running_ || !jobs_.empty())
    return FailedPrecondition(state_.serving
                                  ? "a reconfiguration is in progress; retry when it is done"
                                  : "the initial placement is in progress; retry when serving");
  PlanJob job;
  job.target = proposal.parallel;
  job.reason = std::string("POST /admin/plan ") + (proposal.planned ? "auto " : "") +
               proposal.parallel.ToString();
  if (proposal.planned) {
    job.ranks = std::move(proposal.ranks);
    job.planned = std::move(proposal.planned);
  }
  job.res = std::move(res);
  jobs_.push_back(std::move(job));
  state_.cv.notify_all();
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
    in_plan = state_.InPlan(id);
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
    {
      MutexLock lock(&state_.mu);
      state_.cv.wait(state_.mu,
                     [&]() REQUIRES(state_.mu) { return state_.stopping || !jobs_.empty(); });
      if (state_.stopping) {
        for (PlanJob& j : jobs_)
          if (j.res) j.res->SendError(503, "the coordinator is stopping");
        jobs_.clear();
        return;
      }
      job = std::move(jobs_.front());
      jobs_.pop_front();
      job_running_ = true;
    }
    RunJob(std::move(job));
    {
      MutexLock lock(&state_.mu);
      job_running_ = false;
    }
    ReleaseReturningWorkers();
  }
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
    replan = state_.serving && (!state_.degraded.empty() ||
                                state_.parallel.world_size() < state_.wanted.world_size());
  }
  for (const std::string& id : returned)
    TESSERA_LOG_INFO("coordinator", "worker {} (declared lost, registered again) is usable", id);
  if (replan) RequestReplan("worker " + returned.front() + " registered again", false);
}

bool PlanRunner::SettleAccusations(const PlanJob& job) {
  bool declared = false;
  for (const auto& [worker, at] : job.accused) {
    const auto deadline = at + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                   std::chrono::duration<double>(kAccusedSilenceSeconds));
    bool spoke = false, known = false;
    while (true) {
      const double since_accused =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - at).count();
      known = false;
      for (const ControlWorkerInfo& w : control_->Workers()) {
        if (w.worker_id != worker || !w.alive) continue;
        known = true;
        spoke = w.seconds_since_last_message < since_accused;
      }
      MutexLock lock(&state_.mu);
      // An Error of its own (state failed) says it is alive and broke its
      // communicator itself, whenever that Error arrived.
      auto st = state_.states.find(worker);
      spoke |= st != state_.states.end() && st->second == control::WORKER_STATE_FAILED;
      if (!known || spoke || std::chrono::steady_clock::now() >= deadline || state_.stopping) break;
      state_.cv.wait_for(state_.mu, std::chrono::milliseconds(5));
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
  while (SecondsSince(since) < limit) {
    bool settled = true;
    const double elapsed = SecondsSince(since);
    for (const ControlWorkerInfo& w : control_->Workers())
      if (w.alive && w.seconds_since_last_message >= elapsed) settled = false;
    if (settled) return;
    MutexLock lock(&state_.mu);
    if (state_.cv.wait_for(state_.mu, std::chrono::milliseconds(20),
                           [&]() REQUIRES(state_.mu) { return state_.stopping; }))
      return;
  }
}

void PlanRunner::RunJob(PlanJob job) {
  const auto t0 = std::chrono::steady_clock::now();
  const bool admin = job.target.has_value();
  if (job.fault) {
    bool superseded;
    {
      MutexLock lock(&state_.mu);
      superseded = job.plan_version < state_.plan_version && state_.degraded.empty();
    }
    std::shared_ptr<RemoteExecutor> ex;
    {
      MutexLock lock(&state_.exec_mu);
      ex = state_.executor;
    }
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
    ++state_.reconfigurations;
    if (job.fault) ++state_.faults;
  }
  metrics_->Counter(metric::kReconfigurationsTotal).WithLabels({}).Inc();
  if (job.fault) metrics_->Counter(metric::kFaultsTotal).WithLabels({}).Inc();
  TESSERA_LOG_INFO("coordinator", "re-plan: {}", job.reason);
  // A fault breaks the running plan: /readyz answers 503 (re-planning) from
  // here until the new plan serves, whoever reported the fault.
  if (job.fault) state_.ready.store(false);
  // Drain: no admission; in-flight sequences get the deadline (none after a
  // fault: the plan is broken), the rest are re-queued.
  const int requeued =
      loop_->Pause(job.fault ? 0.0 : config_.scheduler.drain_timeout_seconds).value_or(0);
  const double drain_seconds = SecondsSince(t0);
  // A known culprit (declared lost by its heartbeats, or a silent worker a
  // survivor saw disconnect) needs no wait; otherwise (a timeout) wait until
  // every worker was heard from, so no rank lands on a dead one.
  const bool culprit = SettleAccusations(job) || job.culprit_known;
  if (job.fault && !culprit) AwaitLiveness(job.raised);
  const double detect_seconds = SecondsSince(job.raised);
  {
    MutexLock lock(&state_.mu);
    state_.requeued_total += requeued;
  }
  metrics_->Counter(metric::kRequeuedRequestsTotal)
      .WithLabels({})
      .Inc(static_cast<double>(requeued));
  Status result = Status::Ok();
  json report;
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
    result = ApplyPlan(target, *placed, job.reason, report,
                       keep ? job.planned : std::optional<PlanResult>());
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
      state_.degraded.clear();
      if (admin) state_.wanted = *job.target;
      report["drain_seconds"] = drain_seconds;
      if (job.fault) report["detect_seconds"] = detect_seconds;
      report["requeued_requests"] = requeued;
      report["total_seconds"] = SecondsSince(t0);
      if (!state_.history.empty()) state_.history.back() = report;
    }
    loop_->Resume();
    state_.ready.store(true);
    state_.cv.notify_all();
    TESSERA_LOG_INFO("coordinator",
                     "re-plan done in {:.2f} s (drain {:.2f} s, {} requests re-queued): {}",
                     SecondsSince(t0), drain_seconds, requeued, job.reason);
    if (job.res) job.res->SendJson(200, report.dump());
    return;
  }
  TESSERA_LOG_ERROR("coordinator", "re-plan failed: {}", result.ToString());
  if (admin) {
    // The new layout could not be loaded: fall back to the wanted layout on
    // the usable workers, so the cluster serves again.
    if (job.res)
      job.res->SendError(503, "applying the plan failed: " + result.message() +
                                  "; re-planning the previous layout");
    RequestReplan("recovering after a failed reconfiguration", true);
    return;
  }
  {
    MutexLock lock(&state_.mu);
    state_.degraded = result.message();
  }
  state_.ready.store(false);
  TESSERA_LOG_ERROR("coordinator", "degraded: {}; waiting for workers", result.message());
}

}  // namespace tessera
