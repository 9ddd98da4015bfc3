#include "coordinator/serving/replica_placement.h"

#include <algorithm>
#include <map>
#include <optional>

#include "common/engine/block_allocator.h"
#include "common/model/shard_spec.h"
#include "coordinator/control/worker_cluster.h"
#include "coordinator/placement/cluster_model.h"
#include "coordinator/placement/cost_model.h"

namespace tessera {

int64_t ReplicaPlacer::PredictedKvBytes(const ParallelConfig& parallel, int stage,
                                        int64_t blocks) const {
  StageShape shape;
  shape.tp = parallel.TpOfStage(stage);
  shape.layers = parallel.EndLayer(stage) - parallel.FirstLayer(stage);
  // F32 as a CPU worker holds it (the auto dtype; on CUDA the worker's own count
  // replaces it), or fp8's one byte on every backend.
  const DType kv = KvStorageDType(config_.kv_cache.dtype, DType::kF32);
  return static_cast<int64_t>(
      static_cast<double>(blocks * config_.kv_cache.block_size) *
      KvBytesPerTokenPerGpu(ModelSizes::From(model_, DType::kF32, kv), shape));
}

const ParallelConfig& ReplicaPlacer::LayoutOf(int replica) const {
  auto it = overrides_.find(replica);
  return it == overrides_.end() ? configured_ : it->second;
}

PlanOptions ReplicaPlacer::PlanOptionsFor(bool cpu, int max_replicas,
                                          const ParallelConfig* layout) const {
  PlanOptions o;
  o.objective = config_.parallel.objective == ParallelObjective::kThroughput
                    ? Objective::kThroughput
                    : Objective::kLatency;
  o.max_context = max_context_;
  o.min_kv_tokens = max_context_;  // one sequence of the longest context, at least
  o.gpu_memory_fraction = config_.kv_cache.memory_fraction;
  // The CPU backend holds weights and KV in float32 whatever the checkpoint.
  if (cpu) {
    o.weight_dtype = o.kv_dtype = DType::kF32;
  } else if (config_.model.dtype) {
    o.weight_dtype = o.kv_dtype = *config_.model.dtype;
  }
  // The fp8 KV cache stores one byte per element on either backend.
  if (config_.kv_cache.dtype == KvCacheDType::kFp8) o.kv_dtype = DType::kF8E4M3;
  // FP8 projections stay FP8 only on CUDA (at a 16-bit dtype, which the
  // planner checks); the CPU backend dequantizes them at load.
  o.keeps_fp8 = !cpu;
  o.prefill_chunk_tokens = config_.scheduler.prefill_chunk_tokens;
  o.max_batch = config_.scheduler.max_sequences;
  // Each replica has its own scheduler and serving loop (replica_set.h).
  o.max_replicas = max_replicas;
  o.uniform_tp = true;
  if (cpu) {
    // Gloo over TCP: a collective costs tens of microseconds, not NCCL's ten.
    o.cost.collective_launch_s = 50e-6;
    o.cost.pcie_step_s = 20e-6;
    o.cost.network_step_s = 50e-6;
  }
  if (config_.parallel.mode == ParallelMode::kExplicit) {
    const ParallelConfig& fixed = layout ? *layout : configured_;
    o.fixed_tp = fixed.tp;
    o.fixed_pp = fixed.pp;
    // The configured split, or the even one ParallelConfig made of `[]`.
    o.fixed_layers_per_stage = fixed.layers_per_stage;
    o.allow_cross_node_tp = true;                          // the operator chose the tp
    o.expert_parallel = config_.parallel.expert_parallel;  // auto mode: the planner chooses
  }
  return o;
}

ReplicaStart ReplicaPlacer::InRegistrationOrder(const ParallelConfig& parallel,
                                                const std::vector<ControlWorkerInfo>& workers,
                                                size_t first) const {
  const int64_t block = config_.kv_cache.block_size;
  ReplicaStart st;
  st.parallel = parallel;
  st.kv_blocks = config_.kv_cache.max_blocks > 0
                     ? config_.kv_cache.max_blocks
                     : BlockAllocator::BlocksFor(max_context_, block) *
                           std::min<int64_t>(8, config_.scheduler.max_sequences);
  st.reason = "initial placement";
  for (int r = 0; r < parallel.world_size(); ++r) {
    RankPlacement p = RankSlice(parallel, r);
    p.worker_id = workers[first + static_cast<size_t>(r)].worker_id;
    st.ranks.push_back(p);
  }
  return st;
}

// An explicit tp per stage: the planner searches uniform tp only, so the
// ranks go to the workers in registration order (docs/operations.md),
// replica after replica.
StatusOr<std::vector<ReplicaStart>> ReplicaPlacer::PlacePerStageTp(
    const std::vector<ControlWorkerInfo>& workers) const {
  const int world = configured_.world_size();
  int n = static_cast<int>(workers.size()) / world;
  if (config_.parallel.replicas > 0) n = std::min(n, config_.parallel.replicas);
  std::vector<ReplicaStart> out;
  for (int rep = 0; rep < n; ++rep)
    out.push_back(InRegistrationOrder(configured_, workers, static_cast<size_t>(rep * world)));
  return out;
}

StatusOr<int64_t> ReplicaPlacer::ShardWeightBytes(const ParallelConfig& parallel,
                                                  int world_rank) const {
  // ToString names tp (per stage), pp and the layer split: the whole layout.
  const auto key = std::make_pair(parallel.ToString(), world_rank);
  {
    MutexLock lock(&shard_bytes_mu_);
    auto it = shard_bytes_.find(key);
    if (it != shard_bytes_.end()) return it->second;
  }
  TESSERA_ASSIGN_OR_RETURN(ShardSpec spec, ShardSpec::Make(model_, parallel, world_rank));
  const int64_t bytes = spec.WeightBytes(DType::kF32);
  MutexLock lock(&shard_bytes_mu_);
  shard_bytes_.emplace(key, bytes);
  return bytes;
}

StatusOr<ReplicaStart> ReplicaPlacer::FromPlan(std::shared_ptr<const PlanResult> result, int index,
                                               const WorkerCluster& cluster) const {
  TESSERA_ASSIGN_OR_RETURN(ParallelConfig par, result->plan.ParallelConfigOf(model_, index));
  const PlannedReplica& rep = result->plan.replicas[static_cast<size_t>(index)];
  // KV blocks: what fits on the tightest rank (the planner's KV pool), at
  // most what the scheduler can use and kv_cache.max_blocks.
  const int64_t block = config_.kv_cache.block_size;
  int64_t blocks = rep.kv_tokens / block;
  blocks = std::min(
      blocks, config_.scheduler.max_sequences * BlockAllocator::BlocksFor(max_context_, block));
  if (config_.kv_cache.max_blocks > 0) blocks = std::min(blocks, config_.kv_cache.max_blocks);
  if (blocks < BlockAllocator::BlocksFor(max_context_, block))
    return ResourceExhausted("the KV cache holds " + std::to_string(blocks) + " blocks of " +
                             std::to_string(block) + " tokens, less than one sequence of " +
                             "scheduler.max_context " + std::to_string(max_context_));
  ReplicaStart st;
  st.parallel = par;
  st.kv_blocks = blocks;
  st.reason = "initial placement";
  st.planned_index = index;
  for (int s = 0; s < rep.pp(); ++s) {
    const PlannedStage& ps = rep.stages[static_cast<size_t>(s)];
    for (int i = 0; i < ps.tp; ++i) {
      const GpuRef& ref = ps.gpus[static_cast<size_t>(i)];
      Assignment a;
      a.worker_id = cluster.workers[static_cast<size_t>(ref.node)][static_cast<size_t>(ref.gpu)];
      a.world_rank = s * par.tp + i;
      a.stage = s;
      a.tp_rank = i;
      a.predicted_weight_bytes = ps.weight_bytes;
      a.predicted_kv_bytes = PredictedKvBytes(par, s, blocks);
      RankPlacement p = RankSlice(par, a.world_rank);
      p.worker_id = a.worker_id;
      st.ranks.push_back(p);
      st.predicted.push_back(std::move(a));
    }
  }
  st.planned = std::move(result);
  return st;
}

// Replicas whose explicit layouts differ (parallel.replica_override): one at
// a time, the largest first (a replica of many ranks needs the hosts with
// many devices; a small one fits in what is left), ties in index order.
StatusOr<std::vector<ReplicaStart>> ReplicaPlacer::PlaceEachReplica(
    const std::vector<ControlWorkerInfo>& workers) const {
  const int n = config_.parallel.replicas;  // >= 1 with overrides (validated)
  std::vector<int> order(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) order[static_cast<size_t>(r)] = r;
  std::stable_sort(order.begin(), order.end(), [this](int a, int b) {
    return LayoutOf(a).world_size() > LayoutOf(b).world_size();
  });
  std::vector<ControlWorkerInfo> free = workers;  // registration order
  std::vector<std::optional<ReplicaStart>> starts(static_cast<size_t>(n));
  for (int r : order) {
    const ParallelConfig& layout = LayoutOf(r);
    const std::string what = "replica " + std::to_string(r) + " (" + layout.ToString() + ")";
    if (layout.world_size() > static_cast<int>(free.size()))
      return ResourceExhausted(what + " needs " + std::to_string(layout.world_size()) +
                               " workers; " + std::to_string(free.size()) + " of the " +
                               std::to_string(workers.size()) +
                               " are left after the replicas placed before it (largest layout "
                               "first); no worker was assigned anything");
    ReplicaStart st;
    if (!layout.uniform_tp()) {
      st = InRegistrationOrder(layout, free, 0);
    } else {
      TESSERA_ASSIGN_OR_RETURN(WorkerCluster cluster, BuildWorkerCluster(free));
      TESSERA_ASSIGN_OR_RETURN(ClusterModel model, BuildClusterModel(cluster.topology));
      auto result = planner_->Plan(model_, model, PlanOptionsFor(cluster.cpu, 1, &layout));
      if (!result.ok())
        return result.status().WithContext("placement of " + what + " refused (" +
                                           std::to_string(free.size()) +
                                           " worker(s) left); no worker was assigned anything");
      for (const std::string& note : cluster.notes) result->explanation.notes.push_back(note);
      if (result->plan.replicas.empty()) return Internal("the planner placed no replica");
      auto placed = FromPlan(std::make_shared<const PlanResult>(std::move(*result)), 0, cluster);
      if (!placed.ok()) return placed.status().WithContext(what);
      st = std::move(placed).value();
    }
    for (const RankPlacement& p : st.ranks)
      free.erase(std::find_if(free.begin(), free.end(), [&p](const ControlWorkerInfo& w) {
        return w.worker_id == p.worker_id;
      }));
    starts[static_cast<size_t>(r)] = std::move(st);
  }
  std::vector<ReplicaStart> out;
  for (auto& st : starts) out.push_back(std::move(*st));
  return out;
}

StatusOr<std::vector<ReplicaStart>> ReplicaPlacer::Place(
    const std::vector<ControlWorkerInfo>& workers) const {
  if (config_.parallel.mode == ParallelMode::kExplicit && !overrides_.empty())
    return PlaceEachReplica(workers);
  std::vector<ReplicaStart> out;
  if (config_.parallel.mode == ParallelMode::kExplicit && !configured_.tp_per_stage.empty()) {
    TESSERA_ASSIGN_OR_RETURN(out, PlacePerStageTp(workers));
  } else {
    TESSERA_ASSIGN_OR_RETURN(WorkerCluster cluster, BuildWorkerCluster(workers));
    TESSERA_ASSIGN_OR_RETURN(ClusterModel model, BuildClusterModel(cluster.topology));
    auto result =
        planner_->Plan(model_, model, PlanOptionsFor(cluster.cpu, config_.parallel.replicas));
    if (!result.ok())
      return result.status().WithContext(std::string("placement refused (parallel.mode = ") +
                                         ParallelModeName(config_.parallel.mode) + ", " +
                                         std::to_string(workers.size()) +
                                         " worker(s)); no worker was assigned anything");
    for (const std::string& n : cluster.notes) result->explanation.notes.push_back(n);
    if (result->plan.replicas.empty()) return Internal("the planner placed no replica");
    const auto shared = std::make_shared<const PlanResult>(std::move(*result));
    for (size_t r = 0; r < shared->plan.replicas.size(); ++r) {
      TESSERA_ASSIGN_OR_RETURN(ReplicaStart st, FromPlan(shared, static_cast<int>(r), cluster));
      out.push_back(std::move(st));
    }
  }
  const int wanted = config_.parallel.replicas;
  if (out.empty()) return ResourceExhausted("no replica fits the workers");
  if (wanted > 0 && static_cast<int>(out.size()) < wanted)
    return ResourceExhausted(
        ConfigKeyContext(config_, "parallel.replicas") + ": " + std::to_string(wanted) +
        " replicas wanted, but only " + std::to_string(out.size()) + " fit the " +
        std::to_string(workers.size()) + " worker(s) (" + out[0].parallel.ToString() +
        " each); no worker was assigned anything");
  return out;
}

std::vector<ReplicaStart> ReplicaPlacer::HeldPlans(
    const std::vector<ControlWorkerInfo>& usable) const {
  // Per plan version: the workers holding a shard of it, by world rank.
  std::map<uint64_t, std::vector<std::pair<std::string, control::AssignShard>>> by_version;
  for (const ControlWorkerInfo& w : usable) {
    if (!w.alive || !w.registration->has_held_shard()) continue;
    const control::AssignShard& a = w.registration->held_shard();
    if (a.model_path() != config_.model.path || a.plan_version() == 0) continue;
    by_version[a.plan_version()].emplace_back(w.worker_id, a);
  }
  std::vector<ReplicaStart> out;
  for (auto it = by_version.rbegin(); it != by_version.rend(); ++it) {
    const control::AssignShard& first = it->second.front().second;
    std::map<int, std::string> by_rank;
    bool consistent = true;
    for (const auto& [id, a] : it->second) {
      const bool same =
          a.tp() == first.tp() && a.pp() == first.pp() &&
          std::equal(a.tp_per_stage().begin(), a.tp_per_stage().end(), first.tp_per_stage().begin(),
                     first.tp_per_stage().end()) &&
          std::equal(a.layers_per_stage().begin(), a.layers_per_stage().end(),
                     first.layers_per_stage().begin(), first.layers_per_stage().end());
      if (!same || by_rank.count(static_cast<int>(a.world_rank()))) consistent = false;
      by_rank[static_cast<int>(a.world_rank())] = id;
    }
    if (!consistent) continue;
    std::vector<int> layers(first.layers_per_stage().begin(), first.layers_per_stage().end());
    std::vector<int> tps(first.tp_per_stage().begin(), first.tp_per_stage().end());
    auto parallel = tps.empty() ? ParallelConfig::Make(model_, static_cast<int>(first.tp()),
                                                       static_cast<int>(first.pp()), layers)
                                : ParallelConfig::MakePerStage(model_, tps, layers);
    if (!parallel.ok() || static_cast<int>(by_rank.size()) != parallel->world_size()) continue;
    ReplicaStart st;
    st.parallel = *parallel;
    for (const auto& [rank, id] : by_rank) {
      RankPlacement p = RankSlice(*parallel, rank);
      p.worker_id = id;
      p.reused_first = p.first_layer;
      p.reused_end = p.end_layer;
      p.reuses_embedding = p.stage == 0;
      p.reuses_lm_head = p.stage == parallel->pp - 1;
      st.ranks.push_back(p);
    }
    st.adopted_version = it->first;
    st.kv_blocks = static_cast<int64_t>(first.kv_num_blocks());
    st.reason = "adopted plan " + std::to_string(it->first) + " held by the workers";
    out.push_back(std::move(st));
  }
  return out;
}

}  // namespace tessera
