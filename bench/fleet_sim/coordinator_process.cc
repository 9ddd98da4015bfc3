#include "bench/fleet_sim/coordinator_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

namespace tessera::fleet_sim {

std::string FileTail(const std::string& path, size_t bytes) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string s = ss.str();
  return s.size() > bytes ? s.substr(s.size() - bytes) : s;
}

Status CoordinatorProcess::Start(const std::string& binary, const std::string& config,
                                 const std::string& dir, const std::string& log_path) {
  const std::string ports_path = dir + "/ports.json";
  ::unlink(ports_path.c_str());
  log_path_ = log_path;
  const pid_t pid = ::fork();
  if (pid < 0) return IoError("fork failed");
  if (pid == 0) {
    const int fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
    }
    std::vector<std::string> args = {binary, "--config", config, "--ports-file", ports_path};
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(binary.c_str(), argv.data());
    ::_exit(127);
  }
  pid_ = pid;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < deadline) {
    StatusOr<ListenerPorts> p = ReadPortsFile(ports_path);
    if (p.ok()) {
      ports_ = *p;
      return Status::Ok();
    }
    int st = 0;
    if (::waitpid(pid_, &st, WNOHANG) == pid_) {
      pid_ = -1;
      const std::string tail = FileTail(log_path, 2000);
      return Unavailable(
          binary + " exited (" +
          (WIFEXITED(st) ? "exit code " + std::to_string(WEXITSTATUS(st))
                         : "signal " + std::to_string(WTERMSIG(st))) +
          ") before it listened; " +
          (tail.empty() ? "its log " + log_path + " is empty" : "its log ends:\n" + tail));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  Stop();
  return Unavailable("the coordinator wrote no ports file in 60 s; its log ends:\n" +
                     FileTail(log_path, 2000));
}

double CoordinatorProcess::CpuSeconds() const {
  if (pid_ <= 0) return -1;
  std::ifstream in("/proc/" + std::to_string(pid_) + "/stat");
  std::string line;
  if (!std::getline(in, line)) return -1;
  // Fields after the command name (which may hold spaces) in parentheses.
  const size_t close = line.rfind(')');
  if (close == std::string::npos) return -1;
  std::istringstream rest(line.substr(close + 2));
  std::string field;
  double utime = 0, stime = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i == 14) utime = std::stod(field);
    if (i == 15) stime = std::stod(field);
  }
  return (utime + stime) / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

namespace {
int64_t StatusKb(pid_t pid, const std::string& key) {
  if (pid <= 0) return -1;
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(key + ":", 0) == 0) return std::stoll(line.substr(key.size() + 1)) * 1024;
  return -1;
}
}  // namespace

int64_t CoordinatorProcess::RssBytes() const { return StatusKb(pid_, "VmRSS"); }
int64_t CoordinatorProcess::PeakRssBytes() const { return StatusKb(pid_, "VmHWM"); }

int CoordinatorProcess::Stop() {
  if (pid_ <= 0) return status_;
  ::kill(pid_, SIGTERM);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  int st = 0;
  while (::waitpid(pid_, &st, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, &st, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  pid_ = -1;
  status_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  return status_;
}

}  // namespace tessera::fleet_sim
