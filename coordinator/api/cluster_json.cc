#include "coordinator/api/cluster_json.h"

#include <string>

#include "common/format/kv_cache_dtype.h"
#include "coordinator/api/plan_json.h"

namespace tessera {

using nlohmann::json;

json NotReadyJson(const NotReadyStatus& s) {
  return {{"status", s.degraded ? "degraded" : "not_ready"}, {"reason", s.reason}};
}

namespace {

const char* HealthName(WorkerHealth h) {
  switch (h) {
    case WorkerHealth::kAlive:
      return "alive";
    case WorkerHealth::kFailed:
      return "failed";
    case WorkerHealth::kDrained:
      return "drained";
    case WorkerHealth::kExcluded:
      return "excluded";
  }
  return "unknown";
}

const char* ReportedName(WorkerReportedState s) {
  switch (s) {
    case WorkerReportedState::kLost:
      return "lost";
    case WorkerReportedState::kRegistered:
      return "registered";
    case WorkerReportedState::kIdle:
      return "idle";
    case WorkerReportedState::kLoading:
      return "loading";
    case WorkerReportedState::kReady:
      return "ready";
    case WorkerReportedState::kDraining:
      return "draining";
    case WorkerReportedState::kFailed:
      return "failed";
    case WorkerReportedState::kUnknown:
      return "unknown";
  }
  return "unknown";
}

// "" is JSON's null: the documents' convention for "no such string".
json OrNull(const std::string& s) { return s.empty() ? json(nullptr) : json(s); }

json WorkerJson(const WorkerStatus& w) {
  json devices = json::array();
  for (const WorkerDeviceStatus& d : w.devices)
    devices.push_back({{"index", d.index},
                       {"name", d.name},
                       {"kind", d.cpu ? "cpu" : "cuda"},
                       {"memory_bytes", d.memory_bytes}});
  json role = nullptr;
  if (w.rank)
    role = {{"world_rank", w.rank->world_rank},
            {"stage", w.rank->stage},
            {"tp_rank", w.rank->tp_rank},
            {"replica", w.rank->replica}};
  json exclusion = nullptr;
  if (w.exclusion)
    exclusion = {{"excluded", w.exclusion->excluded},
                 {"reason", w.exclusion->reason},
                 {"kind", w.exclusion->kind},
                 {"count", w.exclusion->count},
                 {"seconds_left", w.exclusion->seconds_left}};
  return {{"id", w.id},
          {"host", w.host},
          {"pid", w.pid},
          {"data_address", w.data_address},
          {"devices", devices},
          {"curve_public_key", w.curve_public_key},
          {"state", HealthName(w.health)},
          {"exclusion", exclusion},
          {"worker_state", ReportedName(w.reported)},
          {"rank", role},
          {"in_plan", w.in_plan},
          {"replica", w.replica ? json(*w.replica) : json(nullptr)},
          {"seconds_since_last_message", w.seconds_since_last_message}};
}

json ReplicaJson(const ReplicaStatus& r) {
  json j = {{"replica", r.replica},
            {"ready", r.ready},
            {"degraded", OrNull(r.degraded)},
            {"plan_version", r.plan_version},
            {"layout", LayoutJson(r.layout)},
            {"workers", r.workers},
            {"reconfigurations_total", r.reconfigurations_total},
            {"faults_total", r.faults_total},
            {"requeued_requests_total", r.requeued_requests_total}};
  if (r.live) {
    const ReplicaLoadInfo& l = r.live->load;
    j["reconfiguring"] = r.live->reconfiguring;
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
  return j;
}

}  // namespace

json ClusterJson(const ClusterDocument& doc) {
  json workers = json::array();
  for (const WorkerStatus& w : doc.workers) workers.push_back(WorkerJson(w));
  json replicas = json::array();
  for (const ReplicaStatus& r : doc.replicas) replicas.push_back(ReplicaJson(r));
  json queue = nullptr;
  if (doc.queue) queue = {{"waiting", doc.queue->waiting}, {"running", doc.queue->running}};
  return {{"workers", workers},
          {"ready", doc.ready},
          {"degraded", OrNull(doc.degraded)},
          {"plan_version", doc.plan_version},
          {"queue", queue},
          {"reconfiguring", doc.reconfiguring},
          {"reconfigurations_total", doc.reconfigurations_total},
          {"faults_total", doc.faults_total},
          {"requeued_requests_total", doc.requeued_requests_total},
          {"replicas", replicas},
          {"workers_total", doc.workers_total},
          {"replicas_total", doc.replicas_total},
          {"replicas_ready", doc.replicas_ready},
          {"page", doc.page.page},
          {"page_size", doc.page.page_size},
          {"pages", doc.pages}};
}

namespace {

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

json RankJson(const PlanRankStatus& r) {
  const Assignment& a = r.assignment;
  json rank = {{"worker", a.worker_id},
               {"host", a.host},
               {"device", a.device_index},
               {"world_rank", a.world_rank},
               {"stage", a.stage},
               {"tp_rank", a.tp_rank},
               {"layers", {r.first_layer, r.end_layer}},
               {"predicted_weight_bytes", a.predicted_weight_bytes},
               {"shard_weight_bytes", a.shard_weight_bytes},
               {"weight_bytes", a.loaded_weight_bytes},
               {"reused_weight_bytes", a.reused_weight_bytes},
               {"predicted_kv_bytes", a.predicted_kv_bytes},
               {"kv_bytes", a.kv_bytes},
               {"load_seconds", a.load_seconds},
               {"load_bytes_done", a.load_bytes_done},
               {"load_bytes_total", a.load_bytes_total}};
  if (r.experts) {
    rank["experts"] = {r.experts->begin, r.experts->end};
    rank["expert_split"] =
        r.expert_split_tp == 0 ? "whole" : "1/" + std::to_string(r.expert_split_tp);
  }
  return rank;
}

json PlannerJson(const ReplicaPlanStatus& p) {
  const PlanResult& r = *p.planner;
  const PlannedReplica& rep = r.plan.replicas[p.planner_replica];
  json stages = json::array();
  for (int s = 0; s < rep.pp(); ++s)
    stages.push_back(StageJson(rep.stages[s], p.stage_workers[static_cast<size_t>(s)]));
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
  return {{"objective", ObjectiveName(r.plan.objective)},
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
}

json ReplicaPlanJson(const ReplicaPlanStatus& p, ParallelMode mode) {
  json ranks = json::array();
  for (const PlanRankStatus& r : p.ranks) ranks.push_back(RankJson(r));
  json out = {{"plan_version", p.plan_version},
              {"replica", p.replica},
              {"mode", ParallelModeName(mode)},
              {"ready", p.ready},
              {"ranks", ranks}};
  if (!p.error.empty()) out["error"] = p.error;
  if (!p.degraded.empty()) out["degraded"] = p.degraded;
  if (p.ranks.empty()) {
    if (p.waiting_for_workers) out["waiting_for_workers"] = *p.waiting_for_workers;
    return out;
  }
  out["quantization"] = p.quantization;
  out["tp"] = p.parallel.tp;  // 0 when stages differ in tp
  out["tp_per_stage"] = p.parallel.TpPerStage();
  out["pp"] = p.parallel.pp;
  out["layers_per_stage"] = p.parallel.layers_per_stage;
  if (p.moe) out["expert_parallel"] = p.expert_parallel;
  out["kv_blocks"] = p.kv_blocks;
  out["kv_block_size"] = p.kv_block_size;
  out["kv_cache_dtype"] = KvCacheDTypeName(p.kv_cache_dtype);  // "auto" or "fp8"
  out["wanted"] = LayoutJson(p.wanted);
  json history = json::array();
  for (const PlanChangeReport& r : p.history) history.push_back(PlanChangeReportJson(r));
  out["history"] = std::move(history);
  if (p.planner) out["planner"] = PlannerJson(p);
  return out;
}

}  // namespace

json PlanJson(const PlanDocument& doc) {
  if (doc.replicas.empty()) {
    json out = {{"plan_version", 0},
                {"mode", ParallelModeName(doc.mode)},
                {"ready", false},
                {"ranks", json::array()}};
    if (!doc.error.empty()) {
      out["error"] = doc.error;
    } else {
      out["waiting_for_workers"] = doc.waiting_for_workers;
    }
    out["replicas"] = json::array();
    return out;
  }
  json out = ReplicaPlanJson(doc.replicas[0], doc.mode);
  json all = json::array();
  for (const ReplicaPlanStatus& r : doc.replicas) all.push_back(ReplicaPlanJson(r, doc.mode));
  out["replicas"] = std::move(all);
  return out;
}

}  // namespace tessera
