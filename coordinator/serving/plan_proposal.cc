// PlanRunner, computing layouts and placements: the workers a replica may
// use, what they hold, and POST /admin/plan's proposals (Propose). (The
// first placement is the replica set's: replica_placement.h.)
#include <algorithm>

#include "common/base/logging.h"
#include "common/model/shard_spec.h"
#include "coordinator/control/worker_cluster.h"
#include "coordinator/placement/cluster_model.h"
#include "coordinator/placement/cost_model.h"
#include "coordinator/serving/plan_runner.h"

namespace tessera {

std::vector<std::string> PlanRunner::UsableWorkers() const {
  std::vector<std::string> usable = state_.UsableWorkers(control_->Workers());
  MutexLock lock(&state_.mu);
  // Its own workers and the spares; never another replica's.
  usable.erase(std::remove_if(usable.begin(), usable.end(),
                              [&](const std::string& id) REQUIRES(state_.mu) {
                                const int owner = state_.ReplicaOf(id);
                                return owner >= 0 && owner != replica_;
                              }),
               usable.end());
  return usable;
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
    if (!w.alive || !w.registration->has_held_shard()) continue;
    const control::AssignShard& a = w.registration->held_shard();
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
  for (const Assignment& a : rep().assignments) {
    if (a.loaded_weight_bytes < 0) continue;  // never loaded: holds nothing of this plan
    HeldSlice h;
    h.tp = rep().parallel.TpOfStage(a.stage);
    h.tp_rank = a.tp_rank;
    h.first_layer = rep().parallel.FirstLayer(a.stage);
    h.end_layer = rep().parallel.EndLayer(a.stage);
    h.embedding = a.stage == 0;
    h.lm_head = a.stage == rep().parallel.pp - 1;
    held[a.worker_id] = h;
  }
  return held;
}

bool PlanRunner::PlanUnchanged(const ParallelConfig& target,
                               const std::vector<RankPlacement>& ranks) const {
  MutexLock lock(&state_.mu);
  if (!rep().degraded.empty() || target.tp != rep().parallel.tp ||
      target.tp_per_stage != rep().parallel.tp_per_stage || target.pp != rep().parallel.pp ||
      target.layers_per_stage != rep().parallel.layers_per_stage ||
      ranks.size() != rep().assignments.size())
    return false;
  for (size_t i = 0; i < ranks.size(); ++i)
    if (ranks[i].worker_id != rep().assignments[i].worker_id) return false;
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
  PlanOptions o = placer_.PlanOptionsFor(cluster->cpu, 1);  // this replica alone
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
  const std::map<std::string, HeldSlice> held = HeldSlices();
  std::vector<RankPlacement> ranks;
  for (int s = 0; s < rep.pp(); ++s)
    for (int i = 0; i < rep.stages[s].tp; ++i) {
      const GpuRef& ref = rep.stages[s].gpus[i];
      RankPlacement r = RankSlice(*parallel, parallel->WorldRank(s, i));
      r.worker_id = cluster->workers[ref.node][ref.gpu];
      FillReuse(r, parallel->pp, held);  // what the dry run reports as kept
      ranks.push_back(r);
    }
  TESSERA_LOG_INFO("coordinator", "replica {}: auto plan ({}): {}\n{}", replica_,
                   ObjectiveName(objective), parallel->ToString(), result->ToText());
  PlanProposal out;
  out.parallel = *parallel;
  out.ranks = std::move(ranks);
  out.planned = std::make_shared<const PlanResult>(std::move(*result));
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

PlanDryRun PlanRunner::DryRun(const PlanProposal& proposal) const {
  MutexLock lock(&state_.mu);
  std::vector<std::string> from;
  for (const Assignment& a : rep().assignments) from.push_back(a.worker_id);
  PlanDryRun out;
  out.change = DescribePlanChange(rep().serving ? &rep().parallel : nullptr, proposal.parallel,
                                  proposal.ranks, from, rep().plan_version + 1);
  out.drain_timeout_seconds = config_.scheduler.drain_timeout_seconds;
  out.planned = proposal.planned;  // its text says why the planner chose it
  return out;
}

}  // namespace tessera
