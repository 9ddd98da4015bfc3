// tessera-worker: one per GPU (or CPU rank). Joins a coordinator, loads its
// shard and runs its pipeline stage until the coordinator shuts it down.
#include <CLI/CLI.hpp>
#include <cstdio>

#include "common/curve_keys.h"
#include "coordinator/daemon_config.h"
#include "worker/worker_daemon.h"

int main(int argc, char** argv) {
  CLI::App app{"tessera-worker: runs one rank of a Tessera deployment"};
  app.set_version_flag("--version", std::string("tessera-worker ") + TESSERA_VERSION);
  std::string config_path;
  std::vector<std::string> overrides;
  tessera::WorkerDaemonOptions o;
  std::string coordinator;
  int device = -1;
  app.add_option("--config", config_path, "TOML config file (its [worker] table)")
      ->check(CLI::ExistingFile);
  app.add_option("--set", overrides, "override a config key, e.g. --set worker.gloo_host=10.0.0.2");
  app.add_option("--coordinator", coordinator, "coordinator control endpoint, tcp://HOST:PORT");
  app.add_option("--device", device, "device index on this host")->check(CLI::NonNegativeNumber);
  app.add_option("--id", o.worker_id, "worker id to request (default: assigned)");
  app.add_option("--timeout", o.collective_timeout_seconds,
                 "seconds before a collective is declared failed")
      ->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);

  tessera::DaemonConfig cfg;
  if (!config_path.empty()) {
    auto loaded = tessera::LoadDaemonConfig(config_path);
    if (!loaded.ok()) {
      std::fprintf(stderr, "tessera-worker: %s\n", loaded.status().ToString().c_str());
      return 2;
    }
    cfg = *loaded;
  }
  if (tessera::Status s = tessera::ApplyOverrides(cfg, overrides); !s.ok()) {
    std::fprintf(stderr, "tessera-worker: %s\n", s.ToString().c_str());
    return 2;
  }
  o.coordinator = coordinator.empty() ? cfg.worker.coordinator : coordinator;
  o.device = device >= 0 ? device : cfg.worker.device;
  o.host = cfg.worker.host;
  o.gloo_host = cfg.worker.gloo_host;
  if (!cfg.control.worker_secret_key_file.empty()) {
    auto keys = tessera::LoadCurveSecretKeyFile(cfg.control.worker_secret_key_file);
    if (!keys.ok()) {
      std::fprintf(stderr, "tessera-worker: control.worker_secret_key_file: %s\n",
                   keys.status().ToString().c_str());
      return 2;
    }
    o.curve_secret_key = keys->secret_key;
    o.curve_server_key = cfg.control.coordinator_public_key;
  }
  tessera::WorkerDaemon daemon(o);
  tessera::Status s = daemon.Run();
  if (!s.ok()) {
    std::fprintf(stderr, "tessera-worker: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
