// ReplicaSet: the coordinator's data-parallel replicas behind one API.
//
// Each replica has its own workers, its own ServingLoop (scheduler, KV pool,
// serving thread) and its own PlanRunner (plan changes, on their thread);
// its plan is ClusterState::replicas[i]. The set
//
//  - places them (its placement thread): waits for parallel.workers (an
//    explicit layout: replicas x tp x pp), or adopts the complete plans
//    re-registered workers hold (a restarted coordinator); otherwise plans
//    every replica at once (ReplicaPlacer: parallel.replicas, the objective)
//    and starts each replica's runner on its first plan;
//  - routes requests (RequestSink): ReplicaRouter picks the replica by load
//    (outstanding tokens, free KV blocks) and prefix affinity; a full queue
//    passes the request to the next replica, and only when every replica's
//    queue is full does Submit answer kResourceExhausted (429). The
//    schedulers share one OutputProcessor, so request ids are unique over
//    the replicas and a queued request can move between them keeping its
//    stream, stop strings and logprobs;
//  - hands a broken replica's queue to the serving replicas (HandOff, called
//    by its runner after the fault's pause): every waiting request, the
//    re-queued ones included, goes to the least loaded serving replica and
//    resumes there from prompt + generated tokens (none lost or duplicated);
//    with no other replica serving they stay and wait for the re-plan;
//  - routes the admin API (PlanControl) to a replica: POST /admin/plan's
//    `replica`, a worker's drain to its replica, a replica's drain
//    (SetReplicaDrained: the router sends it nothing new, its queue moves).
//
// Thread-safety: Start and Stop from one thread (Stop after
// ClusterState::stopping is set); everything else from any thread. The
// replicas are created once by the placement thread before placed() turns
// true and never change after.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/base/mutex.h"
#include "common/base/thread_annotations.h"
#include "common/config/daemon_config.h"
#include "common/engine/output_processor.h"
#include "common/engine/scheduler.h"
#include "common/metrics/metrics_registry.h"
#include "common/net/tcp_store.h"
#include "coordinator/control/control_server.h"
#include "coordinator/serving/cluster_state.h"
#include "coordinator/serving/leader_loop.h"
#include "coordinator/serving/plan_control.h"
#include "coordinator/serving/plan_runner.h"
#include "coordinator/serving/replica_placement.h"
#include "coordinator/serving/replica_router.h"
#include "coordinator/serving/request_sink.h"
#include "coordinator/serving/serving_loop.h"

namespace tessera {

// One replica's load and counters (GET /admin/cluster, tessera status).
struct ReplicaLoadInfo {
  bool accepting = false;          // started and not drained by the admin
  int64_t outstanding_tokens = 0;  // queued + running, see ReplicaRouter
  int64_t free_kv_blocks = 0;
  int64_t kv_blocks = 0;
  size_t waiting = 0, running = 0;
  int64_t routed_total = 0;      // requests routed or handed to it
  int64_t finished_total = 0;    // requests that finished on it
  int64_t handed_off_total = 0;  // requests it handed to other replicas
};

class ReplicaSet : public RequestSink, public PlanControl {
 public:
  // Everything here outlives the set.
  struct Context {
    const DaemonConfig* config = nullptr;
    const ModelConfig* model = nullptr;
    const Tokenizer* tokenizer = nullptr;  // may be null
    ParallelConfig configured;             // explicit mode: the configured layout
    // Explicit mode: replica index -> its own layout (parallel.replica_override).
    std::map<int, ParallelConfig> overrides;
    int expected_workers = 1;
    int64_t max_context = 0;
    SchedulerOptions scheduler;  // every replica's (the set adds the shared output)
    ControlServer* control = nullptr;
    TcpStoreServer* store = nullptr;
    std::string store_secret;
    MetricsRegistry* metrics = nullptr;
    Planner* planner = nullptr;
    ClusterState* state = nullptr;
  };
  explicit ReplicaSet(Context context);
  ~ReplicaSet() override;
  ReplicaSet(const ReplicaSet&) = delete;
  ReplicaSet& operator=(const ReplicaSet&) = delete;

  void Start();  // the placement thread
  // Stops every replica's loop, then its runner, and the placement thread.
  void Stop();

  bool placed() const { return placed_.load(std::memory_order_acquire); }
  int size() const { return placed() ? static_cast<int>(replicas_.size()) : 0; }
  // Replica `r` (0 <= r < size()).
  PlanRunner* runner(int r) const { return replicas_[static_cast<size_t>(r)]->runner.get(); }
  ReplicaLoop* loop(int r) const { return replicas_[static_cast<size_t>(r)]->loop.get(); }
  // A change is queued or running on some replica.
  bool reconfiguring() const;
  ReplicaLoadInfo Load(int r) const EXCLUDES(routes_mu_);

  // RequestSink.
  StatusOr<std::vector<int64_t>> Submit(std::vector<GenerationRequest> requests,
                                        std::vector<RequestCallbacks> callbacks) override
      EXCLUDES(routes_mu_);
  void Cancel(const std::vector<int64_t>& ids) override EXCLUDES(routes_mu_);
  size_t waiting() const override;  // over every replica
  size_t running() const override;

  // PlanControl: routed to request.replica (absent: replica 0 when there
  // is one; with several, kInvalidArgument asks for it).
  StatusOr<PlanProposal> Propose(const PlanRequest& request) const override;
  PlanDryRun DryRun(const PlanProposal& proposal) const override;
  Status Apply(PlanProposal proposal, PlanApplyDone done) override;
  DrainOutcome SetDrained(const std::string& id, bool drain) override;
  StatusOr<bool> SetReplicaDrained(int replica, bool drain) override EXCLUDES(routes_mu_);

  // Moves replica `from`'s queued requests to the serving replicas; returns
  // how many moved (PlanRunner's hand_off).
  int HandOff(int from) EXCLUDES(routes_mu_);

  // The control server's thread: RequestUpdates of plan `updates.plan_version`
  // from `worker_id`, for replica `replica` when it schedules on its leader
  // (LeaderLoop::OnUpdates, which takes them). False: dropped (no such
  // leader, a superseded plan, or the coordinator schedules that replica),
  // `updates` left as it was.
  bool OnLeaderUpdates(int replica, const std::string& worker_id,
                       control::RequestUpdates&& updates);

 private:
  struct Replica {
    std::unique_ptr<ReplicaLoop> loop;
    LeaderLoop* leader = nullptr;  // `loop`, when the replica schedules on its leader
    std::unique_ptr<PlanRunner> runner;
  };
  // One routed request: the set and the request's own callbacks (fixed
  // when it is made), the rest guarded by routes_mu_. Its wrapped callbacks
  // capture only the Route's shared_ptr, which std::function holds without
  // an allocation.
  struct Route {
    ReplicaSet* set = nullptr;
    std::shared_ptr<const RequestCallbacks> inner;
    int64_t id = -1;  // -1 until Submit returned
    int replica = 0;
    int64_t remaining = 0;  // its part of outstanding_[replica]
    bool finished = false;
    bool cancelled = false;
  };

  // The placement thread: waits for the workers (on the control server's
  // registrations and losses, WorkerActivity), then places every replica.
  void PlaceAll();
  // Every replica's load into `loads` (resized; its storage reused).
  void Loads(int exclude, std::vector<ReplicaLoad>& loads) const EXCLUDES(routes_mu_);
  // The callbacks the replica's loop runs for `route`'s request: they keep
  // the route's counts, then run route->inner's.
  static RequestCallbacks Wrap(const std::shared_ptr<Route>& route);
  Status CheckReplica(int replica) const;

  Context c_;
  ReplicaPlacer placer_;
  ReplicaRouter router_;
  // Shared by every replica's scheduler (see the header comment).
  std::shared_ptr<OutputProcessor> output_;
  std::vector<std::unique_ptr<Replica>> replicas_;  // written once before placed_
  std::atomic<bool> placed_{false};
  std::thread thread_;

  mutable Mutex routes_mu_;  // a leaf: nothing is called while it is held
  std::unordered_map<int64_t, std::shared_ptr<Route>> routes_ GUARDED_BY(routes_mu_);
  std::vector<int64_t> outstanding_ GUARDED_BY(routes_mu_);
  std::vector<bool> drained_ GUARDED_BY(routes_mu_);
  std::vector<int64_t> routed_ GUARDED_BY(routes_mu_);
  std::vector<int64_t> finished_ GUARDED_BY(routes_mu_);
  std::vector<int64_t> handed_off_ GUARDED_BY(routes_mu_);
};

}  // namespace tessera
