#include "support/small_host.h"

#include <vector>

#include "coordinator/control/worker_cluster.h"
#include "coordinator/placement/cluster_model.h"
#include "coordinator/placement/placement_planner.h"

namespace tessera::testing {

TopologyReport SmallHost(int64_t memory_bytes) {
  TopologyReport r;
  r.hostname = "small-box";
  r.source = "cpu-only";
  r.cpu_source = "sysfs";
  r.host_memory_bytes = memory_bytes;
  r.cpu.model = "Test CPU";
  r.cpu.sockets = 1;
  r.cpu.cores = 4;
  r.cpu.pus = 4;
  return r;
}

int64_t MemoryNeedingTwoRanks(const ModelConfig& model, int ranks_per_host, const PlanOptions& o,
                              int hosts) {
  const int ranks = ranks_per_host;
  auto fits = [&](int64_t memory, int tp, int pp) {
    ClusterTopology t;
    t.gpu_specs.push_back(WorkerClusterOptions{}.cpu_rank_spec);
    for (int h = 0; h < hosts; ++h) {
      TopologyReport r = SmallHost(memory);
      if (hosts > 1) r.hostname = "small-box-" + std::to_string(h);
      for (int i = 0; i < ranks; ++i) {
        GpuInfo g;
        g.index = i;
        g.name = "CPU rank (Test CPU)";
        g.memory_total_bytes = g.memory_free_bytes = memory / ranks;
        r.gpus.push_back(g);
      }
      r.links.assign(ranks, std::vector<GpuLink>(ranks));
      for (int a = 0; a < ranks; ++a)
        for (int b = 0; b < ranks; ++b) {
          r.links[a][b].type = a == b ? LinkType::kSelf : LinkType::kNode;
          r.links[a][b].bandwidth_gb_per_s = a == b ? 0 : 2.0;
        }
      t.nodes.push_back(r);
    }
    auto cm = BuildClusterModel(t);
    if (!cm.ok()) return false;
    PlanOptions p = o;
    p.fixed_tp = tp;
    p.fixed_pp = pp;
    PlacementPlanner planner;
    return planner.Plan(model, *cm, p).ok();
  };
  // The smallest memory where some two-rank layout fits; one rank must not fit there.
  for (int64_t m = int64_t{64} << 10; m < (int64_t{1} << 32); m += int64_t{64} << 10) {
    if (fits(m, 1, 2) || fits(m, 2, 1)) return fits(m, 1, 1) ? -1 : m;
  }
  return -1;
}

}  // namespace tessera::testing
