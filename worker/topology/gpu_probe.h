// GpuProbe: the per-GPU and per-pair facts a GPU management library reports,
// behind an interface so the discovery logic that turns them into a link
// matrix (AssembleGpus) runs the same on NVML and on a test's scripted probe.
//
// NvmlProbe (worker/topology/nvml_probe.h) is the real one.
//
// Thread-safety: a probe is used from one thread.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "common/base/status.h"
#include "common/topology/report.h"

namespace tessera {

class GpuProbe {
 public:
  virtual ~GpuProbe() = default;
  virtual std::string DriverVersion() = 0;
  virtual int DeviceCount() = 0;
  // Fills index, name, uuid, memory, compute capability, sm_count (0 when
  // the library does not know it), pci_bus_id, PCIe gen/width, the active
  // NVLinks with their remote PCI id and type, and nvlink_gb_per_s_per_link
  // (0: take NvLinkGbPerSPerLink). Errors: kUnavailable naming the device
  // and the library's message.
  virtual StatusOr<GpuInfo> Device(int index) = 0;
  // The PCIe level between two devices (kPix ... kSys), kUnknown when the
  // library does not report it.
  virtual LinkType CommonAncestor(int a, int b) = 0;
  // Whether CUDA peer reads from a to b work.
  virtual bool P2pRead(int a, int b) = 0;
  // Whether a and b reach each other over NVLink (NVML's P2P NVLINK status).
  // Used to decide NVSwitch-connected pairs.
  virtual bool P2pNvLink(int a, int b) = 0;
};

// Fills report->gpus and report->links from `probe`:
//  - a pair with NVLinks whose remote PCI id is the other GPU is NV<count of
//    those links>;
//  - else, when both have NVLinks to NVSwitches (remote type "switch", or a
//    remote PCI id that is no GPU of this host) and the probe says the pair
//    reaches over NVLink, it is NV<min of the two GPUs' switch links> (as
//    nvidia-smi prints NV18 between every pair of an HGX H100);
//  - else the probe's CommonAncestor level, or `fallback_level(a, b)` when
//    that is kUnknown;
//  - p2p from P2pRead (true for NVLink pairs);
//  - bandwidths by FillLinkBandwidths(report, default_pcie_gb_per_s).
// A device the probe cannot read is skipped with a note in report->notes.
// `fallback_level` takes the two GPUs' PCI bus ids.
using PciLevelFn = std::function<LinkType(const std::string&, const std::string&)>;
void AssembleGpus(GpuProbe& probe, const PciLevelFn& fallback_level, double default_pcie_gb_per_s,
                  TopologyReport* report);

}  // namespace tessera
