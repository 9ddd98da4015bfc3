// CoordinatorProcess: a real tessera-coordinator started by the fleet
// simulator, and what /proc says about it (CPU seconds, resident memory).
//
// Threading: one controlling thread.
#pragma once

#include <sys/types.h>

#include <string>

#include "common/base/status.h"
#include "common/net/ports_file.h"

namespace tessera::fleet_sim {

class CoordinatorProcess {
 public:
  ~CoordinatorProcess() { Stop(); }
  // Starts `binary --config config --ports-file <dir>/ports.json`, its
  // stdout and stderr to `log_path`, and waits up to 60 s for the ports.
  // Errors: kIoError (fork/exec failed), kUnavailable (it exited, with its
  // exit code or signal, or wrote no ports in time; the message quotes the
  // log's tail).
  Status Start(const std::string& binary, const std::string& config, const std::string& dir,
               const std::string& log_path);
  const ListenerPorts& ports() const { return ports_; }
  pid_t pid() const { return pid_; }
  // User + system CPU seconds so far; -1 when /proc cannot tell.
  double CpuSeconds() const;
  // Resident set size, bytes (VmRSS); -1 when unknown.
  int64_t RssBytes() const;
  // The peak resident set size, bytes (VmHWM); -1 when unknown.
  int64_t PeakRssBytes() const;
  // SIGTERM, then SIGKILL after 20 s. Returns the exit status (-1 when not
  // started). Idempotent.
  int Stop();

 private:
  pid_t pid_ = -1;
  int status_ = -1;
  std::string log_path_;
  ListenerPorts ports_;
};

// The last `bytes` of a file ("" when unreadable).
std::string FileTail(const std::string& path, size_t bytes);

}  // namespace tessera::fleet_sim
