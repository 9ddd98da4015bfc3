#include "coordinator/serving/cluster_view.h"

#include <algorithm>
#include <chrono>

namespace tessera {

NotReadyStatus ClusterView::NotReady() const {
  MutexLock lock(&state_.mu);
  std::string degraded;
  bool serving = false;
  for (size_t r = 0; r < state_.replicas.size(); ++r) {
    const ReplicaPlan& p = state_.replicas[r];
    if (!p.degraded.empty() && degraded.empty())
      degraded = state_.replicas.size() > 1 ? "replica " + std::to_string(r) + ": " + p.degraded
                                            : p.degraded;
    serving |= p.serving;
  }
  NotReadyStatus out;
  out.degraded = !degraded.empty();
  out.reason = !state_.placement_status.ok() ? state_.placement_status.ToString()
               : !degraded.empty()           ? "degraded: " + degraded
               : serving                     ? "re-planning after a worker failure"
                                             : "waiting for workers";
  return out;
}

namespace {

WorkerReportedState Reported(control::WorkerState s) {
  switch (s) {
    case control::WORKER_STATE_IDLE:
      return WorkerReportedState::kIdle;
    case control::WORKER_STATE_LOADING:
      return WorkerReportedState::kLoading;
    case control::WORKER_STATE_READY:
      return WorkerReportedState::kReady;
    case control::WORKER_STATE_DRAINING:
      return WorkerReportedState::kDraining;
    case control::WORKER_STATE_FAILED:
      return WorkerReportedState::kFailed;
    default:
      return WorkerReportedState::kUnknown;
  }
}

}  // namespace

WorkerStatus ClusterView::Worker(const ControlWorkerInfo& w) const {
  WorkerStatus out;
  out.id = w.worker_id;
  out.host = w.registration->host();
  out.pid = w.registration->pid();
  out.data_address = w.registration->data_address();
  for (const auto& d : w.registration->devices())
    out.devices.push_back(
        {d.index(), d.name(), d.kind() == control::DEVICE_KIND_CPU, d.total_memory_bytes()});
  out.curve_public_key = w.curve_public_key;
  const int replica = state_.ReplicaOf(w.worker_id);
  if (replica >= 0) {
    out.replica = replica;
    for (const Assignment& a : state_.replicas[static_cast<size_t>(replica)].assignments)
      if (a.worker_id == w.worker_id)
        out.rank = WorkerRankStatus{a.world_rank, a.stage, a.tp_rank, replica};
  }
  // Its last exclusion (kept, with the count, after the back-off ended).
  if (auto ex = state_.excluded_workers.find(w.worker_id); ex != state_.excluded_workers.end()) {
    const double left =
        std::chrono::duration<double>(ex->second.until - std::chrono::steady_clock::now()).count();
    out.exclusion = WorkerExclusionStatus{left > 0, ex->second.reason, ex->second.kind,
                                          ex->second.count, std::max(0.0, left)};
  }
  // A worker declared lost reports nothing more: its last report ("ready")
  // is stale.
  auto st = state_.states.find(w.worker_id);
  out.reported = !w.alive                    ? WorkerReportedState::kLost
                 : st == state_.states.end() ? WorkerReportedState::kRegistered
                                             : Reported(st->second);
  out.health = state_.IsFailed(w.worker_id) || !w.alive ? WorkerHealth::kFailed
               : state_.IsDrained(w.worker_id)          ? WorkerHealth::kDrained
               : state_.IsExcluded(w.worker_id)         ? WorkerHealth::kExcluded
                                                        : WorkerHealth::kAlive;
  out.in_plan = replica >= 0 && w.alive;
  out.seconds_since_last_message = w.seconds_since_last_message;
  return out;
}

ClusterDocument ClusterView::Cluster(const ClusterPage& page) const {
  ClusterDocument doc;
  doc.page = page;
  doc.reconfiguring = replicas_->reconfiguring();
  // This page's slice of the replicas [r0, r1) and of the workers.
  const size_t size = static_cast<size_t>(std::max<int64_t>(1, page.page_size));
  const auto slice = [&page, size](size_t n) {
    const size_t first = std::min(n, static_cast<size_t>(page.page) * size);
    return std::pair<size_t, size_t>{first, std::min(n, first + size)};
  };
  const size_t num_replicas = static_cast<size_t>(std::max(0, replicas_->size()));
  const auto [r0, r1] = slice(num_replicas);
  std::vector<ReplicaStatus::Live> live;
  for (size_t r = r0; r < r1; ++r)
    live.push_back({replicas_->runner(static_cast<int>(r))->reconfiguring(),
                    replicas_->Load(static_cast<int>(r))});
  // This page's workers only: a fleet's page does not copy all of it.
  const std::vector<ControlWorkerInfo> page_workers =
      control_->WorkersPage(static_cast<size_t>(page.page) * size, size, &doc.workers_total);
  MutexLock lock(&state_.mu);
  for (const ControlWorkerInfo& w : page_workers) doc.workers.push_back(Worker(w));
  doc.ready = state_.ready.load();
  if (!state_.replicas.empty()) {
    doc.degraded = state_.replicas[0].degraded;
    doc.plan_version = state_.replicas[0].plan_version;
  }
  if (doc.ready && replicas_->placed())
    doc.queue = ClusterDocument::Queue{replicas_->waiting(), replicas_->running()};
  for (size_t r = 0; r < state_.replicas.size(); ++r) {
    const ReplicaPlan& p = state_.replicas[r];
    doc.reconfigurations_total += p.reconfigurations;
    doc.faults_total += p.faults;
    doc.requeued_requests_total += p.requeued_total;
    doc.replicas_ready += p.ready ? 1 : 0;
    if (r < r0 || r >= r1) continue;
    ReplicaStatus rs;
    rs.replica = r;
    rs.ready = p.ready;
    rs.degraded = p.degraded;
    rs.plan_version = p.plan_version;
    rs.layout = p.parallel;
    for (const Assignment& a : p.assignments) rs.workers.push_back(a.worker_id);
    rs.reconfigurations_total = p.reconfigurations;
    rs.faults_total = p.faults;
    rs.requeued_requests_total = p.requeued_total;
    if (r - r0 < live.size()) rs.live = live[r - r0];
    doc.replicas.push_back(std::move(rs));
  }
  doc.replicas_total = state_.replicas.size();
  doc.pages =
      std::max<size_t>(1, (std::max(doc.workers_total, doc.replicas_total) + size - 1) / size);
  return doc;
}

PlanDocument ClusterView::Plan() const {
  MutexLock lock(&state_.mu);
  PlanDocument doc;
  doc.mode = config_.parallel.mode;
  if (!state_.placement_status.ok()) doc.error = state_.placement_status.ToString();
  doc.waiting_for_workers = expected_workers_;
  for (size_t r = 0; r < state_.replicas.size(); ++r) doc.replicas.push_back(ReplicaPlanOf(r));
  return doc;
}

ReplicaPlanStatus ClusterView::ReplicaPlanOf(size_t index) const {
  const ReplicaPlan& p = state_.replicas[index];
  ReplicaPlanStatus out;
  const bool moe = model_ != nullptr && model_->is_moe();
  const bool ep = moe && p.parallel.expert_parallel;  // as the plan applied it
  for (const Assignment& a : p.assignments) {
    PlanRankStatus rank;
    rank.assignment = a;
    rank.first_layer = p.parallel.FirstLayer(a.stage);
    rank.end_layer = p.parallel.EndLayer(a.stage);
    if (moe) {
      // Whole experts [begin, end) under expert parallelism, else a 1/tp
      // slice of every one.
      const int tp = p.parallel.TpOfStage(a.stage);
      rank.experts = ep ? ExpertsOfRank(model_->num_experts, tp, a.tp_rank)
                        : ExpertRange{0, model_->num_experts};
      rank.expert_split_tp = ep ? 0 : tp;
    }
    out.ranks.push_back(std::move(rank));
  }
  out.plan_version = p.plan_version;
  out.replica = index;
  out.ready = p.ready;
  if (!state_.placement_status.ok()) out.error = state_.placement_status.ToString();
  out.degraded = p.degraded;
  if (p.assignments.empty()) {
    if (state_.placement_status.ok()) out.waiting_for_workers = expected_workers_;
    return out;
  }
  out.quantization = quantization_;
  out.parallel = p.parallel;
  out.moe = moe;
  out.expert_parallel = ep;
  out.kv_blocks = p.kv_blocks;
  out.kv_block_size = config_.kv_cache.block_size;
  out.kv_cache_dtype = config_.kv_cache.dtype;
  out.wanted = p.wanted;
  out.history = p.history;
  if (!p.plan_result) return out;  // an explicit tp per stage: no planner run
  out.planner = p.plan_result;
  out.planner_replica = std::min<size_t>(static_cast<size_t>(std::max(0, p.plan_result_replica)),
                                         p.plan_result->plan.replicas.size() - 1);
  const int pp = p.plan_result->plan.replicas[out.planner_replica].pp();
  out.stage_workers.resize(static_cast<size_t>(std::max(0, pp)));
  for (const Assignment& a : p.assignments)
    if (a.stage >= 0 && a.stage < pp)
      out.stage_workers[static_cast<size_t>(a.stage)].push_back(a.worker_id);
  return out;
}

}  // namespace tessera
