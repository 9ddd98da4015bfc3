// Faults a test can make a worker commit (issue #31), so the coordinator's
// handling of them is tested on real daemons. Only the test build's worker,
// tessera-worker-failpoints (tests/support/worker_failpoints_main.cc: the
// worker program of worker_program.h with its own main()), reads them, from
// its environment (ParseWorkerFailpoints); tessera-worker has no way to set
// them, and with the defaults nothing changes.
//
//   TESSERA_FAILPOINT_IGNORE_ASSIGN=1   register and heartbeat, never take an
//                                       AssignShard (a stale key's process,
//                                       a host whose disk hangs)
//   TESSERA_FAILPOINT_IGNORE_ASSIGN=first  ignore only the first AssignShard
//                                       (a load that hangs once), take the
//                                       later ones
//   TESSERA_FAILPOINT_STEP_SLEEP=R:S:F  a stage-0 rank of world rank R
//                                       sleeps S seconds inside the compute
//                                       of its first step that starts while
//                                       file F exists (a hung kernel; its
//                                       heartbeats go on), once per process
//
// Thread-safety: a value type.
#pragma once

#include <string>

#include "common/base/status.h"

namespace tessera {

struct WorkerFailpoints {
  bool ignore_assignments = false;       // every AssignShard
  bool ignore_first_assignment = false;  // the first one only
  int step_sleep_rank = -1;              // world rank; -1 = none
  double step_sleep_seconds = 0;
  std::string step_sleep_trigger;  // the file whose existence arms it
};

// From the values of the two variables (null = unset). Errors:
// kInvalidArgument naming the variable and what it expects.
StatusOr<WorkerFailpoints> ParseWorkerFailpoints(const char* ignore_assign, const char* step_sleep);

}  // namespace tessera
