// PlanRunner, computing layouts and placements: the first plan (Plan), the
// plan re-registered workers hold (HeldPlan) and POST /admin/plan's
// proposals (Propose).
#include <algorithm>
#include <nlohmann/json.hpp>

#include "common/base/logging.h"
#include "common/model/shard_spec.h"
#include "coordinator/control/worker_cluster.h"
#include "coordinator/placement/cluster_model.h"
#include "coordinator/placement/cost_model.h"
#include "coordinator/serving/plan_runner.h"

namespace tessera {

using nlohmann::json;

std::vector<std::string> PlanRunner::UsableWorkers() const {
  return state_.UsableWorkers(control_->Workers());
}

std::vector<ControlWorkerInfo> PlanRunner::WorkerInfos(const std::vector<std::string>& ids) const {
  std::vector<ControlWorkerInfo> all = control_->Workers(), out;
  for (const std::string& id : ids)
    for (const ControlWorkerInfo& w : all)
      if (w.worker_id == id) {
        out.push_back(w);
        break;
      }
  return out;
}

std::map<std::string, HeldSlice> PlanRunner::HeldSlices() const {
  std::map<std::string, HeldSlice> held;
  // What re-registered workers say they hold (a restarted coordinator) ...
  for (const ControlWorkerInfo& w : control_->Workers()) {
    if (!w.alive || !w.registration.has_held_shard()) continue;
    const control::AssignShard& a = w.registration.held_shard();
    if (a.model_path() != config_.model.path) continue;
    HeldSlice h;
    h.tp = a.tp_per_stage_size() > static_cast<int>(a.stage())
               ? static_cast<int>(a.tp_per_stage(static_cast<int>(a.stage())))
               : static_cast<int>(a.tp());
    h.tp_rank = static_cast<int>(a.tp_rank());
    h.first_layer = static_cast<int>(a.first_layer());
    h.end_layer = static_cast<int>(a.end_layer());
    h.embedding = a.stage() == 0;
    h.lm_head = a.stage() + 1 == a.pp();
    held[w.worker_id] = h;
  }
  // ... and, more recent, what the workers loaded for this coordinator.
  MutexLock lock(&state_.mu);
  for (const Assignment& a : state_.assignments) {
    if (a.loaded_weight_bytes < 0) continue;  // never loaded: holds nothing of this plan
    HeldSlice h;
    h.tp = state_.parallel.TpOfStage(a.stage);
    h.tp_rank = a.tp_rank;
    h.first_layer = state_.parallel.FirstLayer(a.stage);
    h.end_layer = state_.parallel.EndLayer(a.stage);
    h.embedding = a.stage == 0;
    h.lm_head = a.stage == state_.parallel.pp - 1;
    held[a.worker_id] = h;
  }
  return held;
}

std::optional<std::pair<ParallelConfig, std::vector<RankPlacement>>> PlanRunner::HeldPlan(
    const std::vector<std::string>& usable, uint64_t* version, int64_t* kv_blocks) const {
  std::map<std::string, control::AssignShard> shards;
  uint64_t newest = 0;
  for (const ControlWorkerInfo& w : control_->Workers()) {
    if (!w.alive || !w.registration.has_held_shard() ||
        std::find(usable.begin(), usable.end(), w.worker_id) == usable.end())
      continue;
    shards[w.worker_id] = w.registration.held_shard();
    newest = std::max(newest, w.registration.held_shard().plan_version());
  }
  if (newest == 0) return std::nullopt;
  const control::AssignShard* first = nullptr;
  std::map<int, std::string> by_rank;
  for (const auto& [id, a] : shards) {
    if (a.plan_version() != newest) continue;
    if (!first) first = &a;
    const bool same =
        a.tp() == first->tp() && a.pp() == first->pp() &&
        std::equal(a.tp_per_stage().begin(), a.tp_per_stage().end(), first->tp_per_stage().begin(),
                   first->tp_per_stage().end()) &&
        std::equal(a.layers_per_stage().begin(), a.layers_per_stage().end(),
                   first->layers_per_stage().begin(), first->layers_per_stage().end()) &&
        a.model_path() == config_.model.path;
    if (!same || by_rank.count(static_cast<int>(a.world_rank()))) return std::nullopt;
    by_rank[static_cast<int>(a.world_rank())] = id;
  }
  std::vector<int> layers(first->layers_per_stage().begin(), first->layers_per_stage().end());
  std::vector<int> tps(first->tp_per_stage().begin(), first->tp_per_stage().end());
  auto parallel = tps.empty() ? ParallelConfig::Make(model_, static_cast<int>(first->tp()),
                                                     static_cast<int>(first->pp()), layers)
                              : ParallelConfig::MakePerStage(model_, tps, layers);
  if (!parallel.ok() || static_cast<int>(by_rank.size()) != parallel->world_size())
    return std::nullopt;
  std::vector<RankPlacement> ranks;
  for (const auto& [rank, id] : by_rank) {
    RankPlacement p = RankSlice(*parallel, rank);
    p.worker_id = id;
    p.reused_first = p.first_layer;
    p.reused_end = p.end_layer;
    p.reuses_embedding = p.stage == 0;
    p.reuses_lm_head = p.stage == parallel->pp - 1;
    ranks.push_back(p);
  }
  *version = newest;
  *kv_blocks = static_cast<int64_t>(first->kv_num_blocks());
  return std::make_pair(*parallel, std::move(ranks));
}

// An explicit tp per stage: the planner searches uniform tp only, so the
// ranks go to the workers in registration order (docs/operations.md), with
// the KV cache kv_cache.max_blocks (or room for min(8, max_sequences)
// sequences of scheduler.max_context).
Status PlanRunner::PlanPerStageTp(const std::vector<ControlWorkerInfo>& workers) {
  const int64_t block = config_.kv_cache.block_size;
  const int64_t blocks = config_.kv_cache.max_blocks > 0
                             ? config_.kv_cache.max_blocks
                             : BlockAllocator::BlocksFor(max_context_, block) *
                                   std::min<int64_t>(8, config_.scheduler.max_sequences);
  std::vector<Assignment> plan;
  for (int r = 0; r < configured_.world_size(); ++r) {
    const ControlWorkerInfo& w = workers[static_cast<size_t>(r)];
    Assignment a;
    a.worker_id = w.worker_id;
    a.host = w.registration.host();
    a.data_address = w.registration.data_address();
    a.device_index = w.registration.devices_size() ? w.registration.devices(0).index() : 0;
    a.world_rank = r;
    a.stage = configured_.StageOf(r);
    a.tp_rank = configured_.TpRankOf(r);
    TESSERA_ASSIGN_OR_RETURN(ShardSpec spec, ShardSpec::Make(model_, configured_, r));
    a.shard_weight_bytes = a.predicted_weight_bytes = spec.WeightBytes(DType::kF32);
    plan.push_back(a);
  }
  MutexLock lock(&state_.mu);
  state_.kv_blocks = blocks;
  state_.assignments = std::move(plan);
  state_.plan_result.reset();
  return Status::Ok();
}

PlanOptions PlanRunner::PlanOptionsFor(bool cpu) const {
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
  o.prefill_chunk_tokens = config_.scheduler.prefill_chunk_tokens;
  o.max_batch = config_.scheduler.max_sequences;
  o.max_replicas = 1;  // the scheduler drives one pipeline
  o.uniform_tp = true;
  if (cpu) {
    // Gloo over TCP: a collective costs tens of microseconds, not NCCL's ten.
    o.cost.collective_launch_s = 50e-6;
    o.cost.pcie_step_s = 20e-6;
    o.cost.network_step_s = 50e-6;
  }
  if (config_.parallel.mode == ParallelMode::kExplicit) {
    o.fixed_tp = config_.parallel.tp;
    o.fixed_pp = config_.parallel.pp;
    // The configured split, or the even one ParallelConfig made of `[]`.
    o.fixed_layers_per_stage = config_.parallel.layers_per_stage.empty()
                                   ? configured_.layers_per_stage
                                   : config_.parallel.layers_per_stage;
    o.allow_cross_node_tp = true;  // the operator chose the tp
  }
  return o;
}

Status PlanRunner::Plan(const std::vector<ControlWorkerInfo>& workers) {
  if (config_.parallel.mode == ParallelMode::kExplicit && !configured_.tp_per_stage.empty())
    return PlanPerStageTp(workers);
  TESSERA_ASSIGN_OR_RETURN(WorkerCluster cluster, BuildWorkerCluster(workers));
  TESSERA_ASSIGN_OR_RETURN(ClusterModel model, BuildClusterModel(cluster.topology));
  auto result = planner_->Plan(model_, model, PlanOptionsFor(cluster.cpu));
  if (!result.ok())
    return result.status().WithContext(std::string("placement refused (parallel.mode = ") +
                                       ParallelModeName(config_.parallel.mode) + ", " +
                                       std::to_string(workers.size()) +
                                       " worker(s)); no worker was assigned anything");
  for (const std::string& n : cluster.notes) result->explanation.notes.push_back(n);
  if (result->plan.replicas.empty()) return Internal("the planner placed no replica");
  TESSERA_ASSIGN_OR_RETURN(ParallelConfig par, result->plan.ParallelConfigOf(model_, 0));
  const PlannedReplica& rep = result->plan.replicas[0];
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
  std::vector<Assignment> plan;
  for (int s = 0; s < rep.pp(); ++s) {
    const PlannedStage& st = rep.stages[s];
    for (int i = 0; i < st.tp; ++i) {
      const GpuRef& ref = st.gpus[i];
      Assignment a;
      a.worker_id = cluster.workers[ref.node][ref.gpu];
      for (const ControlWorkerInfo& w : workers) {
        if (w.worker_id != a.worker_id) continue;
        a.host = w.registration.host();
        a.data_address = w.registration.data_address();
        a.device_index = w.registration.devices(0).index();
      }
      a.world_rank = s * par.tp + i;
      a.stage = s;
      a.tp_rank = i;
      a.predicted_weight_bytes = st.weight_bytes;
      TESSERA_ASSIGN_OR_RETURN(ShardSpec spec, ShardSpec::Make(model_, par, a.world_rank));
      a.shard_weight_bytes = spec.WeightBytes(DType::kF32);
      a.predicted_kv_bytes = PredictedKvBytes(par, s, blocks);
      plan.push_back(a);
    }
  }
  MutexLock lock(&state_.mu);
  state_.parallel = par;
  state_.kv_blocks = blocks;
  state_.assignments = std::move(plan);
  state_.plan_result = std::move(*result);
  return Status::Ok();
}

bool PlanRunner::PlanUnchanged(const ParallelConfig& target,
                               const std::vector<RankPlacement>& ranks) const {
  MutexLock lock(&state_.mu);
  if (!state_.degraded.empty() || target.tp != state_.parallel.tp ||
      target.tp_per_stage != state_.parallel.tp_per_stage || target.pp != state_.parallel.pp ||
      target.layers_per_stage != state_.parallel.layers_per_stage ||
      ranks.size() != state_.assignments.size())
    return false;
  for (size_t i = 0; i < ranks.size(); ++i)
    if (ranks[i].worker_id != state_.assignments[i].worker_id) return false;
  return true;
}

StatusOr<PlanProposal> PlanRunner::ProposeAuto(Objective objective) const {
  const std::vector<std::string> usable = UsableWorkers();
  if (usable.empty()) return InvalidArgument("auto: no usable worker (alive, not drained)");
  auto cluster = BuildWorkerCluster(WorkerInfos(usable));
  if (!cluster.ok()) return InvalidArgument("auto: " + cluster.status().message());
  auto topology = BuildClusterModel(cluster->topology);
  if (!topology.ok()) return InvalidArgument("auto: " + topology.status().message());
  // The auto-mode options (whatever parallel.mode says) with the asked objective.
  PlanOptions o = PlanOptionsFor(cluster->cpu);
  const PlanOptions free_layout;
  o.fixed_tp = free_layout.fixed_tp;
  o.fixed_pp = free_layout.fixed_pp;
  o.fixed_layers_per_stage = free_layout.fixed_layers_per_stage;
  o.allow_cross_node_tp = free_layout.allow_cross_node_tp;
  o.objective = objective;
  auto result = planner_->Plan(model_, *topology, o);
  if (!result.ok())
    return InvalidArgument("auto: no layout fits the " + std::to_string(usable.size()) +
                           " usable worker(s): " + result.status().message());
  if (result->plan.replicas.empty()) return Internal("auto: the planner placed no replica");
  auto parallel = result->plan.ParallelConfigOf(model_, 0);
  if (!parallel.ok()) return InvalidArgument("auto: " + parallel.status().message());
  const PlannedReplica& rep = result->plan.replicas[0];
  std::vector<RankPlacement> ranks;
  for (int s = 0; s < rep.pp(); ++s)
    for (int i = 0; i < rep.stages[s].tp; ++i) {
      const GpuRef& ref = rep.stages[s].gpus[i];
      RankPlacement r = RankSlice(*parallel, parallel->WorldRank(s, i));
      r.worker_id = cluster->workers[ref.node][ref.gpu];
      ranks.push_back(r);
    }
  TESSERA_LOG_INFO("coordinator", "auto plan ({}): {}\n{}", ObjectiveName(objective),
                   parallel->ToString(), result->ToText());
  PlanProposal out;
  out.parallel = *parallel;
  out.ranks = std::move(ranks);
  out.planned = std::move(*result);
  return out;
}

StatusOr<PlanProposal> PlanRunner::Propose(const PlanRequest& request) const {
  if (request.auto_plan) return ProposeAuto(request.objective);
  auto parallel = request.Layout(model_);
  if (!parallel.ok()) return InvalidArgument(parallel.status().message());
  std::vector<std::string> usable = UsableWorkers();
  if (parallel->world_size() > static_cast<int>(usable.size()))
    return InvalidArgument(parallel->ToString() + " needs " +
                           std::to_string(parallel->world_size()) + " workers; the cluster has " +
                           std::to_string(usable.size()) + " usable (alive, not drained)");
  PlanProposal out;
  out.parallel = *parallel;
  TESSERA_ASSIGN_OR_RETURN(out.ranks, PlaceRanks(*parallel, usable, HeldSlices()));
  return out;
}

std::string PlanRunner::DryRunJson(const PlanProposal& proposal) const {
  MutexLock lock(&state_.mu);
  std::vector<std::string> from;
  for (const Assignment& a : state_.assignments) from.push_back(a.worker_id);
  json j = PlanChangeJson(state_.serving ? &state_.parallel : nullptr, proposal.parallel,
                          proposal.ranks, from, state_.plan_version + 1);
  j["dry_run"] = true;
  j["drain_timeout_seconds"] = config_.scheduler.drain_timeout_seconds;
  if (proposal.planned) j["planner_text"] = proposal.planned->ToText();  // why the planner chose it
  return j.dump();
}

}  // namespace tessera
