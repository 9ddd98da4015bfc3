// Helpers shared by the unit tests: fixture paths and scratch directories.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace tessera::testing {

// Absolute path of tests/fixtures/<name>.
std::string FixturePath(const std::string& name);
// A fresh, empty directory under the system temp dir, removed at process exit.
std::string MakeTempDir(const std::string& prefix);
// Directory of the build tree (for locating the tessera binaries).
std::string BinaryDir();
// A TCP port on 127.0.0.1 that was free a moment ago (bound to port 0, then
// released). Two calls in one process never return the same port.
int FreeTcpPort();
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

// CURVE keys for daemons a test starts by hand (the control plane refuses to
// run without keys unless control.allow_unauthenticated is set): a
// coordinator pair and one pair per worker, written under `dir`.
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
