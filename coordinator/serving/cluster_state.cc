#include "coordinator/serving/cluster_state.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <unordered_set>

namespace tessera {

namespace {

bool Has(const std::vector<std::string>& ids, const std::string& id) {
  return std::find(ids.begin(), ids.end(), id) != ids.end();
}

}  // namespace

bool ReplicaPlan::InPlan(const std::string& worker_id) const {
  return std::any_of(assignments.begin(), assignments.end(),
                     [&](const Assignment& a) { return a.worker_id == worker_id; });
}

void ClusterState::SizeReplicas(size_t n) {
  TESSERA_CHECK(replicas.empty());  // once
  replicas.resize(n);
  replica_ready = std::make_unique<std::atomic<bool>[]>(n);
  for (size_t r = 0; r < n; ++r) replica_ready[r].store(false, std::memory_order_relaxed);
  replica_cvs.resize(n);
  for (auto& c : replica_cvs)
    if (!c) c = std::make_unique<std::condition_variable_any>();
}

void ClusterState::NotifyReplica(int replica) {
  if (replica >= 0 && replica < static_cast<int>(replica_cvs.size()))
    replica_cvs[static_cast<size_t>(replica)]->notify_all();
}

void ClusterState::SetReplicaReady(int replica, bool ready) {
  replicas[static_cast<size_t>(replica)].ready = ready;
  replica_ready[static_cast<size_t>(replica)].store(ready, std::memory_order_release);
  UpdateReady();
}

void ClusterState::NotifyAll() {
  cv.notify_all();
  for (auto& c : replica_cvs) c->notify_all();
}

std::shared_ptr<RemoteExecutor> ClusterState::Executor(int replica) const {
  MutexLock lock(&exec_mu);
  if (replica < 0 || replica >= static_cast<int>(executors.size())) return nullptr;
  return executors[static_cast<size_t>(replica)];
}

std::shared_ptr<RemoteExecutor> ClusterState::ExecutorOfPlan(uint64_t plan_version) const {
  MutexLock lock(&exec_mu);
  for (const auto& e : executors)
    if (e && e->plan_version() == plan_version) return e;
  return nullptr;
}

int ClusterState::ReplicaOf(const std::string& worker_id) const {
  auto it = replica_of_worker.find(worker_id);
  return it == replica_of_worker.end() ? -1 : it->second;
}

void ClusterState::SetAssignments(int replica, std::vector<Assignment> plan) {
  ReplicaPlan& rp = replicas[static_cast<size_t>(replica)];
  for (const Assignment& a : rp.assignments) {
    auto it = replica_of_worker.find(a.worker_id);
    if (it != replica_of_worker.end() && it->second == replica) replica_of_worker.erase(it);
  }
  rp.assignments = std::move(plan);
  for (const Assignment& a : rp.assignments) replica_of_worker[a.worker_id] = replica;
}

int ClusterState::ReplicaOfPlan(uint64_t plan_version) const {
  for (size_t r = 0; r < replicas.size(); ++r)
    if (replicas[r].plan_version == plan_version) return static_cast<int>(r);
  return -1;
}

void ClusterState::UpdateReady() {
  bool any = false, all = !replicas.empty();
  for (const ReplicaPlan& r : replicas) {
    any |= r.ready;
    all &= r.ready;
  }
  ready.store(any);
  all_ready.store(all);
}

bool ClusterState::IsFailed(const std::string& worker_id) const {
  return Has(failed_workers, worker_id);
}

bool ClusterState::IsDrained(const std::string& worker_id) const {
  return Has(drained_workers, worker_id);
}

bool ClusterState::IsExcluded(const std::string& worker_id) const {
  auto it = excluded_workers.find(worker_id);
  return it != excluded_workers.end() && std::chrono::steady_clock::now() < it->second.until;
}

const WorkerExclusion& ClusterState::Exclude(const std::string& worker_id, const std::string& kind,
                                             const std::string& reason, double base_seconds) {
  WorkerExclusion& e = excluded_workers[worker_id];
  ++e.count;
  e.kind = kind;
  e.reason = reason;
  e.end_claimed = false;
  const double seconds =
      std::min(kMaxExclusionSeconds, base_seconds * std::ldexp(1.0, std::min(e.count - 1, 30)));
  e.until = std::chrono::steady_clock::now() +
            std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                std::chrono::duration<double>(seconds));
  // A spare's exclusion concerns every replica that needs workers.
  NotifyAll();
  return e;
}

namespace {

// Whether replica `replica` may re-plan for the end of `worker_id`'s
// exclusion `e` (see ClusterState::NextExclusionEnd).
bool EndMatters(const ClusterState& state, int replica, const std::string& worker_id,
                const WorkerExclusion& e, std::chrono::steady_clock::time_point since)
    REQUIRES(state.mu) {
  if (e.end_claimed || e.until <= since) return false;
  const int owner = state.ReplicaOf(worker_id);
  return (owner < 0 || owner == replica) && !state.IsFailed(worker_id) &&
         !state.IsDrained(worker_id);
}

}  // namespace

std::optional<std::chrono::steady_clock::time_point> ClusterState::NextExclusionEnd(
    int replica, std::chrono::steady_clock::time_point since) const {
  std::optional<std::chrono::steady_clock::time_point> earliest;
  for (const auto& [id, e] : excluded_workers)
    if (EndMatters(*this, replica, id, e, since) && (!earliest || e.until < *earliest))
      earliest = e.until;
  return earliest;
}

std::vector<std::pair<std::string, WorkerExclusion>> ClusterState::ClaimEndedExclusions(
    int replica, std::chrono::steady_clock::time_point since,
    std::chrono::steady_clock::time_point now) {
  std::vector<std::pair<std::string, WorkerExclusion>> ended;
  for (auto& [id, e] : excluded_workers) {
    if (e.until > now || !EndMatters(*this, replica, id, e, since)) continue;
    e.end_claimed = true;
    ended.emplace_back(id, e);
  }
  return ended;
}

int ClusterState::MarkFailed(const std::string& worker_id, const Status& why,
                             std::optional<std::chrono::steady_clock::time_point> since) {
  int replica = -1;
  {
    MutexLock lock(&mu);
    if (!IsFailed(worker_id)) failed_workers.push_back(worker_id);
    if (since)
      lost_since[worker_id] = *since;
    else
      lost_since.erase(worker_id);
    replica = ReplicaOf(worker_id);
    if (replica >= 0 && !replicas[static_cast<size_t>(replica)].serving) replica = -1;
    NotifyAll();  // its replica's load waits, and the exclusions it ends
  }
  MutexLock lock(&exec_mu);
  for (const auto& e : executors)
    if (e) e->OnWorkerFailed(worker_id, why);  // only its own replica's waits on it
  return replica;
}

std::optional<std::chrono::steady_clock::time_point> ClusterState::EarliestLoss(
    const std::vector<Assignment>& assignments) const {
  std::optional<std::chrono::steady_clock::time_point> earliest;
  for (const Assignment& a : assignments) {
    auto it = lost_since.find(a.worker_id);
    if (it == lost_since.end() || !IsFailed(a.worker_id)) continue;
    if (!earliest || it->second < *earliest) earliest = it->second;
  }
  return earliest;
}

std::vector<std::string> ClusterState::UsableWorkers(
    const std::vector<ControlWorkerInfo>& workers) const {
  std::vector<std::string> out;
  std::unordered_set<std::string> seen;  // a fleet has thousands: no linear search
  MutexLock lock(&mu);
  for (const ControlWorkerInfo& w : workers) {
    if (!w.alive) continue;
    if (IsFailed(w.worker_id) || IsDrained(w.worker_id) || IsExcluded(w.worker_id) ||
        !seen.insert(w.worker_id).second)
      continue;
    out.push_back(w.worker_id);
  }
  return out;
}

}  // namespace tessera
