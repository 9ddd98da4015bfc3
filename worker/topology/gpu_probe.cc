#include "worker/topology/gpu_probe.h"

#include <algorithm>
#include <set>

namespace tessera {

void AssembleGpus(GpuProbe& probe, const PciLevelFn& fallback_level, double default_pcie_gb_per_s,
                  TopologyReport* report) {
  std::vector<int> probe_index;  // report GPU i is probe device probe_index[i]
  const int count = probe.DeviceCount();
  for (int i = 0; i < count; ++i) {
    auto g = probe.Device(i);
    if (!g.ok()) {
      report->notes.push_back("GPU " + std::to_string(i) + " skipped: " + g.status().message());
      continue;
    }
    g->pci_bus_id = CanonicalPciBusId(g->pci_bus_id);
    for (NvLinkInfo& l : g->nvlinks) l.remote_pci_bus_id = CanonicalPciBusId(l.remote_pci_bus_id);
    report->gpus.push_back(std::move(*g));
    probe_index.push_back(i);
  }
  const size_t n = report->gpus.size();
  std::set<std::string> gpu_ids;
  for (const GpuInfo& g : report->gpus) gpu_ids.insert(g.pci_bus_id);
  // Links to NVSwitches: typed "switch", or (older drivers without a type)
  // any remote that is not one of this host's GPUs.
  std::vector<int> switch_links(n, 0);
  for (size_t a = 0; a < n; ++a) {
    for (const NvLinkInfo& l : report->gpus[a].nvlinks) {
      if (l.remote_type == "switch" ||
          (l.remote_type != "gpu" && !gpu_ids.count(l.remote_pci_bus_id)))
        ++switch_links[a];
    }
  }
  report->links.assign(n, std::vector<GpuLink>(n));
  for (size_t a = 0; a < n; ++a) {
    for (size_t b = 0; b < n; ++b) {
      GpuLink& link = report->links[a][b];
      if (a == b) {
        link.type = LinkType::kSelf;
        continue;
      }
      int direct = 0;
      for (const NvLinkInfo& l : report->gpus[a].nvlinks)
        if (l.remote_pci_bus_id == report->gpus[b].pci_bus_id) ++direct;
      if (direct > 0) {
        link.type = LinkType::kNvLink;
        link.nvlink_count = direct;
      } else if (switch_links[a] > 0 && switch_links[b] > 0 &&
                 probe.P2pNvLink(probe_index[a], probe_index[b])) {
        link.type = LinkType::kNvLink;
        link.nvlink_count = std::min(switch_links[a], switch_links[b]);
      } else {
        link.type = probe.CommonAncestor(probe_index[a], probe_index[b]);
        if (link.type == LinkType::kUnknown)
          link.type = fallback_level(report->gpus[a].pci_bus_id, report->gpus[b].pci_bus_id);
      }
      link.p2p = link.type == LinkType::kNvLink || probe.P2pRead(probe_index[a], probe_index[b]);
    }
  }
  // Direct NVLink counts are per side; make the matrix symmetric by taking
  // the smaller count (the links a bonded pair can use).
  for (size_t a = 0; a < n; ++a) {
    for (size_t b = a + 1; b < n; ++b) {
      GpuLink& x = report->links[a][b];
      GpuLink& y = report->links[b][a];
      if (x.type != y.type) {
        // One side saw NVLink, the other not: trust the NVLink side.
        if (y.type == LinkType::kNvLink)
          x = y;
        else if (x.type == LinkType::kNvLink)
          y = x;
        else if (x.type == LinkType::kUnknown)
          x.type = y.type;
        else
          y.type = x.type;
      }
      const int c = std::min(x.nvlink_count, y.nvlink_count);
      if (x.type == LinkType::kNvLink) x.nvlink_count = y.nvlink_count = std::max(c, 1);
      x.p2p = y.p2p = x.p2p && y.p2p;
    }
  }
  FillLinkBandwidths(report, default_pcie_gb_per_s);
}

}  // namespace tessera
