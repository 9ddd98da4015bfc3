// Host facts read from Linux's /proc and /sys: memory, CPUs and NUMA nodes,
// NICs (Ethernet, InfiniBand, RoCE), the NUMA node and local CPUs of a PCI
// device, and the PCIe path level between two PCI devices.
//
// Every function takes `root`, the directory that stands for "/" (normally
// "/"; tests point it at a fake tree). Paths read, relative to root:
//   proc/meminfo                       MemTotal
//   proc/cpuinfo                       model name
//   proc/sys/kernel/hostname
//   sys/devices/system/cpu/cpuN/topology/{physical_package_id,core_id}
//   sys/devices/system/node/nodeN/{cpulist,meminfo}
//   sys/class/net/IF/{device,type,speed,operstate}
//   sys/class/infiniband/DEV/{device,ports/P/{rate,link_layer,state}}
//   sys/bus/pci/devices/BUSID -> sys/devices/pciDDDD:BB/.../BUSID
//     with numa_node and local_cpulist
//
// Thread-safety: the functions only read files and may be called
// concurrently.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/base/status.h"
#include "common/topology/report.h"

namespace tessera {

// MemTotal of root/proc/meminfo in bytes. Errors: kIoError / kNotFound naming
// the file when it cannot be read or has no MemTotal line.
StatusOr<int64_t> ReadHostMemoryBytes(const std::string& root);

// root/proc/sys/kernel/hostname without the newline; "" when unreadable.
std::string ReadHostname(const std::string& root);

// Sockets (distinct physical_package_id), cores (distinct package/core_id
// pairs), hardware threads (cpuN directories with a topology), NUMA nodes
// with their cpulist and MemTotal, and the model name. Missing files leave
// fields at 0 / empty.
CpuInfo ReadCpuInfoFromSysfs(const std::string& root);

// The physical NICs: one entry per InfiniBand device (type "infiniband", or
// "roce" when its port's link_layer is Ethernet; speed from the first port's
// rate; netdev the interface under its PCI device) and one per remaining
// interface of sys/class/net that has a PCI `device` (type "ethernet",
// speed from `speed` in Mb/s). Loopback and virtual interfaces (no device)
// are skipped. Sorted by name.
std::vector<NicInfo> ReadNics(const std::string& root);

// The numa_node of PCI device `bus_id` (any spelling CanonicalPciBusId
// accepts); -1 when unknown.
int ReadPciNumaNode(const std::string& root, const std::string& bus_id);
// Its local_cpulist; "" when unknown.
std::string ReadPciLocalCpus(const std::string& root, const std::string& bus_id);

// The `nvidia-smi topo -m` level between PCI devices a and b from their
// paths under sys/devices:
//  - different root complexes (pciDDDD:BB): NODE when both NUMA nodes are
//    known and equal, else SYS;
//  - same root complex, no common PCIe bridge: PHB;
//  - a common bridge with at most one more bridge on each side below it
//    (sibling ports of one switch): PIX, else PXB.
// kUnknown when either path cannot be resolved.
LinkType PciPathLevel(const std::string& root, const std::string& a, const std::string& b);

}  // namespace tessera
