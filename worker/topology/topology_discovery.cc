#include "worker/topology/topology_discovery.h"

#include <memory>

#include "worker/topology/hwloc_probe.h"
#include "worker/topology/nvml_probe.h"
#include "worker/topology/sysfs_topology.h"

namespace tessera {

StatusOr<TopologyReport> DiscoverTopologyWith(GpuProbe* probe, const DiscoveryOptions& o) {
  TopologyReport r;
  r.hostname = ReadHostname(o.root);
  TESSERA_ASSIGN_OR_RETURN(r.host_memory_bytes, ReadHostMemoryBytes(o.root));
  std::unique_ptr<HwlocProbe> hwloc;
  const bool real_root = o.root.empty() || o.root == "/";
  if (o.use_hwloc && real_root) {
    auto h = HwlocProbe::Load();
    if (h.ok()) {
      hwloc = std::move(*h);
    } else {
      r.notes.push_back("hwloc: " + h.status().message() + "; CPU facts from sysfs");
    }
  }
  if (hwloc) {
    r.cpu = hwloc->Cpu();
    r.cpu_source = "hwloc";
    // hwloc reports the package's CPUModel only on some platforms.
    if (r.cpu.model.empty()) r.cpu.model = ReadCpuInfoFromSysfs(o.root).model;
  } else {
    r.cpu = ReadCpuInfoFromSysfs(o.root);
    r.cpu_source = "sysfs";
  }
  r.nics = ReadNics(o.root);
  auto local_cpus = [&](const std::string& bus) {
    std::string s = hwloc ? hwloc->PciLocalCpus(bus) : "";
    return s.empty() ? ReadPciLocalCpus(o.root, bus) : s;
  };
  auto numa_node = [&](const std::string& bus) {
    int n = ReadPciNumaNode(o.root, bus);
    if (n < 0 && hwloc) n = hwloc->PciNumaNode(bus);
    return n;
  };
  for (NicInfo& n : r.nics) {
    if (n.pci_bus_id.empty()) continue;
    if (n.cpu_affinity.empty()) n.cpu_affinity = local_cpus(n.pci_bus_id);
    if (n.numa_node < 0) n.numa_node = numa_node(n.pci_bus_id);
  }
  if (probe) {
    r.source = "nvml";
    r.driver_version = probe->DriverVersion();
    AssembleGpus(
        *probe,
        [&](const std::string& a, const std::string& b) { return PciPathLevel(o.root, a, b); },
        o.default_pcie_gb_per_s, &r);
    for (GpuInfo& g : r.gpus) {
      if (g.pci_bus_id.empty()) continue;
      g.numa_node = numa_node(g.pci_bus_id);
      g.cpu_affinity = local_cpus(g.pci_bus_id);
    }
    if (r.gpus.empty()) {
      r.source = "cpu-only";
      r.notes.push_back("NVML loaded but reports no GPU");
    }
  } else {
    r.source = "cpu-only";
    r.links.clear();
  }
  if (!r.gpus.empty() && !r.nics.empty()) {
    for (const GpuInfo& g : r.gpus) {
      std::vector<LinkType> row;
      for (const NicInfo& n : r.nics) {
        LinkType t = LinkType::kUnknown;
        if (!g.pci_bus_id.empty() && !n.pci_bus_id.empty())
          t = PciPathLevel(o.root, g.pci_bus_id, n.pci_bus_id);
        if (t == LinkType::kUnknown && g.numa_node >= 0 && n.numa_node >= 0)
          t = g.numa_node == n.numa_node ? LinkType::kNode : LinkType::kSys;
        row.push_back(t);
      }
      r.gpu_nic.push_back(row);
    }
  }
  TESSERA_RETURN_IF_ERROR_CTX(ValidateTopologyReport(r), "discovery");
  return r;
}

StatusOr<TopologyReport> DiscoverTopology(const DiscoveryOptions& o) {
  std::unique_ptr<NvmlProbe> nvml;
  std::vector<std::string> notes;
  if (o.use_nvml) {
    auto p = NvmlProbe::Load(o.nvml_library);
    if (p.ok()) {
      nvml = std::move(*p);
    } else {
      notes.push_back(p.status().message());
    }
  } else {
    notes.push_back("NVML not used (--no-nvml)");
  }
  auto r = DiscoverTopologyWith(nvml.get(), o);
  if (!r.ok()) return r;
  if (nvml) notes.insert(notes.end(), nvml->notes().begin(), nvml->notes().end());
  r->notes.insert(r->notes.begin(), notes.begin(), notes.end());
  return r;
}

}  // namespace tessera
