// ClusterTopology: a whole fleet as the planner sees it (one TopologyReport
// per host, the network between hosts, GPU speed overrides), read from a TOML
// topology file for dry runs and tests, or from the JSON a worker's
// `tessera topo --json` prints.
//
// The TOML format is documented in docs/topology.md; configs/topologies/ has
// examples. Repeated hosts and GPUs are written once with `count`; links are
// given as an NVSwitch link count, NVLink groups, or an `nvidia-smi topo -m`
// style matrix.
//
// Thread-safety: plain values; the functions are pure apart from file reads.
#pragma once

#include <string>
#include <vector>

#include "common/base/status.h"
#include "common/topology/gpu_specs.h"
#include "common/topology/report.h"

namespace tessera {

struct NetworkSpec {
  // Bandwidth between two hosts, Gbit/s per direction. 0: the sum of each
  // host's InfiniBand / RoCE NIC speeds (Ethernet when it has none), the
  // smaller host of the pair.
  double inter_node_gbit_per_s = 0;
  // One-way latency of a message between hosts, microseconds.
  double latency_us = 5.0;
};

struct ClusterTopology {
  std::string name;         // "2 x DGX H100"
  std::string description;  // free text
  NetworkSpec network;
  std::vector<GpuSpec> gpu_specs;  // overrides of the built-in GPU table
  std::vector<TopologyReport> nodes;
};

// Parses a TOML topology file's text; `path` names it in errors.
// Errors: kInvalidArgument naming path:line:col and the key for malformed
// TOML, a missing or unknown key, a wrong type, a bad value (count < 1, a
// matrix row of the wrong length or asymmetric, an NVLink group naming a GPU
// that does not exist), or a report that fails ValidateTopologyReport.
StatusOr<ClusterTopology> ParseTopologyToml(const std::string& text, const std::string& path);

// Reads a topology file: `*.json` is one TopologyReport or an array of them
// (the output of `tessera topo --json` on each host); anything else is TOML.
// Errors: kNotFound / kIoError naming the path, else as the parsers.
StatusOr<ClusterTopology> LoadTopologyFile(const std::string& path);

// Writes `topology` as TOML that ParseTopologyToml reads back to an equal
// ClusterTopology: every host and GPU explicit, links as a matrix with their
// bandwidth and P2P flags.
std::string ClusterTopologyToToml(const ClusterTopology& topology);

}  // namespace tessera
