#include "cli/local_launcher.h"

#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <thread>

namespace tessera {

LocalLauncher::~LocalLauncher() {
  for (pid_t& p : pids_) {
    if (p > 0) {
      kill(p, SIGKILL);
      waitpid(p, nullptr, 0);
      p = -1;
    }
  }
}

Status LocalLauncher::Start(const std::vector<ChildSpec>& children) {
  for (const ChildSpec& c : children) {
    std::vector<char*> argv;
    for (const std::string& a : c.argv) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    const pid_t pid = fork();
    if (pid < 0) {
      const std::string err = strerror(errno);
      this->~LocalLauncher();
      pids_.clear();
      return IoError("fork for " + c.name + ": " + err);
    }
    if (pid == 0) {
      // Die with the launcher, so a killed launcher leaves no rank behind.
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (c.own_process_group) setpgid(0, 0);
      if (c.quiet_stdout) {
        const int fd = open("/dev/null", O_WRONLY);
        if (fd >= 0) dup2(fd, STDOUT_FILENO);
      }
      execv(argv[0], argv.data());
      dprintf(STDERR_FILENO, "tessera: exec %s for %s: %s\n", argv[0], c.name.c_str(),
              strerror(errno));
      _exit(127);
    }
    specs_.push_back(c);
    pids_.push_back(pid);
  }
  return Status::Ok();
}

void LocalLauncher::ForwardSignal(int sig) {
  for (pid_t p : pids_)
    if (p > 0) kill(p, sig);
}

void LocalLauncher::SignalChild(size_t index, int sig) {
  if (index < pids_.size() && pids_[index] > 0) kill(pids_[index], sig);
}

Status LocalLauncher::CheckRunning() {
  std::string exited;
  for (size_t i = 0; i < pids_.size(); ++i) {
    if (pids_[i] <= 0) continue;
    int status = 0;
    if (waitpid(pids_[i], &status, WNOHANG) != pids_[i]) continue;
    pids_[i] = -1;
    const std::string how = WIFSIGNALED(status)
                                ? std::string("was killed by signal ") + strsignal(WTERMSIG(status))
                                : "exited with status " + std::to_string(WEXITSTATUS(status));
    exited += (exited.empty() ? "" : "; ") + specs_[i].name + " " + how;
  }
  if (!exited.empty()) return Unavailable(exited);
  return Status::Ok();
}

Status LocalLauncher::Wait(double grace_seconds, double timeout_seconds) {
  std::string failures;
  bool deadline_set = timeout_seconds >= 0;
  std::chrono::steady_clock::time_point deadline =
      std::chrono::steady_clock::now() +
      std::chrono::milliseconds(static_cast<int64_t>(std::max(0.0, timeout_seconds) * 1000));
  size_t running = 0;
  for (pid_t p : pids_) running += p > 0 ? 1 : 0;
  while (running > 0) {
    int status = 0;
    const pid_t got = waitpid(-1, &status, WNOHANG);
    if (got > 0) {
      for (size_t i = 0; i < pids_.size(); ++i) {
        if (pids_[i] != got) continue;
        pids_[i] = -1;
        --running;
        std::string how;
        if (WIFEXITED(status) && WEXITSTATUS(status) != 0) {
          how = "exited with status " + std::to_string(WEXITSTATUS(status));
        } else if (WIFSIGNALED(status)) {
          how = std::string("was killed by signal ") + strsignal(WTERMSIG(status));
        }
        if (!how.empty()) {
          failures += (failures.empty() ? "" : "; ") + specs_[i].name + " " + how;
          const auto grace = std::chrono::steady_clock::now() +
                             std::chrono::milliseconds(static_cast<int64_t>(grace_seconds * 1000));
          if (!deadline_set || grace < deadline) deadline = grace;
          deadline_set = true;
        }
      }
      continue;
    }
    if (got < 0 && errno != EINTR && errno != ECHILD) break;
    if (deadline_set && std::chrono::steady_clock::now() >= deadline) {
      const std::string why = failures.empty() ? " did not exit in time and was killed"
                                               : " was killed after that failure";
      for (size_t i = 0; i < pids_.size(); ++i) {
        if (pids_[i] <= 0) continue;
        kill(pids_[i], SIGKILL);
        waitpid(pids_[i], nullptr, 0);
        pids_[i] = -1;
        --running;
        failures += (failures.empty() ? "" : "; ") + specs_[i].name + why;
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (!failures.empty()) return Unavailable(failures);
  return Status::Ok();
}

}  // namespace tessera
