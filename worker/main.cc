// tessera-worker: one per GPU (or CPU rank). Joins a coordinator, loads its
// shard and runs its pipeline stage. The control plane lands with the daemons
// issue; this binary already reports its version and usage.
#include <CLI/CLI.hpp>
#include <cstdio>

int main(int argc, char** argv) {
  CLI::App app{"tessera-worker: runs one rank of a Tessera deployment"};
  app.set_version_flag("--version", std::string("tessera-worker ") + TESSERA_VERSION);
  std::string coordinator;
  int device = 0;
  app.add_option("--coordinator", coordinator, "coordinator control-plane address (tcp://host:port)");
  app.add_option("--device", device, "device index on this host")->check(CLI::NonNegativeNumber);
  CLI11_PARSE(app, argc, argv);
  std::fprintf(stderr, "tessera-worker: the control plane is not part of this build yet\n");
  return 2;
}
