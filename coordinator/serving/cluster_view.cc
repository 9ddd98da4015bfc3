#include "coordinator/serving/cluster_view.h"

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>

#include "coordinator/placement/plan_change.h"

namespace tessera {

using nlohmann::json;

std::string ClusterView::NotReadyJson() const {
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
  std::string reason = !state_.placement_status.ok() ? state_.placement_status.ToString()
                       : !degraded.empty()           ? "degraded: " + degraded
                       : serving                     ? "re-planning after a worker failure"
                                                     : "waiting for workers";
  json j = {{"status", degraded.empty() ? "not_ready" : "degraded"}, {"reason", reason}};
  return j.dump();
}

namespace {

const char* StateName(control::WorkerState s) {
  switch (s) {
    case control::WORKER_STATE_IDLE:
      return "idle";
    case control::WORKER_STATE_LOADING:
      return "loading";
    case control::WORKER_STATE_READY:
      return "ready";
    case control::WORKER_STATE_DRAINING:
      return "draining";
    case control::WORKER_STATE_FAILED:
      return "failed";
    default:
      return "unknown";
  }
}

json StageJson(const PlannedStage& st, const std::vector<std::string>& workers) {
  json gpus = json::array();
  for (const GpuRef& g : st.gpus) gpus.push_back({g.node, g.gpu});
  return {{"tp", st.tp},
          {"hosts", st.hosts},
          {"workers", workers},
          {"devices", gpus},
          {"device_name", st.gpu_name},
          {"layers", {st.first_layer, st.end_layer}},
          {"embedding", st.embedding},
          {"lm_head", st.lm_head},
          {"tp_link", st.tp_link},
          {"predicted_weight_bytes", st.weight_bytes},
          {"predicted_kv_pool_bytes", st.kv_bytes},
          {"predicted_activation_bytes", st.activation_bytes},
          {"usable_bytes", st.usable_bytes},
          {"predicted_decode_seconds", st.decode_seconds}};
}

}  // namespace

std::string ClusterView::ClusterJson(const ClusterPage& page) const {
  json workers = json::array();
  const bool reconfiguring = replicas_->reconfiguring();
  // This page's slice of the replicas [r0, r1) and of the workers.
  const auto slice = [&page](size_t n) {
    const size_t size = static_cast<size_t>(std::max<int64_t>(1, page.page_size));
    const size_t first = std::min(n, static_cast<size_t>(page.page) * size);
    return std::pair<size_t, size_t>{first, std::min(n, first + size)};
  };
  const size_t num_replicas = static_cast<size_t>(std::max(0, replicas_->size()));
  const auto [r0, r1] = slice(num_replicas);
  std::vector<ReplicaLoadInfo> loads;
  std::vector<bool> replica_reconfiguring;
  for (size_t r = r0; r < r1; ++r) {
    loads.push_back(replicas_->Load(static_cast<int>(r)));
    replica_reconfiguring.push_back(replicas_->runner(static_cast<int>(r))->reconfiguring());
  }
  // This page's workers only: a fleet's page does not copy all of it.
  const size_t size = static_cast<size_t>(std::max<int64_t>(1, page.page_size));
  size_t num_workers = 0;
  const std::vector<ControlWorkerInfo> page_workers =
      control_->WorkersPage(static_cast<size_t>(page.page) * size, size, &num_workers);
  MutexLock lock(&state_.mu);
  static const ReplicaPlan kNone;
  const ReplicaPlan& first = state_.replicas.empty() ? kNone : state_.replicas[0];
  for (const ControlWorkerInfo& w : page_workers) {
    const bool failed = state_.IsFailed(w.worker_id);
    const bool drained = state_.IsDrained(w.worker_id);
    const int replica = state_.ReplicaOf(w.worker_id);
    const bool in_plan = replica >= 0;
    json devices = json::array();
    for (const auto& d : w.registration->devices())
      devices.push_back({{"index", d.index()},
                         {"name", d.name()},
                         {"kind", d.kind() == control::DEVICE_KIND_CPU ? "cpu" : "cuda"},
                         {"memory_bytes", d.total_memory_bytes()}});
    json role = nullptr;
    if (replica >= 0)
      for (const Assignment& a : state_.replicas[static_cast<size_t>(replica)].assignments)
        if (a.worker_id == w.worker_id)
          role = {{"world_rank", a.world_rank},
                  {"stage", a.stage},
                  {"tp_rank", a.tp_rank},
                  {"replica", replica}};
    auto st = state_.states.find(w.worker_id);
    // Its last exclusion (kept, with the count, after the back-off ended).
    json exclusion = nullptr;
    if (auto ex = state_.excluded_workers.find(w.worker_id); ex != state_.excluded_workers.end()) {
      const double left =
          std::chrono::duration<double>(ex->second.until - std::chrono::steady_clock::now())
              .count();
      exclusion = {{"excluded", left > 0},
                   {"reason", ex->second.reason},
                   {"kind", ex->second.kind},
                   {"count", ex->second.count},
                   {"seconds_left", std::max(0.0, left)}};
    }
    // A worker declared lost reports nothing more: its last report ("ready")
    // is stale.
    const char* worker_state = !w.alive                    ? "lost"
                               : st == state_.states.end() ? "registered"
                                                           : StateName(st->second);
    workers.push_back({{"id", w.worker_id},
                       {"host", w.registration->host()},
                       {"pid", w.registration->pid()},
                       {"data_address", w.registration->data_address()},
                       {"devices", devices},
                       {"curve_public_key", w.curve_public_key},
                       {"state", failed || !w.alive               ? "failed"
                                 : drained                        ? "drained"
                                 : state_.IsExcluded(w.worker_id) ? "excluded"
                                                                  : "alive"},
                       {"exclusion", exclusion},
                       {"worker_state", worker_state},
                       {"rank", role},
                       {"in_plan", in_plan && w.alive},
                       {"replica", replica >= 0 ? json(replica) : json(nullptr)},
                       {"seconds_since_last_message", w.seconds_since_last_message}});
  }
  json queue = nullptr;
  if (state_.ready.load() && replicas_->placed())
    queue = {{"waiting", replicas_->waiting()}, {"running", replicas_->running()}};
  json replicas = json::array();
  int64_t reconfigurations = 0, faults = 0, requeued = 0;
  int64_t replicas_ready = 0;
  for (size_t r = 0; r < state_.replicas.size(); ++r) {
    const ReplicaPlan& p = state_.replicas[r];
    reconfigurations += p.reconfigurations;
    faults += p.faults;
    requeued += p.requeued_total;
    replicas_ready += p.ready ? 1 : 0;
    if (r < r0 || r >= r1) continue;
    std::vector<std::string> ws;
    for (const Assignment& a : p.assignments) ws.push_back(a.worker_id);
    json j = {{"replica", r},
              {"ready", p.ready},
              {"degraded", p.degraded.empty() ? json(nullptr) : json(p.degraded)},
              {"plan_version", p.plan_version},
              {"layout", LayoutJson(p.parallel)},
              {"workers", ws},
              {"reconfigurations_total", p.reconfigurations},
              {"faults_total", p.faults},
              {"requeued_requests_total", p.requeued_total}};
    if (r - r0 < loads.size()) {
      const ReplicaLoadInfo& l = loads[r - r0];
      j["reconfiguring"] = static_cast<bool>(replica_reconfiguring[r - r0]);
      j["accepting"] = l.accepting;
      j["load"] = {{"waiting", l.waiting},
                   {"running", l.running},
                   {"outstanding_tokens", l.outstanding_tokens},
                   {"free_kv_blocks", l.free_kv_blocks},
                   {"kv_blocks", l.kv_blocks}};
      j["requests_routed_total"] = l.routed_total;
      j["requests_finished_total"] = l.finished_total;
      j["requests_handed_off_total"] = l.handed_off_total;
    }
    replicas.push_back(std::move(j));
  }
  return json{{"workers", workers},
              {"ready", state_.ready.load()},
              {"degraded", first.degraded.empty() ? json(nullptr) : json(first.degraded)},
              {"plan_version", first.plan_version},
              {"queue", queue},
              {"reconfiguring", reconfiguring},
              {"reconfigurations_total", reconfigurations},
              {"faults_total", faults},
              {"requeued_requests_total", requeued},
              {"replicas", replicas},
              {"workers_total", num_workers},
              {"replicas_total", state_.replicas.size()},
              {"replicas_ready", replicas_ready},
              {"page", page.page},
              {"page_size", page.page_size},
              {"pages", std::max<size_t>(1, (std::max(num_workers, state_.replicas.size()) +
                                             static_cast<size_t>(page.page_size) - 1) /
                                                static_cast<size_t>(page.page_size))}}
      .dump();
}

std::string ClusterView::PlanJson() const {
  MutexLock lock(&state_.mu);
  json out;
  if (state_.replicas.empty()) {
    out = {{"plan_version", 0},
           {"mode", ParallelModeName(config_.parallel.mode)},
           {"ready", false},
           {"ranks", json::array()}};
    if (!state_.placement_status.ok()) {
      out["error"] = state_.placement_status.ToString();
    } else {
      out["waiting_for_workers"] = expected_workers_;
    }
    out["replicas"] = json::array();
    return out.dump();
  }
  out = ReplicaPlanJson(0);
  json all = json::array();
  for (size_t r = 0; r < state_.replicas.size(); ++r) all.push_back(ReplicaPlanJson(r));
  out["replicas"] = std::move(all);
  return out.dump();
}

json ClusterView::ReplicaPlanJson(size_t index) const {
  const ReplicaPlan& p = state_.replicas[index];
  json ranks = json::array();
  const bool moe = model_ != nullptr && model_->is_moe();
  const bool ep = moe && p.parallel.expert_parallel;  // as the plan applied it
  for (const Assignment& a : p.assignments) {
    // An MoE model's experts on this rank: [begin, end) whole under expert
    // parallelism, else a 1/tp slice of every one.
    json rank = {{"worker", a.worker_id},
                 {"host", a.host},
                 {"device", a.device_index},
                 {"world_rank", a.world_rank},
                 {"stage", a.stage},
                 {"tp_rank", a.tp_rank},
                 {"layers", {p.parallel.FirstLayer(a.stage), p.parallel.EndLayer(a.stage)}},
                 {"predicted_weight_bytes", a.predicted_weight_bytes},
                 {"shard_weight_bytes", a.shard_weight_bytes},
                 {"weight_bytes", a.loaded_weight_bytes},
                 {"reused_weight_bytes", a.reused_weight_bytes},
                 {"predicted_kv_bytes", a.predicted_kv_bytes},
                 {"kv_bytes", a.kv_bytes},
                 {"load_seconds", a.load_seconds},
                 {"load_bytes_done", a.load_bytes_done},
                 {"load_bytes_total", a.load_bytes_total}};
    if (moe) {
      const int tp = p.parallel.TpOfStage(a.stage);
      const ExpertRange er = ep ? ExpertsOfRank(model_->num_experts, tp, a.tp_rank)
                                : ExpertRange{0, model_->num_experts};
      rank["experts"] = {er.begin, er.end};
      rank["expert_split"] = ep ? "whole" : "1/" + std::to_string(tp);
    }
    ranks.push_back(std::move(rank));
  }
  json out = {{"plan_version", p.plan_version},
              {"replica", index},
              {"mode", ParallelModeName(config_.parallel.mode)},
              {"ready", p.ready},
              {"ranks", ranks}};
  if (!state_.placement_status.ok()) out["error"] = state_.placement_status.ToString();
  if (!p.degraded.empty()) out["degraded"] = p.degraded;
  if (p.assignments.empty()) {
    if (state_.placement_status.ok()) out["waiting_for_workers"] = expected_workers_;
    return out;
  }
  out["quantization"] = quantization_;
  out["tp"] = p.parallel.tp;  // 0 when stages differ in tp
  out["tp_per_stage"] = p.parallel.TpPerStage();
  out["pp"] = p.parallel.pp;
  out["layers_per_stage"] = p.parallel.layers_per_stage;
  if (moe) out["expert_parallel"] = ep;
  out["kv_blocks"] = p.kv_blocks;
  out["kv_block_size"] = config_.kv_cache.block_size;
  out["kv_cache_dtype"] = KvCacheDTypeName(config_.kv_cache.dtype);  // "auto" or "fp8"
  out["wanted"] = LayoutJson(p.wanted);
  json history = json::array();
  for (const PlanChangeReport& r : p.history) history.push_back(PlanChangeReportJson(r));
  out["history"] = std::move(history);
  if (!p.plan_result) return out;  // an explicit tp per stage: no planner run
  const PlanResult& r = *p.plan_result;
  const PlannedReplica& rep = r.plan.replicas[std::min<size_t>(
      static_cast<size_t>(std::max(0, p.plan_result_replica)), r.plan.replicas.size() - 1)];
  json stages = json::array();
  for (int s = 0; s < rep.pp(); ++s) {
    std::vector<std::string> ws;
    for (const Assignment& a : p.assignments)
      if (a.stage == s) ws.push_back(a.worker_id);
    stages.push_back(StageJson(rep.stages[s], ws));
  }
  json top = json::array();
  for (const CandidateSummary& c : r.explanation.top)
    top.push_back({{"layout", c.layout},
                   {"pp", c.pp},
                   {"replicas", c.replicas},
                   {"devices_used", c.gpus_used},
                   {"decode_latency_s", c.decode_latency_s},
                   {"throughput_tokens_per_s", c.throughput_tokens_per_s},
                   {"peak_device_bytes", c.peak_gpu_bytes},
                   {"usable_device_bytes", c.usable_gpu_bytes},
                   {"note", c.note}});
  json rejected = json::array();
  for (const Rejection& x : r.explanation.rejected)
    rejected.push_back({{"layout", x.what}, {"why", x.why}});
  out["planner"] = {{"objective", ObjectiveName(r.plan.objective)},
                    {"quantization", r.plan.quantization},
                    {"layout", r.plan.layout},
                    {"devices_used", r.plan.gpus_used},
                    {"replicas", r.plan.replicas.size()},
                    {"fleet_throughput_tokens_per_s", r.plan.throughput_tokens_per_s},
                    {"devices_total", r.plan.gpus_total},
                    {"decode_latency_s", rep.decode_latency_s},
                    {"throughput_tokens_per_s", rep.throughput_tokens_per_s},
                    {"kv_tokens", rep.kv_tokens},
                    {"hop_links", rep.hop_links},
                    {"hop_seconds", rep.hop_seconds},
                    {"stages", stages},
                    {"candidates_evaluated", r.explanation.candidates_evaluated},
                    {"candidates_fitting", r.explanation.candidates_fitting},
                    {"top", top},
                    {"rejected", rejected},
                    {"notes", r.explanation.notes},
                    {"text", r.ToText()}};
  return out;
}

}  // namespace tessera
