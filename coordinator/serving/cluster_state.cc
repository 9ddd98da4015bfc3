#include "coordinator/serving/cluster_state.h"

#include <algorithm>

namespace tessera {

namespace {

bool Has(const std::vector<std::string>& ids, const std::string& id) {
  return std::find(ids.begin(), ids.end(), id) != ids.end();
}

}  // namespace

std::shared_ptr<RemoteExecutor> ClusterState::Executor() const {
  MutexLock lock(&exec_mu);
  return executor;
}

bool ClusterState::InPlan(const std::string& worker_id) const {
  return std::any_of(assignments.begin(), assignments.end(),
                     [&](const Assignment& a) { return a.worker_id == worker_id; });
}

bool ClusterState::IsFailed(const std::string& worker_id) const {
  return Has(failed_workers, worker_id);
}

bool ClusterState::IsDrained(const std::string& worker_id) const {
  return Has(drained_workers, worker_id);
}

bool ClusterState::MarkFailed(const std::string& worker_id, const Status& why) {
  bool in_plan = false;
  {
    MutexLock lock(&mu);
    if (!IsFailed(worker_id)) failed_workers.push_back(worker_id);
    in_plan = InPlan(worker_id) && serving;
    cv.notify_all();
  }
  MutexLock lock(&exec_mu);
  if (executor) executor->OnWorkerFailed(worker_id, why);
  return in_plan;
}

std::vector<std::string> ClusterState::UsableWorkers(
    const std::vector<ControlWorkerInfo>& workers) const {
  std::vector<std::string> out;
  MutexLock lock(&mu);
  for (const ControlWorkerInfo& w : workers) {
    if (!w.alive) continue;
    if (IsFailed(w.worker_id) || IsDrained(w.worker_id) || Has(out, w.worker_id)) continue;
    out.push_back(w.worker_id);
  }
  return out;
}

}  // namespace tessera
