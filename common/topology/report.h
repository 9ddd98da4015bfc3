// TopologyReport: what one host has for serving: its GPUs, how each pair of
// GPUs is linked, its NICs, host memory and CPUs.
//
// A worker fills it by discovery (worker/topology/topology_discovery.h) and sends it as
// JSON at registration; a dry run reads it from a TOML topology file
// (common/topology/topology_file.h, format in docs/topology.md). The coordinator's
// cluster model (coordinator/placement/cluster_model.h) is built from these reports.
//
// Link levels are those of `nvidia-smi topo -m` (NVML's nvmlGpuTopologyLevel_t):
//   NV#   NVLink, # = active links between the pair (directly or through
//         NVSwitch)
//   PIX   at most one PCIe switch between the pair
//   PXB   several PCIe switches, no host bridge
//   PHB   through a PCIe host bridge (the CPU's root complex)
//   NODE  through host bridges of one NUMA node
//   SYS   across NUMA nodes (the socket interconnect: UPI / Infinity Fabric)
//
// Units: memory in bytes, GPU link bandwidth in GB/s (1e9 bytes per second)
// per direction, NIC speed in Gbit/s (1e9 bits per second).
//
// Thread-safety: plain values; the functions are pure.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/base/status.h"

namespace tessera {

enum class LinkType { kSelf, kNvLink, kPix, kPxb, kPhb, kNode, kSys, kUnknown };
// "X", "NV", "PIX", "PXB", "PHB", "NODE", "SYS", "?".
const char* LinkTypeName(LinkType type);
// Parses "PIX", "PXB", "PHB", "NODE", "SYS", "X" (case-insensitive).
// "NV<n>" is parsed by ParseLinkCell. Errors: kInvalidArgument listing the
// accepted names.
StatusOr<LinkType> ParseLinkType(const std::string& name);
// True for the PCIe levels PIX, PXB, PHB, NODE and SYS.
bool IsPcieLevel(LinkType type);

// One NVLink of a GPU as NVML reports it.
struct NvLinkInfo {
  int link = 0;                   // link index on this GPU
  std::string remote_pci_bus_id;  // the device behind the link ("0000:07:00.0")
  std::string remote_type;        // "gpu", "switch" (NVSwitch) or "unknown"
  int version = 0;                // NVLink version as NVML reports it (0: unknown)
};

struct GpuInfo {
  int index = 0;     // NVML / nvidia-smi index on the host
  std::string name;  // "NVIDIA H100 80GB HBM3"
  std::string uuid;  // "GPU-..."
  int64_t memory_total_bytes = 0;
  int64_t memory_free_bytes = 0;  // at discovery time; equal to total in topology files
  int cc_major = 0;               // compute capability, 0.0 when unknown
  int cc_minor = 0;
  int sm_count = 0;                 // streaming multiprocessors, 0 when unknown
  std::string pci_bus_id;           // domain:bus:device.function, "0000:18:00.0"
  int numa_node = -1;               // -1: unknown or single-node host
  std::string cpu_affinity;         // CPUs close to the GPU, as a cpulist ("0-55,112-167")
  int pcie_gen = 0;                 // PCIe link generation (max), 0 when unknown
  int pcie_width = 0;               // PCIe lanes (max), 0 when unknown
  std::vector<NvLinkInfo> nvlinks;  // active NVLinks only
  // NVLink bandwidth of one link, GB/s per direction (0 without NVLink).
  double nvlink_gb_per_s_per_link = 0;
};

// How GPU a reaches GPU b.
struct GpuLink {
  LinkType type = LinkType::kUnknown;
  int nvlink_count = 0;           // links used between the pair when type == kNvLink
  double bandwidth_gb_per_s = 0;  // per direction; 0 on the diagonal
  bool p2p = false;               // CUDA peer access (NVML P2P read status OK)
};

struct NicInfo {
  std::string name;             // the RDMA device ("mlx5_0") or the interface ("eth0")
  std::string netdev;           // the kernel interface, "" when it has none
  std::string type;             // "infiniband", "roce" or "ethernet"
  double speed_gbit_per_s = 0;  // link speed; 0 when down or unknown
  int numa_node = -1;
  std::string pci_bus_id;    // "" for a virtual interface
  std::string cpu_affinity;  // cpulist, "" when unknown
  bool up = false;           // operstate up / IB port ACTIVE
};

struct NumaNodeInfo {
  int id = 0;
  std::string cpus;  // cpulist
  int64_t memory_bytes = 0;
};

struct CpuInfo {
  std::string model;  // "/proc/cpuinfo" model name
  int sockets = 0;
  int cores = 0;  // physical cores
  int pus = 0;    // hardware threads
  std::vector<NumaNodeInfo> numa_nodes;
};

struct TopologyReport {
  std::string hostname;
  // How it was obtained: "nvml" (GPUs found), "cpu-only" (no NVML or no GPU),
  // "file" (a topology file).
  std::string source;
  std::string driver_version;  // NVML's, "" without NVML
  std::string cpu_source;      // "hwloc" or "sysfs"
  int64_t host_memory_bytes = 0;
  CpuInfo cpu;
  std::vector<GpuInfo> gpus;
  // links[a][b] for GPU indices a, b in [0, gpus.size()); links[a][a].type is
  // kSelf. Symmetric.
  std::vector<std::vector<GpuLink>> links;
  // gpu_nic[g][n]: the PCIe level between GPU g and NIC n (sized gpus x nics,
  // or empty when not known).
  std::vector<std::vector<LinkType>> gpu_nic;
  std::vector<NicInfo> nics;
  // What discovery could not find or had to guess ("NVML: ...", "CUDA
  // sees 7 devices, NVML 8"), for the operator.
  std::vector<std::string> notes;
};

// Checks the report's shape: links is gpus x gpus with kSelf on the diagonal
// and nowhere else, symmetric in type and nvlink_count; gpu_nic empty or
// gpus x nics; GPU indices distinct. Errors: kInvalidArgument naming the GPU
// pair or field.
Status ValidateTopologyReport(const TopologyReport& report);

// JSON (the form a worker sends at registration). Keys are the field names
// above; link types are their LinkTypeName spelling.
std::string TopologyReportToJson(const TopologyReport& report, int indent = 2);
// Errors: kInvalidArgument naming `what` (a path or "registration") and the
// key at fault for malformed JSON, a missing key or a wrong type, or as
// ValidateTopologyReport.
StatusOr<TopologyReport> TopologyReportFromJson(const std::string& text, const std::string& what);

// The cell text nvidia-smi prints: "X", "NV18", "PIX", ...
std::string LinkCell(const GpuLink& link);
// Parses a matrix cell: "X", "NV<n>" (n >= 1) or a PCIe level.
// Errors: kInvalidArgument naming the cell.
StatusOr<GpuLink> ParseLinkCell(const std::string& cell);

// A table in the layout of `nvidia-smi topo -m`: one row per GPU and NIC with
// the link level to every GPU and NIC, then CPU and NUMA affinity, a NIC
// legend, and lines for host memory, CPUs and GPU memory.
std::string FormatTopology(const TopologyReport& report);

// Expands a Linux cpulist ("0-3,8,10-11") into CPU ids. Errors:
// kInvalidArgument naming the text.
StatusOr<std::vector<int>> ParseCpuList(const std::string& text);

// Bandwidth of one NVLink, GB/s per direction, by GPU generation (compute
// capability major), as `nvidia-smi nvlink --status` reports it: 6 (P100,
// NVLink 1) 20; 7 (V100, NVLink 2) 25; 8 (A100, NVLink 3) 25; 9 (H100/H200,
// NVLink 4) 26.562; 10 and later (B200, NVLink 5) 50. 0 for < 6.
double NvLinkGbPerSPerLink(int cc_major);
// PCIe bandwidth per direction, GB/s: width x the per-lane rate after line
// coding (gen 1 0.25, gen 2 0.5, gen 3 0.985, gen 4 1.969, gen 5 3.938,
// gen 6 7.877). 0 when gen or width is unknown (0).
double PcieGbPerS(int gen, int width);
// Fills bandwidth_gb_per_s of every off-diagonal link: NVLink:
// nvlink_count x min(per-link bandwidth of the two GPUs, or
// NvLinkGbPerSPerLink(cc_major) when 0); PCIe levels: min over the two GPUs
// of PcieGbPerS(gen, width), `default_pcie_gb_per_s` for a GPU whose PCIe
// link is unknown, halved for SYS (the pair crosses the socket interconnect).
void FillLinkBandwidths(TopologyReport* report, double default_pcie_gb_per_s);

// The canonical spelling of a PCI bus id: lowercase with a 4-digit domain
// ("00000000:18:00.0" from NVML -> "0000:18:00.0"). Returned unchanged when
// it is not of the form domain:bus:device.function.
std::string CanonicalPciBusId(const std::string& id);

}  // namespace tessera
