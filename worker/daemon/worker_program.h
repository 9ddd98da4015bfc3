// The tessera-worker program: its command line, the config file and
// overrides, logging, the control plane's CURVE keys, the metrics endpoint and
// the ports file, wired into one WorkerDaemon that runs until the coordinator
// shuts it down. worker/daemon/main.cc is tessera-worker's main(); the test
// build's worker (tests/support/worker_failpoints_main.cc) is the same program
// with the failpoints of worker_failpoints.h read from its environment.
//
// Thread-safety: call once, from main().
#pragma once

#include <functional>

#include "common/base/status.h"
#include "worker/daemon/worker_daemon.h"

namespace tessera {

// Parses argv (--help lists the options), runs the worker and returns the
// process's exit status: 0 when the coordinator shut it down, 1 when the
// daemon failed or the metrics endpoint or ports file could not be set up, 2
// for a bad command line, config, topology file or key file (the error on
// stderr, naming it). `configure`, when set, adjusts the daemon's options
// last, before the daemon is made; its error exits 2.
int RunWorkerProgram(int argc, char** argv,
                     const std::function<Status(WorkerDaemonOptions&)>& configure = {});

}  // namespace tessera
