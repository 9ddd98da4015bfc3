// Topology discovery on a fake /proc + /sys tree (NICs, memory, CPUs, PCIe
// path levels, NUMA nodes) with scripted GPU probes standing in for NVML
// (direct NVLink pairs, NVSwitch hosts), discovery on this machine (no
// NVML: CPU-only; hwloc against sysfs), and `tessera topo` on the fake tree.
#include "worker/topology/topology_discovery.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "support/test_util.h"
#include "worker/topology/hwloc_probe.h"
#include "worker/topology/sysfs_topology.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

void Write(const std::string& path, const std::string& text) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path) << text;
}

// Builds a host of two sockets x 2 cores x 2 threads, 8 GiB per NUMA node,
// and this PCI tree:
//   pci0000:00 - 00:01.0 (root port) - 01:00.0 (switch up)
//                  - 02:00.0 - 03:00.0  GPU A
//                  - 02:01.0 - 04:00.0  GPU B          (A-B: PIX)
//                  - 02:02.0 - 05:00.0  mlx5_0 (IB 400, netdev ib0)
//                  - 02:03.0 - 07:00.0 - 08:00.0 - 09:00.0  GPU D  (A-D: PXB)
//              - 00:02.0 - 06:00.0      GPU C          (A-C: PHB)
//              - 00:03.0                eth0 (25 GbE)
//   pci0000:80 - 80:01.0 - 81:00.0      GPU E (NUMA 1) (A-E: SYS)
//                        - 81:00.1      mlx5_1 (RoCE 100, netdev ens1)
// plus veth0 (virtual, no device) and lo.
std::string FakeRoot() {
  const std::string root = ::tessera::testing::MakeTempDir("fake-sysfs");
  Write(root + "/proc/meminfo", "MemTotal:       16777216 kB\nMemFree:         1000 kB\n");
  Write(root + "/proc/cpuinfo", "processor\t: 0\nmodel name\t: Fake CPU 9000\n");
  Write(root + "/proc/sys/kernel/hostname", "fakehost\n");
  for (int c = 0; c < 8; ++c) {
    const std::string d = root + "/sys/devices/system/cpu/cpu" + std::to_string(c) + "/topology/";
    Write(d + "physical_package_id", std::to_string(c / 4) + "\n");
    Write(d + "core_id", std::to_string((c % 4) / 2) + "\n");
  }
  Write(root + "/sys/devices/system/cpu/online", "0-7\n");
  for (int n = 0; n < 2; ++n) {
    const std::string d = root + "/sys/devices/system/node/node" + std::to_string(n) + "/";
    Write(d + "cpulist", n == 0 ? "0-3\n" : "4-7\n");
    Write(d + "meminfo", "Node " + std::to_string(n) + " MemTotal:       8388608 kB\n");
  }
  const std::string dev = root + "/sys/devices/";
  const std::map<std::string, std::string> devices = {
      {"0000:03:00.0", "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0/0000:03:00.0"},
      {"0000:04:00.0", "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:01.0/0000:04:00.0"},
      {"0000:05:00.0", "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:02.0/0000:05:00.0"},
      {"0000:09:00.0",
       "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:03.0/0000:07:00.0/0000:08:00.0/0000:09:00.0"},
      {"0000:06:00.0", "pci0000:00/0000:00:02.0/0000:06:00.0"},
      {"0000:00:03.0", "pci0000:00/0000:00:03.0"},
      {"0000:81:00.0", "pci0000:80/0000:80:01.0/0000:81:00.0"},
      {"0000:81:00.1", "pci0000:80/0000:80:01.0/0000:81:00.1"},
  };
  fs::create_directories(root + "/sys/bus/pci/devices");
  for (const auto& [id, path] : devices) {
    const bool far = id.rfind("0000:8", 0) == 0;
    Write(dev + path + "/numa_node", far ? "1\n" : "0\n");
    Write(dev + path + "/local_cpulist", far ? "4-7\n" : "0-3\n");
    fs::create_directory_symlink(dev + path, root + "/sys/bus/pci/devices/" + id);
  }
  // InfiniBand device with its IPoIB netdev, and a RoCE device.
  auto ib = [&](const std::string& name, const std::string& id, const std::string& netdev,
                const std::string& rate, const std::string& layer) {
    const std::string d = root + "/sys/class/infiniband/" + name;
    fs::create_directories(d + "/ports/1");
    fs::create_directory_symlink(dev + devices.at(id), d + "/device");
    Write(dev + devices.at(id) + "/net/" + netdev + "/type", "32\n");
    Write(d + "/ports/1/rate", rate + "\n");
    Write(d + "/ports/1/link_layer", layer + "\n");
    Write(d + "/ports/1/state", "4: ACTIVE\n");
    fs::create_directories(root + "/sys/class/net/" + netdev);
    fs::create_directory_symlink(dev + devices.at(id),
                                 root + "/sys/class/net/" + netdev + "/device");
  };
  ib("mlx5_0", "0000:05:00.0", "ib0", "400 Gb/sec (4X NDR)", "InfiniBand");
  ib("mlx5_1", "0000:81:00.1", "ens1", "100 Gb/sec (4X EDR)", "Ethernet");
  fs::create_directories(root + "/sys/class/net/eth0");
  fs::create_directory_symlink(dev + devices.at("0000:00:03.0"),
                               root + "/sys/class/net/eth0/device");
  Write(root + "/sys/class/net/eth0/type", "1\n");
  Write(root + "/sys/class/net/eth0/speed", "25000\n");
  Write(root + "/sys/class/net/eth0/operstate", "up\n");
  Write(root + "/sys/class/net/veth0/type", "1\n");
  Write(root + "/sys/class/net/lo/type", "772\n");
  return root;
}

// A scripted GPU probe: what NVML would answer for the GPUs at `bus_ids`.
class ScriptedProbe : public GpuProbe {
 public:
  std::vector<GpuInfo> gpus;
  std::map<std::pair<int, int>, LinkType> ancestor;  // unknown when absent
  bool nvlink_p2p = true;

  std::string DriverVersion() override { return "999.1"; }
  int DeviceCount() override { return static_cast<int>(gpus.size()); }
  StatusOr<GpuInfo> Device(int i) override {
    if (gpus[i].name.empty()) return Unavailable("GPU " + std::to_string(i) + " is lost");
    return gpus[i];
  }
  LinkType CommonAncestor(int a, int b) override {
    auto it = ancestor.find({std::min(a, b), std::max(a, b)});
    return it == ancestor.end() ? LinkType::kUnknown : it->second;
  }
  bool P2pRead(int, int) override { return true; }
  bool P2pNvLink(int, int) override { return nvlink_p2p; }

  void Add(const std::string& bus) {
    GpuInfo g;
    g.index = static_cast<int>(gpus.size());
    g.name = "NVIDIA H100 80GB HBM3";
    g.uuid = "GPU-" + std::to_string(g.index);
    g.memory_total_bytes = 85520809984;
    g.memory_free_bytes = 84000000000;
    g.cc_major = 9;
    g.sm_count = 132;
    g.pci_bus_id = "0000" + bus;  // NVML's 8-digit domain
    g.pcie_gen = 5;
    g.pcie_width = 16;
    gpus.push_back(g);
  }
  void Link(int a, int b, int n) {
    for (int i = 0; i < n; ++i) {
      gpus[a].nvlinks.push_back(
          {static_cast<int>(gpus[a].nvlinks.size()), gpus[b].pci_bus_id, "gpu", 4});
      gpus[b].nvlinks.push_back(
          {static_cast<int>(gpus[b].nvlinks.size()), gpus[a].pci_bus_id, "gpu", 4});
    }
  }
};

TEST(Sysfs, HostMemoryCpusAndNics) {
  const std::string root = FakeRoot();
  EXPECT_EQ(ReadHostMemoryBytes(root).value(), 16777216LL * 1024);
  EXPECT_EQ(ReadHostname(root), "fakehost");
  const CpuInfo cpu = ReadCpuInfoFromSysfs(root);
  EXPECT_EQ(cpu.model, "Fake CPU 9000");
  EXPECT_EQ(cpu.sockets, 2);
  EXPECT_EQ(cpu.cores, 4);
  EXPECT_EQ(cpu.pus, 8);
  ASSERT_EQ(cpu.numa_nodes.size(), 2u);
  EXPECT_EQ(cpu.numa_nodes[1].cpus, "4-7");
  EXPECT_EQ(cpu.numa_nodes[1].memory_bytes, 8388608LL * 1024);

  const std::vector<NicInfo> nics = ReadNics(root);
  ASSERT_EQ(nics.size(),
            3u);  // eth0, mlx5_0, mlx5_1; ib0/ens1 belong to the RDMA devices; veth0, lo skipped
  EXPECT_EQ(nics[0].name, "eth0");
  EXPECT_EQ(nics[0].type, "ethernet");
  EXPECT_DOUBLE_EQ(nics[0].speed_gbit_per_s, 25);
  EXPECT_TRUE(nics[0].up);
  EXPECT_EQ(nics[0].pci_bus_id, "0000:00:03.0");
  EXPECT_EQ(nics[1].name, "mlx5_0");
  EXPECT_EQ(nics[1].type, "infiniband");
  EXPECT_EQ(nics[1].netdev, "ib0");
  EXPECT_DOUBLE_EQ(nics[1].speed_gbit_per_s, 400);
  EXPECT_EQ(nics[1].numa_node, 0);
  EXPECT_EQ(nics[2].type, "roce");
  EXPECT_EQ(nics[2].netdev, "ens1");
  EXPECT_EQ(nics[2].numa_node, 1);
  EXPECT_EQ(nics[2].cpu_affinity, "4-7");

  EXPECT_EQ(ReadHostMemoryBytes(root + "/nowhere").status().code(), StatusCode::kIoError);
  EXPECT_TRUE(ReadNics(root + "/nowhere").empty());
}

TEST(Sysfs, PciPathLevels) {
  const std::string root = FakeRoot();
  EXPECT_EQ(PciPathLevel(root, "0000:03:00.0", "0000:04:00.0"), LinkType::kPix);
  EXPECT_EQ(PciPathLevel(root, "00000000:03:00.0", "0000:05:00.0"),
            LinkType::kPix);  // NVML spelling
  EXPECT_EQ(PciPathLevel(root, "0000:03:00.0", "0000:09:00.0"), LinkType::kPxb);
  EXPECT_EQ(PciPathLevel(root, "0000:03:00.0", "0000:06:00.0"), LinkType::kPhb);
  EXPECT_EQ(PciPathLevel(root, "0000:03:00.0", "0000:81:00.0"), LinkType::kSys);
  EXPECT_EQ(PciPathLevel(root, "0000:81:00.0", "0000:81:00.1"), LinkType::kPix);
  EXPECT_EQ(PciPathLevel(root, "0000:03:00.0", "0000:ff:00.0"), LinkType::kUnknown);
  EXPECT_EQ(ReadPciNumaNode(root, "0000:81:00.0"), 1);
  EXPECT_EQ(ReadPciNumaNode(root, "0000:ff:00.0"), -1);
  EXPECT_EQ(ReadPciLocalCpus(root, "0000:03:00.0"), "0-3");
}

TEST(Discovery, DirectNvlinkPairAndPcieLevelsFromSysfs) {
  const std::string root = FakeRoot();
  ScriptedProbe probe;
  for (const char* bus : {":03:00.0", ":04:00.0", ":06:00.0", ":81:00.0", ":09:00.0"})
    probe.Add(bus);
  probe.Link(0, 1, 4);                      // an NVLink bridge: NV4
  probe.ancestor[{2, 3}] = LinkType::kSys;  // NVML answers this pair; sysfs the rest
  DiscoveryOptions o;
  o.root = root;
  auto r = DiscoverTopologyWith(&probe, o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->source, "nvml");
  EXPECT_EQ(r->cpu_source, "sysfs");
  EXPECT_EQ(r->hostname, "fakehost");
  EXPECT_EQ(r->driver_version, "999.1");
  ASSERT_EQ(r->gpus.size(), 5u);
  EXPECT_EQ(r->gpus[0].pci_bus_id, "0000:03:00.0");
  EXPECT_EQ(r->gpus[3].numa_node, 1);
  EXPECT_EQ(r->gpus[3].cpu_affinity, "4-7");
  auto cell = [&](int a, int b) { return LinkCell(r->links[a][b]); };
  EXPECT_EQ(cell(0, 1), "NV4");
  EXPECT_EQ(cell(1, 0), "NV4");
  EXPECT_NEAR(r->links[0][1].bandwidth_gb_per_s, 4 * 26.562, 1e-9);
  EXPECT_EQ(cell(0, 2), "PHB");
  EXPECT_EQ(cell(0, 3), "SYS");
  EXPECT_EQ(cell(2, 3), "SYS");
  EXPECT_EQ(cell(0, 4), "PXB");
  EXPECT_EQ(cell(1, 4), "PXB");
  EXPECT_EQ(cell(3, 3), "X");
  // GPU-NIC levels: GPU0 shares the switch with mlx5_0; GPU3 sits beside mlx5_1.
  ASSERT_EQ(r->nics.size(), 3u);
  EXPECT_EQ(r->gpu_nic[0][1], LinkType::kPix);
  EXPECT_EQ(r->gpu_nic[3][2], LinkType::kPix);
  EXPECT_EQ(r->gpu_nic[3][1], LinkType::kSys);
  EXPECT_TRUE(ValidateTopologyReport(*r).ok());
  const std::string text = FormatTopology(*r);
  EXPECT_THAT(text, HasSubstr("GPU0    X       NV4     PHB     SYS     PXB"));
}

TEST(Discovery, NvswitchHostIsNvEverywhere) {
  const std::string root = FakeRoot();
  ScriptedProbe probe;
  for (const char* bus : {":03:00.0", ":04:00.0", ":06:00.0", ":81:00.0"}) probe.Add(bus);
  // 18 links per GPU, each to one of 4 NVSwitches (remote PCI ids of the
  // switches, typed "switch"), as on an HGX H100.
  for (auto& g : probe.gpus)
    for (int l = 0; l < 18; ++l)
      g.nvlinks.push_back({l, "0000:c" + std::to_string(l % 4) + ":00.0", "switch", 4});
  probe.gpus[2].nvlinks.resize(12);  // a GPU with 6 links down
  DiscoveryOptions o;
  o.root = root;
  auto r = DiscoverTopologyWith(&probe, o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(LinkCell(r->links[0][1]), "NV18");
  EXPECT_EQ(LinkCell(r->links[0][3]), "NV18");
  EXPECT_EQ(LinkCell(r->links[2][0]), "NV12");
  // Without NVLink P2P the switch links do not make a pair NVLink.
  probe.nvlink_p2p = false;
  auto r2 = DiscoverTopologyWith(&probe, o);
  ASSERT_TRUE(r2.ok());
  EXPECT_EQ(LinkCell(r2->links[0][1]), "PIX");
  // A GPU the probe cannot read is left out with a note.
  probe.gpus[1].name.clear();
  auto r3 = DiscoverTopologyWith(&probe, o);
  ASSERT_TRUE(r3.ok());
  EXPECT_EQ(r3->gpus.size(), 3u);
  EXPECT_THAT(r3->notes.back(), HasSubstr("GPU 1 skipped: GPU 1 is lost"));
}

TEST(Discovery, WithoutNvmlTheHostIsCpuOnly) {
  const std::string root = FakeRoot();
  DiscoveryOptions o;
  o.root = root;
  o.nvml_library = "libtessera-no-such-nvml.so.1";
  auto r = DiscoverTopology(o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->source, "cpu-only");
  EXPECT_TRUE(r->gpus.empty());
  EXPECT_TRUE(r->links.empty());
  ASSERT_FALSE(r->notes.empty());
  EXPECT_THAT(r->notes[0], HasSubstr("NVML: cannot load libtessera-no-such-nvml.so.1"));
  EXPECT_EQ(r->nics.size(), 3u);
  EXPECT_EQ(r->cpu.pus, 8);
}

TEST(Discovery, ThisMachineHwlocAgreesWithSysfs) {
  // This host through the real paths: hwloc and /sys must agree on sockets
  // and NUMA nodes, and discovery must produce a valid report whatever NVML
  // finds here.
  auto h = HwlocProbe::Load();
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  const CpuInfo hw = (*h)->Cpu();
  const CpuInfo sys = ReadCpuInfoFromSysfs("/");
  EXPECT_GE(hw.pus, 1);
  EXPECT_GE(hw.cores, 1);
  EXPECT_LE(hw.cores, hw.pus);
  EXPECT_EQ(hw.sockets, sys.sockets);
  EXPECT_LE(hw.pus, sys.pus);  // hwloc sees the CPUs this process may use
  EXPECT_EQ(hw.numa_nodes.size(), std::max<size_t>(1, sys.numa_nodes.size()));
  auto r = DiscoverTopology();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->cpu_source, "hwloc");
  EXPECT_GT(r->host_memory_bytes, 0);
  EXPECT_TRUE(ValidateTopologyReport(*r).ok());
  if (r->gpus.empty()) {
    EXPECT_EQ(r->source, "cpu-only");
  }
}

TEST(Discovery, TopoCommandPrintsJsonAndTable) {
  const std::string root = FakeRoot();
  const std::string out = ::tessera::testing::MakeTempDir("topo-cli");
  const std::string bin = ::tessera::testing::BinaryDir() + "/tessera topo --root " + root;
  ASSERT_EQ(std::system((bin + " --json > " + out + "/json 2>&1").c_str()), 0)
      << ::tessera::testing::ReadFileOrDie(out + "/json");
  auto r = TopologyReportFromJson(::tessera::testing::ReadFileOrDie(out + "/json"), "topo --json");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->hostname, "fakehost");
  EXPECT_EQ(r->nics.size(), 3u);
  EXPECT_EQ(r->host_memory_bytes, 16777216LL * 1024);
  ASSERT_EQ(std::system((bin + " --no-nvml > " + out + "/text 2>&1").c_str()), 0);
  const std::string text = ::tessera::testing::ReadFileOrDie(out + "/text");
  EXPECT_THAT(text, HasSubstr("NIC1: mlx5_0 (ib0)  infiniband  400 Gb/s  up  NUMA 0"));
  EXPECT_THAT(text, HasSubstr("no GPUs (CPU-only)"));
  EXPECT_THAT(text, HasSubstr("CPU: Fake CPU 9000, 2 socket(s), 4 cores, 8 threads (sysfs)"));
  ASSERT_EQ(std::system((bin + " --no-nvml --toml > " + out + "/toml 2>&1").c_str()), 0);
  EXPECT_THAT(::tessera::testing::ReadFileOrDie(out + "/toml"),
              HasSubstr("hostname = \"fakehost\""));
}

}  // namespace
}  // namespace tessera
