// tessera-fleet-sim: a real tessera-coordinator and thousands of simulated
// workers (bench/fleet_sim/sim_fleet.h) on the real control plane, to
// measure what one coordinator carries at fleet scale: registration,
// heartbeats, planning, routing, the loss of a node under load, memory, and
// the steps per second one process can drive. bench/fleet_sim.sh runs it at
// 1,024 nodes; tests/integration/fleet_sim_test.cc at a CI-sized fleet.
//
// Prints one JSON object (also to --json) with every figure; exits 1 when a
// phase fails (not all registered, not all replicas ready, a request lost).
#include <sys/resource.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>

#include "bench/fleet_sim/coordinator_process.h"
#include "bench/fleet_sim/load_client.h"
#include "bench/fleet_sim/sim_fleet.h"
#include "bench/fleet_sim/step_model.h"
#include "bench/fleet_sim/thread_cpu.h"
#include "common/base/logging.h"
#include "common/format/model_config.h"
#include "common/net/curve_keys.h"
#include "common/net/http_client.h"
#include "common/tokenizer/tokenizer.h"
#include "common/topology/topology_file.h"

namespace fs = std::filesystem;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace tessera::fleet_sim {
namespace {

struct Args {
  std::string coordinator;
  std::string topology = "configs/topologies/dgx_h100_x1.toml";
  std::string model_config = "configs/models/llama-2-70b.json";
  std::string tokenizer = "models/default";
  std::string work_dir;
  std::string json_out;
  int nodes = 1024;
  int tp = 8, pp = 2, replicas = 0;
  bool curve = true;
  int shards = 0;
  double heartbeat = 1.0, heartbeat_timeout = 10.0;
  double disk_gbps = 5, time_scale = 1;
  int clients = 64, max_tokens = 4;
  bool stream = false;
  // [scheduler] runs_on: "coordinator" or "leader" (each replica's leader,
  // a simulated worker running the real ReplicaLeader, schedules itself).
  std::string runs_on = "coordinator";
  double idle_seconds = 10, load_seconds = 10;
  int kill_node = -1;
  double kill_after = 3;
  double ready_timeout = 300;
  int admin_page_size = 1024;
};

double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A TOML basic string.
std::string Quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

Status Fail(const std::string& what) { return Unavailable(what); }

// GET /admin/cluster?page=P&page_size=S on the admin listener.
StatusOr<json> Cluster(int port, int page, int page_size) {
  HttpReply r = HttpCall(
      port, "GET",
      "/admin/cluster?page=" + std::to_string(page) + "&page_size=" + std::to_string(page_size));
  if (r.status != 200)
    return Unavailable("GET /admin/cluster: " + std::to_string(r.status) + " " + r.body);
  json j = json::parse(r.body, nullptr, false);
  if (!j.is_object()) return Unavailable("GET /admin/cluster: not a JSON object");
  return j;
}

// Every page of /admin/cluster: the replicas' plan versions and the
// replica of each worker's host.
struct ClusterSnapshot {
  std::vector<uint64_t> plan_versions;
  std::vector<bool> ready;
  std::vector<int64_t> routed;  // requests_routed_total per replica
  std::map<std::string, std::set<int>> replicas_of_host;
  int pages = 0;
  int workers = 0;
  double seconds = 0;
};

StatusOr<ClusterSnapshot> Snapshot(int port, int page_size) {
  const auto t0 = Clock::now();
  ClusterSnapshot s;
  for (int page = 0;; ++page) {
    TESSERA_ASSIGN_OR_RETURN(json j, Cluster(port, page, page_size));
    for (const json& r : j["replicas"]) {
      s.plan_versions.push_back(r["plan_version"].get<uint64_t>());
      s.ready.push_back(r["ready"].get<bool>());
      s.routed.push_back(r.value("requests_routed_total", int64_t{0}));
    }
    for (const json& w : j["workers"]) {
      ++s.workers;
      if (w["replica"].is_number()) s.replicas_of_host[w["host"]].insert(w["replica"].get<int>());
    }
    ++s.pages;
    if (page + 1 >= j["pages"].get<int>()) break;
  }
  s.seconds = Since(t0);
  return s;
}

// This process's CPU seconds (every thread: the simulated workers, the
// load clients).
double SelfCpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

Status Run(const Args& a, json& out) {
  // A worker holds two descriptors (socket, mailbox): lift the soft limit.
  rlimit nofile{};
  if (getrlimit(RLIMIT_NOFILE, &nofile) == 0) {
    nofile.rlim_cur = nofile.rlim_max;
    setrlimit(RLIMIT_NOFILE, &nofile);
  }
  TESSERA_ASSIGN_OR_RETURN(ClusterTopology topo, LoadTopologyFile(a.topology));
  if (topo.nodes.empty()) return InvalidArgument(a.topology + ": no node");
  const TopologyReport node = topo.nodes[0];
  TESSERA_ASSIGN_OR_RETURN(ModelConfig model,
                           ParseModelConfig(Slurp(a.model_config), a.model_config));
  const int workers = a.nodes * static_cast<int>(node.gpus.size());
  // An explicit layout waits for exactly the workers it uses
  // (parallel.workers): the fleet is replicas x tp x pp workers.
  if (a.replicas > 0 && a.replicas * a.tp * a.pp != workers)
    return InvalidArgument(
        "--replicas " + std::to_string(a.replicas) + " x --tp " + std::to_string(a.tp) +
        " x --pp " + std::to_string(a.pp) + " = " + std::to_string(a.replicas * a.tp * a.pp) +
        " workers, but --nodes " + std::to_string(a.nodes) + " x " +
        std::to_string(node.gpus.size()) + " GPUs = " + std::to_string(workers) +
        "; give --replicas 0 (as many as fit) or " + std::to_string(workers / (a.tp * a.pp)));

  // The coordinator's model: the shapes of --model-config, the tokenizer of
  // --tokenizer (no weights: the coordinator reads none).
  std::string dir = a.work_dir;
  if (dir.empty()) {
    char tmpl[] = "/tmp/tessera-fleet-sim-XXXXXX";
    if (!mkdtemp(tmpl)) return IoError("mkdtemp failed");
    dir = tmpl;
  }
  out["work_dir"] = dir;
  out["runs_on"] = a.runs_on;
  fs::create_directories(dir + "/model");
  fs::copy_file(a.model_config, dir + "/model/config.json", fs::copy_options::overwrite_existing);
  for (const auto& e : fs::directory_iterator(a.tokenizer)) {
    const std::string name = e.path().filename();
    if (name == "config.json" || e.path().extension() == ".safetensors" ||
        e.path().extension() == ".gguf" || name.find(".index.") != std::string::npos)
      continue;
    fs::remove(dir + "/model/" + name);
    fs::create_symlink(fs::absolute(e.path()), dir + "/model/" + name);
  }

  // Keys: one pair for the coordinator, one per simulated worker.
  std::string coordinator_public;
  std::vector<std::string> worker_secrets;
  std::string control_toml;
  const auto t_keys = Clock::now();
  if (a.curve) {
    TESSERA_ASSIGN_OR_RETURN(CurveKeyPair c, GenerateCurveKeyPair());
    fs::remove(dir + "/coordinator.key");
    fs::remove(dir + "/coordinator.pub");
    TESSERA_RETURN_IF_ERROR(WriteCurveKeyPair(c, dir + "/coordinator"));
    coordinator_public = c.public_key;
    control_toml = "coordinator_secret_key_file = " + Quote(dir + "/coordinator.key") +
                   "\nworker_public_keys = [\n";
    for (int i = 0; i < workers; ++i) {
      TESSERA_ASSIGN_OR_RETURN(CurveKeyPair w, GenerateCurveKeyPair());
      worker_secrets.push_back(w.secret_key);
      control_toml += "  " + Quote(w.public_key) + ",\n";
    }
    control_toml += "]\n";
  } else {
    control_toml = "allow_unauthenticated = true\n";
  }
  out["keys_seconds"] = Since(t_keys);

  std::ostringstream toml;
  toml << "[model]\npath = " << Quote(dir + "/model") << "\nname = \"fleet-sim\"\n"
       << "\n[parallel]\nmode = \"explicit\"\ntp = " << a.tp << "\npp = " << a.pp
       << "\nreplicas = " << a.replicas << "\nworkers = " << workers << "\n"
       << "\n[server]\nhost = \"127.0.0.1\"\nport = 0\n"
       << "control_endpoint = \"tcp://127.0.0.1:0\"\nmax_workers = " << workers + 64
       << "\nmax_connections = " << a.clients + 64 << "\nmax_streams = " << a.clients + 64 << "\n"
       << "\n[admin]\nport = 0\n"
       << "\n[heartbeat]\ninterval_seconds = " << a.heartbeat
       << "\ntimeout_seconds = " << a.heartbeat_timeout << "\n"
       << "\n[scheduler]\nqueue_limit = 4096\nruns_on = " << Quote(a.runs_on) << "\n"
       << "\n[logging]\nlevel = \"warn\"\n"
       << "\n[control]\n"
       << control_toml;
  const std::string config = dir + "/coordinator.toml";
  std::ofstream(config) << toml.str();

  CoordinatorProcess coordinator;
  TESSERA_RETURN_IF_ERROR(coordinator.Start(a.coordinator, config, dir, dir + "/coordinator.log"));
  const int admin = coordinator.ports().admin;
  out["coordinator_log"] = dir + "/coordinator.log";

  StepModelOptions so;
  so.gpu =
      FindGpuSpec(node.gpus[0].name, topo.gpu_specs).value_or(FallbackGpuSpec(node.gpus[0].name));
  so.disk_gb_per_s = a.disk_gbps;
  so.time_scale = a.time_scale;
  StepModel step_model(model, so);
  FleetOptions fo;
  fo.coordinator_endpoint = "tcp://127.0.0.1:" + std::to_string(coordinator.ports().control);
  fo.coordinator_public_key = coordinator_public;
  fo.worker_secret_keys = std::move(worker_secrets);
  fo.node = node;
  fo.nodes = a.nodes;
  // A shard thread waits in epoll on its sockets, so a turn costs its ready
  // sockets only: a few threads carry the fleet (more only add switches on
  // a small machine).
  fo.shards = a.shards > 0 ? a.shards : std::clamp((workers + 1023) / 1024, 1, 8);
  // Tokens the tokenizer can decode, clear of the special ids at the start.
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tokenizer, Tokenizer::Load(a.tokenizer));
  fo.token_hi =
      static_cast<int32_t>(std::min<int64_t>({model.vocab_size, tokenizer->vocab_size(), 30000}));
  fo.token_lo = std::min<int32_t>(1000, fo.token_hi / 2);
  fo.model = &step_model;

  // 1. Registration.
  const double cpu0 = coordinator.CpuSeconds();
  const auto t_start = Clock::now();
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<SimFleet> fleet, SimFleet::Start(std::move(fo)));
  while (fleet->stats().seconds_to_all_registered < 0 && Since(t_start) < a.ready_timeout)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  FleetStats st = fleet->stats();
  out["workers"] = workers;
  out["registration_seconds"] = st.seconds_to_all_registered;
  out["registers_sent"] = st.registers_sent;
  out["registration_cpu_seconds"] = coordinator.CpuSeconds() - cpu0;
  out["rss_after_registration_bytes"] = coordinator.RssBytes();
  if (st.seconds_to_all_registered < 0)
    return Fail(std::to_string(st.registered) + " of " + std::to_string(workers) +
                " workers registered in " + std::to_string(a.ready_timeout) + " s");

  // 2. Planning and loading: every rank assigned, then every replica ready.
  const auto t_reg = Clock::now();
  const int64_t ranks = workers / (a.tp * a.pp) * (a.tp * a.pp);
  auto t_check = Clock::now();
  while (fleet->stats().assigned < ranks && Since(t_reg) < a.ready_timeout) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    if (Since(t_check) < 0.5) continue;
    t_check = Clock::now();
    // A placement the coordinator refused ends the run now, with its reason.
    HttpReply r = HttpCall(coordinator.ports().api, "GET", "/readyz");
    json j = json::parse(r.body, nullptr, false);
    if (r.status == 503 && j.is_object() &&
        j.value("reason", "").find("placement") != std::string::npos)
      return Fail("the coordinator did not place the fleet: " + j.value("reason", ""));
  }
  out["plan_seconds"] = Since(t_reg);  // registration complete -> every AssignShard received
  int replicas = 0, ready = 0;
  while (Since(t_reg) < a.ready_timeout) {
    auto j = Cluster(admin, 0, 1);
    if (j.ok()) {
      replicas = (*j)["replicas_total"].get<int>();
      ready = (*j)["replicas_ready"].get<int>();
      if (replicas > 0 && ready == replicas) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  out["ready_seconds"] = Since(t_reg);
  out["rss_after_ready_bytes"] = coordinator.RssBytes();
  out["replicas"] = replicas;
  out["replicas_ready"] = ready;
  out["ranks_assigned"] = fleet->stats().assigned;
  if (replicas == 0 || ready != replicas)
    return Fail(std::to_string(ready) + " of " + std::to_string(replicas) + " replicas ready");
  TESSERA_ASSIGN_OR_RETURN(ClusterSnapshot before, Snapshot(admin, a.admin_page_size));
  out["admin_cluster_pages"] = before.pages;
  out["admin_cluster_workers"] = before.workers;
  out["admin_cluster_replicas"] = before.plan_versions.size();
  out["admin_cluster_seconds"] = before.seconds;

  // 3. Heartbeats alone.
  const double idle_cpu0 = coordinator.CpuSeconds();
  const auto t_idle = Clock::now();
  const int64_t hb0 = fleet->stats().heartbeats_sent;
  std::this_thread::sleep_for(std::chrono::duration<double>(a.idle_seconds));
  const double idle_s = Since(t_idle);
  out["idle_heartbeats_per_second"] =
      static_cast<double>(fleet->stats().heartbeats_sent - hb0) / idle_s;
  out["idle_coordinator_cores"] = (coordinator.CpuSeconds() - idle_cpu0) / idle_s;

  // 4. Requests through the router (and the loss of a node under them).
  LoadOptions lo;
  lo.port = coordinator.ports().api;
  lo.clients = a.clients;
  lo.max_tokens = a.max_tokens;
  lo.model = "fleet-sim";
  lo.stream = a.stream;
  LoadClient load(lo);
  const FleetStats s0 = fleet->stats();
  const double load_cpu0 = coordinator.CpuSeconds();
  const double sim_cpu0 = SelfCpuSeconds();
  const ThreadCpuSnapshot sim_threads0 = SampleThreadCpu(::getpid());
  const ThreadCpuSnapshot coordinator_threads0 = SampleThreadCpu(coordinator.pid());
  const auto t_load = Clock::now();
  load.Start();
  json loss = nullptr;
  if (a.kill_node >= 0) {
    std::this_thread::sleep_for(std::chrono::duration<double>(a.kill_after));
    const std::string host = SimFleet::NodeName(a.kill_node);
    const std::set<int> hit = before.replicas_of_host[host];
    const int64_t assigned_before = fleet->stats().assigned;
    fleet->KillNode(a.kill_node);
    const auto t_kill = Clock::now();
    double reassigned = -1;  // the re-plan's first AssignShard reached a worker
    // Serving again: every replica the node served runs a new plan and is ready.
    double back = -1;
    while (Since(t_kill) < a.heartbeat_timeout + 60) {
      if (reassigned < 0 && fleet->stats().assigned > assigned_before) reassigned = Since(t_kill);
      auto snap = Snapshot(admin, a.admin_page_size);
      if (snap.ok()) {
        bool all = !hit.empty();
        for (int r : hit)
          all = all && static_cast<size_t>(r) < snap->plan_versions.size() &&
                snap->plan_versions[static_cast<size_t>(r)] !=
                    before.plan_versions[static_cast<size_t>(r)] &&
                snap->ready[static_cast<size_t>(r)];
        if (all) {
          back = Since(t_kill);
          break;
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    loss = {{"node", host},
            {"replicas_of_node", std::vector<int>(hit.begin(), hit.end())},
            {"serving_again_seconds", back},
            {"reassigned_seconds", reassigned},
            {"heartbeat_timeout_seconds", a.heartbeat_timeout}};
  }
  const double rest = a.load_seconds - Since(t_load);
  if (rest > 0) std::this_thread::sleep_for(std::chrono::duration<double>(rest));
  // Sampled before the load clients' threads end (a thread that ended is
  // gone from /proc).
  const ThreadCpuSnapshot sim_threads1 = SampleThreadCpu(::getpid());
  const ThreadCpuSnapshot coordinator_threads1 = SampleThreadCpu(coordinator.pid());
  const double threads_s = Since(t_load);
  load.Stop();
  const double load_s = Since(t_load);
  const double load_cpu = coordinator.CpuSeconds() - load_cpu0;
  const FleetStats s1 = fleet->stats();
  const LoadStats ls = load.stats();
  json by_status = json::object();
  for (const auto& [code, n] : ls.by_status) by_status[std::to_string(code)] = n;
  out["load"] = {
      {"clients", a.clients},
      {"max_tokens", a.max_tokens},
      {"stream", a.stream},
      {"events", ls.events},
      {"seconds", load_s},
      {"sent", ls.sent},
      {"ok", ls.ok},
      {"short", ls.short_},
      {"failed", ls.failed},
      {"by_status", by_status},
      {"first_error", ls.first_error},
      {"requests_per_second", static_cast<double>(ls.ok) / load_s},
      {"tokens_per_second", static_cast<double>(ls.tokens) / load_s},
      {"latency_p50_s", Percentile(ls.latencies_s, 0.5)},
      {"latency_p99_s", Percentile(ls.latencies_s, 0.99)},
      {"latency_max_s", Percentile(ls.latencies_s, 1.0)},
      {"steps", s1.steps - s0.steps},
      {"steps_per_second", static_cast<double>(s1.steps - s0.steps) / load_s},
      {"heartbeats_per_second",
       static_cast<double>(s1.heartbeats_sent - s0.heartbeats_sent) / load_s},
      {"coordinator_cores", load_cpu / load_s},
      {"simulator_cores", (SelfCpuSeconds() - sim_cpu0) / load_s},
      {"coordinator_us_per_token",
       ls.tokens > 0 ? 1e6 * load_cpu / static_cast<double>(ls.tokens) : 0},
      {"coordinator_us_per_step",
       s1.steps > s0.steps ? 1e6 * load_cpu / static_cast<double>(s1.steps - s0.steps) : 0}};
  // Where each process's CPU went: the simulator's shard threads
  // ("sim-shard-"), its ZeroMQ I/O threads ("ZMQbg/IO/", CURVE and TCP) and
  // the load clients ("load-client"); the coordinator's threads.
  out["load"]["simulator_threads_cores"] =
      CoresByThreadGroup(sim_threads0, sim_threads1, threads_s);
  out["load"]["coordinator_threads_cores"] =
      CoresByThreadGroup(coordinator_threads0, coordinator_threads1, threads_s);
  const auto [busiest, busiest_cores] =
      BusiestThread(coordinator_threads0, coordinator_threads1, threads_s);
  out["load"]["coordinator_busiest_thread"] = {{"thread", busiest}, {"cores", busiest_cores}};
  // The API listener's stream writes (a coordinator that exports them):
  // events per write shows how often events that were ready together
  // shared one.
  const HttpReply metrics = HttpCall(coordinator.ports().api, "GET", "/metrics");
  for (const char* name :
       {"tessera_http_stream_events_total", "tessera_http_stream_writes_total"}) {
    const size_t at = metrics.body.find(std::string("\n") + name + " ");
    if (at != std::string::npos)
      out["load"][name] = std::strtod(metrics.body.c_str() + at + std::strlen(name) + 2, nullptr);
  }
  TESSERA_ASSIGN_OR_RETURN(ClusterSnapshot after, Snapshot(admin, a.admin_page_size));
  if (!after.routed.empty()) {
    // How evenly the router spread the requests over the replicas.
    const auto [lo, hi] = std::minmax_element(after.routed.begin(), after.routed.end());
    out["load"]["routed_per_replica"] = {{"min", *lo}, {"max", *hi}};
  }
  if (!loss.is_null()) {
    std::vector<int> replanned;
    for (size_t r = 0; r < after.plan_versions.size() && r < before.plan_versions.size(); ++r)
      if (after.plan_versions[r] != before.plan_versions[r])
        replanned.push_back(static_cast<int>(r));
    loss["replanned_replicas"] = replanned;
    out["node_loss"] = loss;
  }
  out["coordinator_rss_bytes"] = coordinator.RssBytes();
  out["coordinator_peak_rss_bytes"] = coordinator.PeakRssBytes();
  fleet->Stop();
  out["coordinator_exit"] = coordinator.Stop();
  if (ls.failed > 0 || ls.short_ > 0)
    return Fail(std::to_string(ls.failed + ls.short_) +
                " requests failed or were cut short; first: " + ls.first_error);
  if (!loss.is_null() && loss["serving_again_seconds"].get<double>() < 0)
    return Fail("the node's replicas did not serve again");
  return Status::Ok();
}

}  // namespace
}  // namespace tessera::fleet_sim

int main(int argc, char** argv) {
  tessera::fleet_sim::Args a;
  CLI::App app{"tessera-fleet-sim: a real coordinator and thousands of simulated workers"};
  app.option_defaults()->always_capture_default();
  const fs::path self = fs::canonical("/proc/self/exe").parent_path();
  a.coordinator = (self / "tessera-coordinator").string();
  app.add_option("--coordinator", a.coordinator, "tessera-coordinator binary")
      ->check(CLI::ExistingFile);
  app.add_option("--topology", a.topology, "topology file; its first node is every simulated node")
      ->check(CLI::ExistingFile);
  app.add_option("--model-config", a.model_config, "Hugging Face config.json of the served model")
      ->check(CLI::ExistingFile);
  app.add_option("--tokenizer", a.tokenizer, "folder with the tokenizer files")
      ->check(CLI::ExistingDirectory);
  app.add_option("--work-dir", a.work_dir,
                 "folder for the config, keys and log (default: a new /tmp folder)");
  app.add_option("--json", a.json_out, "also write the result here");
  app.add_option("--nodes", a.nodes, "simulated nodes")->check(CLI::Range(1, 4096));
  app.add_option("--tp", a.tp, "tp of every replica")->check(CLI::Range(1, 64));
  app.add_option("--pp", a.pp, "pp of every replica")->check(CLI::Range(1, 64));
  app.add_option("--replicas", a.replicas,
                 "replicas (0: as many as fit; else replicas x tp x pp = every worker)")
      ->check(CLI::Range(0, 65536));
  app.add_option("--runs-on", a.runs_on,
                 "scheduler.runs_on: coordinator, or leader (tp 1 x pp 1; the simulated leaders "
                 "run the real scheduler)")
      ->check(CLI::IsMember({"coordinator", "leader"}));
  app.add_flag("!--no-curve", a.curve, "plain TCP control plane (default: a CURVE key per worker)");
  app.add_option("--shards", a.shards, "simulator threads (0: one per 1,024 workers, up to 8)")
      ->check(CLI::Range(0, 256));
  app.add_option("--heartbeat", a.heartbeat, "heartbeat.interval_seconds")
      ->check(CLI::Range(0.05, 60.0));
  app.add_option("--heartbeat-timeout", a.heartbeat_timeout, "heartbeat.timeout_seconds")
      ->check(CLI::Range(0.1, 600.0));
  app.add_option("--disk-gbps", a.disk_gbps, "modeled checkpoint read speed per worker, GB/s")
      ->check(CLI::Range(0.001, 1000.0));
  app.add_option("--time-scale", a.time_scale, "multiplies modeled load and step times (0: none)")
      ->check(CLI::Range(0.0, 1000.0));
  app.add_option("--clients", a.clients, "concurrent API clients")->check(CLI::Range(1, 4096));
  app.add_option("--max-tokens", a.max_tokens, "new tokens per request")
      ->check(CLI::Range(1, 4096));
  app.add_flag("--stream", a.stream,
               "streamed requests (SSE, stream_options.include_usage): the coordinator writes "
               "an event per token");
  app.add_option("--idle-seconds", a.idle_seconds, "heartbeats-only window")
      ->check(CLI::Range(0.0, 3600.0));
  app.add_option("--load-seconds", a.load_seconds, "request load window")
      ->check(CLI::Range(0.1, 3600.0));
  app.add_option("--kill-node", a.kill_node, "node to kill under load (-1: none)")
      ->check(CLI::Range(-1, 4095));
  app.add_option("--kill-after", a.kill_after, "seconds into the load")
      ->check(CLI::Range(0.0, 3600.0));
  app.add_option("--ready-timeout", a.ready_timeout, "bound on registration and on readiness, s")
      ->check(CLI::Range(1.0, 3600.0));
  app.add_option("--admin-page-size", a.admin_page_size, "page size of the /admin/cluster reads")
      ->check(CLI::Range(1, 4096));
  CLI11_PARSE(app, argc, argv);
  if (a.kill_node >= a.nodes) {
    std::fprintf(stderr, "--kill-node %d: there are only %d nodes\n", a.kill_node, a.nodes);
    return 2;
  }
  tessera::SetLogLevel(tessera::LogLevel::kWarn);
  json out;
  tessera::Status s = tessera::fleet_sim::Run(a, out);
  // A folder of our own (no --work-dir) goes once the run passed; a failed
  // run keeps it for the coordinator's log.
  if (s.ok() && a.work_dir.empty() && out.contains("work_dir")) {
    std::error_code ec;
    fs::remove_all(out["work_dir"].get<std::string>(), ec);
    out.erase("work_dir");
    out.erase("coordinator_log");
  }
  out["ok"] = s.ok();
  if (!s.ok()) out["error"] = s.ToString();
  const std::string text = out.dump(2);
  std::cout << text << std::endl;
  if (!a.json_out.empty()) std::ofstream(a.json_out) << text << "\n";
  if (!s.ok()) std::fprintf(stderr, "fleet-sim: %s\n", s.ToString().c_str());
  return s.ok() ? 0 : 1;
}
