// PlanRunner, applying a plan: Drain the old plan's workers, open the plan
// in the rendezvous store, AssignShard to every rank under the new version,
// wait for every Loaded, swap the executor.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>

#include "common/base/logging.h"
#include "common/metrics/metric_catalog.h"
#include "common/model/shard_spec.h"
#include "common/net/endpoint.h"
#include "common/net/store_auth.h"
#include "coordinator/placement/cost_model.h"
#include "coordinator/serving/load_culprits.h"
#include "coordinator/serving/plan_runner.h"

namespace tessera {

namespace {

double SecondsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

int64_t UnixSeconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string FormatSeconds(double s) { return fmt::format("{:g} s", s); }

// The first rank whose Loaded reports more bytes (weights plus KV cache)
// than its registered device has, as "<worker id>\n<why>"; "" when none.
std::string LoadedMismatch(const std::vector<Assignment>& assignments,
                           const std::vector<ControlWorkerInfo>& infos) {
  for (const Assignment& a : assignments)
    for (const ControlWorkerInfo& w : infos) {
      if (w.worker_id != a.worker_id) continue;
      for (int i = 0; i < w.registration->devices_size(); ++i) {
        const control::Device& d = w.registration->devices(i);
        const uint64_t held = static_cast<uint64_t>(std::max<int64_t>(0, a.loaded_weight_bytes)) +
                              static_cast<uint64_t>(std::max<int64_t>(0, a.kv_bytes));
        if (d.index() != a.device_index || held <= d.total_memory_bytes()) continue;
        return a.worker_id + "\nworker " + a.worker_id + " (rank " + std::to_string(a.world_rank) +
               "): Loaded reports " + std::to_string(held) +
               " bytes of weights and KV cache, more than the " +
               std::to_string(d.total_memory_bytes()) + " bytes its registration's devices[" +
               std::to_string(i) + "].total_memory_bytes (device " + std::to_string(d.index()) +
               ") has";
      }
    }
  return "";
}

}  // namespace

std::string PlanRunner::StoreHostFor(const std::string& worker_address) const {
  if (store_->host() != "0.0.0.0") return store_->host();
  // The store listens on every interface: name the one that routes to the
  // worker (its Gloo address is on the network it shares with us).
  if (!worker_address.empty()) {
    auto local = LocalAddressToward(FormatTcpEndpoint(worker_address, 1));
    if (local.ok()) return *local;
  }
  return "127.0.0.1";
}

Status PlanRunner::ExcludeLoadCulprits(uint64_t version, const std::string& reporter,
                                       const std::string* error) {
  const double load_timeout = config_.heartbeat.load_timeout_seconds;
  const std::vector<int> joined = store_->JoinedRanks(version);
  std::vector<RankLoadStage> stages;
  for (const Assignment& a : rep().assignments) {
    RankLoadStage r;
    r.worker_id = a.worker_id;
    r.world_rank = a.world_rank;
    r.stage = a.loaded_weight_bytes >= 0                                       ? 3
              : a.load_bytes_total > 0                                         ? 2
              : std::binary_search(joined.begin(), joined.end(), a.world_rank) ? 1
                                                                               : 0;
    stages.push_back(r);
  }
  const std::vector<std::string> culprits = LoadCulprits(stages, reporter);
  std::string message = "plan " + std::to_string(version) + ": ";
  for (size_t i = 0; i < culprits.size(); ++i) {
    const std::string& id = culprits[i];
    std::string why, kind = "load_timeout";
    if (error && id == reporter) {
      why = *error;
      kind = rep().load_error_kind.empty() ? "load_error" : rep().load_error_kind;
    } else {
      for (const RankLoadStage& r : stages)
        if (r.worker_id == id) {
          why = "worker " + id + " (rank " + std::to_string(r.world_rank) + ") " +
                LoadStageShortfall(r.stage);
          break;
        }
      why += error ? " (its peer's load failed: " + *error + ")"
                   : " within heartbeat.load_timeout_seconds = " + FormatSeconds(load_timeout);
    }
    const WorkerExclusion& e = state_.Exclude(id, kind, why, load_timeout);
    const double backoff =
        std::chrono::duration<double>(e.until - std::chrono::steady_clock::now()).count();
    metrics_->Counter(metric::kWorkerExclusionsTotal).WithLabels({kind}).Inc();
    TESSERA_LOG_ERROR("coordinator",
                      "replica {}: {}; worker {} left out of placement for {:.0f} s (exclusion {})",
                      replica_, why, id, backoff, e.count);
    message += (i ? "; " : "") + why;
  }
  message += culprits.size() == 1 ? "; it is left out of the next placement"
                                  : "; they are left out of the next placement";
  if (error) return Unavailable(message);
  return DeadlineExceeded(message);
}

Status PlanRunner::ApplyPlan(const ParallelConfig& planned_layout,
                             const std::vector<RankPlacement>& ranks, const std::string& reason,
                             PlanChangeReport& report, std::shared_ptr<const PlanResult> planned,
                             const std::vector<Assignment>* predicted) {
  const auto t0 = std::chrono::steady_clock::now();
  // The layout with parallel.expert_parallel (MoE models): the shard bytes,
  // /admin/plan and every AssignShard follow it.
  ParallelConfig parallel = planned_layout;
  bool expert_parallel = config_.parallel.expert_parallel;
  if (config_.parallel.mode == ParallelMode::kAuto) {
    // The planner's choice, or the last plan's when this one had no planner run.
    MutexLock lock(&state_.mu);
    if (planned) {
      expert_parallel = planned->expert_parallel;
    } else if (rep().plan_result) {
      expert_parallel = rep().plan_result->expert_parallel;
    }
  }
  parallel.expert_parallel = expert_parallel && model_.is_moe();
  std::vector<Assignment> plan;
  std::vector<std::string> ids;
  for (const RankPlacement& r : ranks) ids.push_back(r.worker_id);
  const std::vector<ControlWorkerInfo> infos = control_->WorkersOf(ids);
  int64_t kv_blocks = 0;
  {
    MutexLock lock(&state_.mu);
    kv_blocks = rep().kv_blocks;
  }
  for (const RankPlacement& r : ranks) {
    Assignment a;
    a.worker_id = r.worker_id;
    for (const ControlWorkerInfo& w : infos) {
      if (w.worker_id != a.worker_id || !w.alive) continue;
      a.host = w.registration->host();
      a.data_address = w.registration->data_address();
      a.device_index = w.registration->devices_size() ? w.registration->devices(0).index() : 0;
    }
    a.world_rank = r.world_rank;
    a.stage = r.stage;
    a.tp_rank = r.tp_rank;
    TESSERA_ASSIGN_OR_RETURN(a.shard_weight_bytes,
                             placer_.ShardWeightBytes(parallel, r.world_rank));
    a.predicted_weight_bytes = a.shard_weight_bytes;
    // The KV pool keeps its kv_blocks across re-plans; this rank's part of it.
    a.predicted_kv_bytes = placer_.PredictedKvBytes(parallel, a.stage, kv_blocks);
    // The planner's predictions for this rank, when it placed the plan.
    if (predicted)
      for (const Assignment& p : *predicted)
        if (p.world_rank == a.world_rank && p.worker_id == a.worker_id) {
          a.predicted_weight_bytes = p.predicted_weight_bytes;
          if (p.predicted_kv_bytes > 0) a.predicted_kv_bytes = p.predicted_kv_bytes;
        }
    plan.push_back(a);
  }
  std::vector<std::string> old_workers;
  uint64_t version = 0;
  {
    MutexLock lock(&state_.mu);
    // A worker is one replica's: a spare another replica took since this
    // placement was computed fails the attempt (the next one places without it).
    for (const Assignment& a : plan) {
      const int owner = state_.ReplicaOf(a.worker_id);
      if (owner >= 0 && owner != replica_)
        return Unavailable("worker " + a.worker_id + " was taken by replica " +
                           std::to_string(owner));
    }
    for (const Assignment& a : rep().assignments) old_workers.push_back(a.worker_id);
    version = state_.NextPlanVersion();
    rep().plan_version = version;
    metrics_->Gauge(metric::kPlanVersion).WithLabels({}).Set(static_cast<double>(version));
    rep().parallel = parallel;
    state_.SetAssignments(replica_, plan);
    rep().plan_result = std::move(planned);  // the planner's explanation, when it placed this plan
    rep().plan_result_replica = 0;
    for (const Assignment& a : plan) state_.states[a.worker_id] = control::WORKER_STATE_LOADING;
    rep().load_error.clear();
    rep().load_error_worker.clear();
    rep().load_error_kind.clear();
  }
  TESSERA_LOG_INFO("coordinator", "replica {}: plan {}: applying {} ({}) on {} workers", replica_,
                   version, parallel.ToString(), reason, plan.size());
  // End the old plan on its workers: stage-0 ranks pass the end down their
  // pipelines, everyone drops the plan's communicators and keeps its weights.
  for (const std::string& w : old_workers) {
    control::Envelope e;
    e.mutable_drain()->set_reason("plan " + std::to_string(version) + ": " + reason);
    control_->Send(w, std::move(e)).IgnoreError();  // a lost worker cannot be drained
  }
  // The store admits this plan's ranks (and erases the last plan's keys)
  // before any of them hears of it.
  const std::string key_prefix = "plan" + std::to_string(version) + "/";
  store_->OpenPlan(version, static_cast<int>(plan.size()), key_prefix, replica_);
  for (const Assignment& a : plan) {
    control::Envelope e;
    control::AssignShard* s = e.mutable_assign_shard();
    s->set_plan_version(version);
    s->set_tp(static_cast<uint32_t>(parallel.tp));  // 0 when stages differ in tp
    for (int t : parallel.tp_per_stage) s->add_tp_per_stage(static_cast<uint32_t>(t));
    s->set_pp(static_cast<uint32_t>(parallel.pp));
    for (int n : parallel.layers_per_stage) s->add_layers_per_stage(static_cast<uint32_t>(n));
    s->set_expert_parallel(parallel.expert_parallel);
    s->set_stage(static_cast<uint32_t>(a.stage));
    s->set_tp_rank(static_cast<uint32_t>(a.tp_rank));
    s->set_world_rank(static_cast<uint32_t>(a.world_rank));
    s->set_first_layer(static_cast<uint32_t>(parallel.FirstLayer(a.stage)));
    s->set_end_layer(static_cast<uint32_t>(parallel.EndLayer(a.stage)));
    s->set_model_path(config_.model.path);
    if (config_.model.quantization == QuantMethod::kOnlineFp8) s->set_quantization("fp8");
    s->set_kv_cache_dtype(KvCacheDTypeWire(config_.kv_cache.dtype));
    // model.dtype, or the checkpoint's; CPU workers compute in F32 regardless.
    s->set_dtype(DTypeName(config_.model.dtype.value_or(model_.torch_dtype)));
    s->set_kv_block_size(static_cast<uint32_t>(config_.kv_cache.block_size));
    s->set_kv_num_blocks(static_cast<uint64_t>(kv_blocks));
    s->set_device_index(a.device_index);
    s->set_replica(static_cast<uint32_t>(replica_));  // the worker's metrics label
    // Every stage-0 rank learns the replica schedules itself: tp rank 0
    // leads, the others run what it broadcasts.
    if (leader_ && a.stage == 0) *s->mutable_leader() = *leader_;
    // With pp > 1 the last stage returns its tokens to the leader, not here.
    if (leader_ && parallel.pp > 1 && a.stage == parallel.pp - 1) s->set_tokens_to_leader(true);
    control::GlooRendezvous* g = s->mutable_gloo();
    g->set_store_host(StoreHostFor(a.data_address));
    g->set_store_port(static_cast<uint32_t>(store_->port()));
    g->set_key_prefix(key_prefix);
    g->set_store_key(StoreCredentials::Rank(store_secret_, version, a.world_rank).key);
    TESSERA_RETURN_IF_ERROR(control_->Send(a.worker_id, std::move(e))
                                .WithContext("assigning rank " + std::to_string(a.world_rank) +
                                             " of plan " + std::to_string(version)));
  }
  // Wait for every Loaded of this version.
  const double load_timeout = config_.heartbeat.load_timeout_seconds;
  const auto deadline = t0 + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                 std::chrono::duration<double>(load_timeout));
  int64_t reused = 0, weights = 0;
  {
    MutexLock lock(&state_.mu);
    while (true) {
      if (state_.stopping) return Unavailable("stopping");
      for (const Assignment& a : rep().assignments)
        if (std::find(state_.failed_workers.begin(), state_.failed_workers.end(), a.worker_id) !=
            state_.failed_workers.end())
          return Unavailable("worker " + a.worker_id + " was lost while loading plan " +
                             std::to_string(version));
      if (!rep().load_error.empty()) {
        const std::string error = rep().load_error;
        const std::string reporter = rep().load_error_worker;
        return ExcludeLoadCulprits(version, reporter, &error);
      }
      if (std::all_of(rep().assignments.begin(), rep().assignments.end(),
                      [](const Assignment& a) { return a.loaded_weight_bytes >= 0; })) {
        // A Loaded that holds more than the device it registered has.
        std::string mismatch = LoadedMismatch(rep().assignments, infos);
        if (mismatch.empty()) break;
        rep().load_error_kind = "loaded_mismatch";
        const std::string reporter = mismatch.substr(0, mismatch.find('\n'));
        mismatch.erase(0, reporter.size() + 1);
        return ExcludeLoadCulprits(version, reporter, &mismatch);
      }
      if (std::chrono::steady_clock::now() >= deadline)
        return ExcludeLoadCulprits(version, "", nullptr);
      // Each condition above changes under `mu` and notifies this replica's
      // condition variable (a Loaded or an Error of its plan: WorkerEvents;
      // a lost worker: MarkFailed; Stop), so sleep until one does or the
      // load deadline passes.
      state_.ReplicaCv(replica_).wait_until(state_.mu, deadline);
    }
    for (const Assignment& a : rep().assignments) {
      reused += a.reused_weight_bytes;
      weights += a.loaded_weight_bytes;
    }
  }
  std::vector<std::string> first, all;
  std::string sampler;  // tp rank 0 of the last stage returns the tokens
  for (const Assignment& a : plan) {
    all.push_back(a.worker_id);
    if (a.stage == 0 && a.tp_rank == 0)
      first.insert(first.begin(), a.worker_id);  // the leader
    else if (a.stage == 0)
      first.push_back(a.worker_id);
    if (a.stage == parallel.pp - 1 && a.tp_rank == 0) sampler = a.worker_id;
  }
  auto executor =
      std::make_shared<RemoteExecutor>(control_, version, first, all, sampler, parallel.pp,
                                       model_.vocab_size, config_.heartbeat.step_timeout_seconds);
  {
    MutexLock lock(&state_.exec_mu);
    state_.executors[static_cast<size_t>(replica_)] = executor;
  }
  // The loop is paused (or not started yet): its thread swaps the executor.
  if (loop_->started())
    loop_->SwapExecutor(
        executor, [executor] { return executor->health(); }, version);
  const double seconds = SecondsSince(t0);
  report = PlanChangeReport{};
  report.plan_version = version;
  report.reason = reason;
  report.replica = replica_;
  report.layout = parallel;
  report.workers = all;
  report.load_seconds = seconds;
  report.weight_bytes = weights;
  report.reused_weight_bytes = reused;
  report.unix_time = UnixSeconds();
  {
    MutexLock lock(&state_.mu);
    rep().history.push_back(report);
    if (rep().history.size() > 32) rep().history.erase(rep().history.begin());
  }
  TESSERA_LOG_INFO("coordinator",
                   "replica {}: plan {} loaded on {} workers in {:.2f} s ({:.1f} of {:.1f} MB "
                   "reused); serving",
                   replica_, version, plan.size(), seconds, static_cast<double>(reused) / 1e6,
                   static_cast<double>(weights) / 1e6);
  return Status::Ok();
}

}  // namespace tessera
