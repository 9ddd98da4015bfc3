// CoordinatorDaemon: the body of `tessera-coordinator`.
//
//  1. Binds the control plane (ZeroMQ ROUTER), the Gloo rendezvous store
//     (TcpStoreServer: the coordinator is the store, no shared file system)
//     and the HTTP listeners (OpenAI API, health, admin).
//  2. Waits for parallel.workers workers (tp * pp in explicit mode) to
//     register, builds the cluster model from their topology reports
//     (coordinator/worker_cluster.h) and asks its Planner
//     (coordinator/planner.h; PlacementPlanner) for a placement: in auto mode
//     the planner's choice, in explicit mode the configured tp, pp and layer
//     split, checked the same way. A layout that is invalid or does not fit
//     is refused with the planner's reasons before any worker loads
//     anything. Otherwise it assigns each worker of the plan its shard
//     (AssignShard) and waits for every Loaded. The KV cache holds, on every
//     rank, the blocks that fit on the tightest one (bounded by
//     kv_cache.max_blocks and by what the scheduler can use).
//  3. Serves: the Scheduler's owner thread runs continuous batching over a
//     RemoteExecutor; HTTP handlers enqueue requests and stream tokens back.
//
// A lost worker (missed heartbeats) or a worker error fails the steps in
// flight back to the scheduler: the affected requests finish with an error
// event; /readyz turns 503 and /admin/cluster shows the worker as failed.
//
// Thread-safety: Start/Stop from one thread; the accessors are thread-safe.
#pragma once

#include <atomic>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/metrics_registry.h"
#include "common/model_config.h"
#include "common/parallel_config.h"
#include "common/tcp_store.h"
#include "common/tokenizer.h"
#include "coordinator/control_server.h"
#include "coordinator/daemon_config.h"
#include "coordinator/http_server.h"
#include "coordinator/planner.h"
#include "coordinator/remote_executor.h"
#include "coordinator/request_metrics.h"
#include "worker/scheduler.h"

namespace tessera {

class CoordinatorDaemon {
 public:
  explicit CoordinatorDaemon(DaemonConfig config);
  ~CoordinatorDaemon();

  // Errors: bad model directory or layout (naming the file or the numbers),
  // listeners that cannot bind.
  Status Start();
  void Stop();

  int api_port() const;
  int admin_port() const;
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
    int64_t kv_bytes = -1;
    double load_seconds = 0;
    int64_t load_bytes_done = 0, load_bytes_total = 0;  // from LoadProgress
  };

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
  void SchedulerLoop();
  void OnControlMessage(const ControlPeer& peer, const control::Envelope& envelope);
  void OnWorkerLost(const std::string& worker_id);
  void RegisterRoutes(HttpServer& api, HttpServer* admin);
  void HandleCompletions(const HttpRequest& req, std::shared_ptr<Responder> res, bool chat);
  std::string ClusterJson() const;
  std::string PlanJson() const;
  // Refreshes the cluster and scheduler gauges (a collect hook of metrics_).
  void CollectMetrics();

  DaemonConfig config_;
  ModelConfig model_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::optional<ChatTemplate> chat_template_;
  ParallelConfig parallel_;  // protected by mu_ once placement runs
  int expected_workers_ = 1;
  int64_t max_context_ = 0;
  int64_t kv_blocks_ = 0;  // protected by mu_
  std::string model_name_;
  // GET /metrics (the coordinator part of common/metric_catalog.h). Declared
  // before the scheduler, whose requests' callbacks record into it.
  MetricsRegistry metrics_;
  std::unique_ptr<RequestMetrics> request_metrics_;
  int64_t preemptions_seen_ = 0;  // scheduler thread only

  std::unique_ptr<ControlServer> control_;
  std::string control_endpoint_;
  std::unique_ptr<TcpStoreServer> store_;
  std::unique_ptr<HttpServer> api_;
  std::unique_ptr<HttpServer> admin_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Assignment> assignments_;      // protected by mu_
  std::vector<std::string> failed_workers_;  // protected by mu_
  std::unique_ptr<Planner> planner_;
  std::optional<PlanResult> plan_result_;               // protected by mu_
  std::vector<std::string> cluster_notes_;              // protected by mu_
  std::map<std::string, control::WorkerState> states_;  // protected by mu_; from heartbeats
  Status placement_status_;                             // protected by mu_
  bool stopping_ = false;                               // protected by mu_
  std::atomic<bool> ready_{false};
  std::atomic<int> open_streams_{0};  // streaming responses open (server.max_streams)

  std::unique_ptr<RemoteExecutor> executor_;
  std::unique_ptr<BlockAllocator> allocator_;
  std::unique_ptr<Scheduler> scheduler_;
  std::mutex work_mu_;
  std::condition_variable work_cv_;  // new requests for the scheduler thread
  std::thread placement_thread_;
  std::thread scheduler_thread_;
  uint64_t plan_version_ = 1;
};

}  // namespace tessera
