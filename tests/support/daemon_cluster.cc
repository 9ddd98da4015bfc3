#include "support/daemon_cluster.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>
#include <utility>

#include "common/net/curve_keys.h"
#include "support/https_client.h"

namespace tessera::testing {

namespace {

using Clock = std::chrono::steady_clock;

Clock::time_point After(double seconds) {
  return Clock::now() +
         std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

// A test set the cluster up wrong (a key it did not ask for): stop here,
// saying what, as MakeControlKeys does.
[[noreturn]] void Misuse(const std::string& what) {
  std::fprintf(stderr, "DaemonCluster: %s\n", what.c_str());
  std::abort();
}

std::string Tail(const std::string& s, size_t n) {
  return s.size() > n ? "..." + s.substr(s.size() - n) : s;
}

std::string Table(const std::string& name, const std::string& body) {
  return body.empty() ? "" : "[" + name + "]\n" + body;
}

// `wrapper`, then /usr/bin/env with `env` when there is any, then the
// program of the build tree and `args`.
std::vector<std::string> CommandLine(const std::vector<std::string>& wrapper,
                                     const std::vector<std::string>& env,
                                     const std::string& bin_dir, const std::string& program,
                                     const std::vector<std::string>& args) {
  std::vector<std::string> cmd = wrapper;
  if (!env.empty()) {
    cmd.push_back("/usr/bin/env");
    cmd.insert(cmd.end(), env.begin(), env.end());
  }
  cmd.push_back((bin_dir.empty() ? BinaryDir() : bin_dir) + "/" + program);
  cmd.insert(cmd.end(), args.begin(), args.end());
  return cmd;
}

}  // namespace

DaemonCluster::DaemonCluster(DaemonClusterOptions options) : options_(std::move(options)) {
  dir_ = options_.dir.empty() ? MakeTempDir(options_.temp_prefix) : options_.dir;
  model_ = options_.model_path.empty() ? FixturePath("models/llama_gqa_f32") : options_.model_path;
}

DaemonCluster::~DaemonCluster() { Stop(); }

void DaemonCluster::WriteConfig() {
  std::string server = options_.server_toml;
  if (!options_.tls_cert.empty())
    server += "tls_cert = \"" + options_.tls_cert + "\"\ntls_key = \"" + options_.tls_key + "\"\n";
  std::ofstream(config_path()) << "[model]\npath = \"" << model_ << "\"\n"
                               << options_.model_toml << Table("parallel", options_.parallel_toml)
                               << Table("server", server) << Table("admin", options_.admin_toml)
                               << Table("heartbeat", options_.heartbeat_toml)
                               << Table("kv_cache", options_.kv_cache_toml)
                               << Table("scheduler", options_.scheduler_toml) << options_.extra_toml
                               << (options_.curve ? keys_.CoordinatorToml()
                                                  : "[control]\nallow_unauthenticated = true\n");
}

Status DaemonCluster::Start() {
  if (coordinator_starts_ > 0) Misuse("Start() called twice");
  if (options_.curve) {
    keys_ = MakeControlKeys(dir_, options_.workers + options_.spare_worker_keys);
    for (int u = 0; u < options_.unlisted_keys; ++u) {
      StatusOr<CurveKeyPair> pair = GenerateCurveKeyPair();
      if (!pair.ok()) return pair.status();
      const std::string base = dir_ + "/unlisted" + std::to_string(u);
      TESSERA_RETURN_IF_ERROR(WriteCurveKeyPair(*pair, base));
      unlisted_files_.push_back(base + ".key");
      unlisted_public_.push_back(pair->public_key);
    }
  }
  WriteConfig();
  TESSERA_RETURN_IF_ERROR(StartCoordinator({}, dir_ + "/ports.json"));
  for (int i = 0; i < options_.workers; ++i)
    StartWorker(i < static_cast<int>(options_.worker_specs.size())
                    ? options_.worker_specs[static_cast<size_t>(i)]
                    : WorkerSpec{});
  if (options_.worker_metrics) {
    for (int i = 0; i < options_.workers; ++i) {
      const std::string name = "worker" + std::to_string(i);
      const auto port = WaitForReportedPort(dir_ + "/" + name + ".json", "metrics", worker_pid(i),
                                            options_.ready_timeout_seconds);
      if (!port) return Internal("no metrics port from " + name + ": " + WorkerLog(i));
      metrics_ports_.push_back(*port);
    }
  }
  if (!options_.wait_ready) return Status::Ok();
  return WaitReady(options_.ready_timeout_seconds);
}

Status DaemonCluster::StartCoordinator(const std::vector<std::string>& extra,
                                       const std::string& ports_file) {
  ++coordinator_starts_;
  coordinator_log_ = coordinator_starts_ == 1
                         ? "coordinator.log"
                         : "coordinator" + std::to_string(coordinator_starts_) + ".log";
  std::vector<std::string> args = {"--config", config_path()};
  args.insert(args.end(), extra.begin(), extra.end());
  args.insert(args.end(), {"--ports-file", ports_file});
  coordinator_pid_ = Spawn(
      CommandLine(options_.coordinator_wrapper, {}, options_.bin_dir, "tessera-coordinator", args),
      dir_ + "/" + coordinator_log_);
  held_.insert(held_.begin(), coordinator_pid_);
  const auto ports = WaitForPortsFile(ports_file, coordinator_pid_, options_.ready_timeout_seconds);
  if (!ports) return Failure("no ports file " + ports_file);
  ports_ = *ports;
  return Status::Ok();
}

std::vector<std::string> DaemonCluster::KeyArgs(int key) const {
  if (!options_.curve) return {"--set", "control.allow_unauthenticated=true"};
  if (key == WorkerSpec::kNoKey) return {};
  if (key >= WorkerSpec::kUnlistedKey) {
    const size_t u = static_cast<size_t>(key - WorkerSpec::kUnlistedKey);
    if (u >= unlisted_files_.size())
      Misuse(
          fmt::format("unlisted key {} asked for; the options make {}", u, unlisted_files_.size()));
    return {"--set", "control.worker_secret_key_file=" + unlisted_files_[u], "--set",
            "control.coordinator_public_key=" + keys_.coordinator_public_key};
  }
  if (key < 0 || key >= static_cast<int>(keys_.worker_secret_files.size()))
    Misuse(fmt::format("worker key {} asked for; the options make {} (raise spare_worker_keys)",
                       key, keys_.worker_secret_files.size()));
  return keys_.WorkerArgs(key);
}

pid_t DaemonCluster::StartWorker(const WorkerSpec& spec) {
  const int i = workers_started();
  std::vector<std::string> args;
  if (options_.workers_read_config) args.insert(args.end(), {"--config", config_path()});
  args.insert(args.end(),
              {"--coordinator",
               options_.worker_coordinator_endpoint.empty() ? control_endpoint()
                                                            : options_.worker_coordinator_endpoint,
               "--device", std::to_string(spec.device < 0 ? i : spec.device)});
  if (options_.worker_timeout_seconds > 0)
    args.insert(args.end(), {"--timeout", fmt::format("{}", options_.worker_timeout_seconds)});
  if (options_.worker_metrics)
    args.insert(args.end(), {"--metrics-pick-port", "--ports-file",
                             dir_ + "/worker" + std::to_string(i) + ".json"});
  const std::vector<std::string> key =
      KeyArgs(spec.key < 0 && spec.key != WorkerSpec::kNoKey ? i : spec.key);
  args.insert(args.end(), key.begin(), key.end());
  args.insert(args.end(), options_.worker_args.begin(), options_.worker_args.end());
  args.insert(args.end(), spec.args.begin(), spec.args.end());
  const pid_t pid = Spawn(CommandLine(spec.wrapper, spec.env, options_.bin_dir, spec.program, args),
                          dir_ + "/worker" + std::to_string(i) + ".log");
  worker_pids_.push_back(pid);
  held_.push_back(pid);
  return pid;
}

HttpReply DaemonCluster::Readyz() const {
  if (options_.ready_probe) return options_.ready_probe(*this);
  if (options_.tls_cert.empty()) return HttpCall(api_port(), "GET", "/readyz");
  const HttpsReply r =
      HttpsCall(api_port(), options_.tls_cert, boost::beast::http::verb::get, "/readyz");
  HttpReply reply;
  reply.status = r.status;
  reply.body = r.status == 0 ? r.error : r.body;
  return reply;
}

Status DaemonCluster::WaitReady(double timeout_seconds,
                                const std::function<bool(const HttpReply&)>& give_up,
                                HttpReply* last) {
  const auto deadline = After(timeout_seconds);
  HttpReply r;
  std::string why = fmt::format("not ready within {} s", timeout_seconds);
  while (true) {
    r = Readyz();
    if (last) *last = r;
    if (r.status == 200) return Status::Ok();
    if (give_up && give_up(r)) {
      why = "not ready and not going to be";
      break;
    }
    int status = 0;
    if (waitpid(coordinator_pid_, &status, WNOHANG) == coordinator_pid_) {
      Forget(coordinator_pid_);
      why = fmt::format("the coordinator exited (code {})", ExitCodeOf(status));
      break;
    }
    if (Clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return Failure(fmt::format("daemons {}; last /readyz: {} {}", why, r.status, r.body));
}

void DaemonCluster::KillCoordinator() {
  kill(coordinator_pid_, SIGKILL);
  waitpid(coordinator_pid_, nullptr, 0);
  Forget(coordinator_pid_);
}

Status DaemonCluster::RestartCoordinator() {
  if (std::find(held_.begin(), held_.end(), coordinator_pid_) != held_.end())
    Misuse("RestartCoordinator() while the coordinator runs");
  const std::string control = control_endpoint();
  return StartCoordinator({"--set", "server.control_endpoint=" + control},
                          dir_ + "/ports" + std::to_string(coordinator_starts_ + 1) + ".json");
}

Status DaemonCluster::RestartCoordinatorAndWaitReady(double timeout_seconds) {
  const int control = control_port();
  TESSERA_RETURN_IF_ERROR(RestartCoordinator());
  if (control_port() != control)
    return Internal(fmt::format("the restarted coordinator took control port {}, not {}",
                                control_port(), control));
  return WaitReady(timeout_seconds);
}

std::optional<int> DaemonCluster::WaitForExit(pid_t pid, double timeout_seconds) {
  const auto deadline = After(timeout_seconds);
  int status = 0;
  pid_t got = 0;
  while ((got = waitpid(pid, &status, WNOHANG)) == 0 && Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  if (got == 0) {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
  }
  Forget(pid);
  if (got != pid) return std::nullopt;
  return status;
}

void DaemonCluster::Forget(pid_t pid) {
  held_.erase(std::remove(held_.begin(), held_.end(), pid), held_.end());
}

void DaemonCluster::Stop() {
  for (pid_t p : held_)
    if (p > 0) kill(p, SIGCONT);  // a stopped process cannot act on SIGTERM
  StopProcesses(held_, options_.stop_grace_seconds);
  held_.clear();
}

std::string DaemonCluster::Log(const std::string& name) const {
  std::ifstream in(dir_ + "/" + name, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

Status DaemonCluster::Failure(const std::string& what) const {
  std::string text = what + "\n---- " + coordinator_log_ + "\n" + CoordinatorLog();
  for (int i = 0; i < workers_started(); ++i)
    text += "\n---- worker" + std::to_string(i) + ".log\n" + Tail(WorkerLog(i), 3000);
  return Internal(text);
}

int RunDaemonUntilExit(const std::string& program, const std::vector<std::string>& args,
                       const std::string& log, double timeout_seconds) {
  const pid_t pid = Spawn(CommandLine({}, {}, "", program, args), log);
  const auto deadline = After(timeout_seconds);
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (Clock::now() >= deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return ExitCodeOf(status);
}

int ExitCodeOf(int wait_status) {
  return WIFEXITED(wait_status) ? WEXITSTATUS(wait_status) : 128 + WTERMSIG(wait_status);
}

std::vector<std::string> ConcurrentCompletionTexts(int port,
                                                   const std::vector<std::string>& requests) {
  using nlohmann::json;
  std::vector<std::string> out(requests.size());
  std::vector<std::thread> ts;
  for (size_t i = 0; i < requests.size(); ++i)
    ts.emplace_back([&, i] {
      const json req = json::parse(requests[i], nullptr, false);
      const bool stream = req.is_object() && req.value("stream", false);
      auto r = HttpCall(port, "POST", "/v1/completions", requests[i]);
      EXPECT_EQ(r.status, 200) << "request " << i << ": " << r.body;
      if (!stream) {
        const json j = json::parse(r.body, nullptr, false);
        if (!j.is_discarded() && j.contains("choices")) out[i] = j["choices"][0]["text"];
        return;
      }
      std::string text;
      int done = 0;
      for (const std::string& ev : r.events) {
        if (ev == "[DONE]") {
          ++done;
          continue;
        }
        const json j = json::parse(ev, nullptr, false);
        ASSERT_FALSE(j.is_discarded() || j.contains("error")) << "request " << i << ": " << ev;
        for (const json& c : j["choices"])
          if (c.contains("text") && c["text"].is_string()) text += c["text"].get<std::string>();
      }
      EXPECT_EQ(done, 1) << "request " << i;
      out[i] = text;
    });
  for (auto& t : ts) t.join();
  return out;
}

}  // namespace tessera::testing
