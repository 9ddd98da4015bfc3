#include "common/topology/report.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "common/base/json_parse.h"

namespace tessera {

using json = nlohmann::json;

const char* LinkTypeName(LinkType type) {
  switch (type) {
    case LinkType::kSelf:
      return "X";
    case LinkType::kNvLink:
      return "NV";
    case LinkType::kPix:
      return "PIX";
    case LinkType::kPxb:
      return "PXB";
    case LinkType::kPhb:
      return "PHB";
    case LinkType::kNode:
      return "NODE";
    case LinkType::kSys:
      return "SYS";
    case LinkType::kUnknown:
      return "?";
  }
  return "?";
}

StatusOr<LinkType> ParseLinkType(const std::string& name) {
  std::string up;
  for (char c : name) up += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  for (LinkType t : {LinkType::kSelf, LinkType::kNvLink, LinkType::kPix, LinkType::kPxb,
                     LinkType::kPhb, LinkType::kNode, LinkType::kSys, LinkType::kUnknown}) {
    if (up == LinkTypeName(t)) return t;
  }
  return InvalidArgument("unknown link type '" + name +
                         "' (expected X, NV, PIX, PXB, PHB, NODE, SYS or ?)");
}

bool IsPcieLevel(LinkType type) {
  return type == LinkType::kPix || type == LinkType::kPxb || type == LinkType::kPhb ||
         type == LinkType::kNode || type == LinkType::kSys;
}

std::string LinkCell(const GpuLink& link) {
  if (link.type == LinkType::kNvLink) return "NV" + std::to_string(link.nvlink_count);
  return LinkTypeName(link.type);
}

StatusOr<GpuLink> ParseLinkCell(const std::string& cell) {
  GpuLink link;
  if (cell.size() > 2 && (cell[0] == 'N' || cell[0] == 'n') && (cell[1] == 'V' || cell[1] == 'v') &&
      std::isdigit(static_cast<unsigned char>(cell[2]))) {
    int n = 0;
    for (size_t i = 2; i < cell.size(); ++i) {
      if (!std::isdigit(static_cast<unsigned char>(cell[i])) || n > 1000)
        return InvalidArgument("bad link cell '" + cell + "' (expected NV<links>)");
      n = n * 10 + (cell[i] - '0');
    }
    if (n < 1) return InvalidArgument("bad link cell '" + cell + "': NVLink count must be >= 1");
    link.type = LinkType::kNvLink;
    link.nvlink_count = n;
    return link;
  }
  auto t = ParseLinkType(cell);
  if (!t.ok()) return t.status();
  if (*t == LinkType::kNvLink)
    return InvalidArgument("bad link cell '" + cell + "': NVLink needs a link count, e.g. NV12");
  link.type = *t;
  return link;
}

Status ValidateTopologyReport(const TopologyReport& r) {
  const size_t n = r.gpus.size();
  std::set<int> indices;
  for (const GpuInfo& g : r.gpus) {
    if (!indices.insert(g.index).second)
      return InvalidArgument("host " + r.hostname + ": GPU index " + std::to_string(g.index) +
                             " appears twice");
    if (g.memory_total_bytes < 0 || g.memory_free_bytes < 0)
      return InvalidArgument("host " + r.hostname + ": GPU " + std::to_string(g.index) +
                             " has negative memory");
  }
  if (r.links.size() != n)
    return InvalidArgument("host " + r.hostname + ": links has " + std::to_string(r.links.size()) +
                           " rows for " + std::to_string(n) + " GPUs");
  for (size_t a = 0; a < n; ++a) {
    if (r.links[a].size() != n)
      return InvalidArgument("host " + r.hostname + ": links row " + std::to_string(a) + " has " +
                             std::to_string(r.links[a].size()) + " entries for " +
                             std::to_string(n) + " GPUs");
  }
  for (size_t a = 0; a < n; ++a) {
    for (size_t b = 0; b < n; ++b) {
      const GpuLink& l = r.links[a][b];
      const std::string pair =
          "host " + r.hostname + ": GPU" + std::to_string(a) + "-GPU" + std::to_string(b);
      if ((a == b) != (l.type == LinkType::kSelf))
        return InvalidArgument(pair + ": 'X' must be exactly the diagonal");
      if (l.type == LinkType::kNvLink && l.nvlink_count < 1)
        return InvalidArgument(pair + ": NVLink with " + std::to_string(l.nvlink_count) + " links");
      const GpuLink& o = r.links[b][a];
      if (o.type != l.type || o.nvlink_count != l.nvlink_count)
        return InvalidArgument(pair + ": link is " + LinkCell(l) + " one way and " + LinkCell(o) +
                               " the other");
      if (l.bandwidth_gb_per_s < 0) return InvalidArgument(pair + ": negative bandwidth");
    }
  }
  if (!r.gpu_nic.empty()) {
    if (r.gpu_nic.size() != n)
      return InvalidArgument("host " + r.hostname + ": gpu_nic has " +
                             std::to_string(r.gpu_nic.size()) + " rows for " + std::to_string(n) +
                             " GPUs");
    for (size_t g = 0; g < n; ++g) {
      if (r.gpu_nic[g].size() != r.nics.size())
        return InvalidArgument("host " + r.hostname + ": gpu_nic row " + std::to_string(g) +
                               " has " + std::to_string(r.gpu_nic[g].size()) + " entries for " +
                               std::to_string(r.nics.size()) + " NICs");
    }
  }
  return Status::Ok();
}

// ---------------------------------------------------------------------------
// JSON

namespace {

json GpuToJson(const GpuInfo& g) {
  json links = json::array();
  for (const NvLinkInfo& l : g.nvlinks) {
    links.push_back({{"link", l.link},
                     {"remote_pci_bus_id", l.remote_pci_bus_id},
                     {"remote_type", l.remote_type},
                     {"version", l.version}});
  }
  return {{"index", g.index},
          {"name", g.name},
          {"uuid", g.uuid},
          {"memory_total_bytes", g.memory_total_bytes},
          {"memory_free_bytes", g.memory_free_bytes},
          {"cc_major", g.cc_major},
          {"cc_minor", g.cc_minor},
          {"sm_count", g.sm_count},
          {"pci_bus_id", g.pci_bus_id},
          {"numa_node", g.numa_node},
          {"cpu_affinity", g.cpu_affinity},
          {"pcie_gen", g.pcie_gen},
          {"pcie_width", g.pcie_width},
          {"nvlink_gb_per_s_per_link", g.nvlink_gb_per_s_per_link},
          {"nvlinks", links}};
}

// Reads obj[key] into out, converting with nlohmann's get<T>. Missing keys
// are errors; `where` names the enclosing object for the message.
template <typename T>
Status Get(const json& obj, const char* key, const std::string& where, T* out) {
  if (!obj.is_object()) return InvalidArgument(where + ": expected an object");
  auto it = obj.find(key);
  if (it == obj.end()) return InvalidArgument(where + ": missing key '" + key + "'");
  try {
    *out = it->get<T>();
  } catch (const json::exception&) {
    return InvalidArgument(where + ": key '" + key + "' has the wrong type (" +
                           std::string(it->type_name()) + ")");
  }
  return Status::Ok();
}

Status GetLinkType(const json& obj, const char* key, const std::string& where, LinkType* out) {
  std::string s;
  TESSERA_RETURN_IF_ERROR(Get(obj, key, where, &s));
  auto t = ParseLinkType(s);
  if (!t.ok()) return t.status().WithContext(where + ": key '" + key + "'");
  *out = *t;
  return Status::Ok();
}

Status GpuFromJson(const json& j, const std::string& where, GpuInfo* g) {
  TESSERA_RETURN_IF_ERROR(Get(j, "index", where, &g->index));
  TESSERA_RETURN_IF_ERROR(Get(j, "name", where, &g->name));
  TESSERA_RETURN_IF_ERROR(Get(j, "uuid", where, &g->uuid));
  TESSERA_RETURN_IF_ERROR(Get(j, "memory_total_bytes", where, &g->memory_total_bytes));
  TESSERA_RETURN_IF_ERROR(Get(j, "memory_free_bytes", where, &g->memory_free_bytes));
  TESSERA_RETURN_IF_ERROR(Get(j, "cc_major", where, &g->cc_major));
  TESSERA_RETURN_IF_ERROR(Get(j, "cc_minor", where, &g->cc_minor));
  TESSERA_RETURN_IF_ERROR(Get(j, "sm_count", where, &g->sm_count));
  TESSERA_RETURN_IF_ERROR(Get(j, "pci_bus_id", where, &g->pci_bus_id));
  TESSERA_RETURN_IF_ERROR(Get(j, "numa_node", where, &g->numa_node));
  TESSERA_RETURN_IF_ERROR(Get(j, "cpu_affinity", where, &g->cpu_affinity));
  TESSERA_RETURN_IF_ERROR(Get(j, "pcie_gen", where, &g->pcie_gen));
  TESSERA_RETURN_IF_ERROR(Get(j, "pcie_width", where, &g->pcie_width));
  TESSERA_RETURN_IF_ERROR(Get(j, "nvlink_gb_per_s_per_link", where, &g->nvlink_gb_per_s_per_link));
  json links;
  TESSERA_RETURN_IF_ERROR(Get(j, "nvlinks", where, &links));
  if (!links.is_array()) return InvalidArgument(where + ": key 'nvlinks' must be an array");
  for (size_t i = 0; i < links.size(); ++i) {
    const std::string w = where + ".nvlinks[" + std::to_string(i) + "]";
    NvLinkInfo l;
    TESSERA_RETURN_IF_ERROR(Get(links[i], "link", w, &l.link));
    TESSERA_RETURN_IF_ERROR(Get(links[i], "remote_pci_bus_id", w, &l.remote_pci_bus_id));
    TESSERA_RETURN_IF_ERROR(Get(links[i], "remote_type", w, &l.remote_type));
    TESSERA_RETURN_IF_ERROR(Get(links[i], "version", w, &l.version));
    g->nvlinks.push_back(l);
  }
  return Status::Ok();
}

}  // namespace

std::string TopologyReportToJson(const TopologyReport& r, int indent) {
  json numa = json::array();
  for (const NumaNodeInfo& n : r.cpu.numa_nodes)
    numa.push_back({{"id", n.id}, {"cpus", n.cpus}, {"memory_bytes", n.memory_bytes}});
  json gpus = json::array();
  for (const GpuInfo& g : r.gpus) gpus.push_back(GpuToJson(g));
  json links = json::array();
  for (const auto& row : r.links) {
    json jr = json::array();
    for (const GpuLink& l : row) {
      jr.push_back({{"type", LinkTypeName(l.type)},
                    {"nvlink_count", l.nvlink_count},
                    {"bandwidth_gb_per_s", l.bandwidth_gb_per_s},
                    {"p2p", l.p2p}});
    }
    links.push_back(jr);
  }
  json gpu_nic = json::array();
  for (const auto& row : r.gpu_nic) {
    json jr = json::array();
    for (LinkType t : row) jr.push_back(LinkTypeName(t));
    gpu_nic.push_back(jr);
  }
  json nics = json::array();
  for (const NicInfo& n : r.nics) {
    nics.push_back({{"name", n.name},
                    {"netdev", n.netdev},
                    {"type", n.type},
                    {"speed_gbit_per_s", n.speed_gbit_per_s},
                    {"numa_node", n.numa_node},
                    {"pci_bus_id", n.pci_bus_id},
                    {"cpu_affinity", n.cpu_affinity},
                    {"up", n.up}});
  }
  json j = {{"hostname", r.hostname},
            {"source", r.source},
            {"driver_version", r.driver_version},
            {"cpu_source", r.cpu_source},
            {"host_memory_bytes", r.host_memory_bytes},
            {"cpu",
             {{"model", r.cpu.model},
              {"sockets", r.cpu.sockets},
              {"cores", r.cpu.cores},
              {"pus", r.cpu.pus},
              {"numa_nodes", numa}}},
            {"gpus", gpus},
            {"links", links},
            {"gpu_nic", gpu_nic},
            {"nics", nics},
            {"notes", r.notes}};
  return j.dump(indent);
}

StatusOr<TopologyReport> TopologyReportFromJson(const std::string& text, const std::string& what) {
  // A report arrives in a worker's Register message: bounded like any
  // untrusted document (the nesting, numbers beyond the double range).
  json j;
  JsonParseError error;
  if (!ParseJsonBounded(text, kMaxRequestJsonDepth, &j, &error))
    return InvalidArgument(what + ": malformed JSON: " + error.message);
  TopologyReport r;
  TESSERA_RETURN_IF_ERROR(Get(j, "hostname", what, &r.hostname));
  TESSERA_RETURN_IF_ERROR(Get(j, "source", what, &r.source));
  TESSERA_RETURN_IF_ERROR(Get(j, "driver_version", what, &r.driver_version));
  TESSERA_RETURN_IF_ERROR(Get(j, "cpu_source", what, &r.cpu_source));
  TESSERA_RETURN_IF_ERROR(Get(j, "host_memory_bytes", what, &r.host_memory_bytes));
  json cpu;
  TESSERA_RETURN_IF_ERROR(Get(j, "cpu", what, &cpu));
  const std::string wc = what + ": cpu";
  TESSERA_RETURN_IF_ERROR(Get(cpu, "model", wc, &r.cpu.model));
  TESSERA_RETURN_IF_ERROR(Get(cpu, "sockets", wc, &r.cpu.sockets));
  TESSERA_RETURN_IF_ERROR(Get(cpu, "cores", wc, &r.cpu.cores));
  TESSERA_RETURN_IF_ERROR(Get(cpu, "pus", wc, &r.cpu.pus));
  json numa;
  TESSERA_RETURN_IF_ERROR(Get(cpu, "numa_nodes", wc, &numa));
  if (!numa.is_array()) return InvalidArgument(wc + ": key 'numa_nodes' must be an array");
  for (size_t i = 0; i < numa.size(); ++i) {
    const std::string w = wc + ".numa_nodes[" + std::to_string(i) + "]";
    NumaNodeInfo n;
    TESSERA_RETURN_IF_ERROR(Get(numa[i], "id", w, &n.id));
    TESSERA_RETURN_IF_ERROR(Get(numa[i], "cpus", w, &n.cpus));
    TESSERA_RETURN_IF_ERROR(Get(numa[i], "memory_bytes", w, &n.memory_bytes));
    r.cpu.numa_nodes.push_back(n);
  }
  json gpus, links, gpu_nic, nics;
  TESSERA_RETURN_IF_ERROR(Get(j, "gpus", what, &gpus));
  TESSERA_RETURN_IF_ERROR(Get(j, "links", what, &links));
  TESSERA_RETURN_IF_ERROR(Get(j, "gpu_nic", what, &gpu_nic));
  TESSERA_RETURN_IF_ERROR(Get(j, "nics", what, &nics));
  TESSERA_RETURN_IF_ERROR(Get(j, "notes", what, &r.notes));
  for (const char* k : {"gpus", "links", "gpu_nic", "nics"}) {
    if (!j[k].is_array()) return InvalidArgument(what + ": key '" + k + "' must be an array");
  }
  for (size_t i = 0; i < gpus.size(); ++i) {
    GpuInfo g;
    TESSERA_RETURN_IF_ERROR(GpuFromJson(gpus[i], what + ": gpus[" + std::to_string(i) + "]", &g));
    r.gpus.push_back(std::move(g));
  }
  for (size_t a = 0; a < links.size(); ++a) {
    if (!links[a].is_array())
      return InvalidArgument(what + ": links[" + std::to_string(a) + "] must be an array");
    std::vector<GpuLink> row;
    for (size_t b = 0; b < links[a].size(); ++b) {
      const std::string w = what + ": links[" + std::to_string(a) + "][" + std::to_string(b) + "]";
      GpuLink l;
      TESSERA_RETURN_IF_ERROR(GetLinkType(links[a][b], "type", w, &l.type));
      TESSERA_RETURN_IF_ERROR(Get(links[a][b], "nvlink_count", w, &l.nvlink_count));
      TESSERA_RETURN_IF_ERROR(Get(links[a][b], "bandwidth_gb_per_s", w, &l.bandwidth_gb_per_s));
      TESSERA_RETURN_IF_ERROR(Get(links[a][b], "p2p", w, &l.p2p));
      row.push_back(l);
    }
    r.links.push_back(std::move(row));
  }
  for (size_t g = 0; g < gpu_nic.size(); ++g) {
    if (!gpu_nic[g].is_array())
      return InvalidArgument(what + ": gpu_nic[" + std::to_string(g) + "] must be an array");
    std::vector<LinkType> row;
    for (size_t n = 0; n < gpu_nic[g].size(); ++n) {
      const std::string w =
          what + ": gpu_nic[" + std::to_string(g) + "][" + std::to_string(n) + "]";
      if (!gpu_nic[g][n].is_string()) return InvalidArgument(w + " must be a string");
      auto t = ParseLinkType(gpu_nic[g][n].get<std::string>());
      if (!t.ok()) return t.status().WithContext(w);
      row.push_back(*t);
    }
    r.gpu_nic.push_back(std::move(row));
  }
  for (size_t i = 0; i < nics.size(); ++i) {
    const std::string w = what + ": nics[" + std::to_string(i) + "]";
    NicInfo n;
    TESSERA_RETURN_IF_ERROR(Get(nics[i], "name", w, &n.name));
    TESSERA_RETURN_IF_ERROR(Get(nics[i], "netdev", w, &n.netdev));
    TESSERA_RETURN_IF_ERROR(Get(nics[i], "type", w, &n.type));
    TESSERA_RETURN_IF_ERROR(Get(nics[i], "speed_gbit_per_s", w, &n.speed_gbit_per_s));
    TESSERA_RETURN_IF_ERROR(Get(nics[i], "numa_node", w, &n.numa_node));
    TESSERA_RETURN_IF_ERROR(Get(nics[i], "pci_bus_id", w, &n.pci_bus_id));
    TESSERA_RETURN_IF_ERROR(Get(nics[i], "cpu_affinity", w, &n.cpu_affinity));
    TESSERA_RETURN_IF_ERROR(Get(nics[i], "up", w, &n.up));
    r.nics.push_back(std::move(n));
  }
  TESSERA_RETURN_IF_ERROR_CTX(ValidateTopologyReport(r), what);
  return r;
}

// ---------------------------------------------------------------------------
// Text

namespace {

std::string Gib(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f GiB", static_cast<double>(bytes) / (1024.0 * 1024 * 1024));
  return buf;
}

std::string Pad(const std::string& s, size_t width) {
  return s.size() >= width ? s + " " : s + std::string(width - s.size(), ' ');
}

}  // namespace

std::string FormatTopology(const TopologyReport& r) {
  std::ostringstream out;
  out << "host " << r.hostname << " (" << r.source;
  if (!r.driver_version.empty()) out << ", driver " << r.driver_version;
  out << ")\n";
  const size_t ng = r.gpus.size(), nn = r.nics.size();
  if (ng + nn > 0) {
    const size_t w = 8;
    out << Pad("", w);
    for (size_t g = 0; g < ng; ++g) out << Pad("GPU" + std::to_string(g), w);
    for (size_t n = 0; n < nn; ++n) out << Pad("NIC" + std::to_string(n), w);
    out << "CPU Affinity    NUMA Affinity\n";
    auto gpu_nic = [&](size_t g, size_t n) -> std::string {
      return r.gpu_nic.empty() ? "?" : LinkTypeName(r.gpu_nic[g][n]);
    };
    for (size_t g = 0; g < ng; ++g) {
      out << Pad("GPU" + std::to_string(g), w);
      for (size_t h = 0; h < ng; ++h) out << Pad(LinkCell(r.links[g][h]), w);
      for (size_t n = 0; n < nn; ++n) out << Pad(gpu_nic(g, n), w);
      out << Pad(r.gpus[g].cpu_affinity.empty() ? "N/A" : r.gpus[g].cpu_affinity, 16)
          << (r.gpus[g].numa_node < 0 ? "N/A" : std::to_string(r.gpus[g].numa_node)) << "\n";
    }
    for (size_t n = 0; n < nn; ++n) {
      out << Pad("NIC" + std::to_string(n), w);
      for (size_t g = 0; g < ng; ++g) out << Pad(gpu_nic(g, n), w);
      for (size_t m = 0; m < nn; ++m) out << Pad(m == n ? "X" : "", w);
      out << "\n";
    }
    out << "\n";
  }
  if (nn > 0) {
    out << "NIC Legend:\n";
    for (size_t n = 0; n < nn; ++n) {
      const NicInfo& c = r.nics[n];
      char speed[32];
      std::snprintf(speed, sizeof speed, "%g Gb/s", c.speed_gbit_per_s);
      out << "  NIC" << n << ": " << c.name;
      if (!c.netdev.empty() && c.netdev != c.name) out << " (" << c.netdev << ")";
      out << "  " << c.type << "  " << (c.speed_gbit_per_s > 0 ? speed : "speed unknown") << "  "
          << (c.up ? "up" : "down");
      if (c.numa_node >= 0) out << "  NUMA " << c.numa_node;
      out << "\n";
    }
    out << "\n";
  }
  for (size_t g = 0; g < ng; ++g) {
    const GpuInfo& gpu = r.gpus[g];
    out << "GPU" << g << ": " << gpu.name << "  " << Gib(gpu.memory_total_bytes) << " ("
        << Gib(gpu.memory_free_bytes) << " free)";
    if (gpu.cc_major > 0) out << "  sm_" << gpu.cc_major << gpu.cc_minor;
    if (gpu.sm_count > 0) out << "  " << gpu.sm_count << " SMs";
    if (!gpu.pci_bus_id.empty()) out << "  " << gpu.pci_bus_id;
    if (!gpu.nvlinks.empty()) {
      char bw[48];
      std::snprintf(bw, sizeof bw, "  %zu NVLinks x %g GB/s", gpu.nvlinks.size(),
                    gpu.nvlink_gb_per_s_per_link);
      out << bw;
    }
    if (!gpu.uuid.empty()) out << "  " << gpu.uuid;
    out << "\n";
  }
  if (ng == 0) out << "no GPUs (CPU-only)\n";
  for (const std::string& note : r.notes) out << "note: " << note << "\n";
  out << "host memory: " << Gib(r.host_memory_bytes) << "\n";
  out << "CPU: " << (r.cpu.model.empty() ? "unknown model" : r.cpu.model) << ", " << r.cpu.sockets
      << " socket(s), " << r.cpu.cores << " cores, " << r.cpu.pus << " threads (" << r.cpu_source
      << ")\n";
  for (const NumaNodeInfo& n : r.cpu.numa_nodes) {
    out << "NUMA node " << n.id << ": CPUs " << n.cpus << ", " << Gib(n.memory_bytes) << "\n";
  }
  out << "\nLegend:\n"
         "  X    = Self\n"
         "  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes\n"
         "  NODE = Connection traversing PCIe and the interconnect between host bridges in a NUMA "
         "node\n"
         "  PHB  = Connection traversing PCIe and a PCIe Host Bridge (typically the CPU)\n"
         "  PXB  = Connection traversing multiple PCIe bridges (without the PCIe Host Bridge)\n"
         "  PIX  = Connection traversing at most a single PCIe bridge\n"
         "  NV#  = Connection traversing a bonded set of # NVLinks\n";
  return out.str();
}

StatusOr<std::vector<int>> ParseCpuList(const std::string& text) {
  std::vector<int> cpus;
  std::string s;
  for (char c : text)
    if (!std::isspace(static_cast<unsigned char>(c))) s += c;
  if (s.empty()) return cpus;
  std::stringstream ss(s);
  std::string part;
  while (std::getline(ss, part, ',')) {
    int a = -1, b = -1;
    char extra;
    if (std::sscanf(part.c_str(), "%d-%d%c", &a, &b, &extra) == 2) {
    } else if (std::sscanf(part.c_str(), "%d%c", &a, &extra) == 1) {
      b = a;
    } else {
      return InvalidArgument("bad cpulist '" + text + "' at '" + part + "'");
    }
    if (a < 0 || b < a || b - a > 1 << 20)
      return InvalidArgument("bad cpulist range '" + part + "'");
    for (int c = a; c <= b; ++c) cpus.push_back(c);
  }
  return cpus;
}

double NvLinkGbPerSPerLink(int cc_major) {
  if (cc_major >= 10) return 50.0;
  if (cc_major == 9) return 26.562;
  if (cc_major >= 7) return 25.0;
  if (cc_major == 6) return 20.0;
  return 0.0;
}

double PcieGbPerS(int gen, int width) {
  static const double kPerLane[] = {0, 0.25, 0.5, 0.985, 1.969, 3.938, 7.877};
  if (gen < 1 || width < 1) return 0.0;
  const int g = std::min(gen, 6);
  return kPerLane[g] * width;
}

void FillLinkBandwidths(TopologyReport* r, double default_pcie_gb_per_s) {
  const size_t n = r->gpus.size();
  auto pcie = [&](size_t g) {
    const double bw = PcieGbPerS(r->gpus[g].pcie_gen, r->gpus[g].pcie_width);
    return bw > 0 ? bw : default_pcie_gb_per_s;
  };
  auto nvlink = [&](size_t g) {
    const double bw = r->gpus[g].nvlink_gb_per_s_per_link;
    return bw > 0 ? bw : NvLinkGbPerSPerLink(r->gpus[g].cc_major);
  };
  for (size_t a = 0; a < n && a < r->links.size(); ++a) {
    for (size_t b = 0; b < n && b < r->links[a].size(); ++b) {
      GpuLink& l = r->links[a][b];
      if (a == b) {
        l.bandwidth_gb_per_s = 0;
      } else if (l.type == LinkType::kNvLink) {
        l.bandwidth_gb_per_s = l.nvlink_count * std::min(nvlink(a), nvlink(b));
      } else if (IsPcieLevel(l.type)) {
        l.bandwidth_gb_per_s = std::min(pcie(a), pcie(b)) * (l.type == LinkType::kSys ? 0.5 : 1.0);
      } else {
        l.bandwidth_gb_per_s = std::min(pcie(a), pcie(b)) * 0.5;
      }
    }
  }
}

std::string CanonicalPciBusId(const std::string& id) {
  unsigned domain = 0, bus = 0, dev = 0, fn = 0;
  char extra;
  if (std::sscanf(id.c_str(), "%x:%x:%x.%x%c", &domain, &bus, &dev, &fn, &extra) != 4) return id;
  char buf[32];
  std::snprintf(buf, sizeof buf, "%04x:%02x:%02x.%x", domain & 0xffffu, bus, dev, fn);
  return buf;
}

}  // namespace tessera
