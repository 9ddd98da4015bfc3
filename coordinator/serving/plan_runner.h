// PlanRunner: one replica's plans (coordinator/serving/replica_set.h): it
// applies the replica's first plan and every later change, on its own
// thread, one change at a time.
//
//  1. Start(first): the replica set placed every replica (ReplicaPlacer) or
//     found the plan re-registered workers hold (a restarted coordinator:
//     same layout and ranks, a new version, weights reused).
//  2. Applies it (ApplyPlan: Drain the old plan's workers, AssignShard under
//     a new plan version, wait for every Loaded), starts the replica's
//     serving loop and marks the replica ready. A first plan that fails to
//     load (a worker lost, failing or past heartbeat.load_timeout_seconds:
//     excluded) leaves the replica degraded ("first placement failed: ...")
//     and queues a re-fit as for a fault (step 3); the first re-plan that
//     loads starts the serving loop.
//  3. Runs the queued changes (POST /admin/plan, drain / undrain, a lost or
//     failing worker, a registration or the end of a worker's exclusion
//     while degraded or shrunk): pause command on the serving loop (drain
//     and re-queue), ApplyPlan, swap command, resume command. A failed
//     re-fit after kMaxFitAttempts leaves the replica degraded until a
//     worker registers or an exclusion ends: while the replica lacks
//     workers (ReplicaPlan::NeedsWorkers), the plan thread's wait has a
//     deadline, the earliest end of an exclusion it could use
//     (ClusterState::NextExclusionEnd), and it re-plans then. After a fault's pause
//     the replica hands its queued requests (re-queued ones included) to
//     the other replicas (`hand_off`), which serve them while it re-plans.
//
// The replica plans on its own workers and the spares (workers no replica
// holds); a worker another replica took meanwhile fails the attempt, and the
// next one places without it. It implements PlanControl for the admin API
// (the replica set routes a request to its replica).
//
// Thread-safety: Start and Stop from one thread (Stop after
// ClusterState::stopping is set and the serving loop stopped); the rest from
// any thread. Its job queue and its replica's plan are guarded by the
// cluster state's mutex.
#pragma once

#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/config/daemon_config.h"
#include "common/format/model_config.h"
#include "common/metrics/metrics_registry.h"
#include "common/net/tcp_store.h"
#include "common/wire/control.pb.h"
#include "coordinator/control/control_server.h"
#include "coordinator/placement/plan_change.h"
#include "coordinator/placement/planner.h"
#include "coordinator/serving/cluster_state.h"
#include "coordinator/serving/plan_control.h"
#include "coordinator/serving/plan_report.h"
#include "coordinator/serving/replica_placement.h"
#include "coordinator/serving/serving_loop.h"

namespace tessera {

class PlanRunner : public PlanControl {
 public:
  // Everything here outlives the runner.
  struct Context {
    const DaemonConfig* config = nullptr;
    const ModelConfig* model = nullptr;
    int replica = 0;  // its index in ClusterState::replicas
    const ReplicaPlacer* placer = nullptr;
    ControlServer* control = nullptr;
    TcpStoreServer* store = nullptr;
    std::string store_secret;  // the store's deployment secret (per-rank keys derive from it)
    MetricsRegistry* metrics = nullptr;
    Planner* planner = nullptr;
    ClusterState* state = nullptr;
    ReplicaLoop* loop = nullptr;  // the replica's
    // Set when the replica schedules itself ([scheduler] runs_on =
    // "leader"): each plan's AssignShard to stage 0, tp rank 0 carries it.
    std::optional<control::LeaderOptions> leader;
    // Moves the replica's queued requests to the other serving replicas;
    // returns how many moved. May be empty.
    std::function<int()> hand_off;
  };
  explicit PlanRunner(Context context);
  ~PlanRunner() override;

  // The plan thread: steps 2 and 3 of the header comment, from `first`.
  void Start(ReplicaStart first);
  int replica() const { return replica_; }
  void Stop();  // joins it; queued admin requests get a 503

  // Queues a re-fit of the wanted layout to the usable workers (`fault`: the
  // running plan is broken, no drain wait). One pending re-fit covers every
  // fault reported before it runs.
  // `culprit_known`: the lost worker is known (declared lost), so the
  // re-plan waits for nothing; `accused`: workers a survivor saw disconnect
  // (see PlanJob); `fault_at`: the fault's first sign when it came before
  // this call (a lost worker's last message, its connection closing), else
  // now; the job's `raised` is the earliest of its faults'.
  void RequestReplan(
      const std::string& reason, bool fault, bool culprit_known = false,
      std::vector<std::pair<std::string, std::chrono::steady_clock::time_point>> accused = {},
      std::optional<std::chrono::steady_clock::time_point> fault_at = std::nullopt)
      EXCLUDES(state_.mu);
  // The serving loop's step failed (`failed`): the replica stops taking
  // requests and re-plans as for a fault. A step that missed
  // heartbeat.step_timeout_seconds is hung: the plan's worker that was still
  // computing it (the longest Heartbeat.step_compute_seconds, at least half
  // the deadline) is named, excluded like a worker that fails to load, and
  // the re-plan leaves it out at once.
  void OnStepFailed(const Status& failed) EXCLUDES(state_.mu);
  // A change is queued or running.
  bool reconfiguring() const EXCLUDES(state_.mu);
  // Sets the replica's ready flag (and the cluster's): false stops the
  // router sending it requests until its re-plan serves.
  void SetReady(bool ready) EXCLUDES(state_.mu);

  // PlanControl.
  StatusOr<PlanProposal> Propose(const PlanRequest& request) const override;
  PlanDryRun DryRun(const PlanProposal& proposal) const override;
  Status Apply(PlanProposal proposal, PlanApplyDone done) override;
  DrainOutcome SetDrained(const std::string& id, bool drain) override;

 private:
  // One re-plan. `target` set: an admin layout, already validated; empty:
  // re-fit the wanted layout to the usable workers.
  struct PlanJob {
    std::optional<ParallelConfig> target;
    std::string reason;
    PlanApplyDone done;  // called with the result (admin requests)
    // With `target` from the planner (auto): its worker per rank (used while
    // they are all usable, else PlaceRanks) and its explanation.
    std::vector<RankPlacement> ranks;
    std::shared_ptr<const PlanResult> planned;
    bool fault = false;         // the running plan is broken: no drain wait
    uint64_t plan_version = 0;  // the plan running when the fault was raised
    // The first sign of its earliest fault; `detect_seconds` runs from here
    // to the lost worker being known.
    std::chrono::steady_clock::time_point raised = std::chrono::steady_clock::now();
    // The fault's lost worker is known (declared lost): no AwaitLiveness.
    bool culprit_known = false;
    // Workers whose connection a survivor saw break (Error.lost_peer_
    // world_ranks), with when: declared lost unless they speak within
    // kAccusedSilenceSeconds (a live rank that broke its own communicator
    // reports its own Error at once; a killed one says nothing).
    std::vector<std::pair<std::string, std::chrono::steady_clock::time_point>> accused;
  };

  // plan_runner.cc: the thread and the changes.
  void Serve(ReplicaStart first);
  // This replica's plan (ClusterState::replicas[replica_]).
  ReplicaPlan& rep() const REQUIRES(state_.mu) {
    return state_.replicas[static_cast<size_t>(replica_)];
  }

  // Starts the serving loop on the replica's executor (its first plan that
  // loaded) and marks the replica serving.
  void StartServing() EXCLUDES(state_.mu);
  void PlanLoop();
  void RunJob(PlanJob job);
  ParallelConfig Wanted() const EXCLUDES(state_.mu);
  // Waits until every worker was heard from after `since` or declared lost
  // (at most a heartbeat timeout), on the control server's events
  // (WorkerActivity: it watches the silent ones), not on a timer.
  void AwaitLiveness(std::chrono::steady_clock::time_point since) EXCLUDES(state_.mu);
  // Declares lost the accused workers of `job` that stayed silent (and
  // fails their steps); true if any was. Waits on the control server's
  // events for each accused worker's next message.
  bool SettleAccusations(const PlanJob& job) EXCLUDES(state_.mu);
  // After the last queued re-plan: the returning workers become usable.
  void ReleaseReturningWorkers() EXCLUDES(state_.mu);
  // Waits (with `state_.mu`) until a job is queued, stopping, or, while the
  // replica lacks workers, an exclusion it could use ended; returns whether
  // it was the latter.
  bool AwaitJobOrExclusionEnd() REQUIRES(state_.mu);
  // Claims the exclusions that ended (ClusterState::ClaimEndedExclusions)
  // and re-plans if the replica still lacks workers and one of their
  // workers is usable ("worker X's exclusion (kind) ended").
  void ReplanForEndedExclusions() EXCLUDES(state_.mu);

  // plan_apply.cc. Loads `ranks` of `parallel` under a new plan version
  // (the loop paused or not started), swaps the executor, fills `report`
  // and appends it to the replica's history. `planned`: the planner's result when it chose this
  // plan (GET /admin/plan shows it); `predicted`: its per-rank predictions. Errors: a worker lost
  // or failing while loading, the load deadline, stopping. Errors also: a rank's worker taken by
  // another replica meanwhile.
  Status ApplyPlan(const ParallelConfig& parallel, const std::vector<RankPlacement>& ranks,
                   const std::string& reason, PlanChangeReport& report,
                   std::shared_ptr<const PlanResult> planned = nullptr,
                   const std::vector<Assignment>* predicted = nullptr);
  // A load of plan `version` failed: at the load deadline (`error` null) or
  // on `reporter`'s Error (`error`). Excludes the workers at fault
  // (load_culprits.h) with a back-off, counts and logs it, and returns the
  // failure naming them.
  Status ExcludeLoadCulprits(uint64_t version, const std::string& reporter,
                             const std::string* error) REQUIRES(state_.mu);
  // The rendezvous store's address as the worker at `worker_address` reaches
  // it: the store's host, or, when it listens on every interface, this
  // host's address on the route to the worker.
  std::string StoreHostFor(const std::string& worker_address) const;

  // plan_proposal.cc: computing layouts and placements.
  // The workers this replica may use: usable (ClusterState::UsableWorkers),
  // and its own or spares.
  std::vector<std::string> UsableWorkers() const EXCLUDES(state_.mu);
  // The registrations of the workers `ids`, in that order.
  std::vector<ControlWorkerInfo> WorkerInfos(const std::vector<std::string>& ids) const;
  std::map<std::string, HeldSlice> HeldSlices() const;  // what each worker holds
  // {"auto": true}: the placement planner's choice for `objective` over the
  // usable workers. Errors: kInvalidArgument naming why.
  StatusOr<PlanProposal> ProposeAuto(Objective objective) const;
  // Whether `ranks` of `target` are exactly the running plan.
  bool PlanUnchanged(const ParallelConfig& target, const std::vector<RankPlacement>& ranks) const;

  const DaemonConfig& config_;
  const ModelConfig& model_;
  const int replica_;
  const ReplicaPlacer& placer_;
  ControlServer* const control_;
  TcpStoreServer* const store_;
  const std::string store_secret_;
  MetricsRegistry* const metrics_;
  Planner* const planner_;
  ClusterState& state_;
  ReplicaLoop* const loop_;
  const std::optional<control::LeaderOptions> leader_;
  const std::function<int()> hand_off_;

  std::deque<PlanJob> jobs_ GUARDED_BY(state_.mu);
  bool job_running_ GUARDED_BY(state_.mu) = false;  // a re-plan is in progress
  // When the last job started (the plan thread's own): that job saw every
  // exclusion that had ended by then, so only later ends re-plan.
  std::chrono::steady_clock::time_point last_job_start_ = std::chrono::steady_clock::now();
  std::thread thread_;
};

}  // namespace tessera
