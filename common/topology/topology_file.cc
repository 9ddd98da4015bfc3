#include "common/topology/topology_file.h"

#include <sys/stat.h>
#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <sstream>

namespace tessera {

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr double kDefaultPcieGbPerS = 25.0;  // PCIe gen4 x16 after coding, rounded

// Typed, strict access to TOML tables: every error names path:line:col and
// the key.
class Reader {
 public:
  explicit Reader(std::string path) : path_(std::move(path)) {}

  std::string Where(const toml::node& n) const {
    const auto& b = n.source().begin;
    return path_ + ":" + std::to_string(b.line) + ":" + std::to_string(b.column);
  }

  Status CheckKeys(const toml::table& t, std::initializer_list<const char*> allowed,
                   const std::string& what) const {
    for (const auto& [k, v] : t) {
      bool ok = false;
      for (const char* a : allowed) ok = ok || k.str() == a;
      if (!ok) {
        std::string list;
        for (const char* a : allowed) list += std::string(list.empty() ? "" : ", ") + a;
        return InvalidArgument(Where(v) + ": unknown key '" + std::string(k.str()) + "' in " +
                               what + " (known: " + list + ")");
      }
    }
    return Status::Ok();
  }

  // Reads t[key] when present. Returns whether it was present.
  StatusOr<bool> Int(const toml::table& t, const char* key, int64_t* out) const {
    const toml::node* n = t.get(key);
    if (!n) return false;
    if (!n->is_integer()) return TypeError(*n, key, "an integer");
    *out = n->as_integer()->get();
    return true;
  }
  StatusOr<bool> Int(const toml::table& t, const char* key, int* out) const {
    int64_t v = 0;
    auto r = Int(t, key, &v);
    if (!r.ok() || !*r) return r;
    if (v < INT32_MIN || v > INT32_MAX) return TypeError(*t.get(key), key, "a 32-bit integer");
    *out = static_cast<int>(v);
    return true;
  }
  StatusOr<bool> Double(const toml::table& t, const char* key, double* out) const {
    const toml::node* n = t.get(key);
    if (!n) return false;
    if (n->is_integer()) {
      *out = static_cast<double>(n->as_integer()->get());
    } else if (n->is_floating_point()) {
      *out = n->as_floating_point()->get();
    } else {
      return TypeError(*n, key, "a number");
    }
    if (!std::isfinite(*out) || *out < 0) return TypeError(*n, key, "a finite number >= 0");
    return true;
  }
  StatusOr<bool> String(const toml::table& t, const char* key, std::string* out) const {
    const toml::node* n = t.get(key);
    if (!n) return false;
    if (!n->is_string()) return TypeError(*n, key, "a string");
    *out = n->as_string()->get();
    return true;
  }
  StatusOr<bool> Bool(const toml::table& t, const char* key, bool* out) const {
    const toml::node* n = t.get(key);
    if (!n) return false;
    if (!n->is_boolean()) return TypeError(*n, key, "a boolean");
    *out = n->as_boolean()->get();
    return true;
  }
  // An array of integers, strings (T = std::string) or doubles.
  template <typename T>
  StatusOr<bool> Array(const toml::table& t, const char* key, std::vector<T>* out) const {
    const toml::node* n = t.get(key);
    if (!n) return false;
    if (!n->is_array()) return TypeError(*n, key, "an array");
    out->clear();
    for (const toml::node& e : *n->as_array()) {
      if constexpr (std::is_same_v<T, std::string>) {
        if (!e.is_string()) return TypeError(e, key, "an array of strings");
        out->push_back(e.as_string()->get());
      } else if constexpr (std::is_same_v<T, double>) {
        if (e.is_integer()) {
          out->push_back(static_cast<double>(e.as_integer()->get()));
        } else if (e.is_floating_point()) {
          out->push_back(e.as_floating_point()->get());
        } else {
          return TypeError(e, key, "an array of numbers");
        }
      } else if constexpr (std::is_same_v<T, bool>) {
        if (!e.is_boolean()) return TypeError(e, key, "an array of booleans");
        out->push_back(e.as_boolean()->get());
      } else {
        if (!e.is_integer()) return TypeError(e, key, "an array of integers");
        out->push_back(static_cast<T>(e.as_integer()->get()));
      }
    }
    return true;
  }
  const toml::table* Table(const toml::table& t, const char* key, Status* st) const {
    const toml::node* n = t.get(key);
    if (!n) return nullptr;
    if (!n->is_table()) {
      *st = TypeError(*n, key, "a table");
      return nullptr;
    }
    return n->as_table();
  }
  // An array of tables ([[key]]); nullptr when absent.
  const toml::array* Tables(const toml::table& t, const char* key, Status* st) const {
    const toml::node* n = t.get(key);
    if (!n) return nullptr;
    if (!n->is_array_of_tables()) {
      *st = TypeError(*n, key, "an array of tables ([[" + std::string(key) + "]])");
      return nullptr;
    }
    return n->as_array();
  }
  Status TypeError(const toml::node& n, const char* key, const std::string& want) const {
    return InvalidArgument(Where(n) + ": key '" + key + "' must be " + want);
  }
  Status Bad(const toml::node& n, const std::string& msg) const {
    return InvalidArgument(Where(n) + ": " + msg);
  }

 private:
  std::string path_;
};

#define ASSIGN_PRESENT(var, expr)           \
  TESSERA_ASSIGN_OR_RETURN(bool var, expr); \
  (void)var

Status ParseCpu(const Reader& rd, const toml::table& t, CpuInfo* cpu) {
  TESSERA_RETURN_IF_ERROR(
      rd.CheckKeys(t, {"model", "sockets", "cores", "pus", "numa"}, "[nodes.cpu]"));
  ASSIGN_PRESENT(a, rd.String(t, "model", &cpu->model));
  ASSIGN_PRESENT(b, rd.Int(t, "sockets", &cpu->sockets));
  ASSIGN_PRESENT(c, rd.Int(t, "cores", &cpu->cores));
  ASSIGN_PRESENT(d, rd.Int(t, "pus", &cpu->pus));
  Status st;
  const toml::array* numa = rd.Tables(t, "numa", &st);
  TESSERA_RETURN_IF_ERROR(st);
  if (numa) {
    for (const toml::node& n : *numa) {
      const toml::table& nt = *n.as_table();
      TESSERA_RETURN_IF_ERROR(
          rd.CheckKeys(nt, {"id", "cpus", "memory_bytes", "memory_gib"}, "[[nodes.cpu.numa]]"));
      NumaNodeInfo info;
      TESSERA_ASSIGN_OR_RETURN(bool has_id, rd.Int(nt, "id", &info.id));
      if (!has_id) return rd.Bad(n, "[[nodes.cpu.numa]] needs 'id'");
      ASSIGN_PRESENT(e, rd.String(nt, "cpus", &info.cpus));
      TESSERA_ASSIGN_OR_RETURN(bool has_bytes, rd.Int(nt, "memory_bytes", &info.memory_bytes));
      double gib = 0;
      TESSERA_ASSIGN_OR_RETURN(bool has_gib, rd.Double(nt, "memory_gib", &gib));
      if (!has_bytes && has_gib) info.memory_bytes = static_cast<int64_t>(std::llround(gib * kGiB));
      cpu->numa_nodes.push_back(info);
    }
  }
  return Status::Ok();
}

// Expands one [[nodes.gpus]] entry into `count` GPUs appended to `gpus`.
Status ParseGpus(const Reader& rd, const toml::table& t, std::vector<GpuInfo>* gpus) {
  TESSERA_RETURN_IF_ERROR(
      rd.CheckKeys(t,
                   {"count", "name", "uuid", "uuids", "memory_gib", "memory_bytes",
                    "memory_free_gib", "memory_free_bytes", "compute_capability", "sm_count",
                    "pci_bus_id", "pci_bus_ids", "numa_node", "numa_nodes", "cpu_affinity",
                    "pcie_gen", "pcie_width", "nvlink_gb_per_s_per_link", "nvlinks"},
                   "[[nodes.gpus]]"));
  int count = 1;
  ASSIGN_PRESENT(c0, rd.Int(t, "count", &count));
  if (count < 1 || count > 4096) return rd.Bad(t, "[[nodes.gpus]] count must be in [1, 4096]");
  GpuInfo g;
  TESSERA_ASSIGN_OR_RETURN(bool has_name, rd.String(t, "name", &g.name));
  if (!has_name)
    return rd.Bad(t, "[[nodes.gpus]] needs 'name' (the NVML name, e.g. \"NVIDIA H100 80GB HBM3\")");
  double gib = 0;
  TESSERA_ASSIGN_OR_RETURN(bool has_bytes, rd.Int(t, "memory_bytes", &g.memory_total_bytes));
  TESSERA_ASSIGN_OR_RETURN(bool has_gib, rd.Double(t, "memory_gib", &gib));
  if (has_bytes == has_gib)
    return rd.Bad(t,
                  "[[nodes.gpus]] '" + g.name + "' needs exactly one of memory_gib, memory_bytes");
  if (has_gib) g.memory_total_bytes = static_cast<int64_t>(std::llround(gib * kGiB));
  g.memory_free_bytes = g.memory_total_bytes;
  TESSERA_ASSIGN_OR_RETURN(bool has_free, rd.Int(t, "memory_free_bytes", &g.memory_free_bytes));
  TESSERA_ASSIGN_OR_RETURN(bool has_free_gib, rd.Double(t, "memory_free_gib", &gib));
  if (has_free && has_free_gib)
    return rd.Bad(t, "[[nodes.gpus]] give one of memory_free_gib, memory_free_bytes");
  if (has_free_gib) g.memory_free_bytes = static_cast<int64_t>(std::llround(gib * kGiB));
  std::string cc;
  TESSERA_ASSIGN_OR_RETURN(bool has_cc, rd.String(t, "compute_capability", &cc));
  if (has_cc) {
    char extra;
    if (std::sscanf(cc.c_str(), "%d.%d%c", &g.cc_major, &g.cc_minor, &extra) != 2 || g.cc_major < 0)
      return rd.Bad(*t.get("compute_capability"),
                    "compute_capability must look like \"9.0\", got \"" + cc + "\"");
  }
  ASSIGN_PRESENT(c1, rd.Int(t, "sm_count", &g.sm_count));
  ASSIGN_PRESENT(c2, rd.Int(t, "pcie_gen", &g.pcie_gen));
  ASSIGN_PRESENT(c3, rd.Int(t, "pcie_width", &g.pcie_width));
  ASSIGN_PRESENT(c4, rd.String(t, "cpu_affinity", &g.cpu_affinity));
  ASSIGN_PRESENT(c5, rd.Double(t, "nvlink_gb_per_s_per_link", &g.nvlink_gb_per_s_per_link));
  // Per-GPU lists: one value for all, or a list of `count`.
  std::vector<std::string> uuids, bus_ids;
  std::vector<int> numa;
  std::string one;
  TESSERA_ASSIGN_OR_RETURN(bool has_uuid, rd.String(t, "uuid", &one));
  if (has_uuid) uuids.assign(1, one);
  TESSERA_ASSIGN_OR_RETURN(bool has_uuids, rd.Array(t, "uuids", &uuids));
  TESSERA_ASSIGN_OR_RETURN(bool has_bus, rd.String(t, "pci_bus_id", &one));
  if (has_bus) bus_ids.assign(1, one);
  TESSERA_ASSIGN_OR_RETURN(bool has_buses, rd.Array(t, "pci_bus_ids", &bus_ids));
  int numa_one = -1;
  TESSERA_ASSIGN_OR_RETURN(bool has_numa, rd.Int(t, "numa_node", &numa_one));
  TESSERA_ASSIGN_OR_RETURN(bool has_numas, rd.Array(t, "numa_nodes", &numa));
  if ((has_uuid && has_uuids) || (has_bus && has_buses) || (has_numa && has_numas))
    return rd.Bad(t,
                  "[[nodes.gpus]] give a key or its list form (uuid/uuids, pci_bus_id/pci_bus_ids, "
                  "numa_node/numa_nodes), not both");
  if ((has_uuid || has_bus) && count != 1)
    return rd.Bad(t, "[[nodes.gpus]] uuid and pci_bus_id need count = 1; use uuids / pci_bus_ids");
  auto check_len = [&](bool has, size_t n, const char* key) -> Status {
    if (has && n != static_cast<size_t>(count))
      return rd.Bad(*t.get(key), std::string(key) + " has " + std::to_string(n) +
                                     " entries for count = " + std::to_string(count));
    return Status::Ok();
  };
  TESSERA_RETURN_IF_ERROR(check_len(has_uuids, uuids.size(), "uuids"));
  TESSERA_RETURN_IF_ERROR(check_len(has_buses, bus_ids.size(), "pci_bus_ids"));
  TESSERA_RETURN_IF_ERROR(check_len(has_numas, numa.size(), "numa_nodes"));
  if (const toml::node* nl = t.get("nvlinks")) {
    if (count != 1) return rd.Bad(*nl, "nvlinks needs count = 1");
    if (!nl->is_array()) return rd.TypeError(*nl, "nvlinks", "an array of inline tables");
    for (const toml::node& e : *nl->as_array()) {
      if (!e.is_table()) return rd.TypeError(e, "nvlinks", "an array of inline tables");
      const toml::table& lt = *e.as_table();
      TESSERA_RETURN_IF_ERROR(
          rd.CheckKeys(lt, {"link", "remote_pci_bus_id", "remote_type", "version"}, "nvlinks"));
      NvLinkInfo l;
      ASSIGN_PRESENT(l0, rd.Int(lt, "link", &l.link));
      ASSIGN_PRESENT(l1, rd.String(lt, "remote_pci_bus_id", &l.remote_pci_bus_id));
      ASSIGN_PRESENT(l2, rd.String(lt, "remote_type", &l.remote_type));
      ASSIGN_PRESENT(l3, rd.Int(lt, "version", &l.version));
      g.nvlinks.push_back(l);
    }
  }
  for (int i = 0; i < count; ++i) {
    GpuInfo gi = g;
    gi.index = static_cast<int>(gpus->size());
    if (!uuids.empty()) gi.uuid = uuids[i];
    if (!bus_ids.empty()) gi.pci_bus_id = bus_ids[i];
    gi.numa_node = has_numas ? numa[i] : numa_one;
    gpus->push_back(std::move(gi));
  }
  return Status::Ok();
}

Status ParseNics(const Reader& rd, const toml::table& t, std::vector<NicInfo>* nics) {
  TESSERA_RETURN_IF_ERROR(
      rd.CheckKeys(t,
                   {"count", "name", "netdev", "type", "speed_gbit_per_s", "numa_node",
                    "numa_nodes", "pci_bus_id", "cpu_affinity", "up"},
                   "[[nodes.nics]]"));
  int count = 1;
  ASSIGN_PRESENT(c0, rd.Int(t, "count", &count));
  if (count < 1 || count > 1024) return rd.Bad(t, "[[nodes.nics]] count must be in [1, 1024]");
  NicInfo n;
  n.up = true;
  TESSERA_ASSIGN_OR_RETURN(bool has_name, rd.String(t, "name", &n.name));
  if (!has_name)
    return rd.Bad(t, "[[nodes.nics]] needs 'name' (with count > 1: a prefix, e.g. \"mlx5_\")");
  TESSERA_ASSIGN_OR_RETURN(bool has_type, rd.String(t, "type", &n.type));
  if (!has_type || (n.type != "infiniband" && n.type != "roce" && n.type != "ethernet"))
    return rd.Bad(
        t, "[[nodes.nics]] '" + n.name + "' needs type = \"infiniband\", \"roce\" or \"ethernet\"");
  TESSERA_ASSIGN_OR_RETURN(bool has_speed, rd.Double(t, "speed_gbit_per_s", &n.speed_gbit_per_s));
  if (!has_speed) return rd.Bad(t, "[[nodes.nics]] '" + n.name + "' needs speed_gbit_per_s");
  ASSIGN_PRESENT(c1, rd.String(t, "netdev", &n.netdev));
  ASSIGN_PRESENT(c2, rd.String(t, "pci_bus_id", &n.pci_bus_id));
  ASSIGN_PRESENT(c3, rd.String(t, "cpu_affinity", &n.cpu_affinity));
  ASSIGN_PRESENT(c4, rd.Bool(t, "up", &n.up));
  ASSIGN_PRESENT(c5, rd.Int(t, "numa_node", &n.numa_node));
  std::vector<int> numa;
  TESSERA_ASSIGN_OR_RETURN(bool has_numas, rd.Array(t, "numa_nodes", &numa));
  if (has_numas && numa.size() != static_cast<size_t>(count))
    return rd.Bad(*t.get("numa_nodes"), "numa_nodes has " + std::to_string(numa.size()) +
                                            " entries for count = " + std::to_string(count));
  if (count > 1 && (!n.netdev.empty() || !n.pci_bus_id.empty()))
    return rd.Bad(t, "[[nodes.nics]] netdev and pci_bus_id need count = 1");
  for (int i = 0; i < count; ++i) {
    NicInfo ni = n;
    if (count > 1) ni.name = n.name + std::to_string(i);
    if (has_numas) ni.numa_node = numa[i];
    nics->push_back(std::move(ni));
  }
  return Status::Ok();
}

// Splits a matrix row on whitespace.
std::vector<std::string> Cells(const std::string& row) {
  std::istringstream in(row);
  std::vector<std::string> out;
  std::string c;
  while (in >> c) out.push_back(c);
  return out;
}

Status ParseLinks(const Reader& rd, const toml::table* t, const toml::node& node_where,
                  double pcie_gb_per_s, TopologyReport* r) {
  const size_t n = r->gpus.size();
  r->links.assign(n, std::vector<GpuLink>(n));
  for (size_t a = 0; a < n; ++a) r->links[a][a].type = LinkType::kSelf;
  std::string def;
  int nvswitch = 0, nvlink_links = 0;
  bool pcie_p2p = true;
  std::vector<std::string> matrix, gpu_nic;
  bool has_matrix = false, has_groups = false, has_gpu_nic = false;
  std::vector<std::vector<int>> groups;
  std::vector<std::vector<double>> bandwidth;
  std::vector<std::vector<bool>> p2p;
  if (t) {
    TESSERA_RETURN_IF_ERROR(rd.CheckKeys(*t,
                                         {"default", "nvswitch", "nvlink_groups", "nvlink_links",
                                          "matrix", "bandwidth", "p2p", "pcie_p2p", "gpu_nic"},
                                         "[nodes.links]"));
    ASSIGN_PRESENT(d0, rd.String(*t, "default", &def));
    ASSIGN_PRESENT(d1, rd.Int(*t, "nvswitch", &nvswitch));
    ASSIGN_PRESENT(d2, rd.Int(*t, "nvlink_links", &nvlink_links));
    ASSIGN_PRESENT(d3, rd.Bool(*t, "pcie_p2p", &pcie_p2p));
    TESSERA_ASSIGN_OR_RETURN(has_matrix, rd.Array(*t, "matrix", &matrix));
    TESSERA_ASSIGN_OR_RETURN(has_gpu_nic, rd.Array(*t, "gpu_nic", &gpu_nic));
    if (const toml::node* g = t->get("nvlink_groups")) {
      has_groups = true;
      if (!g->is_array())
        return rd.TypeError(*g, "nvlink_groups", "an array of arrays of GPU indices");
      for (const toml::node& e : *g->as_array()) {
        if (!e.is_array())
          return rd.TypeError(e, "nvlink_groups", "an array of arrays of GPU indices");
        std::vector<int> grp;
        for (const toml::node& x : *e.as_array()) {
          if (!x.is_integer())
            return rd.TypeError(x, "nvlink_groups", "an array of arrays of GPU indices");
          const int64_t v = x.as_integer()->get();
          if (v < 0 || v >= static_cast<int64_t>(n))
            return rd.Bad(x, "nvlink_groups names GPU " + std::to_string(v) + " but the host has " +
                                 std::to_string(n) + " GPUs");
          grp.push_back(static_cast<int>(v));
        }
        groups.push_back(grp);
      }
    }
    for (const char* key : {"bandwidth", "p2p"}) {
      const toml::node* m = t->get(key);
      if (!m) continue;
      if (!m->is_array() || m->as_array()->size() != n)
        return rd.TypeError(*m, key, "an array of " + std::to_string(n) + " rows");
      for (const toml::node& row : *m->as_array()) {
        if (!row.is_array() || row.as_array()->size() != n)
          return rd.TypeError(row, key, "rows of " + std::to_string(n) + " entries");
        std::vector<double> bw;
        std::vector<bool> pp;
        for (const toml::node& x : *row.as_array()) {
          if (std::string(key) == "p2p") {
            if (!x.is_boolean()) return rd.TypeError(x, key, "booleans");
            pp.push_back(x.as_boolean()->get());
          } else {
            if (!x.is_number()) return rd.TypeError(x, key, "numbers (GB/s)");
            bw.push_back(x.is_integer() ? static_cast<double>(x.as_integer()->get())
                                        : x.as_floating_point()->get());
          }
        }
        if (std::string(key) == "p2p") {
          p2p.push_back(pp);
        } else {
          bandwidth.push_back(bw);
        }
      }
    }
  }
  const toml::node& where = t ? static_cast<const toml::node&>(*t) : node_where;
  if (has_matrix && (nvswitch > 0 || has_groups || !def.empty()))
    return rd.Bad(where, "[nodes.links] matrix excludes default, nvswitch and nvlink_groups");
  if (nvswitch > 0 && has_groups)
    return rd.Bad(where, "[nodes.links] give nvswitch or nvlink_groups, not both");
  if (has_groups && nvlink_links < 1)
    return rd.Bad(where,
                  "[nodes.links] nvlink_groups needs nvlink_links >= 1 (links per GPU pair)");
  LinkType def_type = LinkType::kUnknown;
  if (!def.empty()) {
    auto lt = ParseLinkType(def);
    if (!lt.ok() || !IsPcieLevel(*lt))
      return rd.Bad(*t->get("default"),
                    "default must be PIX, PXB, PHB, NODE or SYS, got '" + def + "'");
    def_type = *lt;
  }
  if (has_matrix) {
    if (matrix.size() != n)
      return rd.Bad(*t->get("matrix"), "matrix has " + std::to_string(matrix.size()) +
                                           " rows for " + std::to_string(n) + " GPUs");
    for (size_t a = 0; a < n; ++a) {
      auto cells = Cells(matrix[a]);
      if (cells.size() != n)
        return rd.Bad(*t->get("matrix"), "matrix row " + std::to_string(a) + " has " +
                                             std::to_string(cells.size()) + " cells for " +
                                             std::to_string(n) + " GPUs");
      for (size_t b = 0; b < n; ++b) {
        auto cell = ParseLinkCell(cells[b]);
        if (!cell.ok()) return rd.Bad(*t->get("matrix"), cell.status().message());
        r->links[a][b].type = cell->type;
        r->links[a][b].nvlink_count = cell->nvlink_count;
      }
    }
  } else {
    for (size_t a = 0; a < n; ++a) {
      for (size_t b = 0; b < n; ++b) {
        if (a == b) continue;
        GpuLink& l = r->links[a][b];
        if (nvswitch > 0) {
          l.type = LinkType::kNvLink;
          l.nvlink_count = nvswitch;
        } else if (def_type != LinkType::kUnknown) {
          l.type = def_type;
        } else {
          const int na = r->gpus[a].numa_node, nb = r->gpus[b].numa_node;
          l.type = (na >= 0 && nb >= 0 && na != nb) ? LinkType::kSys : LinkType::kNode;
        }
      }
    }
    for (const auto& grp : groups) {
      for (int a : grp) {
        for (int b : grp) {
          if (a == b) continue;
          r->links[a][b].type = LinkType::kNvLink;
          r->links[a][b].nvlink_count = nvlink_links;
        }
      }
    }
  }
  for (size_t a = 0; a < n; ++a) {
    for (size_t b = 0; b < n; ++b) {
      GpuLink& l = r->links[a][b];
      l.p2p = a != b && (l.type == LinkType::kNvLink ||
                         (pcie_p2p && (l.type == LinkType::kPix || l.type == LinkType::kPxb ||
                                       l.type == LinkType::kPhb)));
      if (!p2p.empty()) l.p2p = p2p[a][b];
    }
  }
  FillLinkBandwidths(r, pcie_gb_per_s);
  if (!bandwidth.empty()) {
    for (size_t a = 0; a < n; ++a)
      for (size_t b = 0; b < n; ++b) r->links[a][b].bandwidth_gb_per_s = bandwidth[a][b];
  }
  // GPU-NIC levels: given, or NODE / SYS from the NUMA nodes when all known.
  if (has_gpu_nic && gpu_nic.empty()) {
    // Explicitly unknown.
  } else if (has_gpu_nic) {
    if (gpu_nic.size() != n)
      return rd.Bad(*t->get("gpu_nic"), "gpu_nic has " + std::to_string(gpu_nic.size()) +
                                            " rows for " + std::to_string(n) + " GPUs");
    for (size_t g = 0; g < n; ++g) {
      auto cells = Cells(gpu_nic[g]);
      if (cells.size() != r->nics.size())
        return rd.Bad(*t->get("gpu_nic"), "gpu_nic row " + std::to_string(g) + " has " +
                                              std::to_string(cells.size()) + " cells for " +
                                              std::to_string(r->nics.size()) + " NICs");
      std::vector<LinkType> row;
      for (const std::string& c : cells) {
        auto lt = ParseLinkType(c);
        if (!lt.ok()) return rd.Bad(*t->get("gpu_nic"), lt.status().message());
        row.push_back(*lt);
      }
      r->gpu_nic.push_back(row);
    }
  } else if (!r->nics.empty()) {
    bool known = true;
    for (const auto& g : r->gpus) known = known && g.numa_node >= 0;
    for (const auto& c : r->nics) known = known && c.numa_node >= 0;
    if (known) {
      for (const auto& g : r->gpus) {
        std::vector<LinkType> row;
        for (const auto& c : r->nics)
          row.push_back(g.numa_node == c.numa_node ? LinkType::kNode : LinkType::kSys);
        r->gpu_nic.push_back(row);
      }
    }
  }
  return Status::Ok();
}

Status ParseNode(const Reader& rd, const toml::table& t, std::vector<TopologyReport>* nodes) {
  TESSERA_RETURN_IF_ERROR(rd.CheckKeys(
      t,
      {"hostname", "count", "source", "driver_version", "cpu_source", "notes", "host_memory_gib",
       "host_memory_bytes", "pcie_gb_per_s", "cpu", "gpus", "links", "nics"},
      "[[nodes]]"));
  TopologyReport r;
  r.source = "file";
  r.cpu_source = "file";
  TESSERA_ASSIGN_OR_RETURN(bool has_host, rd.String(t, "hostname", &r.hostname));
  if (!has_host || r.hostname.empty()) return rd.Bad(t, "[[nodes]] needs 'hostname'");
  int count = 1;
  ASSIGN_PRESENT(c0, rd.Int(t, "count", &count));
  if (count < 1 || count > 100000) return rd.Bad(t, "[[nodes]] count must be in [1, 100000]");
  ASSIGN_PRESENT(c1, rd.String(t, "source", &r.source));
  ASSIGN_PRESENT(c2, rd.String(t, "driver_version", &r.driver_version));
  ASSIGN_PRESENT(c3, rd.String(t, "cpu_source", &r.cpu_source));
  ASSIGN_PRESENT(c5, rd.Array(t, "notes", &r.notes));
  double gib = 0;
  TESSERA_ASSIGN_OR_RETURN(bool has_bytes, rd.Int(t, "host_memory_bytes", &r.host_memory_bytes));
  TESSERA_ASSIGN_OR_RETURN(bool has_gib, rd.Double(t, "host_memory_gib", &gib));
  if (has_bytes && has_gib)
    return rd.Bad(t, "[[nodes]] give one of host_memory_gib, host_memory_bytes");
  if (has_gib) r.host_memory_bytes = static_cast<int64_t>(std::llround(gib * kGiB));
  double pcie = kDefaultPcieGbPerS;
  ASSIGN_PRESENT(c4, rd.Double(t, "pcie_gb_per_s", &pcie));
  Status st;
  if (const toml::table* cpu = rd.Table(t, "cpu", &st))
    TESSERA_RETURN_IF_ERROR(ParseCpu(rd, *cpu, &r.cpu));
  TESSERA_RETURN_IF_ERROR(st);
  if (const toml::array* gpus = rd.Tables(t, "gpus", &st)) {
    for (const toml::node& g : *gpus)
      TESSERA_RETURN_IF_ERROR(ParseGpus(rd, *g.as_table(), &r.gpus));
  }
  TESSERA_RETURN_IF_ERROR(st);
  if (const toml::array* nics = rd.Tables(t, "nics", &st)) {
    for (const toml::node& c : *nics)
      TESSERA_RETURN_IF_ERROR(ParseNics(rd, *c.as_table(), &r.nics));
  }
  TESSERA_RETURN_IF_ERROR(st);
  const toml::table* links = rd.Table(t, "links", &st);
  TESSERA_RETURN_IF_ERROR(st);
  TESSERA_RETURN_IF_ERROR(ParseLinks(rd, links, t, pcie, &r));
  TESSERA_RETURN_IF_ERROR_CTX(ValidateTopologyReport(r), rd.Where(t));
  if (count == 1) {
    nodes->push_back(std::move(r));
    return Status::Ok();
  }
  for (int i = 0; i < count; ++i) {
    TopologyReport ri = r;
    ri.hostname = r.hostname + "-" + std::to_string(i);
    nodes->push_back(std::move(ri));
  }
  return Status::Ok();
}

}  // namespace

StatusOr<ClusterTopology> ParseTopologyToml(const std::string& text, const std::string& path) {
  toml::table root;
  try {
    root = toml::parse(text, path);
  } catch (const toml::parse_error& e) {
    const auto& b = e.source().begin;
    return InvalidArgument(path + ":" + std::to_string(b.line) + ":" + std::to_string(b.column) +
                           ": " + std::string(e.description()));
  }
  Reader rd(path);
  TESSERA_RETURN_IF_ERROR(rd.CheckKeys(
      root, {"name", "description", "network", "gpu_specs", "nodes"}, "the top level"));
  ClusterTopology c;
  ASSIGN_PRESENT(a0, rd.String(root, "name", &c.name));
  ASSIGN_PRESENT(a1, rd.String(root, "description", &c.description));
  Status st;
  if (const toml::table* net = rd.Table(root, "network", &st)) {
    TESSERA_RETURN_IF_ERROR(
        rd.CheckKeys(*net, {"inter_node_gbit_per_s", "latency_us"}, "[network]"));
    ASSIGN_PRESENT(a2, rd.Double(*net, "inter_node_gbit_per_s", &c.network.inter_node_gbit_per_s));
    ASSIGN_PRESENT(a3, rd.Double(*net, "latency_us", &c.network.latency_us));
  }
  TESSERA_RETURN_IF_ERROR(st);
  if (const toml::table* specs = rd.Table(root, "gpu_specs", &st)) {
    for (const auto& [k, v] : *specs) {
      if (!v.is_table())
        return rd.TypeError(v, "gpu_specs", "a table of tables ([gpu_specs.\"NAME\"])");
      const toml::table& s = *v.as_table();
      TESSERA_RETURN_IF_ERROR(rd.CheckKeys(s, {"hbm_gb_per_s", "bf16_tflops"}, "[gpu_specs]"));
      GpuSpec spec;
      spec.match = std::string(k.str());
      TESSERA_ASSIGN_OR_RETURN(bool h, rd.Double(s, "hbm_gb_per_s", &spec.hbm_gb_per_s));
      TESSERA_ASSIGN_OR_RETURN(bool f, rd.Double(s, "bf16_tflops", &spec.bf16_tflops));
      if (!h || !f || spec.hbm_gb_per_s <= 0 || spec.bf16_tflops <= 0)
        return rd.Bad(
            v, "[gpu_specs.\"" + spec.match + "\"] needs hbm_gb_per_s > 0 and bf16_tflops > 0");
      c.gpu_specs.push_back(spec);
    }
  }
  TESSERA_RETURN_IF_ERROR(st);
  const toml::array* nodes = rd.Tables(root, "nodes", &st);
  TESSERA_RETURN_IF_ERROR(st);
  if (!nodes || nodes->empty()) return InvalidArgument(path + ": no [[nodes]]");
  for (const toml::node& n : *nodes)
    TESSERA_RETURN_IF_ERROR(ParseNode(rd, *n.as_table(), &c.nodes));
  return c;
}

StatusOr<ClusterTopology> LoadTopologyFile(const std::string& path) {
  struct stat sb;
  if (stat(path.c_str(), &sb) != 0) return NotFound("topology file " + path + " does not exist");
  std::ifstream in(path, std::ios::binary);
  if (!in) return IoError("cannot read topology file " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  const bool is_json = path.size() >= 5 && path.compare(path.size() - 5, 5, ".json") == 0;
  if (!is_json) return ParseTopologyToml(text, path);
  ClusterTopology c;
  c.name = path;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    return InvalidArgument(path + ": malformed JSON at byte " + std::to_string(e.byte));
  }
  if (j.is_array()) {
    for (size_t i = 0; i < j.size(); ++i) {
      TESSERA_ASSIGN_OR_RETURN(
          auto r, TopologyReportFromJson(j[i].dump(), path + "[" + std::to_string(i) + "]"));
      c.nodes.push_back(std::move(r));
    }
  } else {
    TESSERA_ASSIGN_OR_RETURN(auto r, TopologyReportFromJson(text, path));
    c.nodes.push_back(std::move(r));
  }
  if (c.nodes.empty()) return InvalidArgument(path + ": no topology reports");
  return c;
}

// ---------------------------------------------------------------------------
// Writer

namespace {

std::string Quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string Num(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  std::string s = buf;
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return s;
}

}  // namespace

std::string ClusterTopologyToToml(const ClusterTopology& c) {
  std::ostringstream o;
  o << "name = " << Quote(c.name) << "\n";
  o << "description = " << Quote(c.description) << "\n\n";
  o << "[network]\ninter_node_gbit_per_s = " << Num(c.network.inter_node_gbit_per_s)
    << "\nlatency_us = " << Num(c.network.latency_us) << "\n\n";
  for (const GpuSpec& s : c.gpu_specs) {
    o << "[gpu_specs." << Quote(s.match) << "]\nhbm_gb_per_s = " << Num(s.hbm_gb_per_s)
      << "\nbf16_tflops = " << Num(s.bf16_tflops) << "\n\n";
  }
  for (const TopologyReport& r : c.nodes) {
    o << "[[nodes]]\nhostname = " << Quote(r.hostname) << "\nsource = " << Quote(r.source)
      << "\ndriver_version = " << Quote(r.driver_version)
      << "\ncpu_source = " << Quote(r.cpu_source) << "\nhost_memory_bytes = " << r.host_memory_bytes
      << "\nnotes = [";
    for (size_t i = 0; i < r.notes.size(); ++i) o << (i ? ", " : "") << Quote(r.notes[i]);
    o << "]\n";
    o << "[nodes.cpu]\nmodel = " << Quote(r.cpu.model) << "\nsockets = " << r.cpu.sockets
      << "\ncores = " << r.cpu.cores << "\npus = " << r.cpu.pus << "\n";
    for (const NumaNodeInfo& n : r.cpu.numa_nodes) {
      o << "[[nodes.cpu.numa]]\nid = " << n.id << "\ncpus = " << Quote(n.cpus)
        << "\nmemory_bytes = " << n.memory_bytes << "\n";
    }
    for (const GpuInfo& g : r.gpus) {
      o << "[[nodes.gpus]]\nname = " << Quote(g.name) << "\nuuid = " << Quote(g.uuid)
        << "\nmemory_bytes = " << g.memory_total_bytes
        << "\nmemory_free_bytes = " << g.memory_free_bytes << "\ncompute_capability = \""
        << g.cc_major << "." << g.cc_minor << "\"\nsm_count = " << g.sm_count
        << "\npci_bus_id = " << Quote(g.pci_bus_id) << "\nnuma_node = " << g.numa_node
        << "\ncpu_affinity = " << Quote(g.cpu_affinity) << "\npcie_gen = " << g.pcie_gen
        << "\npcie_width = " << g.pcie_width
        << "\nnvlink_gb_per_s_per_link = " << Num(g.nvlink_gb_per_s_per_link) << "\nnvlinks = [";
      for (size_t i = 0; i < g.nvlinks.size(); ++i) {
        const NvLinkInfo& l = g.nvlinks[i];
        o << (i ? ", " : "") << "{ link = " << l.link
          << ", remote_pci_bus_id = " << Quote(l.remote_pci_bus_id)
          << ", remote_type = " << Quote(l.remote_type) << ", version = " << l.version << " }";
      }
      o << "]\n";
    }
    for (const NicInfo& n : r.nics) {
      o << "[[nodes.nics]]\nname = " << Quote(n.name) << "\nnetdev = " << Quote(n.netdev)
        << "\ntype = " << Quote(n.type) << "\nspeed_gbit_per_s = " << Num(n.speed_gbit_per_s)
        << "\nnuma_node = " << n.numa_node << "\npci_bus_id = " << Quote(n.pci_bus_id)
        << "\ncpu_affinity = " << Quote(n.cpu_affinity) << "\nup = " << (n.up ? "true" : "false")
        << "\n";
    }
    o << "[nodes.links]\nmatrix = [\n";
    for (const auto& row : r.links) {
      std::string cells;
      for (const GpuLink& l : row) cells += (cells.empty() ? "" : " ") + LinkCell(l);
      o << "  " << Quote(cells) << ",\n";
    }
    o << "]\nbandwidth = [\n";
    for (const auto& row : r.links) {
      o << "  [";
      for (size_t b = 0; b < row.size(); ++b)
        o << (b ? ", " : "") << Num(row[b].bandwidth_gb_per_s);
      o << "],\n";
    }
    o << "]\np2p = [\n";
    for (const auto& row : r.links) {
      o << "  [";
      for (size_t b = 0; b < row.size(); ++b)
        o << (b ? ", " : "") << (row[b].p2p ? "true" : "false");
      o << "],\n";
    }
    o << "]\n";
    if (r.gpu_nic.empty() && !r.nics.empty()) o << "gpu_nic = []\n";
    if (!r.gpu_nic.empty() && !r.nics.empty()) {
      o << "gpu_nic = [\n";
      for (const auto& row : r.gpu_nic) {
        std::string cells;
        for (LinkType t : row) cells += (cells.empty() ? "" : " ") + std::string(LinkTypeName(t));
        o << "  " << Quote(cells) << ",\n";
      }
      o << "]\n";
    }
    o << "\n";
  }
  return o.str();
}

}  // namespace tessera
