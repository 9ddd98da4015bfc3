// CoordinatorDaemon: the body of `tessera-coordinator`, and the composition
// root that builds and wires its parts (docs/architecture.md, "The path of
// one request" and "The path of one plan change"):
//
//   ControlServer (coordinator/control/)   the ZeroMQ control plane; its
//       callbacks go to WorkerEvents (coordinator/serving/worker_events.h)
//   TcpStoreServer (common/net/)           the Gloo rendezvous store (the
//       coordinator is the store: no shared file system)
//   ReplicaSet (coordinator/serving/)      the data-parallel replicas: per
//       replica a ServingLoop (the thread that owns its Scheduler and its
//       plan's RemoteExecutor) and a PlanRunner (its plan changes, on their
//       thread), the first placement of them all, and the request router
//   ClusterView, ClusterMetrics            /admin/cluster, /admin/plan,
//       /readyz and the scrape-time gauges
//   HttpServer x 2 (common/net/)           the API and admin listeners;
//       routes in coordinator/api/api_routes.h: the OpenAI frontend sees a
//       RequestSink and the admin API a PlanControl (both the replica set)
//       and a ClusterStatus (the view)
//
// Start checks the model and the layout (an explicit layout that breaks the
// model's rules is refused naming the config key), binds every listener and
// starts the replica set's placement; it does not wait for workers
// (WaitReady does).
//
// Thread-safety: Start and Stop from one thread; the accessors are
// thread-safe.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>

#include "common/config/daemon_config.h"
#include "common/format/model_config.h"
#include "common/metrics/metrics_registry.h"
#include "common/net/http_server.h"
#include "common/net/ports_file.h"
#include "common/net/tcp_store.h"
#include "common/tokenizer/chat_template.h"
#include "common/tokenizer/tokenizer.h"
#include "coordinator/api/openai_frontend.h"
#include "coordinator/api/request_metrics.h"
#include "coordinator/control/control_plane_guard.h"
#include "coordinator/control/control_server.h"
#include "coordinator/placement/planner.h"
#include "coordinator/serving/cluster_metrics.h"
#include "coordinator/serving/cluster_state.h"
#include "coordinator/serving/cluster_view.h"
#include "coordinator/serving/replica_set.h"
#include "coordinator/serving/worker_events.h"

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
  bool ready() const { return state_.ready.load(); }  // some replica serves
  // Waits until every replica serves or the placement failed; returns the
  // placement failure if any.
  Status WaitReady(double timeout_seconds);

 private:
  // Checks the explicit layout, and every parallel.replica_override, against
  // the model (naming the config key).
  Status CheckLayout();
  Status StartControlPlane();
  Status StartStore();
  Status StartHttp();

  DaemonConfig config_;
  ModelConfig model_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::optional<ChatTemplate> chat_template_;
  ParallelConfig configured_;  // explicit mode: the configured layout
  // Explicit mode: replica index -> its own layout (parallel.replica_override).
  std::map<int, ParallelConfig> overrides_;
  int expected_workers_ = 1;
  SchedulerOptions sched_;  // every replica's scheduler
  int64_t max_context_ = 0;
  std::string model_name_;
  // GET /metrics. Declared before everything that records into it.
  MetricsRegistry metrics_;
  std::unique_ptr<RequestMetrics> request_metrics_;
  ControlDrops drops_{&metrics_};  // refused messages from registered workers
  ClusterState state_;
  std::unique_ptr<Planner> planner_;

  std::unique_ptr<ControlServer> control_;
  std::string control_endpoint_;
  std::unique_ptr<TcpStoreServer> store_;
  // The store's deployment secret (NewStoreSecret at Start); only the keys
  // derived from it per (plan, rank) leave this process.
  std::string store_secret_;

  // Destroyed in reverse: the listeners go before the replicas, the
  // replicas before the state they read and before the OpenAI frontend (the
  // schedulers' last callbacks, run as the loops go, release the frontend's
  // per-request exchanges, which point into it).
  std::unique_ptr<OpenAIFrontend> openai_;
  std::unique_ptr<ReplicaSet> replicas_;
  std::unique_ptr<WorkerEvents> events_;
  std::unique_ptr<ClusterView> view_;
  std::unique_ptr<ClusterMetrics> cluster_metrics_;
  std::unique_ptr<HttpServer> api_;
  std::unique_ptr<HttpServer> admin_;
};

}  // namespace tessera
