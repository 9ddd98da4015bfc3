// DaemonCluster: the one place the tests start tessera-coordinator and
// tessera-worker processes. It writes the coordinator's config from
// DaemonClusterOptions (every listener on port 0), makes the CURVE keys
// (MakeControlKeys), starts the coordinator with --ports-file and reads the
// ports it bound, starts the workers against the control port it reports,
// waits for /readyz (over HTTPS when the options give a certificate), and
// stops everything it started: SIGCONT and SIGTERM to each, a bounded grace,
// then SIGKILL, every process reaped (StopProcesses).
//
// The Daemons gtest fixture (daemons_fixture.h) wraps one for a test; suites
// that start their daemons once (SetUpTestSuite) or per test with options of
// their own hold one directly. Logs: <dir>/coordinator.log (coordinator2.log
// after a restart, ...), <dir>/worker<i>.log.
//
// Thread-safety: none; use from the test's main thread. The accessors may be
// read from client threads while nothing starts or stops a process.
#pragma once

#include <sys/types.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "common/base/status.h"
#include "common/net/http_client.h"
#include "support/test_util.h"

namespace tessera::testing {

class DaemonCluster;

// How one worker process starts, beyond what every worker gets.
struct WorkerSpec {
  // --device N; -1: the worker's index.
  int device = -1;
  // Added after the common arguments (so a "--set" here wins).
  std::vector<std::string> args;
  // "NAME=value" entries set in the worker's environment.
  std::vector<std::string> env;
  // Put before the worker's command line (e.g. {"ip", "netns", "exec", ns});
  // the process started is still the worker, under the same pid.
  std::vector<std::string> wrapper;
  // The worker program: "tessera-worker-failpoints" for the test build's
  // worker that reads TESSERA_FAILPOINT_* from `env`
  // (worker/daemon/worker_failpoints.h).
  std::string program = "tessera-worker";
  // The key pair the worker presents: -1 the next one of the deployment's
  // (the worker's index among those started); >= 0 that allowed key;
  // kUnlistedKey + u the unlisted pair u (the coordinator refuses it);
  // kNoKey none (the worker gets no --set for its key).
  int key = -1;
  static constexpr int kUnlistedKey = 1000;
  static constexpr int kNoKey = -2;
};

struct DaemonClusterOptions {
  // Scratch directory for the config, keys, ports files and logs; empty:
  // a fresh one named after `temp_prefix`. A test that writes files the
  // config names (a certificate, a token file) makes it first.
  std::string dir;
  std::string temp_prefix = "tessera-daemons";
  // The model directory; empty: the fixture tests/fixtures/models/llama_gqa_f32.
  std::string model_path;
  // Where tessera-coordinator and tessera-worker are; empty: the build tree
  // (BinaryDir()). The GPU bundle runs them from beside its test program.
  std::string bin_dir;
  // The body of each config table, written in this order after
  // "[model]\npath = ..."; an empty body leaves its table out. Append to a
  // default to add keys (TOML refuses a key given twice).
  std::string model_toml = "chat_template = \"chatml\"\n";  // more [model] keys
  std::string parallel_toml = "tp = 2\npp = 2\n";
  std::string server_toml = "port = 0\ncontrol_endpoint = \"tcp://127.0.0.1:0\"\n";
  std::string admin_toml = "port = 0\ntoken = \"s3cret\"\n";
  std::string heartbeat_toml = "interval_seconds = 0.2\ntimeout_seconds = 1.0\n";
  std::string kv_cache_toml = "max_blocks = 256\nblock_size = 4\n";
  std::string scheduler_toml = "max_context = 128\nqueue_limit = 40\nmax_sequences = 40\n";
  // Whole tables appended after [scheduler] ("[logging]\n...").
  std::string extra_toml;
  // HTTPS: server.tls_cert and server.tls_key (PEM files), and the
  // readiness probe verifies the coordinator against tls_cert as its CA.
  std::string tls_cert, tls_key;

  // Workers Start() starts; worker i gets worker_specs[i] when there is one.
  int workers = 4;
  std::vector<WorkerSpec> worker_specs;
  // CURVE: a coordinator pair and one allowed pair per worker plus
  // `spare_worker_keys` allowed pairs for workers (or attacker peers) a test
  // starts later, and `unlisted_keys` pairs the coordinator does not allow.
  // curve = false: no keys, control.allow_unauthenticated = true on every
  // daemon.
  bool curve = true;
  int spare_worker_keys = 0;
  int unlisted_keys = 0;
  // Every worker: --timeout (seconds, bounds each collective; 0: the
  // worker's default), --config
  // with the coordinator's config file when asked, and --metrics-pick-port
  // with a ports file (metrics_port(i)) when asked; then `worker_args`.
  double worker_timeout_seconds = 5.0;
  bool workers_read_config = false;
  bool worker_metrics = false;
  std::vector<std::string> worker_args;
  // The endpoint the workers connect to; empty: tcp://127.0.0.1:<control port>.
  std::string worker_coordinator_endpoint;
  // Put before the coordinator's command line (see WorkerSpec::wrapper).
  std::vector<std::string> coordinator_wrapper;

  // Start() waits up to `ready_timeout_seconds` for /readyz; wait_ready =
  // false returns once the coordinator reported its ports and the workers
  // were started (call WaitReady, or check what a test expects instead).
  bool wait_ready = true;
  double ready_timeout_seconds = 120.0;
  // The /readyz probe; unset: GET over loopback, HTTPS when tls_cert is set.
  std::function<HttpReply(const DaemonCluster&)> ready_probe;
  // Each process's time to exit after SIGTERM in Stop(), seconds.
  double stop_grace_seconds = 5.0;
};

class DaemonCluster {
 public:
  explicit DaemonCluster(DaemonClusterOptions options);
  ~DaemonCluster();  // Stop()
  DaemonCluster(const DaemonCluster&) = delete;
  DaemonCluster& operator=(const DaemonCluster&) = delete;

  // Writes the keys and the config, starts the coordinator and the
  // workers, and waits for readiness unless the options say not to.
  // Errors (with the coordinator's log): no ports file, a daemon that
  // exited, not ready in time. Call once.
  Status Start();
  // Polls the probe every 100 ms until /readyz is 200. Errors (with the
  // last reply and the coordinator's log): the coordinator exited,
  // `timeout_seconds` passed, or `give_up` (if set) returned true for a
  // reply that is not 200 (a 503 whose reason will not change). `last`, if
  // given, gets the last reply.
  Status WaitReady(double timeout_seconds,
                   const std::function<bool(const HttpReply&)>& give_up = {},
                   HttpReply* last = nullptr);
  // The /readyz reply now.
  HttpReply Readyz() const;

  // Starts one more worker (index: the workers started so far) against the
  // coordinator; returns its pid, also held for Stop().
  pid_t StartWorker(const WorkerSpec& spec = {});
  // SIGKILLs the coordinator and reaps it.
  void KillCoordinator();
  // Starts a coordinator again (after it exited) with the same config and
  // control endpoint, so the workers reconnect to the port they know; its
  // log is coordinator<N>.log, its ports file ports<N>.json (ports() then
  // has the new ports). Errors: no ports file. Does not wait for readiness.
  Status RestartCoordinator();
  // RestartCoordinator, then WaitReady(timeout_seconds). Errors: RestartCoordinator's; a new
  // control port (the workers would not find it); not ready in time.
  Status RestartCoordinatorAndWaitReady(double timeout_seconds);
  // Waits up to `timeout_seconds` for `pid` (one of this cluster's) to exit
  // and reaps it; its wait status, or nullopt when it was still running
  // (then it is SIGKILLed and reaped). The pid is no longer stopped by Stop().
  std::optional<int> WaitForExit(pid_t pid, double timeout_seconds);
  // Stops every process still held; safe to call twice.
  void Stop();

  const DaemonClusterOptions& options() const { return options_; }
  const std::string& dir() const { return dir_; }
  const std::string& model() const { return model_; }
  std::string config_path() const { return dir_ + "/c.toml"; }
  int api_port() const { return ports_.api; }
  int admin_port() const { return ports_.admin; }
  int control_port() const { return ports_.control; }
  int store_port() const { return ports_.store; }
  const CoordinatorPorts& ports() const { return ports_; }
  std::string control_endpoint() const { return LoopbackEndpoint(ports_.control); }
  pid_t coordinator_pid() const { return coordinator_pid_; }
  // Worker i in the order started (still its pid once it was reaped).
  pid_t worker_pid(int i) const { return worker_pids_.at(static_cast<size_t>(i)); }
  int workers_started() const { return static_cast<int>(worker_pids_.size()); }
  // The processes not reaped yet: the coordinator first, then the workers.
  const std::vector<pid_t>& pids() const { return held_; }
  // The worker's /metrics port (worker_metrics), read from its ports file.
  int metrics_port(int i) const { return metrics_ports_.at(static_cast<size_t>(i)); }
  const ControlKeys& keys() const { return keys_; }
  const std::vector<std::string>& unlisted_secret_files() const { return unlisted_files_; }
  const std::vector<std::string>& unlisted_public_keys() const { return unlisted_public_; }
  // The text of <dir>/<name> ("" when it does not exist).
  std::string Log(const std::string& name) const;
  std::string CoordinatorLog() const { return Log(coordinator_log_); }
  std::string WorkerLog(int i) const { return Log("worker" + std::to_string(i) + ".log"); }

 private:
  void WriteConfig();
  Status StartCoordinator(const std::vector<std::string>& extra, const std::string& ports_file);
  std::vector<std::string> KeyArgs(int key) const;
  Status Failure(const std::string& what) const;
  void Forget(pid_t pid);  // no longer held for Stop()

  DaemonClusterOptions options_;
  std::string dir_, model_, coordinator_log_ = "coordinator.log";
  ControlKeys keys_;
  std::vector<std::string> unlisted_files_, unlisted_public_;
  CoordinatorPorts ports_{};
  pid_t coordinator_pid_ = -1;
  int coordinator_starts_ = 0;
  std::vector<pid_t> worker_pids_;  // every worker started, in order
  std::vector<pid_t> held_;         // those not reaped yet: Stop() stops them
  std::vector<int> metrics_ports_;
};

// Runs one daemon program ("tessera-coordinator" or "tessera-worker" from
// the build tree) with `args`, output to `log`, until it exits: its exit
// code (128 + signal when killed by one), or -1 when it still ran after
// `timeout_seconds` (then it is SIGKILLed). For the daemons' refusals to
// start.
int RunDaemonUntilExit(const std::string& program, const std::vector<std::string>& args,
                       const std::string& log, double timeout_seconds);

// The exit code in a wait status: WEXITSTATUS, or 128 + the signal.
int ExitCodeOf(int wait_status);

// Sends every body of `requests` (JSON text) to POST /v1/completions on
// 127.0.0.1:`port` at once, one thread each, and returns each one's text in
// order. A request with "stream": true is read event by event and must end
// with exactly one [DONE]; failures are reported as gtest failures naming
// the request's index.
std::vector<std::string> ConcurrentCompletionTexts(int port,
                                                   const std::vector<std::string>& requests);

}  // namespace tessera::testing
