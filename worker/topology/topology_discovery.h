// Topology discovery: builds this host's TopologyReport (common/topology/report.h)
// from NVML (GPUs, NVLinks, PCIe levels, P2P), hwloc (sockets, cores, NUMA
// nodes, CPU locality of GPUs and NICs) and sysfs (NICs, host memory, PCI
// NUMA nodes and the PCIe path level between a GPU and a NIC).
//
// Without NVML (no driver, or dlopen fails) or without GPUs the report is
// CPU-only (source "cpu-only", a note says why). Without hwloc (or with a
// `root` other than "/", which hwloc cannot read) CPU facts come from sysfs.
//
// Thread-safety: DiscoverTopology may be called from any thread; it only
// reads system state.
#pragma once

#include <string>

#include "common/base/status.h"
#include "common/topology/report.h"
#include "worker/topology/gpu_probe.h"

namespace tessera {

struct DiscoveryOptions {
  std::string root = "/";  // stands for "/" when reading /proc and /sys
  bool use_nvml = true;
  bool use_hwloc = true;  // only when root is "/"
  std::string nvml_library = "libnvidia-ml.so.1";
  // PCIe bandwidth assumed for a GPU whose link NVML does not report, GB/s.
  double default_pcie_gb_per_s = 25.0;
};

// Discovers this host. Errors: kIoError when root/proc/meminfo cannot be
// read (the host's memory is the one fact a report cannot do without).
StatusOr<TopologyReport> DiscoverTopology(const DiscoveryOptions& options = {});

// The same with GPUs from `probe` instead of NVML (nullptr: CPU-only).
StatusOr<TopologyReport> DiscoverTopologyWith(GpuProbe* probe, const DiscoveryOptions& options);

}  // namespace tessera
