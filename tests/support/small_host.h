// A small CPU-only host for the auto-placement tests (parallel.mode = "auto"
// with real daemons): the topology report the workers give through
// worker.topology_file, and the host memory for which the planner needs two
// of its ranks, so the planner's memory limits bite on any machine.
#pragma once

#include <cstdint>

#include "common/format/model_config.h"
#include "common/topology/report.h"
#include "coordinator/placement/planner.h"

namespace tessera::testing {

// A CPU-only host of `memory_bytes` as `tessera topo --json` would print it
// (hostname "small-box", 4 cores).
TopologyReport SmallHost(int64_t memory_bytes);

// The smallest host memory (in 64 KiB steps) for which one CPU rank cannot
// hold `model` with its KV reserve under `o`, but some two-rank layout (tp 2
// or pp 2) can, on the cluster the workers will report: `hosts` hosts (named
// "small-box-<i>" when there are several, as worker.host would) of
// `ranks_per_host` CPU ranks each, the ranks of a host sharing its memory;
// asked of the planner itself. -1 when no memory separates them.
int64_t MemoryNeedingTwoRanks(const ModelConfig& model, int ranks_per_host, const PlanOptions& o,
                              int hosts = 1);

}  // namespace tessera::testing
