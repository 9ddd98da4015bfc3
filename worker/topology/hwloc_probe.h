// HwlocProbe: CPU facts from hwloc (Debian libhwloc-dev): sockets, cores,
// hardware threads, NUMA nodes with their CPUs and memory, and which CPUs
// are close to a PCI device (a GPU or NIC), on the running host.
//
// Thread-safety: a loaded probe is immutable; its const methods may be
// called concurrently.
#pragma once

#include <memory>
#include <string>

#include "common/base/status.h"
#include "common/topology/report.h"

namespace tessera {

class HwlocProbe {
 public:
  // Loads this host's topology, keeping PCI devices. Errors: kUnavailable
  // with hwloc's errno text when hwloc_topology_load fails.
  static StatusOr<std::unique_ptr<HwlocProbe>> Load();
  ~HwlocProbe();
  HwlocProbe(const HwlocProbe&) = delete;
  HwlocProbe& operator=(const HwlocProbe&) = delete;

  // Packages, cores, PUs, NUMA nodes (os index, cpulist, local memory) and
  // the first package's CPUModel.
  CpuInfo Cpu() const;
  // The cpulist of the CPUs nearest the PCI device `bus_id` (the cpuset of
  // its first non-I/O ancestor); "" when hwloc does not know the device.
  std::string PciLocalCpus(const std::string& bus_id) const;
  // The NUMA node nearest the PCI device; -1 when unknown.
  int PciNumaNode(const std::string& bus_id) const;

 private:
  HwlocProbe() = default;
  void* topology_ = nullptr;  // hwloc_topology_t
};

}  // namespace tessera
