// `tessera up --config FILE [--prompt TEXT]`: starts the coordinator and its
// workers on this host as child processes, waits until the plan is loaded,
// prints the placement and the API URL; with --prompt it sends one chat
// request, streams the answer and shuts everything down. Ctrl-C, SIGTERM or SIGHUP
// stops every process.
//
// The control plane is authenticated: unless control.allow_unauthenticated
// is set, `up` makes CURVE keys for this deployment (a coordinator pair and
// one per worker) in a run directory of its own (mode 0700, the secret keys
// 0600), passes them to the daemons as --set overrides, and removes the
// directory when it exits.
//
// `tessera status [--host H] [--port P] [--token T]`: the cluster, the plan and
// the queue, through the admin API.
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/ip/tcp.hpp>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "cli/admin_reply.h"
#include "cli/commands.h"
#include "cli/local_launcher.h"
#include "cli/plan_view.h"
#include "common/base/load_progress.h"
#include "common/config/daemon_config.h"
#include "common/net/curve_keys.h"
#include "common/net/endpoint.h"
#include "common/net/http_client.h"
#include "common/net/ports_file.h"
#include "worker/topology/topology_discovery.h"

namespace tessera::cli {

namespace {

std::vector<std::string> Concat(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

}  // namespace

namespace {

using nlohmann::json;

volatile std::sig_atomic_t g_up_stop = 0;
void OnUpSignal(int) { g_up_stop = 1; }

std::string SelfDir() {
  char exe[4096];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0) return ".";
  exe[n] = '\0';
  std::string s(exe);
  return s.substr(0, s.rfind('/'));
}

void PrintPlan(const std::string& plan_json, bool with_explanation) {
  const std::string out = FormatServingPlan(plan_json, with_explanation);
  std::fwrite(out.data(), 1, out.size(), stdout);
}

// One progress line over every rank's shard load, of every replica, from
// /admin/plan ("" while no rank has reported progress).
std::string LoadProgressLine(const std::string& plan_json, double seconds) {
  const json plan = json::parse(plan_json, nullptr, false);
  if (plan.is_discarded() || !plan.is_object() || !plan.contains("ranks")) return "";
  // "replicas" holds each replica's plan document; the top level is replica 0's.
  std::vector<const json*> rank_lists;
  if (plan.contains("replicas") && plan["replicas"].is_array() && !plan["replicas"].empty()) {
    for (const json& rep : plan["replicas"])
      if (rep.is_object() && rep.contains("ranks") && rep["ranks"].is_array())
        rank_lists.push_back(&rep["ranks"]);
  } else {
    rank_lists.push_back(&plan["ranks"]);
  }
  int64_t done = 0, total = 0;
  int loaded = 0, ranks = 0;
  for (const json* list : rank_lists)
    for (const json& r : *list) {
      ++ranks;
      const bool is_loaded = r.value("weight_bytes", int64_t{-1}) >= 0;
      loaded += is_loaded ? 1 : 0;
      const int64_t rank_total = r.value("load_bytes_total", int64_t{0});
      total += rank_total;
      // A loaded rank has read its whole shard even if its last report was earlier.
      done += is_loaded ? rank_total : r.value("load_bytes_done", int64_t{0});
    }
  if (total == 0) return "";
  return "loading: " + FormatLoadProgress(done, total, seconds) + " (" + std::to_string(loaded) +
         "/" + std::to_string(ranks) + " ranks loaded)";
}

// Fails when nothing could listen on host:port because something already
// does (another deployment on this host, most often): the error names the
// config key. A wildcard host ("*", "0.0.0.0", "::") tries every interface.
// `example` is the value to suggest for `key` in the error's --set hint.
Status CheckPortFree(const std::string& key, const std::string& example, std::string host,
                     int port) {
  namespace asio = boost::asio;
  if (host == "*") host = "0.0.0.0";
  if (host.size() > 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  asio::io_context io;
  boost::system::error_code ec;
  asio::ip::tcp::resolver resolver(io);
  auto endpoints = resolver.resolve(host, std::to_string(port), ec);
  if (ec || endpoints.empty()) return Status::Ok();  // the daemon reports bad hosts itself
  asio::ip::tcp::acceptor acceptor(io);
  const asio::ip::tcp::endpoint ep = endpoints.begin()->endpoint();
  acceptor.open(ep.protocol(), ec);
  if (!ec) acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) acceptor.bind(ep, ec);
  if (ec == asio::error::address_in_use) {
    return FailedPrecondition(fmt::format(
        "{}: {}:{} is already in use (another deployment on this host? stop it, or pass "
        "--set {}={})",
        key, host, port, key, example));
  }
  return Status::Ok();
}

// The run directory of one `tessera up`: made private, removed with its
// files when this goes out of scope.
class RunDir {
 public:
  ~RunDir() {
    if (path_.empty()) return;
    for (const std::string& f : files_) unlink(f.c_str());
    rmdir(path_.c_str());
  }
  Status Make() {
    const char* tmp = std::getenv("TMPDIR");
    std::string tmpl = std::string(tmp && *tmp ? tmp : "/tmp") + "/tessera-up-XXXXXX";
    if (mkdtemp(tmpl.data()) == nullptr)
      return IoError("cannot make a run directory from " + tmpl + ": " + std::strerror(errno));
    path_ = tmpl;
    chmod(path_.c_str(), 0700);
    return Status::Ok();
  }
  void Own(const std::string& file) { files_.push_back(file); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::vector<std::string> files_;
};

}  // namespace

Subcommand AddUpCommand(CLI::App& app) {
  struct Args {
    std::string config;
    std::vector<std::string> sets;  // --set table.key=value, for every daemon
    std::string prompt;
    int max_tokens = 256;
    double ready_timeout = 600;
  };
  auto a = std::make_shared<Args>();
  Subcommand s;
  s.app = app.add_subcommand("up", "start a coordinator and its workers on this host");
  s.app->add_option("--config", a->config, "TOML config (e.g. configs/local-cpu.toml)")
      ->required()
      ->check(CLI::ExistingFile);
  s.app->add_option("--set", a->sets,
                    "override a config key, table.key=value (repeatable; passed on to the "
                    "coordinator and every worker)");
  s.app->add_option("--prompt", a->prompt,
                    "send one chat request, stream the answer, then shut down");
  s.app->add_option("--max-tokens", a->max_tokens, "tokens to generate for --prompt")
      ->capture_default_str();
  s.app->add_option("--ready-timeout", a->ready_timeout, "seconds to wait for the plan to load")
      ->capture_default_str();
  s.run = [a]() -> int {
    // From here on a Ctrl-C means: stop cleanly.
    std::signal(SIGINT, OnUpSignal);
    std::signal(SIGTERM, OnUpSignal);
    // A closed terminal stops the deployment the same way (and removes the
    // run directory with its keys) instead of killing the daemons unstopped.
    std::signal(SIGHUP, OnUpSignal);
    auto cfg = LoadDaemonConfig(a->config);
    if (!cfg.ok()) {
      std::fprintf(stderr, "tessera up: %s\n", cfg.status().ToString().c_str());
      return 2;
    }
    if (Status st = ApplyOverrides(*cfg, a->sets); !st.ok()) {
      std::fprintf(stderr, "tessera up: %s\n", st.ToString().c_str());
      return 2;
    }
    auto with_sets = [&](std::vector<std::string> argv,
                         const std::vector<std::string>& extra = {}) {
      for (const std::string& kv : a->sets) {
        argv.push_back("--set");
        argv.push_back(kv);
      }
      for (const std::string& kv : extra) {
        argv.push_back("--set");
        argv.push_back(kv);
      }
      return argv;
    };
    const bool explicit_mode = cfg->parallel.mode == ParallelMode::kExplicit;
    // Explicit: replicas * tp * pp workers; auto: parallel.workers (default
    // 1), placed by the coordinator's planner. Auto with parallel.replicas
    // other than 1 and no parallel.workers: one worker per GPU of this host
    // (the coordinator is told to wait for them all), so every replica that
    // fits is served.
    int workers = cfg->parallel.ExpectedWorkers();
    std::vector<std::string> coordinator_sets;
    if (!explicit_mode && cfg->parallel.workers == 0 && cfg->parallel.replicas != 1) {
      auto topo = DiscoverTopology();
      if (topo.ok() && !topo->gpus.empty()) {
        workers = static_cast<int>(topo->gpus.size());
        coordinator_sets = {"--set", "parallel.workers=" + std::to_string(workers)};
        std::printf("one worker per GPU: %d worker(s)\n", workers);
      }
    }
    // CURVE keys for this deployment, unless it runs unauthenticated on purpose.
    // The run directory holds the coordinator's ports file and the keys.
    RunDir run_dir;
    if (Status st = run_dir.Make(); !st.ok()) {
      std::fprintf(stderr, "tessera up: %s\n", st.ToString().c_str());
      return 1;
    }
    const std::string ports_file = run_dir.path() + "/ports.json";
    run_dir.Own(ports_file);
    run_dir.Own(ports_file + ".tmp");
    std::optional<DeploymentKeys> keys;
    if (!cfg->control.allow_unauthenticated) {
      StatusOr<DeploymentKeys> made = MakeDeploymentKeys(run_dir.path(), workers);
      run_dir.Own(run_dir.path() + "/coordinator.key");
      run_dir.Own(run_dir.path() + "/coordinator.pub");
      for (int d = 0; d < workers; ++d) {
        run_dir.Own(run_dir.path() + "/worker" + std::to_string(d) + ".key");
        run_dir.Own(run_dir.path() + "/worker" + std::to_string(d) + ".pub");
      }
      if (!made.ok()) {
        std::fprintf(stderr, "tessera up: CURVE keys for the control plane: %s\n",
                     made.status().ToString().c_str());
        return 1;
      }
      keys = std::move(*made);
    }
    const std::string dir = SelfDir();
    // Own process groups: a Ctrl-C reaches only this process, which stops
    // the coordinator first; it shuts its workers down.
    const ChildSpec coordinator{
        "coordinator",
        with_sets(Concat({dir + "/tessera-coordinator", "--config", a->config, "--ports-file",
                          ports_file},
                         coordinator_sets),
                  keys ? keys->CoordinatorOverrides() : std::vector<std::string>{}),
        false, true};
    // Nothing starts while another process holds one of this deployment's
    // ports: its workers would register with that process's coordinator.
    struct Listener {
      std::string key, example, host;
      int port;
    };
    std::vector<Listener> listeners = {
        {"server.port", "<another port>", cfg->server.host, cfg->server.port}};
    if (cfg->admin.port != 0)
      listeners.push_back({"admin.port", "<another port>", cfg->admin.host, cfg->admin.port});
    {
      StatusOr<TcpEndpoint> ep = ParseTcpEndpoint(cfg->server.control_endpoint, EndpointUse::kBind);
      if (!ep.ok()) {  // validated with the config: not reached
        std::fprintf(stderr, "tessera up: server.control_endpoint: %s\n",
                     ep.status().ToString().c_str());
        return 1;
      }
      std::string example = FormatTcpEndpoint(ep->host, 0);  // "tcp://HOST:0"
      example.replace(example.size() - 1, 1, "<another port>");
      listeners.push_back({"server.control_endpoint", example, ep->host, ep->port});
    }
    for (const Listener& l : listeners) {
      if (l.port == 0) continue;  // picked when the coordinator binds: nothing to hold it
      if (Status st = CheckPortFree(l.key, l.example, l.host, l.port); !st.ok()) {
        std::fprintf(stderr, "tessera up: %s\n", st.ToString().c_str());
        return 1;
      }
    }
    // The coordinator first: once it has checked the config against the
    // model and bound its listeners it writes their ports, and only then do
    // workers start, told the control port it bound (a layout the model
    // cannot take stops it before any worker starts).
    LocalLauncher launcher;
    if (Status st = launcher.Start({coordinator}); !st.ok()) {
      std::fprintf(stderr, "tessera up: %s\n", st.ToString().c_str());
      return 1;
    }
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::duration<double>(a->ready_timeout);
    StatusOr<ListenerPorts> ports = NotFound("");
    while (!g_up_stop && std::chrono::steady_clock::now() < deadline) {
      ports = ReadPortsFile(ports_file);
      if (ports.ok() || ports.status().code() != StatusCode::kNotFound) break;
      if (Status alive = launcher.CheckRunning(); !alive.ok()) {
        std::fprintf(stderr, "tessera up: %s before the deployment was ready; no worker started\n",
                     alive.message().c_str());
        return 1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (!ports.ok()) {
      if (g_up_stop) return 0;
      std::fprintf(stderr, "tessera up: the coordinator reported no ports: %s\n",
                   ports.status().message().empty() ? "it did not start in time"
                                                    : ports.status().ToString().c_str());
      return 1;
    }
    {
      // Workers connect to the control port it bound, on its host (a
      // wildcard host is reached on loopback).
      StatusOr<TcpEndpoint> ep = ParseTcpEndpoint(cfg->server.control_endpoint, EndpointUse::kBind);
      std::string host = ep.ok() ? ep->host : "127.0.0.1";  // validated with the config
      if (host == "*" || host == "0.0.0.0") host = "127.0.0.1";
      if (host == "::") host = "::1";
      const std::string endpoint = FormatTcpEndpoint(host, ports->control);
      std::vector<ChildSpec> worker_children;
      for (int d = 0; d < workers; ++d)
        worker_children.push_back(
            {"worker " + std::to_string(d),
             with_sets({dir + "/tessera-worker", "--config", a->config, "--device",
                        std::to_string(d), "--coordinator", endpoint},
                       keys ? keys->WorkerOverrides(d) : std::vector<std::string>{}),
             false, true});
      if (Status st = launcher.Start(worker_children); !st.ok()) {
        std::fprintf(stderr, "tessera up: %s\n", st.ToString().c_str());
        return 1;
      }
    }
    const int port = ports->api;
    const int admin_port = ports->admin;
    const std::string token = cfg->admin.effective_token;
    bool ready = false;
    int64_t ready_replicas = -1, total_replicas = -1;  // while some replicas still load
    const auto start = std::chrono::steady_clock::now();
    auto last_progress = start;
    std::string last_line;
    while (!g_up_stop && std::chrono::steady_clock::now() < deadline) {
      // Our own processes first: a /readyz answer means nothing once they died.
      if (Status alive = launcher.CheckRunning(); !alive.ok()) {
        std::fprintf(stderr, "tessera up: %s before the deployment was ready\n",
                     alive.message().c_str());
        break;
      }
      const auto now = std::chrono::steady_clock::now();
      if (now - last_progress >= std::chrono::seconds(1)) {
        last_progress = now;
        const std::string line = LoadProgressLine(
            HttpCall(admin_port, "GET", "/admin/plan", "", token, cfg->admin.host).body,
            std::chrono::duration<double>(now - start).count());
        if (!line.empty() && line != last_line) {
          std::fprintf(stderr, "tessera up: %s\n", line.c_str());
          last_line = line;
        }
      }
      HttpReply r = HttpCall(port, "GET", "/readyz", "", "", cfg->server.host);
      if (r.status == 200) {
        ready = true;
        // /readyz answers once one replica serves; the deployment is up when
        // every replica does (until the ready timeout: then it serves with
        // those that do, and says so).
        const json c = json::parse(
            HttpCall(admin_port, "GET", "/admin/cluster?page_size=1", "", token, cfg->admin.host)
                .body,
            nullptr, false);
        if (!c.is_object() ||
            c.value("replicas_ready", int64_t{0}) >= c.value("replicas_total", int64_t{0}))
          break;
        ready_replicas = c.value("replicas_ready", int64_t{0});
        total_replicas = c.value("replicas_total", int64_t{0});
      }
      if (r.status == 503) {
        // A refused placement does not heal by waiting (the coordinator's
        // other reasons: waiting for workers, re-planning, degraded).
        const json j = json::parse(r.body, nullptr, false);
        const std::string reason = j.is_object() ? j.value("reason", "") : "";
        const bool waiting = reason == "waiting for workers" ||
                             reason == "re-planning after a worker failure" ||
                             (j.is_object() && j.value("status", "") == "degraded");
        if (!reason.empty() && !waiting) {
          std::fprintf(stderr, "tessera up: %s\n", reason.c_str());
          break;
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      ready = false;  // not every replica yet: look again
    }
    if (!ready && ready_replicas > 0 && !g_up_stop) {
      std::fprintf(stderr,
                   "tessera up: only %lld of %lld replicas became ready within the ready timeout; "
                   "serving with those (tessera status shows why the others are not)\n",
                   static_cast<long long>(ready_replicas), static_cast<long long>(total_replicas));
      ready = true;
    }
    int rc = 0;
    if (!ready) {
      if (!g_up_stop) {
        std::fprintf(stderr, "tessera up: the deployment did not become ready\n");
        rc = 1;
      }
    } else {
      PrintPlan(HttpCall(admin_port, "GET", "/admin/plan", "", token, cfg->admin.host).body,
                !explicit_mode);
      std::printf("API: http://%s:%d/v1 (model \"%s\")\n", cfg->server.host.c_str(), port,
                  ServedModelName(cfg->model).c_str());
      if (admin_port != port)
        std::printf("Admin: http://%s:%d/admin\n", cfg->admin.host.c_str(), admin_port);
      std::fflush(stdout);
      if (!a->prompt.empty()) {
        json req = {{"model", ServedModelName(cfg->model)},
                    {"messages", {{{"role", "user"}, {"content", a->prompt}}}},
                    {"max_tokens", a->max_tokens},
                    {"temperature", 0},
                    {"stream", true}};
        // Print each delta as its event arrives.
        bool done = false;
        auto on_event = [&](const std::string& e) {
          if (done || e == "[DONE]") {
            done = true;
            return;
          }
          const json chunk = json::parse(e, nullptr, false);
          if (chunk.is_discarded()) return;
          if (chunk.contains("error")) {
            std::fprintf(stderr, "\ntessera up: %s\n", chunk["error"].value("message", "").c_str());
            rc = 1;
            return;
          }
          if (!chunk.contains("choices") || chunk["choices"].empty()) return;
          const json& delta = chunk["choices"][0]["delta"];
          if (delta.contains("content") && delta["content"].is_string()) {
            std::fputs(delta["content"].get<std::string>().c_str(), stdout);
            std::fflush(stdout);
          }
        };
        HttpReply r = HttpCall(port, "POST", "/v1/chat/completions", req.dump(), "",
                               cfg->server.host, on_event);
        if (r.status != 200 && !g_up_stop) {
          std::fprintf(stderr, "tessera up: chat request failed (%d): %s\n", r.status,
                       r.body.c_str());
          rc = 1;
        }
        std::fputc('\n', stdout);
        std::fflush(stdout);
      } else {
        std::printf("serving; Ctrl-C stops every process\n");
        std::fflush(stdout);
        while (!g_up_stop) std::this_thread::sleep_for(std::chrono::milliseconds(200));
      }
    }
    // Stop: once serving, the coordinator first (it sends every worker a
    // Shutdown), then whatever is still running after 15 s; while starting,
    // everything at once (workers may not have registered yet).
    if (ready) {
      launcher.SignalChild(0, SIGTERM);
    } else {
      launcher.ForwardSignal(SIGTERM);
    }
    Status waited = launcher.Wait(5.0, 15.0);
    if (!waited.ok()) {
      std::fprintf(stderr, "tessera up: %s\n", waited.ToString().c_str());
      if (ready) rc = 1;  // a clean deployment exits cleanly; a broken one was reported above
    }
    return rc;
  };
  return s;
}

Subcommand AddStatusCommand(CLI::App& app) {
  struct Args {
    std::string host = "127.0.0.1";
    int port = 8001;
    std::string token;
  };
  auto a = std::make_shared<Args>();
  Subcommand s;
  s.app = app.add_subcommand("status",
                             "show the cluster, the plan and the queue of a running coordinator");
  s.app->add_option("--host", a->host, "admin host")->capture_default_str();
  s.app->add_option("--port", a->port, "admin port")->capture_default_str();
  s.app->add_option("--token", a->token, "admin bearer token");
  s.run = [a]() -> int {
    HttpReply cluster = HttpCall(a->port, "GET", "/admin/cluster", "", a->token, a->host);
    if (cluster.status != 200) {
      const Status s =
          AdminCallError(a->host, a->port, "/admin/cluster", cluster, !a->token.empty());
      std::fprintf(stderr, "tessera status: %s\n", s.ToString().c_str());
      return 1;
    }
    json c = json::parse(cluster.body, nullptr, false);
    if (c.is_discarded() || !c.is_object()) {
      std::fprintf(stderr, "tessera status: /admin/cluster is not JSON: %s\n",
                   cluster.body.c_str());
      return 1;
    }
    // A large fleet's document comes in pages: read every one.
    const int64_t pages = c.value("pages", int64_t{1});
    for (int64_t page = 1; page < pages; ++page) {
      const std::string target = "/admin/cluster?page=" + std::to_string(page);
      HttpReply more = HttpCall(a->port, "GET", target, "", a->token, a->host);
      const json m = more.status == 200 ? json::parse(more.body, nullptr, false) : json();
      if (!m.is_object() || !m.contains("workers") || !m.contains("replicas")) {
        const Status s = AdminCallError(a->host, a->port, target, more, !a->token.empty());
        std::fprintf(stderr, "tessera status: %s\n", s.ToString().c_str());
        return 1;
      }
      for (const json& w : m["workers"]) c["workers"].push_back(w);
      for (const json& r : m["replicas"]) c["replicas"].push_back(r);
    }
    std::printf("ready: %s\n", c.value("ready", false) ? "yes" : "no");
    if (c.contains("queue") && c["queue"].is_object())
      std::printf("queue: %d waiting, %d running\n", c["queue"].value("waiting", 0),
                  c["queue"].value("running", 0));
    if (c.contains("replicas") && c["replicas"].is_array() && !c["replicas"].empty()) {
      std::printf("replicas:\n");
      for (const json& r : c["replicas"]) {
        const json load = r.value("load", json::object());
        const json layout = r.value("layout", json::object());
        std::printf(
            "  %-3d %-9s plan %-4llu tp %-3s pp %-3s %3d waiting %3d running %7lld tokens "
            "outstanding %6lld/%lld KV blocks free %6lld finished%s\n",
            r.value("replica", 0),
            !r.value("degraded", json(nullptr)).is_null() ? "degraded"
            : r.value("ready", false)                     ? "ready"
                                                          : "replanning",
            static_cast<unsigned long long>(r.value("plan_version", uint64_t{0})),
            layout.value("tp", json(0)).dump().c_str(), layout.value("pp", json(0)).dump().c_str(),
            load.value("waiting", 0), load.value("running", 0),
            static_cast<long long>(load.value("outstanding_tokens", int64_t{0})),
            static_cast<long long>(load.value("free_kv_blocks", int64_t{0})),
            static_cast<long long>(load.value("kv_blocks", int64_t{0})),
            static_cast<long long>(r.value("requests_finished_total", int64_t{0})),
            r.value("accepting", true) || !r.value("ready", false) ? "" : " (drained)");
      }
    }
    std::printf("workers:\n");
    for (const json& w : c["workers"]) {
      std::string rank = "idle";
      if (w.contains("rank") && w["rank"].is_object())
        rank = (w["rank"].contains("replica") ? "r" + w["rank"]["replica"].dump() + " " : "") +
               "rank " + w["rank"]["world_rank"].dump();
      std::printf("  %-12s %-12s %-16s %-7s %-9s %-8s pid %d\n", w.value("id", "").c_str(),
                  w.value("host", "").c_str(), w.value("data_address", "").c_str(),
                  w.value("state", "").c_str(), w.value("worker_state", "").c_str(), rank.c_str(),
                  w.value("pid", 0));
    }
    PrintPlan(HttpCall(a->port, "GET", "/admin/plan", "", a->token, a->host).body, false);
    return 0;
  };
  return s;
}

}  // namespace tessera::cli
