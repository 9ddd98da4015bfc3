// WorkerMetrics: the metrics one tessera-worker exports (the "worker" part of
// common/metrics/metric_catalog.h), for the one rank and device it runs:
//  - device memory and utilisation, sampled at every scrape: NVML for a GPU
//    (worker/topology/nvml_probe.h); for a CPU rank the process's resident set
//    (/proc/self/statm), the host's MemTotal (/proc/meminfo) and process CPU
//    seconds per wall second (getrusage);
//  - weight and KV cache bytes once the shard is loaded; activation/workspace
//    bytes as used - weights - KV capacity;
//  - load progress, plan version;
//  - per-micro-batch step latency by phase (prefill/decode), busy and idle
//    seconds and the pipeline bubble ratio (StageClock);
//  - communicator time and bytes by op, through Wrap()/WrapPrevLink().
//
// Until SetRank (the assignment arrives) only tessera_worker_info is set;
// every other series carries the rank labels replica (the data-parallel
// replica of the plan, AssignShard.replica), node, gpu, uuid, stage,
// tp_rank.
//
// Thread-safety: all methods are thread-safe; the registry's Render (another
// thread) runs the memory sampling hook.
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/metrics/metrics_registry.h"
#include "common/wire/step_batch.h"
#include "worker/comm/communicator.h"
#include "worker/comm/metered_communicator.h"
#include "worker/model/moe_layer.h"
#include "worker/topology/nvml_probe.h"

namespace tessera {

// Busy/idle accounting of one rank. The rank is in one state at a time; the
// time spent in each goes to the busy and idle counters, and the idle share
// of the current window (window_seconds, then a new window starts) to the
// bubble-ratio gauge. Thread-safe.
class StageClock {
 public:
  StageClock(Counter& busy, Counter& idle, Gauge& bubble, double window_seconds = 10.0);
  void Busy();  // the rank starts running a micro-batch
  void Idle();  // the rank starts waiting for work
  // Accounts the time since the last state change (called at every scrape,
  // so a long wait shows up before it ends).
  void Flush();

 private:
  enum class State { kNone, kBusy, kIdle };
  void Switch(State next);  // requires mu_

  Counter& busy_;
  Counter& idle_;
  Gauge& bubble_;
  const double window_seconds_;
  std::mutex mu_;
  State state_ = State::kNone;                          // protected by mu_
  std::chrono::steady_clock::time_point since_;         // protected by mu_
  std::chrono::steady_clock::time_point window_start_;  // protected by mu_
  double window_busy_ = 0, window_idle_ = 0;            // protected by mu_
};

// "prefill" when any sequence of the batch runs prompt tokens (start_pos <
// prompt_len or more than one token), else "decode".
const char* StepPhase(const StepBatch& batch);

class WorkerMetrics {
 public:
  // Registers the worker catalog in `registry` (which must outlive this) and
  // a collect hook sampling memory. `nvml` (may be null: a CPU rank) reads
  // device `device`'s memory, utilisation and UUID.
  // Errors: as MetricsRegistry::FromCatalog.
  static StatusOr<std::unique_ptr<WorkerMetrics>> Create(MetricsRegistry* registry,
                                                         std::string node, int device,
                                                         std::unique_ptr<NvmlProbe> nvml);
  ~WorkerMetrics();

  // After registration and assignment.
  void SetWorker(const std::string& worker_id, const std::string& version);
  // `replica`: the data-parallel replica of the plan (AssignShard.replica);
  // `stage`, `tp_rank`: the rank's place in it. Series recorded from here on
  // carry these labels.
  void SetRank(int replica, int stage, int tp_rank, uint64_t plan_version);
  void OnLoadProgress(int64_t bytes_done, int64_t bytes_total);
  // `quantized_bytes`: the FP8 values and scales of the quantized projections
  // (LoadedModel::quantized_bytes; 0 for a dense model).
  void OnLoaded(int64_t weight_bytes, int64_t kv_capacity_bytes, double load_seconds,
                int64_t quantized_bytes = 0);

  // MoE models: the loaded model's per-expert token counts (null: none),
  // exported as tessera_moe_expert_tokens_total at each scrape. A new model
  // (a re-plan) replaces the old counts; the counters keep counting up.
  void SetMoeCounts(std::shared_ptr<const MoeTokenCounts> counts);

  // One micro-batch of `seconds` on this rank.
  void ObserveStep(const StepBatch& batch, double seconds);
  StageClock& clock() { return *clock_; }

  // A metered wrapper of `inner` (null stays null), owned by this object.
  Communicator* Wrap(Communicator* inner);
  // Like Wrap, for the link from the previous stage on a stage > 0 rank:
  // ServeStage receives each micro-batch as two frames (step, hidden states)
  // and then runs it, so time blocked in Recv is idle, the time from the
  // hidden frame's arrival to the next Recv is one step (phase read from the
  // step frame, common wire format common/wire/step_codec.h).
  Communicator* WrapPrevLink(Communicator* inner);

  const std::string& uuid() const { return uuid_; }
  bool gpu() const { return nvml_ != nullptr; }

 private:
  WorkerMetrics(MetricsRegistry* registry, std::string node, int device,
                std::unique_ptr<NvmlProbe> nvml);
  void Collect();
  std::vector<std::string> Labels() const;  // requires rank set

  MetricsRegistry* registry_;
  const std::string node_;
  const int device_;
  std::unique_ptr<NvmlProbe> nvml_;
  std::string uuid_;
  std::mutex nvml_mu_;  // NvmlProbe is not thread-safe

  mutable std::mutex mu_;
  bool has_rank_ = false;                      // protected by mu_
  int replica_ = 0, stage_ = 0, tp_rank_ = 0;  // protected by mu_
  int64_t weight_bytes_ = 0, kv_bytes_ = 0;    // protected by mu_
  double last_cpu_seconds_ = -1;               // protected by mu_
  std::chrono::steady_clock::time_point last_sample_;
  std::unique_ptr<StageClock> clock_;
  std::vector<std::unique_ptr<MeteredCommunicator>> wrapped_;
  std::shared_ptr<const MoeTokenCounts> moe_counts_;  // protected by mu_
  std::vector<int64_t> moe_exported_;                 // per held expert; protected by mu_

  // Stage > 0 step tracking (owner thread only, through the recv hooks).
  struct PrevLinkState;
  std::unique_ptr<PrevLinkState> prev_;
};

}  // namespace tessera
