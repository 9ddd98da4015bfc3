#include "worker/daemon/worker_program.h"

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "common/base/logging.h"
#include "common/config/daemon_config.h"
#include "common/metrics/metrics_registry.h"
#include "common/net/curve_keys.h"
#include "common/net/http_server.h"
#include "common/net/ports_file.h"
#include "common/topology/topology_file.h"

namespace tessera {

int RunWorkerProgram(int argc, char** argv,
                     const std::function<Status(WorkerDaemonOptions&)>& configure) {
  CLI::App app{"tessera-worker: runs one rank of a Tessera deployment"};
  app.set_version_flag("--version", std::string("tessera-worker ") + TESSERA_VERSION);
  std::string config_path;
  std::vector<std::string> overrides;
  WorkerDaemonOptions o;
  std::string coordinator;
  int device = -1;
  int metrics_port = -1;
  bool metrics_pick_port = false;
  std::string ports_file;
  std::string log_format;
  app.add_option("--config", config_path, "TOML config file (its [worker] table)")
      ->check(CLI::ExistingFile);
  app.add_option("--set", overrides, "override a config key, e.g. --set worker.gloo_host=10.0.0.2");
  app.add_option("--coordinator", coordinator, "coordinator control endpoint, tcp://HOST:PORT");
  app.add_option("--device", device,
                 "device index on this host: the GPU this rank runs on (worker.backend auto or "
                 "cuda)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--id", o.worker_id, "worker id to request (default: HOST:DEVICE)");
  app.add_option("--timeout", o.collective_timeout_seconds,
                 "seconds before a collective is declared failed")
      ->check(CLI::PositiveNumber);
  app.add_option("--metrics-port", metrics_port,
                 "serve GET /metrics on exactly this port (0 = off; default: "
                 "worker.metrics_port + device, or off when that key is 0)")
      ->check(CLI::Range(0, 65535));
  app.add_flag("--metrics-pick-port", metrics_pick_port,
               "serve GET /metrics on a port the kernel picks (see --ports-file)")
      ->excludes("--metrics-port");
  app.add_option("--ports-file", ports_file,
                 "once the metrics endpoint is bound, write {\"metrics\":N} (0 = off) to this "
                 "file (atomically, by rename)");
  app.add_option("--log-format", log_format, "log lines as text or json (logging.format)")
      ->check(CLI::IsMember({"text", "json"}));
  CLI11_PARSE(app, argc, argv);

  DaemonConfig cfg;
  if (!config_path.empty()) {
    auto loaded = LoadDaemonConfig(config_path);
    if (!loaded.ok()) {
      std::fprintf(stderr, "tessera-worker: %s\n", loaded.status().ToString().c_str());
      return 2;
    }
    cfg = *loaded;
  }
  if (Status s = ApplyOverrides(cfg, overrides); !s.ok()) {
    std::fprintf(stderr, "tessera-worker: %s\n", s.ToString().c_str());
    return 2;
  }
  SetLogLevel(cfg.logging.level);
  SetLogJson(log_format.empty() ? cfg.logging.format == LogFormat::kJson : log_format == "json");
  {
    char host[256] = {0};
    gethostname(host, sizeof host - 1);
    SetLogNode(cfg.worker.host.empty() ? host : cfg.worker.host);
  }
  o.coordinator = coordinator.empty() ? cfg.worker.coordinator : coordinator;
  o.device = device >= 0 ? device : cfg.worker.device;
  o.backend = WorkerBackendName(cfg.worker.backend);
  o.host = cfg.worker.host;
  o.gloo_host = cfg.worker.gloo_host;
  o.grammar_library = cfg.structured_output.paths();
  if (!cfg.worker.topology_file.empty()) {
    auto topo = LoadTopologyFile(cfg.worker.topology_file);
    if (!topo.ok() || topo->nodes.size() != 1) {
      std::fprintf(stderr, "tessera-worker: worker.topology_file %s: %s\n",
                   cfg.worker.topology_file.c_str(),
                   topo.ok() ? ("describes " + std::to_string(topo->nodes.size()) +
                                " hosts; a worker reports exactly one")
                                   .c_str()
                             : topo.status().ToString().c_str());
      return 2;
    }
    o.topology = topo->nodes[0];
  }
  // worker.metrics_port is the first worker's port: device d listens on
  // metrics_port + d, so workers sharing a host and a config file differ.
  // --metrics-pick-port: on, at the port 0 binds (reported by --ports-file).
  if (metrics_pick_port)
    metrics_port = 0;
  else if (metrics_port < 0)
    metrics_port = cfg.worker.metrics_port == 0 ? 0 : cfg.worker.metrics_port + o.device;
  const bool metrics_on = metrics_pick_port || metrics_port != 0;
  if (metrics_port > 65535) {
    std::fprintf(stderr, "tessera-worker: worker.metrics_port %d + device %d exceeds 65535\n",
                 cfg.worker.metrics_port, o.device);
    return 2;
  }
  MetricsRegistry registry;
  if (metrics_on) {
    o.metrics = &registry;
    o.nvml_metrics = cfg.worker.backend == WorkerBackend::kCuda;
#ifdef TESSERA_WITH_CUDA
    o.nvml_metrics |= cfg.worker.backend == WorkerBackend::kAuto;
#endif
  }
  if (!cfg.control.worker_secret_key_file.empty()) {
    // One key per worker: "{device}" in the path becomes this worker's
    // device index, so workers sharing a host and a config file differ.
    std::string key_file = cfg.control.worker_secret_key_file;
    for (size_t at = key_file.find("{device}"); at != std::string::npos;
         at = key_file.find("{device}", at))
      key_file.replace(at, 8, std::to_string(o.device));
    auto keys = LoadCurveSecretKeyFile(key_file);
    if (!keys.ok()) {
      std::fprintf(stderr, "tessera-worker: control.worker_secret_key_file: %s\n",
                   keys.status().ToString().c_str());
      return 2;
    }
    o.curve_secret_key = keys->secret_key;
    o.curve_server_key = cfg.control.coordinator_public_key;
  } else if (!cfg.control.allow_unauthenticated) {
    std::fprintf(stderr,
                 "tessera-worker: the control plane has no CURVE key: set "
                 "control.worker_secret_key_file and control.coordinator_public_key (tessera "
                 "keygen; `tessera up` makes its own), or control.allow_unauthenticated = true to "
                 "take orders from any process that listens on %s\n",
                 o.coordinator.c_str());
    return 2;
  } else {
    TESSERA_LOG_WARN("worker",
                     "control.allow_unauthenticated = true: the control plane to {} runs without "
                     "CURVE; this worker takes orders from whatever listens there",
                     o.coordinator);
  }
  if (configure) {
    if (Status s = configure(o); !s.ok()) {
      std::fprintf(stderr, "tessera-worker: %s\n", s.ToString().c_str());
      return 2;
    }
  }
  WorkerDaemon daemon(o);
  // Declared after the daemon so it stops first (its handler reads the
  // daemon's metrics).
  std::unique_ptr<HttpServer> metrics_server;
  if (metrics_on) {
    HttpServerOptions ho;
    ho.bind_address = cfg.worker.metrics_host;
    ho.port = metrics_port;  // 0 with --metrics-pick-port
    ho.num_threads = 1;
    metrics_server = std::make_unique<HttpServer>(ho);
    metrics_server->Handle("GET", "/metrics",
                           [&registry](const HttpRequest&, std::shared_ptr<Responder> res) {
                             res->Send(200, kPrometheusContentType, registry.Render());
                           });
    if (Status st = metrics_server->Start(); !st.ok()) {
      std::fprintf(stderr, "tessera-worker: metrics endpoint %s:%d: %s\n",
                   cfg.worker.metrics_host.c_str(), metrics_port, st.ToString().c_str());
      return 1;
    }
    TESSERA_LOG_INFO("worker", "metrics on http://{}:{}/metrics", cfg.worker.metrics_host,
                     metrics_server->port());
  }
  if (!ports_file.empty()) {
    const std::string ports =
        "{\"metrics\":" + std::to_string(metrics_server ? metrics_server->port() : 0) + "}";
    if (Status st = WritePortsJson(ports_file, ports); !st.ok()) {
      std::fprintf(stderr, "tessera-worker: %s\n", st.ToString().c_str());
      return 1;
    }
  }
  Status s = daemon.Run();
  if (!s.ok()) {
    std::fprintf(stderr, "tessera-worker: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}

}  // namespace tessera
