// The coordinator's side of control-plane security, besides what
// ControlServer does on its own (CURVE, ZAP, one key per worker, the record
// bounds):
//  - ConfigureControlSecurity: CURVE from [control], refusing to run without
//    it unless control.allow_unauthenticated says so (then a warning is
//    logged), and the registration bounds (server.max_workers,
//    heartbeat.forget_failed_after_seconds).
//  - ControlDrops: messages a registered worker sent that the coordinator
//    refuses (a StepResult from a rank that does not sample, for another
//    plan, for a micro-batch not in flight or with other seq_ids; an Error
//    from a worker outside the plan). Each is counted in
//    tessera_control_messages_dropped_total{reason} and logged once per
//    worker (a misbehaving peer cannot flood the log). The control server's
//    own drops (malformed frames, unsupported versions, messages from a peer
//    not registered) are counted there too: malformed, unsupported_version,
//    unregistered.
//
// Thread-safety: ControlDrops is safe from any thread (its Mutex guards the
// set of workers already logged: GUARDED_BY, checked by scripts/thread-safety).
#pragma once

#include <set>
#include <string>

#include "common/base/mutex.h"
#include "common/base/status.h"
#include "common/base/thread_annotations.h"
#include "common/config/daemon_config.h"
#include "common/metrics/metrics_registry.h"
#include "coordinator/control/control_server.h"

namespace tessera {

// Fills the CURVE keys and the registration bounds of `options` from
// `config`. Errors: kFailedPrecondition when no coordinator key is set and
// control.allow_unauthenticated is false (the message names both keys and
// `tessera keygen`), those of LoadCurveSecretKeyFile (with the key's name).
Status ConfigureControlSecurity(const DaemonConfig& config, ControlServerOptions* options);

class ControlDrops {
 public:
  explicit ControlDrops(MetricsRegistry* metrics) : metrics_(metrics) {}
  // Counts one dropped message under `reason` (a metric label) and logs
  // `detail` the first time `worker_id` has a message dropped.
  void Drop(const std::string& worker_id, const char* reason, const std::string& detail)
      EXCLUDES(mu_);
  // Counts one message the control server dropped (it logs those itself):
  // `reason` from its status (ControlServerOptions::on_dropped).
  void CountServerDrop(const Status& reason);
  // The worker's record is gone: a later worker of that id is logged anew.
  void Forget(const std::string& worker_id) EXCLUDES(mu_);

 private:
  MetricsRegistry* metrics_;
  Mutex mu_;
  std::set<std::string> logged_ GUARDED_BY(mu_);  // workers whose first drop was logged
};

}  // namespace tessera
