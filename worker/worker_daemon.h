// WorkerDaemon: the body of `tessera-worker`. Registers with the coordinator
// over the control plane, loads the shard an AssignShard names (only its own
// slices), joins its Gloo groups through the coordinator's rendezvous store,
// and runs its pipeline stage. On a CUDA rank (worker/rank_device.h) the
// shard lives on GPU `device` in the AssignShard's dtype and the tp group
// all-reduces over NCCL (its unique id exchanged through the same store);
// hidden states between stages go through host memory over Gloo.
//  - stage 0 ranks run the Steps the coordinator sends and pass the hidden
//    states on (or, with pp == 1, sample);
//  - later stages serve the pipeline; tp rank 0 of the last stage returns the
//    sampled tokens to the coordinator as StepResults.
//
// Threads: the main thread owns the model, KV cache and communicators (one
// owner thread per device); the ControlClient's thread owns the ZeroMQ
// socket and hands messages over through a bounded queue.
//
// Errors: a failed load or step is reported to the coordinator as an Error
// naming this worker's rank, then Run returns it (the process exits non-zero).
#pragma once

#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <string>

#include "common/metrics_registry.h"
#include "common/proto/control.pb.h"
#include "common/status.h"
#include "common/topology.h"
#include "worker/worker_metrics.h"

namespace tessera {

struct WorkerDaemonOptions {
  std::string coordinator;  // "tcp://HOST:PORT"
  int device = 0;           // device index on this host
  std::string worker_id;    // requested id ("" = assigned by the coordinator)
  std::string host;         // host name reported at registration ("" = gethostname)
  // Address this worker's Gloo device binds and advertises; "" = the local
  // address that routes to the coordinator (LocalAddressToward).
  std::string gloo_host;
  std::string backend = "auto";  // "auto", "cpu" or "cuda" (worker/rank_device.h)
  // This host's topology to report; nullopt = DiscoverTopology().
  std::optional<TopologyReport> topology;
  double collective_timeout_seconds = 30.0;
  double register_timeout_seconds = 60.0;
  // Where this worker's metrics go (worker/worker_metrics.h); null = none.
  // The caller serves it (tessera-worker: GET /metrics on worker.metrics_port).
  MetricsRegistry* metrics = nullptr;
  // Read device memory, utilisation and UUID from NVML (a CUDA worker);
  // falls back to process memory when NVML is not there.
  bool nvml_metrics = false;
  // CURVE on the control plane: this worker's Z85 secret key and the
  // coordinator's Z85 public key; both "" = plain TCP (see ControlClientOptions).
  std::string curve_secret_key;
  std::string curve_server_key;
};

class WorkerDaemon {
 public:
  explicit WorkerDaemon(WorkerDaemonOptions options);
  // Runs until a Shutdown arrives (OK) or something fails.
  Status Run();

 private:
  void OnMessage(const control::Envelope& envelope);
  StatusOr<control::Envelope> Next(double timeout_seconds);

  WorkerDaemonOptions options_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<control::Envelope> inbox_;     // protected by mu_
  std::unique_ptr<WorkerMetrics> metrics_;  // when options_.metrics is set
};

}  // namespace tessera
