// CoordinatorDaemon: the body of `tessera-coordinator`.
//
//  1. Binds the control plane (ZeroMQ ROUTER), the Gloo rendezvous store
//     (TcpStoreServer: the coordinator is the store, no shared file system)
//     and the HTTP listeners (OpenAI API, health, admin).
//  2. Waits for parallel.workers workers (tp * pp in explicit mode) to
//     register, builds the cluster model from their topology reports
//     (coordinator/control/worker_cluster.h) and asks its Planner
//     (coordinator/placement/planner.h; PlacementPlanner) for a placement: in auto mode
//     the planner's choice, in explicit mode the configured tp, pp and layer
//     split, checked the same way. A layout that is invalid or does not fit
//     is refused with the planner's reasons before any worker loads
//     anything. Otherwise it applies the plan (ApplyPlan: AssignShard, wait
//     for every Loaded). The KV cache holds, on every
//     rank, the blocks that fit on the tightest one (bounded by
//     kv_cache.max_blocks and by what the scheduler can use).
//     After a coordinator restart, workers register again with the shard
//     they hold (Register.held_shard); when those form a complete plan, it
//     is adopted instead: same layout, same ranks, version + 1, and every
//     worker reuses its weights instead of reading them again.
//  3. Serves: the Scheduler's owner thread runs continuous batching over a
//     RemoteExecutor; HTTP handlers enqueue requests and stream tokens back.
//  4. Re-plans while serving (the plan thread runs one change at a time):
//     POST /admin/plan, worker drain / undrain, a lost worker, a worker's
//     error (a collective that timed out), a worker registering while the
//     cluster is degraded or runs a shrunk layout. A change computes the new
//     layout and placement (coordinator/placement/plan_change.h), then applies it:
//     drain the scheduler (no admission; in-flight sequences get
//     scheduler.drain_timeout_seconds to finish), re-queue the unfinished
//     ones (they resume from prompt + generated tokens), Drain the old
//     plan's workers, AssignShard under plan version + 1 (new Gloo key
//     prefix; workers reuse the weight slices they hold), wait for Loaded,
//     swap the executor and resume. Every change is logged and listed in
//     GET /admin/plan's "history".
//
// A lost worker of the plan fails the steps in flight; the scheduler
// re-queues their sequences and the plan thread re-plans onto the usable
// workers (FitLayout's rule). When no layout fits, the cluster is degraded:
// /readyz answers 503 with the reason, /admin/cluster shows it, queued
// requests wait, and a worker registering triggers a new attempt.
//
// Thread-safety: Start/Stop from one thread; the accessors are thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/config/daemon_config.h"
#include "common/engine/scheduler.h"
#include "common/format/model_config.h"
#include "common/metrics/metrics_registry.h"
#include "common/model/parallel_config.h"
#include "common/net/http_server.h"
#include "common/net/ports_file.h"
#include "common/net/tcp_store.h"
#include "common/tokenizer/tokenizer.h"
#include "coordinator/api/request_metrics.h"
#include "coordinator/control/control_plane_guard.h"
#include "coordinator/control/control_server.h"
#include "coordinator/control/remote_executor.h"
#include "coordinator/placement/plan_change.h"
#include "coordinator/placement/planner.h"

namespace tessera {

class CoordinatorDaemon {
 public:
  explicit CoordinatorDaemon(DaemonConfig config);
  ~CoordinatorDaemon();

  // Errors: bad model directory or layout (naming the file or the numbers),
  // listeners that cannot bind.
  Status Start();
  void Stop();

  // The ports bound (after Start): with port 0 in the config, the ones the
  // kernel picked. admin_port() is api_port() when the admin API is served
  // on the API listener.
  int api_port() const;
  int admin_port() const;
  ListenerPorts ports() const;
  std::string control_endpoint() const { return control_endpoint_; }
  bool ready() const { return ready_.load(); }
  // Waits until serving or failed; returns the placement failure if any.
  Status WaitReady(double timeout_seconds);

 private:
  struct Assignment {
    std::string worker_id;
    std::string host;
    std::string data_address;  // the worker's Gloo address
    uint32_t device_index = 0;
    int world_rank = 0, stage = 0, tp_rank = 0;
    int64_t predicted_weight_bytes = 0;  // the planner's cost model
    int64_t shard_weight_bytes = 0;      // the shard's tensors (ShardSpec)
    int64_t predicted_kv_bytes = 0;      // kv_blocks x block bytes of this rank
    int64_t loaded_weight_bytes = -1;    // from Loaded
    int64_t reused_weight_bytes = 0;     // from Loaded
    int64_t kv_bytes = -1;
    double load_seconds = 0;
    int64_t load_bytes_done = 0, load_bytes_total = 0;  // from LoadProgress
  };
  // One re-plan for the plan thread. `target` set: an admin layout, already
  // validated; empty: re-fit the wanted layout to the usable workers.
  struct PlanJob {
    std::optional<ParallelConfig> target;
    std::string reason;
    std::shared_ptr<Responder> res;  // answered when done (admin requests)
    // With `target` from the planner (auto): its worker per rank (used while
    // they are all usable, else PlaceRanks) and its explanation.
    std::vector<RankPlacement> ranks;
    std::optional<PlanResult> planned;
    bool fault = false;         // the running plan is broken: no drain wait
    uint64_t plan_version = 0;  // the plan running when the fault was raised
    std::chrono::steady_clock::time_point raised = std::chrono::steady_clock::now();
    // The fault's lost worker is known (declared lost): the re-plan need not
    // wait to hear from every worker (AwaitLiveness).
    bool culprit_known = false;
    // Workers whose connection a survivor saw break (Error.lost_peer_
    // world_ranks), with when: declared lost unless they speak within
    // kAccusedSilenceSeconds (a live rank that broke its own communicator
    // reports its own Error at once).
    std::vector<std::pair<std::string, std::chrono::steady_clock::time_point>> accused;
  };
  enum class Gate { kRunning, kDraining, kPaused };

  // Plans on `workers`; fills assignments_, parallel_, kv_blocks_ and
  // plan_result_. Errors: the cluster cannot be modelled, or no layout fits.
  Status Plan(const std::vector<ControlWorkerInfo>& workers);
  PlanOptions PlanOptionsFor(bool cpu) const;
  Status PlanPerStageTp(const std::vector<ControlWorkerInfo>& workers);
  // The rendezvous store's address as the worker at `worker_address` reaches
  // it: the store's host, or, when it listens on every interface, this
  // host's address on the route to the worker.
  std::string StoreHostFor(const std::string& worker_address) const;
  void PlaceAndServe();
  void PlanLoop();
  void RunJob(PlanJob job);
  // Loads `ranks` of `parallel` under a new plan version (see the header
  // comment); the scheduler must be paused (or not yet created). Fills
  // `report` with the timings. Errors: a worker lost or failing while
  // loading, the load deadline.
  // Bytes of a KV pool of `blocks` blocks on one rank of `stage` in
  // `parallel` (F32 cache: the CPU backend's; the cost model's formula).
  int64_t PredictedKvBytes(const ParallelConfig& parallel, int stage, int64_t blocks) const;
  // `planned`: the planner's result when it chose this plan (shown by GET
  // /admin/plan), else nullopt; `predicted`: its per-rank predictions.
  Status ApplyPlan(const ParallelConfig& parallel, const std::vector<RankPlacement>& ranks,
                   const std::string& reason, nlohmann::json& report,
                   std::optional<PlanResult> planned = std::nullopt,
                   const std::vector<Assignment>* predicted = nullptr);
  // The complete plan the `usable` workers hold (their re-registrations'
  // held_shard, the newest version, one worker per rank), with its version;
  // nullopt when there is none (fresh workers, or an incomplete set).
  // `kv_blocks`: the KV blocks per rank that plan had.
  std::optional<std::pair<ParallelConfig, std::vector<RankPlacement>>> HeldPlan(
      const std::vector<std::string>& usable, uint64_t* version, int64_t* kv_blocks) const;
  // The workers a plan may use: alive, not drained, in registration order.
  std::vector<std::string> UsableWorkers() const;
  // The registrations of the workers `ids`, in that order.
  std::vector<ControlWorkerInfo> WorkerInfos(const std::vector<std::string>& ids) const;
  std::map<std::string, HeldSlice> HeldSlices() const;  // of the running plan
  // Validates an admin request and computes its layout and placement.
  // Errors: kInvalidArgument (layout or cluster cannot take it, with the
  // reason; for auto, see ProposeAutoPlan).
  // `planned` (optional): set to the planner's result for auto.
  StatusOr<std::pair<ParallelConfig, std::vector<RankPlacement>>> ProposePlan(
      const PlanRequest& request, std::optional<PlanResult>* planned = nullptr) const;
  // {"auto": true}: the placement planner's choice for `objective` over the
  // usable workers' topology reports (as parallel.mode = "auto" places at
  // start). Errors: kInvalidArgument when the cluster cannot be modelled or
  // no layout fits, naming the reason.
  StatusOr<std::pair<ParallelConfig, std::vector<RankPlacement>>> ProposeAutoPlan(
      Objective objective, std::optional<PlanResult>* planned) const;
  // Whether `ranks` of `target` are exactly the running plan.
  bool PlanUnchanged(const ParallelConfig& target, const std::vector<RankPlacement>& ranks) const;
  // Waits until every worker was heard from after `since` or declared lost.
  void AwaitLiveness(std::chrono::steady_clock::time_point since);
  void PauseScheduler(double drain_seconds);
  void ResumeScheduler();
  // Queues a re-fit of the wanted layout (any thread); merges into a pending
  // re-fit. See PlanJob for `culprit_known` and `accused`.
  void RequestReplan(
      const std::string& reason, bool fault, bool culprit_known = false,
      std::vector<std::pair<std::string, std::chrono::steady_clock::time_point>> accused = {});
  // Declares lost the accused workers that stayed silent; true if any was.
  bool SettleAccusations(const PlanJob& job);
  // Marks `worker_id` failed (it was declared lost for `reason`) and re-plans
  // if it ran a rank of the serving plan.
  void MarkWorkerLost(const std::string& worker_id, const std::string& reason);
  void SchedulerLoop();
  void OnControlMessage(const ControlPeer& peer, const control::Envelope& envelope);
  void OnWorkerLost(const std::string& worker_id);
  // The control server dropped a lost worker's record (ControlServerOptions::
  // on_worker_forgotten): so does the coordinator.
  void OnWorkerForgotten(const std::string& worker_id);
  void RegisterRoutes(HttpServer& api, HttpServer* admin);
  void HandleCompletions(const HttpRequest& req, std::shared_ptr<Responder> res, bool chat);
  void HandlePlanPost(const HttpRequest& req, std::shared_ptr<Responder> res);
  void HandleWorkerDrain(const HttpRequest& req, std::shared_ptr<Responder> res, bool drain);
  std::string ClusterJson() const;
  std::string PlanJson() const;
  // Refreshes the cluster and scheduler gauges (a collect hook of metrics_).
  void CollectMetrics();

  DaemonConfig config_;
  ModelConfig model_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::optional<ChatTemplate> chat_template_;
  ParallelConfig parallel_;  // the running plan's layout (protected by mu_ once serving)
  ParallelConfig wanted_;  // the layout asked for (config or the planner's first choice, then POST
                           // /admin/plan)
  int expected_workers_ = 1;
  int64_t max_context_ = 0;
  int64_t kv_blocks_ = 0;  // protected by mu_
  std::string model_name_;
  // GET /metrics (the coordinator part of common/metrics/metric_catalog.h). Declared
  // before the scheduler, whose requests' callbacks record into it.
  MetricsRegistry metrics_;
  std::unique_ptr<RequestMetrics> request_metrics_;
  ControlDrops drops_{&metrics_};  // refused messages from registered workers
  int64_t preemptions_seen_ = 0;   // scheduler thread only

  std::unique_ptr<ControlServer> control_;
  std::string control_endpoint_;
  std::unique_ptr<TcpStoreServer> store_;
  // The store's deployment secret (NewStoreSecret at Start); only the keys
  // derived from it per (plan, rank) leave this process. Set once in Start.
  std::string store_secret_;
  // The store's counters as of the last scrape; guarded by mu_.
  StoreServerCore::Stats store_seen_;
  std::unique_ptr<HttpServer> api_;
  std::unique_ptr<HttpServer> admin_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Assignment> assignments_;      // protected by mu_
  std::vector<std::string> failed_workers_;  // protected by mu_: lost, not re-registered
  // Protected by mu_: lost workers that registered again while a re-plan was
  // pending or running; still in failed_workers_ until the re-plans end.
  std::vector<std::string> returning_workers_;
  std::vector<std::string> drained_workers_;  // protected by mu_: out of placement by the admin
  Status placement_status_;                   // protected by mu_
  std::string degraded_;                      // protected by mu_: why no plan runs ("" = none)
  std::string load_error_;                    // protected by mu_: an Error while loading
  bool stopping_ = false;                     // protected by mu_
  bool serving_ = false;                      // protected by mu_: the scheduler runs
  std::deque<PlanJob> jobs_;                  // protected by mu_
  bool job_running_ = false;                  // protected by mu_: a re-plan is in progress
  Gate gate_ = Gate::kRunning;                // protected by mu_
  std::chrono::steady_clock::time_point drain_deadline_;  // protected by mu_
  int requeued_last_ = 0;      // protected by mu_: re-queued up to the last pause
  int64_t requeued_seen_ = 0;  // protected by mu_: scheduler stats().requeued then
  nlohmann::json history_ = nlohmann::json::array();  // protected by mu_: plan changes
  int64_t reconfigurations_ = 0;                      // protected by mu_
  int64_t faults_ = 0;                                // protected by mu_
  int64_t requeued_total_ = 0;                        // protected by mu_
  std::unique_ptr<Planner> planner_;
  std::optional<PlanResult> plan_result_;               // protected by mu_: set by ApplyPlan
  std::vector<std::string> cluster_notes_;              // protected by mu_
  std::map<std::string, control::WorkerState> states_;  // protected by mu_; from heartbeats
  std::atomic<bool> ready_{false};
  std::atomic<int> open_streams_{0};  // streaming responses open (server.max_streams)

  mutable std::mutex exec_mu_;
  std::shared_ptr<RemoteExecutor> executor_;  // protected by exec_mu_ (swapped by ApplyPlan)
  std::unique_ptr<BlockAllocator> allocator_;
  std::unique_ptr<Scheduler> scheduler_;
  std::mutex work_mu_;
  std::condition_variable work_cv_;  // new requests for the scheduler thread
  std::thread placement_thread_;
  std::thread scheduler_thread_;
  uint64_t plan_version_ = 0;  // protected by mu_ once serving
};

}  // namespace tessera
