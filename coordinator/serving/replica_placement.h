// ReplicaPlacer: the first placement of every replica (coordinator/serving/
// replica_set.h): the planner's plan over the registered workers, an
// explicit tp per stage replicated over them in registration order, explicit
// layouts that differ between replicas (parallel.replica_override) placed
// one replica at a time, or the plans re-registered workers hold (a
// restarted coordinator adopts them), and the planner options every
// placement uses (PlanOptionsFor).
//
// parallel.replicas bounds the replicas placed (0: as many as fit). The
// objective picks the layout (docs/planner.md): `throughput` the one whose
// replicas together generate the most tokens/s, `latency` the fastest
// single replica, replicated over the GPUs it leaves.
//
// Thread-safety: const and stateless after construction; safe from any
// thread.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/base/mutex.h"
#include "common/base/thread_annotations.h"
#include "common/config/daemon_config.h"
#include "common/format/model_config.h"
#include "coordinator/control/control_server.h"
#include "coordinator/control/worker_cluster.h"
#include "coordinator/placement/plan_change.h"
#include "coordinator/placement/planner.h"
#include "coordinator/serving/cluster_state.h"

namespace tessera {

// One replica's first plan.
struct ReplicaStart {
  ParallelConfig parallel;
  std::vector<RankPlacement> ranks;  // worker per world rank, in rank order
  // The planner's per-rank predictions (weight and KV bytes), when it placed
  // the plan; empty otherwise.
  std::vector<Assignment> predicted;
  // The planner's result (every replica's), and which of its replicas this
  // is; unset for an explicit tp per stage or an adopted plan.
  std::shared_ptr<const PlanResult> planned;  // shared by every replica of one run
  int planned_index = 0;
  int64_t kv_blocks = 0;         // per rank
  uint64_t adopted_version = 0;  // an adopted plan: the version its workers hold; else 0
  std::string reason;            // "initial placement", "adopted plan N held by the workers"
};

class ReplicaPlacer {
 public:
  // All outlive the placer. `configured`: the explicit layout (explicit
  // mode); `overrides`: replica index -> its own explicit layout
  // (parallel.replica_override); `max_context`: the scheduler's.
  ReplicaPlacer(const DaemonConfig* config, const ModelConfig* model, ParallelConfig configured,
                std::map<int, ParallelConfig> overrides, int64_t max_context, Planner* planner)
      : config_(*config),
        model_(*model),
        configured_(std::move(configured)),
        overrides_(std::move(overrides)),
        max_context_(max_context),
        planner_(planner) {}

  // The planner's options for one placement over CPU or GPU workers, at most
  // `max_replicas` replicas (0: as many as fit). In explicit mode the layout
  // is fixed to `layout` (null: the configured one).
  PlanOptions PlanOptionsFor(bool cpu, int max_replicas,
                             const ParallelConfig* layout = nullptr) const;
  // Replica `replica`'s explicit layout: its override, else the configured one.
  const ParallelConfig& LayoutOf(int replica) const;
  // Bytes of a KV pool of `blocks` blocks on one rank of `stage` in
  // `parallel` (F32 cache: the CPU backend's; the cost model's formula).
  int64_t PredictedKvBytes(const ParallelConfig& parallel, int stage, int64_t blocks) const;
  // Bytes of the tensors rank `world_rank` of `parallel` holds (ShardSpec's
  // WeightBytes, fp32), remembered per (layout, rank): the replicas of a
  // fleet share a few layouts, and listing a shard's tensors is not free.
  // Thread-safe. Errors: those of ShardSpec::Make.
  StatusOr<int64_t> ShardWeightBytes(const ParallelConfig& parallel, int world_rank) const
      EXCLUDES(shard_bytes_mu_);

  // Every replica's first plan over `workers` (registration order), at most
  // parallel.replicas of them. With replica overrides, the replicas are
  // placed one at a time, the largest layout (most ranks) first, each over
  // the workers the ones before it left: a uniform tp by the planner (that
  // replica alone, its layout fixed), a tp per stage on the first of them
  // in registration order. Errors: the cluster cannot be modelled, no
  // layout fits, fewer replicas than parallel.replicas fit (naming both; an
  // override's replica naming its entry), the KV cache holds less than one
  // sequence of scheduler.max_context.
  StatusOr<std::vector<ReplicaStart>> Place(const std::vector<ControlWorkerInfo>& workers) const;

  // The complete plans the `usable` workers hold (their re-registrations'
  // held_shard for this model, one worker per rank of each plan version),
  // newest first.
  std::vector<ReplicaStart> HeldPlans(const std::vector<ControlWorkerInfo>& usable) const;

 private:
  StatusOr<std::vector<ReplicaStart>> PlacePerStageTp(
      const std::vector<ControlWorkerInfo>& workers) const;
  StatusOr<std::vector<ReplicaStart>> PlaceEachReplica(
      const std::vector<ControlWorkerInfo>& workers) const;
  // `parallel` on workers[first ...] in registration order (a tp per stage),
  // with the KV cache kv_cache.max_blocks or room for min(8,
  // scheduler.max_sequences) sequences of max_context.
  ReplicaStart InRegistrationOrder(const ParallelConfig& parallel,
                                   const std::vector<ControlWorkerInfo>& workers,
                                   size_t first) const;
  // Replica `index` of the planner's `result` over `cluster`. Errors: its
  // KV cache holds less than one sequence of max_context.
  StatusOr<ReplicaStart> FromPlan(std::shared_ptr<const PlanResult> result, int index,
                                  const WorkerCluster& cluster) const;

  const DaemonConfig& config_;
  const ModelConfig& model_;
  const ParallelConfig configured_;
  const std::map<int, ParallelConfig> overrides_;
  const int64_t max_context_;
  Planner* const planner_;
  mutable Mutex shard_bytes_mu_;
  mutable std::map<std::pair<std::string, int>, int64_t> shard_bytes_ GUARDED_BY(shard_bytes_mu_);
};

}  // namespace tessera
