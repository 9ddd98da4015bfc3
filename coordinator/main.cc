// tessera-coordinator: discovers workers, places the model on them and serves
// the OpenAI-compatible API. Stops cleanly on SIGINT or SIGTERM.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <csignal>
#include <cstdio>

#include "common/base/logging.h"
#include "coordinator/coordinator_daemon.h"

namespace {
volatile std::sig_atomic_t g_stop = 0;
void OnSignal(int) { g_stop = 1; }
}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"tessera-coordinator: places a model on workers and serves it"};
  app.set_version_flag("--version", std::string("tessera-coordinator ") + TESSERA_VERSION);
  std::string config_path;
  std::vector<std::string> overrides;
  app.add_option("--config", config_path, "TOML config file")->required()->check(CLI::ExistingFile);
  app.add_option("--set", overrides, "override a config key, e.g. --set scheduler.queue_limit=64");
  std::string log_format;
  std::string ports_file;
  app.add_option("--ports-file", ports_file,
                 "once every listener is bound, write their ports to this file as JSON "
                 "{\"api\":N,\"admin\":N,\"control\":N,\"store\":N} (atomically, by rename); "
                 "for port 0 in the config");
  app.add_option("--log-format", log_format, "log lines as text or json (logging.format)")
      ->check(CLI::IsMember({"text", "json"}));
  CLI11_PARSE(app, argc, argv);
  auto cfg = tessera::LoadDaemonConfig(config_path);
  if (!cfg.ok()) {
    std::fprintf(stderr, "tessera-coordinator: %s\n", cfg.status().ToString().c_str());
    return 2;
  }
  if (tessera::Status s = tessera::ApplyOverrides(*cfg, overrides); !s.ok()) {
    std::fprintf(stderr, "tessera-coordinator: %s\n", s.ToString().c_str());
    return 2;
  }
  tessera::SetLogLevel(cfg->logging.level);
  tessera::SetLogJson(log_format.empty() ? cfg->logging.format == tessera::LogFormat::kJson
                                         : log_format == "json");
  {
    char host[256] = {0};
    gethostname(host, sizeof host - 1);
    tessera::SetLogNode(host);
  }
  tessera::CoordinatorDaemon daemon(*cfg);
  if (tessera::Status s = daemon.Start(); !s.ok()) {
    std::fprintf(stderr, "tessera-coordinator: %s\n", s.ToString().c_str());
    return 1;
  }
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  if (!ports_file.empty()) {
    if (tessera::Status s = tessera::WritePortsFile(ports_file, daemon.ports()); !s.ok()) {
      std::fprintf(stderr, "tessera-coordinator: %s\n", s.ToString().c_str());
      daemon.Stop();
      return 1;
    }
  }
  while (!g_stop) pause();
  daemon.Stop();
  return 0;
}
