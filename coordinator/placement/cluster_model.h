// ClusterModel: the fleet as the placement planner reasons about it, built
// from the hosts' TopologyReports (discovered, or read from a topology file).
//
// Per host: its GPUs with their memory and speed (GpuSpec by model name,
// overridable), the pairwise link level and bandwidth, NVLink islands and
// PCIe groups, and its network bandwidth. Hosts with the same shape share a
// class (the planner chooses one tp per class).
//
//  - NVLink islands: a partition of the host's GPUs into cliques of the
//    NVLink graph (every pair in an island is NVLink-connected), taken
//    greedily largest first (ties: the clique with the smallest GPU indices).
//    An NVSwitch host is one island of all its GPUs; NVLink-bridge pairs are
//    2-GPU islands; a GPU without NVLink is an island of one.
//  - PCIe groups: connected components of the graph whose edges are pairs at
//    PIX or PXB (behind a common PCIe switch).
//  - Network: the sum of the host's InfiniBand / RoCE NIC speeds (Ethernet
//    when it has none; 10 Gbit/s assumed, with a note, when it has no NIC),
//    or NetworkSpec.inter_node_gbit_per_s when set. A pipeline hop between
//    hosts uses one NIC: the fastest one, or the override.
//
// Thread-safety: immutable after BuildClusterModel; const access from any
// thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/base/status.h"
#include "common/topology/gpu_specs.h"
#include "common/topology/report.h"
#include "common/topology/topology_file.h"

namespace tessera {

struct ClusterGpu {
  int local = 0;             // index into the host's TopologyReport::gpus
  std::string name;          // NVML name
  GpuSpec spec;              // HBM bandwidth and bf16 TFLOP/s used by the cost model
  bool spec_known = true;    // false: FallbackGpuSpec was used
  int64_t memory_bytes = 0;  // total
  int64_t free_bytes = 0;    // free at discovery (total for topology files)
};

struct ClusterNode {
  std::string hostname;
  std::vector<ClusterGpu> gpus;
  // level[a][b] and bandwidth (bytes/s per direction) between local GPUs.
  std::vector<std::vector<GpuLink>> links;
  std::vector<std::vector<int>> nvlink_islands;  // largest first; singletons last
  std::vector<std::vector<int>> pcie_groups;
  double network_bytes_per_s = 0;  // all NICs together, per direction
  double hop_bytes_per_s = 0;      // one pipeline hop leaving the host
  int class_id = 0;                // same class: interchangeable (equal in every field above)
  int shape_id = 0;  // same shape: equal but for free memory; the planner picks one tp per shape
};

struct ClusterModel {
  std::string name;
  std::vector<ClusterNode> nodes;
  double network_latency_s = 5e-6;
  // Representative node of each class (class_id indexes this).
  std::vector<int> class_nodes;
  // Representative node of each shape (shape_id indexes this).
  std::vector<int> shape_nodes;
  // Assumptions made while building (unknown GPU models, missing NICs).
  std::vector<std::string> notes;

  int num_classes() const { return static_cast<int>(class_nodes.size()); }
  int num_shapes() const { return static_cast<int>(shape_nodes.size()); }
  int total_gpus() const;
  // Bandwidth of a pipeline hop from node a to node b, bytes/s.
  double HopBytesPerS(int a, int b) const;
  // One paragraph per class: hosts, GPU model, memory, relative speed,
  // islands, network.
  std::string Describe() const;
};

// Builds the model. `topology.gpu_specs` override the built-in GPU table.
// Errors: kInvalidArgument naming the host when a report fails
// ValidateTopologyReport or the topology has no GPU at all.
StatusOr<ClusterModel> BuildClusterModel(const ClusterTopology& topology);

// Partition of GPUs 0..n-1 into cliques of `adjacent` (adjacent[a][b] true
// for connected pairs), greedily largest first as described above; each
// clique sorted ascending.
std::vector<std::vector<int>> GreedyCliquePartition(const std::vector<std::vector<bool>>& adjacent);

}  // namespace tessera
