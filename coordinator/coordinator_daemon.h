// CoordinatorDaemon: the body of `tessera-coordinator`.
//
//  1. Binds the control plane (ZeroMQ ROUTER), the Gloo rendezvous store
//     (TcpStoreServer: the coordinator is the store, no shared file system)
//     and the HTTP listeners (OpenAI API, health, admin).
//  2. Waits for tp * pp workers to register, validates the layout against the
//     model (refusing it with the reason before any worker loads anything),
//     assigns each worker its shard (AssignShard, ranks in registration
//     order) and waits for every Loaded.
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
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/model_config.h"
#include "common/parallel_config.h"
#include "common/tcp_store.h"
#include "common/tokenizer.h"
#include "coordinator/control_server.h"
#include "coordinator/daemon_config.h"
#include "coordinator/http_server.h"
#include "coordinator/remote_executor.h"
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
    int world_rank = 0, stage = 0, tp_rank = 0;
    int64_t predicted_weight_bytes = 0;
    int64_t loaded_weight_bytes = -1;  // from Loaded
    int64_t kv_bytes = -1;
    double load_seconds = 0;
  };

  void PlaceAndServe();
  void SchedulerLoop();
  void OnControlMessage(const ControlPeer& peer, const control::Envelope& envelope);
  void OnWorkerLost(const std::string& worker_id);
  void RegisterRoutes(HttpServer& api, HttpServer* admin);
  void HandleCompletions(const HttpRequest& req, std::shared_ptr<Responder> res, bool chat);
  std::string ClusterJson() const;
  std::string PlanJson() const;

  DaemonConfig config_;
  ModelConfig model_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::optional<ChatTemplate> chat_template_;
  ParallelConfig parallel_;
  int64_t max_context_ = 0;
  int64_t kv_blocks_ = 0;
  std::string model_name_;

  std::unique_ptr<ControlServer> control_;
  std::string control_endpoint_;
  std::unique_ptr<TcpStoreServer> store_;
  std::unique_ptr<HttpServer> api_;
  std::unique_ptr<HttpServer> admin_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Assignment> assignments_;      // protected by mu_
  std::vector<std::string> failed_workers_;  // protected by mu_
  Status placement_status_;                  // protected by mu_
  bool stopping_ = false;                    // protected by mu_
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
