// PlacementPlanner: the topology-aware Planner.
//
// Search (docs/planner.md has the details and an example explanation):
//  1. For every host shape (hosts equal but for free memory) and every tp
//     from 1 to its GPU count (and whole multiples of it when
//     allow_cross_node_tp): tp must pass ParallelConfig's rules (it divides
//     the attention heads and the intermediate size; it divides the KV heads
//     or is a multiple of them) and form groups of tp GPUs inside NVLink
//     islands, or, when allow_pcie_tp, over the PCIe fabric of one host.
//     Each group becomes a stage slot; invalid tps are recorded as rejected.
//  2. Every assignment of one valid tp per shape (a shape may be left
//     unused when there are several), every pp from 1 to min(layers,
//     slots, max_pp), and two host orders when several shapes are used:
//     grouped (all hosts of a shape together) and interleaved (round robin
//     over shapes). Slots are laid out host by host in that order and cut
//     into replicas of pp consecutive slots, so a replica's stages share a
//     host wherever they can and cross the network once per host boundary.
//  3. Each replica splits its layers by memory and speed: every stage gets
//     one layer, then each further layer goes to the stage where it costs
//     least (throughput: the smallest resulting stage time, balancing the
//     pipeline; latency: the smallest per-layer time, then the least loaded)
//     among the stages that still fit weights + the KV reserve
//     (min_kv_tokens) + activations in gpu_memory_fraction of their memory.
//     The first stage holds the embedding, the last the final norm and
//     lm_head. A replica that cannot fit is left idle.
//  4. The cost model (coordinator/placement/cost_model.h) predicts each replica's
//     decode latency and throughput; candidates are ranked by the objective
//     (latency: slowest replica's latency, then throughput; throughput:
//     total tokens/s, then latency), ties going to fewer stages.
// Replicas with the same stage shapes are evaluated once, so a 1024-host
// cluster plans in well under a second.
//
// Thread-safety: stateless; Plan may be called concurrently.
#pragma once

#include "coordinator/placement/planner.h"

namespace tessera {

class PlacementPlanner : public Planner {
 public:
  StatusOr<PlanResult> Plan(const ModelConfig& model, const ClusterModel& cluster,
                            const PlanOptions& options) override;
};

}  // namespace tessera
