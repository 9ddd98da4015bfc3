// Helpers shared by the unit tests: fixture paths and scratch directories.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "common/net/ports_file.h"

namespace tessera::testing {

// Absolute path of tests/fixtures/<name>.
std::string FixturePath(const std::string& name);
// A fresh, empty directory under the system temp dir, removed at process exit.
std::string MakeTempDir(const std::string& prefix);
// Directory of the build tree (for locating the tessera binaries).
std::string BinaryDir();
// The ports a tessera-coordinator started with --ports-file reported
// (common/net/ports_file.h).
using CoordinatorPorts = ::tessera::ListenerPorts;
// Waits up to `timeout_seconds` for the coordinator `pid` to write its ports
// file `path`. nullopt when the process exits first, the time runs out, or
// the file does not hold the four ports.
std::optional<CoordinatorPorts> WaitForPortsFile(const std::string& path, pid_t pid,
                                                 double timeout_seconds = 120.0);
// The port under `key` in the JSON object a process `pid` writes (by
// rename) to `path`: tessera-worker --ports-file's "metrics". Waits up to
// `timeout_seconds`; nullopt when the process exits first, the time runs
// out, or the value is not a port (0 included).
std::optional<int> WaitForReportedPort(const std::string& path, const std::string& key, pid_t pid,
                                       double timeout_seconds = 120.0);
// "tcp://127.0.0.1:<port>": the endpoint workers connect to.
std::string LoopbackEndpoint(int port);
// Stops processes a test started: SIGTERM to each, up to `grace_seconds` for
// each to exit on its own, then SIGKILL; every one is reaped.
void StopProcesses(const std::vector<pid_t>& pids, double grace_seconds = 5.0);
// Starts `args` (args[0]: the executable, a path or a name looked up in
// PATH) as a child process with
// stdout and stderr going to the file `log`; returns its pid (the caller
// waits for it). A child that cannot exec exits with status 127.
pid_t Spawn(const std::vector<std::string>& args, const std::string& log);
// The exit status and combined stdout + stderr of a shell command.
struct CommandResult {
  int rc = -1;  // -1 when it did not exit normally (or could not start)
  std::string output;
};
// Runs `cmd` through /bin/sh (popen), capturing stdout and stderr.
CommandResult RunCommand(const std::string& cmd);
// Reads a whole file; aborts the test process on failure.
std::string ReadFileOrDie(const std::string& path);

// CURVE keys for the daemons DaemonCluster (daemon_cluster.h) starts (the
// control plane refuses to run without keys unless
// control.allow_unauthenticated is set): a coordinator pair and one pair per
// worker, written under `dir`.
struct ControlKeys {
  std::string coordinator_secret_file;
  std::string coordinator_public_key;
  std::vector<std::string> worker_secret_files;
  std::vector<std::string> worker_public_keys;
  // "--set" arguments giving the coordinator its key and every worker's
  // public key, and giving worker i its own key.
  std::vector<std::string> CoordinatorArgs() const;
  std::vector<std::string> WorkerArgs(int i) const;
  // The same as a [control] table, for a config file.
  std::string CoordinatorToml() const;
};
// Aborts the test process when the keys cannot be made.
ControlKeys MakeControlKeys(const std::string& dir, int workers);
// `args` followed by `more`.
std::vector<std::string> Concat(std::vector<std::string> args,
                                const std::vector<std::string>& more);

}  // namespace tessera::testing
