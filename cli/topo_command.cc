// `tessera topo`: discovers this host (worker/topology/topology_discovery.h) and
// prints it like `nvidia-smi topo -m`, or as the JSON a worker sends at
// registration (--json), or as a TOML topology file for dry runs (--toml).
#include <cstdio>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "common/topology/topology_file.h"
#include "worker/topology/topology_discovery.h"

namespace tessera::cli {

namespace {

struct TopoArgs {
  bool json = false;
  bool toml = false;
  bool no_nvml = false;
  std::string root = "/";
};

int RunTopo(const TopoArgs& a) {
  DiscoveryOptions o;
  o.use_nvml = !a.no_nvml;
  o.root = a.root;
  auto r = DiscoverTopology(o);
  if (!r.ok()) {
    std::fprintf(stderr, "tessera: error: %s\n", r.status().ToString().c_str());
    return 1;
  }
  std::string out;
  if (a.json) {
    out = TopologyReportToJson(*r) + "\n";
  } else if (a.toml) {
    ClusterTopology c;
    c.name = r->hostname;
    c.description = "discovered by tessera topo";
    c.nodes.push_back(*r);
    out = ClusterTopologyToToml(c);
  } else {
    out = FormatTopology(*r);
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

}  // namespace

Subcommand AddTopoCommand(CLI::App& app) {
  auto args = std::make_shared<TopoArgs>();
  CLI::App* cmd = app.add_subcommand("topo", "show this host's GPUs, GPU links, NICs and memory");
  auto* json =
      cmd->add_flag("--json", args->json, "print the machine-readable report a worker sends");
  cmd->add_flag("--toml", args->toml, "print a TOML topology file of this host (for tessera plan)")
      ->excludes(json);
  cmd->add_flag("--no-nvml", args->no_nvml, "do not load NVML (report CPU-only)");
  cmd->add_option("--root", args->root,
                  "directory standing for / when reading /proc and /sys (tests)")
      ->check(CLI::ExistingDirectory);
  return {cmd, [args] { return RunTopo(*args); }};
}

}  // namespace tessera::cli
