#include "coordinator/control/control_plane_guard.h"

#include <chrono>

#include "common/base/logging.h"
#include "common/metrics/metric_catalog.h"
#include "common/net/curve_keys.h"

namespace tessera {

Status ConfigureControlSecurity(const DaemonConfig& config, ControlServerOptions* options) {
  options->max_workers = static_cast<size_t>(config.server.max_workers);
  options->forget_lost_after = std::chrono::milliseconds(
      static_cast<int64_t>(config.heartbeat.forget_failed_after_seconds * 1000));
  const ControlSection& ctl = config.control;
  if (ctl.coordinator_secret_key_file.empty()) {
    if (!ctl.allow_unauthenticated)
      return FailedPrecondition(
          "the control plane has no CURVE key: set control.coordinator_secret_key_file and "
          "control.worker_public_keys (make keys with `tessera keygen`; `tessera up` makes its "
          "own), or set control.allow_unauthenticated = true to let any local process register "
          "as a worker");
    TESSERA_LOG_WARN("coordinator",
                     "control.allow_unauthenticated = true: the control plane on {} runs without "
                     "CURVE; any process that can reach it can register as a worker and send it "
                     "results",
                     config.server.control_endpoint);
    return Status::Ok();
  }
  auto keys = LoadCurveSecretKeyFile(ctl.coordinator_secret_key_file);
  if (!keys.ok()) return keys.status().WithContext("control.coordinator_secret_key_file");
  options->curve_secret_key = keys->secret_key;
  options->curve_allowed_public_keys = ctl.worker_public_keys;
  return Status::Ok();
}

void ControlDrops::Drop(const std::string& worker_id, const char* reason,
                        const std::string& detail) {
  metrics_->Counter(metric::kControlMessagesDroppedTotal).WithLabels({reason}).Inc();
  bool first = false;
  {
    MutexLock lock(&mu_);
    first = logged_.insert(worker_id).second;
  }
  if (first)
    TESSERA_LOG_WARN("coordinator",
                     "dropped a control message from worker '{}' ({}): {}; later drops from it "
                     "are counted in {} only",
                     worker_id, reason, detail, metric::kControlMessagesDroppedTotal);
}

void ControlDrops::CountServerDrop(const Status& reason) {
  const char* label = reason.code() == StatusCode::kUnimplemented     ? "unsupported_version"
                      : reason.code() == StatusCode::kInvalidArgument ? "malformed"
                                                                      : "unregistered";
  metrics_->Counter(metric::kControlMessagesDroppedTotal).WithLabels({label}).Inc();
}

void ControlDrops::Forget(const std::string& worker_id) {
  MutexLock lock(&mu_);
  logged_.erase(worker_id);
}

}  // namespace tessera
