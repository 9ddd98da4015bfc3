// WorkerDaemon: the body of `tessera-worker`. Registers with the coordinator
// over the control plane, loads the shard an AssignShard names (only its own
// slices), joins its Gloo groups through the coordinator's rendezvous store,
// and runs its pipeline stage. On a CUDA rank (worker/exec/rank_device.h) the
// shard lives on GPU `device` in the AssignShard's dtype and the tp group
// all-reduces over NCCL (its unique id exchanged through the same store);
// hidden states between stages go through host memory over Gloo.
//  - stage 0 ranks run the Steps the coordinator sends and pass the hidden
//    states on (or, with pp == 1, sample);
//  - later stages serve the pipeline; tp rank 0 of the last stage returns the
//    sampled tokens to the coordinator as StepResults.
//
// Plans change while the worker runs (live reconfiguration, re-plans after a
// fault): a Drain ends the current plan (stage 0 passes the end down the
// pipeline; an idle pipeline gets keepalives so later stages' bounded
// receives do not time out), the communicators are dropped, and the next
// AssignShard builds new ones under its plan's key prefix. Weight slices the
// worker already holds and still needs (the same layers under the same tp
// slice) are reused instead of read again (HeldWeights) while the rank's
// backend and compute dtype stay the same (the backend, and the device
// memory it holds, then carries over too; a new RankDevice and new
// communicators, NCCL included, are made per plan otherwise); Loaded reports
// how many bytes were reused.
//
// Threads: the main thread owns the model, KV cache and communicators (one
// owner thread per device); the ControlClient's thread owns the ZeroMQ
// socket and hands messages over through a bounded queue.
//
// Fencing: when the coordinator ends a plan (a Drain, a newer AssignShard or
// a Shutdown) the end normally comes down the pipeline from stage 0; a later
// stage whose receive waits on a peer that will never send (a stage-0 worker
// that was declared lost, then resumed, still keepalive-ing the old plan; or
// one that is stopped) has its plan's communicators interrupted after
// kPlanEndGraceSeconds, so every receive wakes on a plan change. A worker the
// coordinator declared lost (its RegisterAck says "register again") drops its
// plan at once, sending nothing more to the old plan's peers, and registers
// again as an idle worker. Neither is reported as an Error.
//
// Errors: a failed load or step (a lost peer, a collective timeout) is
// reported to the coordinator as an Error naming this worker's rank and the
// plan version; the worker then drops the plan's communicators and waits for
// the next AssignShard (the coordinator re-plans). Run returns only on
// Shutdown or when the control plane itself fails.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/base/status.h"
#include "common/grammar/grammar_library_paths.h"
#include "common/metrics/metrics_registry.h"
#include "common/topology/report.h"
#include "common/wire/control.pb.h"
#include "worker/daemon/step_watch.h"
#include "worker/daemon/worker_failpoints.h"
#include "worker/daemon/worker_metrics.h"
#include "worker/exec/pipeline_executor.h"
#include "worker/exec/rank_device.h"
#include "worker/model/weight_loader.h"

namespace tessera {

class ControlClient;
class Communicator;

// After the coordinator ends a plan, how long a rank waits for the end to
// come down the pipeline before it interrupts its plan's receives.
inline constexpr double kPlanEndGraceSeconds = 0.5;

struct WorkerDaemonOptions {
  std::string coordinator;  // "tcp://HOST:PORT"
  int device = 0;           // device index on this host
  std::string worker_id;    // requested id ("" = DefaultWorkerId(host, device))
  std::string host;         // host name reported at registration ("" = gethostname)
  // Address this worker's Gloo device binds and advertises; "" = the local
  // address that routes to the coordinator (LocalAddressToward).
  std::string gloo_host;
  std::string backend = "auto";  // "auto", "cpu" or "cuda" (worker/exec/rank_device.h)
  // This host's topology to report; nullopt = DiscoverTopology().
  std::optional<TopologyReport> topology;
  // Bound of every collective and pipeline transfer; an idle pipeline gets a
  // keepalive every third of it.
  double collective_timeout_seconds = 30.0;
  double register_timeout_seconds = 60.0;
  // Where this worker's metrics go (worker/daemon/worker_metrics.h); null = none.
  // The caller serves it (tessera-worker: GET /metrics on worker.metrics_port).
  MetricsRegistry* metrics = nullptr;
  // Read device memory, utilisation and UUID from NVML (a CUDA worker);
  // falls back to process memory when NVML is not there.
  bool nvml_metrics = false;
  // CURVE on the control plane: this worker's Z85 secret key and the
  // coordinator's Z85 public key; both "" = plain TCP (see ControlClientOptions).
  std::string curve_secret_key;
  std::string curve_server_key;
  // The grammar engine's libraries (structured_output.* config keys).
  GrammarLibraryPaths grammar_library = DefaultGrammarLibraryPaths();
  // Test-only faults (worker_failpoints.h); the defaults do nothing.
  WorkerFailpoints failpoints;
};

class WorkerDaemon {
 public:
  explicit WorkerDaemon(WorkerDaemonOptions options);
  // Runs until a Shutdown arrives (OK) or the control plane fails.
  Status Run();

 private:
  void OnMessage(const control::Envelope& envelope);
  StatusOr<control::Envelope> Next(double timeout_seconds);
  void PushFront(control::Envelope envelope);
  // Loads `assign` and serves it until a Drain, Shutdown or newer
  // AssignShard ends it (the latter two are put back in the inbox): OK, or
  // the first failure (already reported to the coordinator).
  Status ServePlan(ControlClient& client, control::Heartbeat& hb,
                   const control::AssignShard& assign, const std::string& worker_id);
  // What ServeAsLeader needs of ServePlan's plan.
  struct LeaderServe {
    ControlClient& client;
    const control::AssignShard& assign;
    const std::string& who;  // "worker ID rank R" for logs and errors
    LlamaModel& model;
    KvCache& cache;
    const PipelineLinks& links;
    SequenceSamplers& samplers;
    // Reports a failure to the coordinator and returns it (ServePlan's).
    std::function<Status(const Status&)> fail;
    // The coordinator ended the plan or declared this worker lost.
    std::function<bool()> ended;
  };
  // The plan's loop on a replica's leader (AssignShard.leader,
  // worker/daemon/leader_serve.cc): the replica's Scheduler runs here and
  // takes Generate / CancelRequests instead of Steps. Returns as ServePlan.
  Status ServeAsLeader(const LeaderServe& serve);
  // A stage-0 tp rank > 0 of such a replica: runs the micro-batches its
  // leader broadcasts until the leader ends the plan. Returns as ServePlan.
  Status ServeAsLeaderPeer(const LeaderServe& serve);
  // The step-sleep failpoint (worker_failpoints.h): sleeps in the step when
  // armed for `world_rank`.
  void StepSleepFailpoint(int world_rank);
  // The watcher thread: interrupts the communicators of a plan whose end was
  // requested (after kPlanEndGraceSeconds; at once when fenced).
  void WatchPlanEnds();
  // Marks the plan served now as ending when `e` ends it. mu_ held.
  void NotePlanEndLocked(const control::Envelope& e);

  WorkerDaemonOptions options_;
  // Main thread only. The rank's backend carries over from plan to plan
  // while its kind and compute dtype stay the same; held_ are the weights it
  // holds (declared after device_, so they are released first).
  bool on_gpu_ = false;               // set by Run(): ranks run on GPU options_.device
  std::optional<RankDevice> device_;  // the last plan's backend
  HeldWeights held_;                  // the weights of the last plan loaded
  std::string held_model_path_;       // the model directory held_ came from
  std::string held_quantization_;     // and its AssignShard.quantization
  control::Register registration_;    // what this worker registers with (main thread)
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<control::Envelope> inbox_;     // protected by mu_
  std::unique_ptr<WorkerMetrics> metrics_;  // when options_.metrics is set

  // The plan being served, as the watcher thread sees it (protected by mu_).
  struct PlanWatch {
    uint64_t version = 0;              // 0 = none
    std::vector<Communicator*> comms;  // the plan's communicators (owned by ServePlan)
    bool end_requested = false;        // a Drain, newer AssignShard or Shutdown arrived
    std::chrono::steady_clock::time_point end_requested_at;
    bool fenced = false;       // the coordinator declared this worker lost
    bool interrupted = false;  // comms were interrupted
  };
  // This rank's compute time in its current step, for the heartbeats.
  StepWatch step_watch_;
  bool step_sleep_done_ = false;  // main thread: the step-sleep failpoint fired
  PlanWatch watch_;               // protected by mu_
  bool stopping_ = false;         // protected by mu_: Run is returning
};

}  // namespace tessera
