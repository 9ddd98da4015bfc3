#include "coordinator/placement/cluster_model.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <map>
#include <numeric>
#include <sstream>

namespace tessera {

namespace {

// Largest clique of the vertices in `cand` (Bron-Kerbosch with pivoting);
// among equal sizes the lexicographically smallest.
std::vector<int> MaxClique(const std::vector<std::vector<bool>>& adj,
                           const std::vector<int>& cand) {
  std::vector<int> best;
  std::vector<int> r;
  std::function<void(std::vector<int>, std::vector<int>)> bk = [&](std::vector<int> p,
                                                                   std::vector<int> x) {
    if (p.empty() && x.empty()) {
      std::vector<int> s = r;
      std::sort(s.begin(), s.end());
      if (s.size() > best.size() || (s.size() == best.size() && s < best)) best = s;
      return;
    }
    if (r.size() + p.size() < best.size()) return;  // cannot beat the best
    // Pivot: the vertex of p or x with most neighbours in p.
    int pivot = -1;
    size_t most = 0;
    for (const auto* set : {&p, &x}) {
      for (int u : *set) {
        size_t c = 0;
        for (int v : p) c += adj[u][v];
        if (pivot < 0 || c > most) pivot = u, most = c;
      }
    }
    std::vector<int> ext;
    for (int v : p)
      if (!adj[pivot][v]) ext.push_back(v);
    for (int v : ext) {
      std::vector<int> np, nx;
      for (int u : p)
        if (adj[v][u]) np.push_back(u);
      for (int u : x)
        if (adj[v][u]) nx.push_back(u);
      r.push_back(v);
      bk(np, nx);
      r.pop_back();
      p.erase(std::find(p.begin(), p.end(), v));
      x.push_back(v);
    }
  };
  bk(cand, {});
  return best;
}

// Hosts with equal class keys are interchangeable for the planner.
std::string ClassKey(const ClusterNode& n, bool with_free) {
  std::ostringstream k;
  for (const ClusterGpu& g : n.gpus) {
    k << g.name << '|' << g.memory_bytes << '|' << (with_free ? g.free_bytes : 0) << '|'
      << g.spec.hbm_gb_per_s << '|' << g.spec.bf16_tflops << ';';
  }
  for (const auto& row : n.links)
    for (const GpuLink& l : row) k << LinkCell(l) << ':' << l.bandwidth_gb_per_s << ',';
  k << '#' << n.network_bytes_per_s << '#' << n.hop_bytes_per_s;
  return k.str();
}

std::string Gb(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.0f GB", bytes / 1e9);
  return buf;
}

}  // namespace

std::vector<std::vector<int>> GreedyCliquePartition(
    const std::vector<std::vector<bool>>& adjacent) {
  const int n = static_cast<int>(adjacent.size());
  std::vector<int> left(n);
  std::iota(left.begin(), left.end(), 0);
  std::vector<std::vector<int>> out;
  while (!left.empty()) {
    std::vector<int> c = MaxClique(adjacent, left);
    if (c.size() < 2) break;
    out.push_back(c);
    std::vector<int> rest;
    for (int v : left)
      if (!std::binary_search(c.begin(), c.end(), v)) rest.push_back(v);
    left = rest;
  }
  for (int v : left) out.push_back({v});
  return out;
}

int ClusterModel::total_gpus() const {
  int n = 0;
  for (const ClusterNode& node : nodes) n += static_cast<int>(node.gpus.size());
  return n;
}

double ClusterModel::HopBytesPerS(int a, int b) const {
  return std::min(nodes[a].hop_bytes_per_s, nodes[b].hop_bytes_per_s);
}

std::string ClusterModel::Describe() const {
  std::ostringstream o;
  o << "cluster " << (name.empty() ? "(unnamed)" : name) << ": " << nodes.size() << " host(s), "
    << total_gpus() << " GPU(s), " << num_classes() << " host class(es)\n";
  for (int c = 0; c < num_classes(); ++c) {
    const ClusterNode& rep = nodes[class_nodes[c]];
    int count = 0;
    std::string first, last;
    for (const ClusterNode& n : nodes) {
      if (n.class_id != c) continue;
      if (count++ == 0) first = n.hostname;
      last = n.hostname;
    }
    o << "  class " << c << ": " << count << " host(s) " << first
      << (count > 1 ? " .. " + last : "") << ": ";
    if (rep.gpus.empty()) {
      o << "no GPU\n";
      continue;
    }
    char buf[160];
    std::snprintf(buf, sizeof buf, "%zu x %s, %s each, HBM %.0f GB/s (relative speed %.2f)%s\n",
                  rep.gpus.size(), rep.gpus[0].name.c_str(),
                  Gb(static_cast<double>(rep.gpus[0].memory_bytes)).c_str(),
                  rep.gpus[0].spec.hbm_gb_per_s, RelativeSpeed(rep.gpus[0].spec),
                  rep.gpus[0].spec_known ? "" : " [assumed]");
    o << buf << "    NVLink islands:";
    for (const auto& isl : rep.nvlink_islands) {
      o << " {";
      for (size_t i = 0; i < isl.size(); ++i) o << (i ? "," : "") << isl[i];
      o << "}";
    }
    o << "\n    PCIe groups:";
    for (const auto& grp : rep.pcie_groups) {
      o << " {";
      for (size_t i = 0; i < grp.size(); ++i) o << (i ? "," : "") << grp[i];
      o << "}";
    }
    std::snprintf(buf, sizeof buf, "\n    network %.0f Gb/s (pipeline hop %.0f Gb/s)\n",
                  rep.network_bytes_per_s * 8 / 1e9, rep.hop_bytes_per_s * 8 / 1e9);
    o << buf;
  }
  for (const std::string& n : notes) o << "  note: " << n << "\n";
  return o.str();
}

StatusOr<ClusterModel> BuildClusterModel(const ClusterTopology& topology) {
  ClusterModel m;
  m.name = topology.name;
  m.network_latency_s = topology.network.latency_us * 1e-6;
  std::map<std::string, int> classes, shapes;
  std::map<std::string, bool> noted_unknown;
  for (const TopologyReport& r : topology.nodes) {
    TESSERA_RETURN_IF_ERROR_CTX(ValidateTopologyReport(r), "host " + r.hostname);
    ClusterNode node;
    node.hostname = r.hostname;
    for (const GpuInfo& g : r.gpus) {
      ClusterGpu cg;
      cg.local = static_cast<int>(node.gpus.size());
      cg.name = g.name;
      cg.memory_bytes = g.memory_total_bytes;
      cg.free_bytes = g.memory_free_bytes > 0 ? g.memory_free_bytes : g.memory_total_bytes;
      auto spec = FindGpuSpec(g.name, topology.gpu_specs);
      if (spec) {
        cg.spec = *spec;
      } else {
        cg.spec = FallbackGpuSpec(g.name);
        cg.spec_known = false;
        if (!noted_unknown[g.name]) {
          noted_unknown[g.name] = true;
          m.notes.push_back("unknown GPU model '" + g.name +
                            "': assumed 1000 GB/s HBM and 100 bf16 TFLOP/s; add [gpu_specs.\"" +
                            g.name + "\"] to the topology file");
        }
      }
      node.gpus.push_back(cg);
    }
    node.links = r.links;
    const size_t n = r.gpus.size();
    std::vector<std::vector<bool>> nv(n, std::vector<bool>(n, false)),
        pcie(n, std::vector<bool>(n, false));
    for (size_t a = 0; a < n; ++a) {
      for (size_t b = 0; b < n; ++b) {
        nv[a][b] = a != b && r.links[a][b].type == LinkType::kNvLink;
        pcie[a][b] = a != b &&
                     (r.links[a][b].type == LinkType::kPix || r.links[a][b].type == LinkType::kPxb);
      }
    }
    node.nvlink_islands = GreedyCliquePartition(nv);
    // PCIe groups: connected components over PIX/PXB edges.
    std::vector<int> comp(n, -1);
    for (size_t s = 0; s < n; ++s) {
      if (comp[s] >= 0) continue;
      std::vector<int> group, stack = {static_cast<int>(s)};
      comp[s] = static_cast<int>(node.pcie_groups.size());
      while (!stack.empty()) {
        const int v = stack.back();
        stack.pop_back();
        group.push_back(v);
        for (size_t u = 0; u < n; ++u) {
          if (pcie[v][u] && comp[u] < 0) {
            comp[u] = comp[s];
            stack.push_back(static_cast<int>(u));
          }
        }
      }
      std::sort(group.begin(), group.end());
      node.pcie_groups.push_back(group);
    }
    double rdma = 0, eth = 0, rdma_max = 0, eth_max = 0;
    for (const NicInfo& c : r.nics) {
      const double bps = c.speed_gbit_per_s * 1e9 / 8;
      if (c.type == "ethernet") {
        eth += bps;
        eth_max = std::max(eth_max, bps);
      } else {
        rdma += bps;
        rdma_max = std::max(rdma_max, bps);
      }
    }
    node.network_bytes_per_s = rdma > 0 ? rdma : eth;
    node.hop_bytes_per_s = rdma > 0 ? rdma_max : eth_max;
    if (topology.network.inter_node_gbit_per_s > 0) {
      node.network_bytes_per_s = node.hop_bytes_per_s =
          topology.network.inter_node_gbit_per_s * 1e9 / 8;
    } else if (node.network_bytes_per_s <= 0) {
      node.network_bytes_per_s = node.hop_bytes_per_s = 10e9 / 8;
      if (topology.nodes.size() > 1)
        m.notes.push_back("host " + r.hostname + " reports no NIC speed: assumed 10 Gb/s");
    }
    const std::string key = ClassKey(node, true);
    auto it = classes.find(key);
    if (it == classes.end()) {
      it = classes.emplace(key, static_cast<int>(m.class_nodes.size())).first;
      m.class_nodes.push_back(static_cast<int>(m.nodes.size()));
    }
    node.class_id = it->second;
    const std::string shape_key = ClassKey(node, false);
    auto sit = shapes.find(shape_key);
    if (sit == shapes.end()) {
      sit = shapes.emplace(shape_key, static_cast<int>(m.shape_nodes.size())).first;
      m.shape_nodes.push_back(static_cast<int>(m.nodes.size()));
    }
    node.shape_id = sit->second;
    m.nodes.push_back(std::move(node));
  }
  if (m.total_gpus() == 0)
    return InvalidArgument("topology " + topology.name + " has no GPU to place a model on");
  return m;
}

}  // namespace tessera
