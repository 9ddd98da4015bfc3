// tessera-coordinator: discovers workers, places the model and schedules
// generation. The control plane lands with the daemons issue; this binary
// already reports its version and usage.
#include <CLI/CLI.hpp>
#include <cstdio>

int main(int argc, char** argv) {
  CLI::App app{"tessera-coordinator: places a model on workers and serves it"};
  app.set_version_flag("--version", std::string("tessera-coordinator ") + TESSERA_VERSION);
  std::string config;
  app.add_option("--config", config, "TOML config file");
  CLI11_PARSE(app, argc, argv);
  std::fprintf(stderr, "tessera-coordinator: the control plane is not part of this build yet\n");
  return 2;
}
