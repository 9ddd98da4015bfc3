// WorkerCluster: the registered workers as the placement planner sees them:
// a ClusterTopology with one TopologyReport per host that holds only the
// devices the workers offer, and which worker runs each of them.
//
// Workers are grouped into hosts by the host name they registered with
// (worker.host, default gethostname()), hosts in order of their first
// worker's registration.
//  - GPU workers (DEVICE_KIND_CUDA): the host's report (Register.
//    topology_json) restricted to the offered GPUs, in device-index order,
//    with their links, PCIe and NIC levels. A worker without a report gets a
//    GPU built from its Device (memory, name) with links of unknown level
//    (treated as SYS), and a note.
//  - CPU workers (DEVICE_KIND_CPU): each is one "CPU rank" device. The ranks
//    of a host share its memory: each gets host memory / ranks on the host.
//    Ranks of one host talk through the kernel's loopback (Gloo over TCP):
//    links of level NODE at `cpu_link_gb_per_s`. Their speed in the cost
//    model is `cpu_rank_spec` (one BLAS thread per rank), added to the
//    topology's GPU spec overrides. Hosts' NICs come from their reports.
// A fleet mixing CPU and GPU workers is refused: one pipeline runs on one
// backend.
//
// Thread-safety: pure function over values.
#pragma once

#include <string>
#include <vector>

#include "common/base/status.h"
#include "common/topology/topology_file.h"
#include "coordinator/control/control_server.h"

namespace tessera {

struct WorkerClusterOptions {
  // A CPU rank in the cost model: memory bandwidth one core streams weights
  // at (GB/s) and the fp32 TFLOP/s one core reaches in GEMMs. Rough
  // figures for a current x86 core; they only rank layouts against each
  // other on the same CPUs.
  GpuSpec cpu_rank_spec = {"CPU rank", 10.0, 0.05};
  // Gloo over loopback TCP between the CPU ranks of one host, GB/s.
  double cpu_link_gb_per_s = 2.0;
};

struct WorkerCluster {
  ClusterTopology topology;                       // nodes[n].gpus[g] is the device of workers[n][g]
  std::vector<std::vector<std::string>> workers;  // worker id per (host, device)
  bool cpu = false;                               // every worker is a CPU rank
  std::vector<std::string> notes;                 // assumptions made
};

// Errors: kInvalidArgument when `workers` is empty, mixes CPU and GPU
// workers, two workers of one host offer the same GPU, a worker offers a
// GPU its host's report lacks, or a report does not parse (naming the
// worker).
StatusOr<WorkerCluster> BuildWorkerCluster(const std::vector<ControlWorkerInfo>& workers,
                                           const WorkerClusterOptions& options = {});

}  // namespace tessera
