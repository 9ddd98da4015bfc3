#include "support/test_util.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>
#include <vector>

#include "common/base/status.h"
#include "common/net/curve_keys.h"

namespace tessera::testing {

namespace {
std::mutex g_mu;
std::vector<std::string>* g_dirs = nullptr;  // protected by g_mu

void RemoveDirs() {
  std::lock_guard<std::mutex> lock(g_mu);
  if (!g_dirs) return;
  for (const auto& d : *g_dirs) {
    std::error_code ec;
    std::filesystem::remove_all(d, ec);
  }
}
}  // namespace

std::string FixturePath(const std::string& name) {
  return std::string(TESSERA_FIXTURES_DIR) + "/" + name;
}

std::string BinaryDir() { return TESSERA_BINARY_DIR; }

std::string MakeTempDir(const std::string& prefix) {
  std::string tmpl = (std::filesystem::temp_directory_path() / (prefix + "-XXXXXX")).string();
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  TESSERA_CHECK(mkdtemp(buf.data()) != nullptr);
  std::lock_guard<std::mutex> lock(g_mu);
  if (!g_dirs) {
    g_dirs = new std::vector<std::string>();
    std::atexit(RemoveDirs);
  }
  g_dirs->emplace_back(buf.data());
  return g_dirs->back();
}

namespace {

// Polls until `path` exists (written by rename, so complete) and returns
// read(path), or nullopt when `pid` exits or `timeout_seconds` pass first.
template <typename T>
std::optional<T> WaitForFile(const std::string& path, pid_t pid, double timeout_seconds,
                             const std::function<std::optional<T>(const std::string&)>& read) {
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(timeout_seconds));
  while (std::chrono::steady_clock::now() < deadline) {
    if (std::filesystem::exists(path)) return read(path);
    if (waitpid(pid, nullptr, WNOHANG) != 0) return std::nullopt;  // it exited (or is no child)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return std::nullopt;
}

}  // namespace

std::optional<CoordinatorPorts> WaitForPortsFile(const std::string& path, pid_t pid,
                                                 double timeout_seconds) {
  return WaitForFile<CoordinatorPorts>(path, pid, timeout_seconds,
                                       [](const std::string& p) -> std::optional<CoordinatorPorts> {
                                         auto read = ReadPortsFile(p);
                                         if (!read.ok()) return std::nullopt;
                                         return *read;
                                       });
}

std::optional<int> WaitForReportedPort(const std::string& path, const std::string& key, pid_t pid,
                                       double timeout_seconds) {
  return WaitForFile<int>(
      path, pid, timeout_seconds, [&key](const std::string& p) -> std::optional<int> {
        const nlohmann::json j = nlohmann::json::parse(ReadFileOrDie(p), nullptr, false);
        if (!j.is_object() || !j.contains(key) || !j[key].is_number_integer()) return std::nullopt;
        const int port = j[key].get<int>();
        if (port < 1 || port > 65535) return std::nullopt;
        return port;
      });
}

void StopProcesses(const std::vector<pid_t>& pids, double grace_seconds) {
  for (pid_t p : pids)
    if (p > 0) kill(p, SIGTERM);  // never 0 or -1: those signal whole groups
  for (pid_t p : pids) {
    if (p <= 0) continue;
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                              std::chrono::duration<double>(grace_seconds));
    while (waitpid(p, nullptr, WNOHANG) == 0 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    kill(p, SIGKILL);
    waitpid(p, nullptr, 0);
  }
}

std::string LoopbackEndpoint(int port) { return "tcp://127.0.0.1:" + std::to_string(port); }

std::string ReadFileOrDie(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  TESSERA_CHECK(in.good());
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

pid_t Spawn(const std::vector<std::string>& args, const std::string& log) {
  const pid_t pid = fork();
  if (pid == 0) {
    const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execvp(argv[0], argv.data());
    _exit(127);
  }
  return pid;
}

CommandResult RunCommand(const std::string& cmd) {
  CommandResult r;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.output.append(buf, n);
  const int status = pclose(p);
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

ControlKeys MakeControlKeys(const std::string& dir, int workers) {
  StatusOr<DeploymentKeys> made = MakeDeploymentKeys(dir, workers);
  if (!made.ok()) {
    std::fprintf(stderr, "MakeControlKeys(%s): %s\n", dir.c_str(),
                 made.status().ToString().c_str());
    std::abort();
  }
  ControlKeys k;
  k.coordinator_secret_file = made->coordinator_secret_file;
  k.coordinator_public_key = made->coordinator_public_key;
  k.worker_secret_files = made->worker_secret_files;
  k.worker_public_keys = made->worker_public_keys;
  return k;
}

namespace {
DeploymentKeys AsDeployment(const ControlKeys& k) {
  DeploymentKeys d;
  d.coordinator_secret_file = k.coordinator_secret_file;
  d.coordinator_public_key = k.coordinator_public_key;
  d.worker_secret_files = k.worker_secret_files;
  d.worker_public_keys = k.worker_public_keys;
  return d;
}
std::vector<std::string> AsSetArgs(const std::vector<std::string>& overrides) {
  std::vector<std::string> out;
  for (const std::string& o : overrides) {
    out.push_back("--set");
    out.push_back(o);
  }
  return out;
}
}  // namespace

std::vector<std::string> ControlKeys::CoordinatorArgs() const {
  return AsSetArgs(AsDeployment(*this).CoordinatorOverrides());
}

std::vector<std::string> ControlKeys::WorkerArgs(int i) const {
  return AsSetArgs(AsDeployment(*this).WorkerOverrides(i));
}

std::string ControlKeys::CoordinatorToml() const {
  std::string list;
  for (const std::string& key : worker_public_keys)
    list += (list.empty() ? "\"" : ", \"") + key + "\"";
  return "[control]\ncoordinator_secret_key_file = \"" + coordinator_secret_file +
         "\"\nworker_public_keys = [" + list + "]\n";
}

std::vector<std::string> Concat(std::vector<std::string> args,
                                const std::vector<std::string>& more) {
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

}  // namespace tessera::testing
