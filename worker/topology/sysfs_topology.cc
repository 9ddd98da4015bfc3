#include "worker/topology/sysfs_topology.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

namespace tessera {

namespace fs = std::filesystem;

namespace {

std::string Join(const std::string& root, const std::string& rel) {
  if (root.empty() || root == "/") return "/" + rel;
  return (root.back() == '/' ? root : root + "/") + rel;
}

// The file's first line without trailing whitespace; false when unreadable.
bool ReadLine(const std::string& path, std::string* out) {
  std::ifstream in(path);
  if (!in) return false;
  std::string line;
  if (!std::getline(in, line) && line.empty()) return false;
  while (!line.empty() && std::isspace(static_cast<unsigned char>(line.back()))) line.pop_back();
  *out = line;
  return true;
}

bool ReadInt(const std::string& path, long long* out) {
  std::string s;
  if (!ReadLine(path, &s)) return false;
  char* end = nullptr;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (end == s.c_str()) return false;
  *out = v;
  return true;
}

std::vector<std::string> ListDir(const std::string& path) {
  std::vector<std::string> out;
  std::error_code ec;
  for (fs::directory_iterator it(path, ec), end; !ec && it != end; it.increment(ec))
    out.push_back(it->path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

// "cpu12" -> 12 for prefix "cpu"; -1 when the name is not prefix + digits.
int NumberedEntry(const std::string& name, const std::string& prefix) {
  if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) return -1;
  int v = 0;
  for (size_t i = prefix.size(); i < name.size(); ++i) {
    if (!std::isdigit(static_cast<unsigned char>(name[i]))) return -1;
    v = v * 10 + (name[i] - '0');
  }
  return v;
}

std::string PciDevicePath(const std::string& root, const std::string& bus_id) {
  return Join(root, "sys/bus/pci/devices/" + CanonicalPciBusId(bus_id));
}

// Basename of the resolved `link` (a PCI device path), "" when it does not
// resolve.
std::string ResolvedBusId(const std::string& link) {
  std::error_code ec;
  const fs::path p = fs::canonical(link, ec);
  if (ec) return "";
  return p.filename().string();
}

// The components under sys/devices of the PCI device: ["pci0000:00",
// "0000:00:01.0", ..., "<bus_id>"]; empty when not resolvable.
std::vector<std::string> PciPath(const std::string& root, const std::string& bus_id) {
  std::error_code ec;
  const fs::path p = fs::canonical(PciDevicePath(root, bus_id), ec);
  if (ec) return {};
  const std::string s = p.string();
  const std::string marker = "/sys/devices/";
  const size_t at = s.rfind(marker);
  if (at == std::string::npos) return {};
  std::vector<std::string> parts;
  std::stringstream ss(s.substr(at + marker.size()));
  std::string part;
  while (std::getline(ss, part, '/'))
    if (!part.empty()) parts.push_back(part);
  if (parts.empty() || parts[0].rfind("pci", 0) != 0) return {};
  return parts;
}

}  // namespace

StatusOr<int64_t> ReadHostMemoryBytes(const std::string& root) {
  const std::string path = Join(root, "proc/meminfo");
  std::ifstream in(path);
  if (!in) return IoError("cannot read " + path);
  std::string line;
  while (std::getline(in, line)) {
    long long kb = 0;
    if (std::sscanf(line.c_str(), "MemTotal: %lld kB", &kb) == 1)
      return static_cast<int64_t>(kb) * 1024;
  }
  return NotFound(path + " has no MemTotal line");
}

std::string ReadHostname(const std::string& root) {
  std::string s;
  return ReadLine(Join(root, "proc/sys/kernel/hostname"), &s) ? s : "";
}

CpuInfo ReadCpuInfoFromSysfs(const std::string& root) {
  CpuInfo cpu;
  {
    std::ifstream in(Join(root, "proc/cpuinfo"));
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind("model name", 0) == 0) {
        const size_t colon = line.find(':');
        if (colon != std::string::npos) {
          cpu.model = line.substr(colon + 1);
          const size_t b = cpu.model.find_first_not_of(" \t");
          cpu.model = b == std::string::npos ? "" : cpu.model.substr(b);
        }
        break;
      }
    }
  }
  std::set<long long> packages;
  std::set<std::pair<long long, long long>> cores;
  const std::string cpu_dir = Join(root, "sys/devices/system/cpu");
  for (const std::string& e : ListDir(cpu_dir)) {
    if (NumberedEntry(e, "cpu") < 0) continue;
    long long pkg = 0, core = 0;
    if (!ReadInt(cpu_dir + "/" + e + "/topology/physical_package_id", &pkg)) continue;
    if (!ReadInt(cpu_dir + "/" + e + "/topology/core_id", &core)) core = NumberedEntry(e, "cpu");
    ++cpu.pus;
    packages.insert(pkg);
    cores.insert({pkg, core});
  }
  cpu.sockets = static_cast<int>(packages.size());
  cpu.cores = static_cast<int>(cores.size());
  const std::string node_dir = Join(root, "sys/devices/system/node");
  std::vector<std::pair<int, std::string>> nodes;
  for (const std::string& e : ListDir(node_dir)) {
    const int id = NumberedEntry(e, "node");
    if (id >= 0) nodes.push_back({id, e});
  }
  std::sort(nodes.begin(), nodes.end());
  for (const auto& [id, e] : nodes) {
    NumaNodeInfo n;
    n.id = id;
    ReadLine(node_dir + "/" + e + "/cpulist", &n.cpus);
    std::ifstream in(node_dir + "/" + e + "/meminfo");
    std::string line;
    while (std::getline(in, line)) {
      int nid = 0;
      long long kb = 0;
      if (std::sscanf(line.c_str(), "Node %d MemTotal: %lld kB", &nid, &kb) == 2) {
        n.memory_bytes = static_cast<int64_t>(kb) * 1024;
        break;
      }
    }
    cpu.numa_nodes.push_back(n);
  }
  return cpu;
}

std::vector<NicInfo> ReadNics(const std::string& root) {
  std::vector<NicInfo> nics;
  std::set<std::string> claimed_netdevs;
  const std::string ib_dir = Join(root, "sys/class/infiniband");
  for (const std::string& dev : ListDir(ib_dir)) {
    NicInfo n;
    n.name = dev;
    const std::string base = ib_dir + "/" + dev;
    n.pci_bus_id = ResolvedBusId(base + "/device");
    long long numa = -1;
    if (ReadInt(base + "/device/numa_node", &numa)) n.numa_node = static_cast<int>(numa);
    ReadLine(base + "/device/local_cpulist", &n.cpu_affinity);
    const std::vector<std::string> netdevs = ListDir(base + "/device/net");
    if (!netdevs.empty()) n.netdev = netdevs[0];
    for (const std::string& nd : netdevs) claimed_netdevs.insert(nd);
    n.type = "infiniband";
    const std::vector<std::string> ports = ListDir(base + "/ports");
    if (!ports.empty()) {
      const std::string port = base + "/ports/" + ports[0];
      std::string layer, rate, state;
      if (ReadLine(port + "/link_layer", &layer) && layer == "Ethernet") n.type = "roce";
      double gbit = 0;
      if (ReadLine(port + "/rate", &rate) && std::sscanf(rate.c_str(), "%lf", &gbit) == 1)
        n.speed_gbit_per_s = gbit;
      // "4: ACTIVE"
      n.up = ReadLine(port + "/state", &state) && state.find("ACTIVE") != std::string::npos;
    }
    nics.push_back(std::move(n));
  }
  const std::string net_dir = Join(root, "sys/class/net");
  for (const std::string& ifname : ListDir(net_dir)) {
    if (ifname == "lo" || claimed_netdevs.count(ifname)) continue;
    const std::string base = net_dir + "/" + ifname;
    std::error_code ec;
    if (!fs::exists(base + "/device", ec)) continue;  // virtual: bridge, veth, tunnel
    NicInfo n;
    n.name = ifname;
    n.netdev = ifname;
    long long type = 1;
    ReadInt(base + "/type", &type);
    n.type = type == 32 ? "infiniband" : "ethernet";  // ARPHRD_INFINIBAND = 32 (IPoIB)
    long long mbit = 0;
    if (ReadInt(base + "/speed", &mbit) && mbit > 0)
      n.speed_gbit_per_s = static_cast<double>(mbit) / 1000.0;
    std::string state;
    n.up = ReadLine(base + "/operstate", &state) && state == "up";
    n.pci_bus_id = ResolvedBusId(base + "/device");
    if (n.pci_bus_id.find(':') == std::string::npos) n.pci_bus_id.clear();  // not a PCI device
    long long numa = -1;
    if (ReadInt(base + "/device/numa_node", &numa)) n.numa_node = static_cast<int>(numa);
    ReadLine(base + "/device/local_cpulist", &n.cpu_affinity);
    nics.push_back(std::move(n));
  }
  std::sort(nics.begin(), nics.end(),
            [](const NicInfo& a, const NicInfo& b) { return a.name < b.name; });
  return nics;
}

int ReadPciNumaNode(const std::string& root, const std::string& bus_id) {
  long long v = -1;
  if (!ReadInt(PciDevicePath(root, bus_id) + "/numa_node", &v)) return -1;
  return v < 0 ? -1 : static_cast<int>(v);
}

std::string ReadPciLocalCpus(const std::string& root, const std::string& bus_id) {
  std::string s;
  return ReadLine(PciDevicePath(root, bus_id) + "/local_cpulist", &s) ? s : "";
}

LinkType PciPathLevel(const std::string& root, const std::string& a, const std::string& b) {
  const std::vector<std::string> pa = PciPath(root, a), pb = PciPath(root, b);
  if (pa.size() < 2 || pb.size() < 2) return LinkType::kUnknown;
  if (pa[0] != pb[0]) {
    const int na = ReadPciNumaNode(root, a), nb = ReadPciNumaNode(root, b);
    return (na >= 0 && na == nb) ? LinkType::kNode : LinkType::kSys;
  }
  // Bridges are the components strictly between the root complex and the
  // device itself.
  const size_t ba = pa.size() - 2, bb = pb.size() - 2;
  size_t common = 0;
  while (common < ba && common < bb && pa[1 + common] == pb[1 + common]) ++common;
  if (common == 0) return LinkType::kPhb;
  const size_t below_a = ba - common, below_b = bb - common;
  return (below_a <= 1 && below_b <= 1) ? LinkType::kPix : LinkType::kPxb;
}

}  // namespace tessera
