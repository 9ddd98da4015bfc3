// LocalLauncher: starts the rank processes of a deployment on this host and
// watches them.
//
// If one child fails (non-zero exit or a signal), the others are given
// `grace_seconds` to exit on their own (0: none; `tessera generate` kills
// them at once); any still running then are killed. The returned Status
// names every child that failed and how, and those killed because of it.
//
// Thread-safety: one thread drives a launcher. ForwardSignal is
// async-signal-safe.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "common/base/status.h"

namespace tessera {

struct ChildSpec {
  std::string name;               // "rank 2 (stage 1, tp_rank 0)", used in reports
  std::vector<std::string> argv;  // argv[0] is the executable path
  bool quiet_stdout = false;      // send stdout to /dev/null
  // Start the child in a process group of its own, so a Ctrl-C at the
  // terminal reaches only the launcher, which then stops the children in
  // its own order.
  bool own_process_group = false;
};

class LocalLauncher {
 public:
  ~LocalLauncher();  // kills children still running

  // Errors: kIoError naming the child when fork/exec fails (children already
  // started are killed).
  Status Start(const std::vector<ChildSpec>& children);
  // Waits for every child. OK when all exited 0. After `timeout_seconds`
  // (< 0: none) children still running are killed and reported.
  Status Wait(double grace_seconds, double timeout_seconds = -1);
  // Sends `sig` to every running child.
  void ForwardSignal(int sig);
  // Sends `sig` to child `index` (in Start order) if it is running.
  void SignalChild(size_t index, int sig);
  // Reaps children that have exited, without blocking. OK while every child
  // runs; else kUnavailable naming each child that exited and how (status or
  // signal), for daemons that must not exit on their own.
  Status CheckRunning();

 private:
  std::vector<ChildSpec> specs_;
  std::vector<pid_t> pids_;  // -1 once reaped
};

}  // namespace tessera
