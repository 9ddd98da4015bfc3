#include "coordinator/serving/cluster_view.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "coordinator/placement/plan_change.h"

namespace tessera {

using nlohmann::json;

std::string ClusterView::NotReadyJson() const {
  MutexLock lock(&state_.mu);
  std::string reason = !state_.placement_status.ok() ? state_.placement_status.ToString()
                       : !state_.degraded.empty()    ? "degraded: " + state_.degraded
                       : state_.serving              ? "re-planning after a worker failure"
                                                     : "waiting for workers";
  json j = {{"status", state_.degraded.empty() ? "not_ready" : "degraded"}, {"reason", reason}};
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

std::string ClusterView::ClusterJson() const {
  json workers = json::array();
  const bool reconfiguring = runner_->reconfiguring();
  MutexLock lock(&state_.mu);
  for (const ControlWorkerInfo& w : control_->Workers()) {
    const bool failed = state_.IsFailed(w.worker_id);
    const bool drained = state_.IsDrained(w.worker_id);
    bool in_plan = false;
    for (const Assignment& a : state_.assignments) in_plan |= a.worker_id == w.worker_id;
    json devices = json::array();
    for (const auto& d : w.registration.devices())
      devices.push_back({{"index", d.index()},
                         {"name", d.name()},
                         {"kind", d.kind() == control::DEVICE_KIND_CPU ? "cpu" : "cuda"},
                         {"memory_bytes", d.total_memory_bytes()}});
    json role = nullptr;
    for (const Assignment& a : state_.assignments)
      if (a.worker_id == w.worker_id)
        role = {{"world_rank", a.world_rank}, {"stage", a.stage}, {"tp_rank", a.tp_rank}};
    auto st = state_.states.find(w.worker_id);
    workers.push_back(
        {{"id", w.worker_id},
         {"host", w.registration.host()},
         {"pid", w.registration.pid()},
         {"data_address", w.registration.data_address()},
         {"devices", devices},
         {"curve_public_key", w.curve_public_key},
         {"state", failed || !w.alive ? "failed"
                   : drained          ? "drained"
                                      : "alive"},
         {"worker_state", st == state_.states.end() ? "registered" : StateName(st->second)},
         {"rank", role},
         {"in_plan", in_plan && w.alive},
         {"seconds_since_last_message", w.seconds_since_last_message}});
  }
  json queue = nullptr;
  if (state_.ready.load() && loop_->started())
    queue = {{"waiting", loop_->waiting()}, {"running", loop_->running()}};
  return json{{"workers", workers},
              {"ready", state_.ready.load()},
              {"degraded", state_.degraded.empty() ? json(nullptr) : json(state_.degraded)},
              {"plan_version", state_.plan_version},
              {"queue", queue},
              {"reconfiguring", reconfiguring},
              {"reconfigurations_total", state_.reconfigurations},
              {"faults_total", state_.faults},
              {"requeued_requests_total", state_.requeued_total}}
      .dump();
}

std::string ClusterView::PlanJson() const {
  json ranks = json::array();
  MutexLock lock(&state_.mu);
  for (const Assignment& a : state_.assignments) {
    ranks.push_back(
        {{"worker", a.worker_id},
         {"host", a.host},
         {"device", a.device_index},
         {"world_rank", a.world_rank},
         {"stage", a.stage},
         {"tp_rank", a.tp_rank},
         {"layers", {state_.parallel.FirstLayer(a.stage), state_.parallel.EndLayer(a.stage)}},
         {"predicted_weight_bytes", a.predicted_weight_bytes},
         {"shard_weight_bytes", a.shard_weight_bytes},
         {"weight_bytes", a.loaded_weight_bytes},
         {"reused_weight_bytes", a.reused_weight_bytes},
         {"predicted_kv_bytes", a.predicted_kv_bytes},
         {"kv_bytes", a.kv_bytes},
         {"load_seconds", a.load_seconds},
         {"load_bytes_done", a.load_bytes_done},
         {"load_bytes_total", a.load_bytes_total}});
  }
  json out = {{"plan_version", state_.plan_version},
              {"mode", ParallelModeName(config_.parallel.mode)},
              {"ready", state_.ready.load()},
              {"ranks", ranks}};
  if (!state_.placement_status.ok()) out["error"] = state_.placement_status.ToString();
  if (state_.assignments.empty()) {
    if (state_.placement_status.ok()) out["waiting_for_workers"] = expected_workers_;
    return out.dump();
  }
  out["tp"] = state_.parallel.tp;  // 0 when stages differ in tp
  out["tp_per_stage"] = state_.parallel.TpPerStage();
  out["pp"] = state_.parallel.pp;
  out["layers_per_stage"] = state_.parallel.layers_per_stage;
  out["kv_blocks"] = state_.kv_blocks;
  out["kv_block_size"] = config_.kv_cache.block_size;
  out["wanted"] = LayoutJson(state_.wanted);
  out["history"] = state_.history;
  if (!state_.plan_result) return out.dump();  // an explicit tp per stage: no planner run
  const PlanResult& r = *state_.plan_result;
  const PlannedReplica& rep = r.plan.replicas[0];
  json stages = json::array();
  for (int s = 0; s < rep.pp(); ++s) {
    std::vector<std::string> ws;
    for (const Assignment& a : state_.assignments)
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
                    {"layout", r.plan.layout},
                    {"devices_used", r.plan.gpus_used},
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
  return out.dump();
}

}  // namespace tessera
