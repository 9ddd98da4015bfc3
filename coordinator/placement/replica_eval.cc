// The evaluation of one replica of a candidate placement
// (coordinator/placement/replica_eval.h).
#include "coordinator/placement/replica_eval.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <queue>
#include <set>
#include <sstream>
#include <unordered_map>

namespace tessera::placement_internal {

// Groups of `tp` local GPUs on `node`: inside NVLink islands first, then (when
// allowed) the remaining GPUs over PCIe, PCIe groups first.
std::vector<std::vector<int>> TpGroups(const ClusterNode& node, int tp, bool allow_pcie) {
  std::vector<std::vector<int>> groups;
  std::vector<bool> used(node.gpus.size(), false);
  for (const auto& isl : node.nvlink_islands) {
    for (size_t i = 0; i + tp <= isl.size(); i += tp) {
      groups.emplace_back(isl.begin() + i, isl.begin() + i + tp);
      for (size_t j = i; j < i + tp; ++j) used[isl[j]] = true;
    }
  }
  if (tp > 1 && allow_pcie) {
    std::vector<int> rest;
    for (const auto& grp : node.pcie_groups)
      for (int g : grp)
        if (!used[g]) rest.push_back(g);
    for (size_t i = 0; i + tp <= rest.size(); i += tp)
      groups.emplace_back(rest.begin() + i, rest.begin() + i + tp);
  }
  return groups;
}

double StepFor(LinkType t, const CostConstants& k) {
  switch (t) {
    case LinkType::kNvLink:
      return k.nvlink_step_s;
    case LinkType::kPix:
    case LinkType::kPxb:
    case LinkType::kPhb:
    case LinkType::kNode:
      return k.pcie_step_s;
    default:
      return k.sys_step_s;
  }
}

// Rank of how bad a link is, for naming a group by its worst link.
int Badness(LinkType t) {
  switch (t) {
    case LinkType::kNvLink:
      return 0;
    case LinkType::kPix:
      return 1;
    case LinkType::kPxb:
      return 2;
    case LinkType::kPhb:
      return 3;
    case LinkType::kNode:
      return 4;
    case LinkType::kSys:
      return 5;
    default:
      return 6;
  }
}

int64_t Usable(const ClusterGpu& g, double fraction) {
  return std::min(static_cast<int64_t>(static_cast<double>(g.memory_bytes) * fraction),
                  g.free_bytes);
}

SlotType MakeSlotType(const Context& c, int cls, int tp, int hosts, const std::vector<int>& gpus) {
  const ClusterNode& node = c.cluster->nodes[c.cluster->class_nodes[cls]];
  SlotType st;
  st.cls = cls;
  st.tp = tp;
  st.hosts = hosts;
  st.gpus = gpus;
  st.usable = std::numeric_limits<int64_t>::max();
  int worst = -1;
  for (int g : gpus) {
    const ClusterGpu& cg = node.gpus[g];
    if (st.gpu_name.empty() || cg.spec.hbm_gb_per_s < st.spec.hbm_gb_per_s) {
      st.spec = cg.spec;
      st.gpu_name = cg.name;
    }
    st.usable = std::min(st.usable, Usable(cg, c.opt.gpu_memory_fraction));
    for (int h : gpus) {
      if (g == h) continue;
      const GpuLink& l = node.links[g][h];
      st.link_bps = std::min(st.link_bps, l.bandwidth_gb_per_s * 1e9);
      if (Badness(l.type) > worst) {
        worst = Badness(l.type);
        st.step_s = StepFor(l.type, c.opt.cost);
        st.link_name = LinkCell(l);
      }
    }
  }
  if (hosts > 1) {
    st.link_bps =
        std::min(st.link_bps, node.network_bytes_per_s / static_cast<double>(gpus.size()));
    st.step_s = c.opt.cost.network_step_s;
    st.link_name = "network";
  }
  if (st.link_bps <= 0) st.link_bps = 1e9;  // a link without bandwidth: assume 1 GB/s
  return st;
}

ReplicaEval Evaluator::Evaluate(const std::vector<int>& sig) const {
  const int pp = static_cast<int>(sig.size() + 1) / 2;
  const int L = static_cast<int>(c.sizes.layers);
  const CostConstants& k = c.opt.cost;
  ReplicaEval e;
  std::vector<const SlotType*> st(pp);
  for (int s = 0; s < pp; ++s) st[s] = &types[sig[2 * s]];
  // Hops.
  std::vector<Hop> hops;
  for (int s = 0; s + 1 < pp; ++s) {
    Hop h;
    if (sig[2 * s + 1]) {
      // Same host: receiver j gets from sender j % tp_from.
      const ClusterNode& node = c.cluster->nodes[c.cluster->class_nodes[st[s]->cls]];
      int worst = -1;
      for (size_t j = 0; j < st[s + 1]->gpus.size(); ++j) {
        const int from = st[s]->gpus[j % st[s]->gpus.size()], to = st[s + 1]->gpus[j];
        if (from == to) continue;
        const GpuLink& l = node.links[from][to];
        h.bps = std::min(h.bps, l.bandwidth_gb_per_s * 1e9);
        if (Badness(l.type) > worst) worst = Badness(l.type), h.link = LinkCell(l);
      }
      if (h.bps == kInf || h.bps <= 0) h.bps = 1e9;
      if (h.link.empty()) h.link = "X";
      h.latency = k.collective_launch_s;
    } else {
      const ClusterNode& a = c.cluster->nodes[c.cluster->class_nodes[st[s]->cls]];
      const ClusterNode& b = c.cluster->nodes[c.cluster->class_nodes[st[s + 1]->cls]];
      h.bps = std::min(a.hop_bytes_per_s, b.hop_bytes_per_s);
      h.latency = k.collective_launch_s + c.cluster->network_latency_s;
      h.link = "network";
    }
    e.hop_links.push_back(h.link);
    hops.push_back(h);
  }
  const double hidden_bytes = static_cast<double>(c.sizes.hidden) * c.sizes.dtype_bytes;
  // Memory caps: layers each stage holds with the KV reserve.
  std::vector<int> cap(pp);
  std::vector<double> per_layer(pp), fixed_time(pp);
  long long cap_sum = 0;
  for (int s = 0; s < pp; ++s) {
    const StageShape zero = Shape(*st[s], 0, s, pp), one = Shape(*st[s], 1, s, pp);
    const double fixed =
        WeightBytesPerGpu(c.sizes, zero) + ActivationBytesPerGpu(c.sizes, zero, c.work);
    const double per = WeightBytesPerGpu(c.sizes, one) - WeightBytesPerGpu(c.sizes, zero) +
                       static_cast<double>(c.min_kv) * KvBytesPerTokenPerGpu(c.sizes, one);
    const double room = static_cast<double>(st[s]->usable) - fixed;
    cap[s] = room <= 0 ? 0 : static_cast<int>(std::min<double>(L, std::floor(room / per)));
    if (cap[s] < 1) {
      e.why = "stage " + std::to_string(s) + " (" + st[s]->gpu_name +
              ", tp=" + std::to_string(st[s]->tp) + ") cannot hold one layer: " + Bytes(fixed) +
              " fixed (embedding/lm_head, activations) + " + Bytes(per) +
              " per layer (weights + KV for " + std::to_string(c.min_kv) + " tokens) > " +
              Bytes(static_cast<double>(st[s]->usable)) + " usable per GPU";
      return e;
    }
    cap_sum += cap[s];
    fixed_time[s] = StageSeconds(c.sizes, zero, k, 1, 1, 0) +
                    (s + 1 < pp ? HopSeconds(hidden_bytes, hops[s].bps, hops[s].latency, k) : 0);
    per_layer[s] = StageSeconds(c.sizes, one, k, 1, 1, 0) - StageSeconds(c.sizes, zero, k, 1, 1, 0);
  }
  if (cap_sum < L) {
    std::ostringstream w;
    w << "its " << pp << " stage(s) hold at most " << cap_sum << " of " << L
      << " layers with a KV reserve of " << c.min_kv << " tokens (per stage: ";
    for (int s = 0; s < pp; ++s) w << (s ? ", " : "") << cap[s];
    w << "; usable per GPU " << Bytes(static_cast<double>(st[0]->usable)) << ")";
    e.why = w.str();
    return e;
  }
  if (!c.opt.fixed_layers_per_stage.empty()) {
    // The configured split: each stage must hold its layers.
    e.layers = c.opt.fixed_layers_per_stage;
    for (int s = 0; s < pp; ++s) {
      if (e.layers[s] > cap[s]) {
        e.why = "stage " + std::to_string(s) + " (" + st[s]->gpu_name +
                ", tp=" + std::to_string(st[s]->tp) + ") is given " + std::to_string(e.layers[s]) +
                " layers but holds at most " + std::to_string(cap[s]) + " with a KV reserve of " +
                std::to_string(c.min_kv) + " tokens (usable per GPU " +
                Bytes(static_cast<double>(st[s]->usable)) + ")";
        e.layers.clear();
        return e;
      }
    }
  }
  // Layer split: one each, then greedily.
  if (e.layers.empty()) e.layers.assign(pp, 1);
  const bool split_given = !c.opt.fixed_layers_per_stage.empty();
  const bool latency = c.opt.objective == Objective::kLatency;
  using Key = std::pair<std::pair<double, double>, int>;
  std::priority_queue<Key, std::vector<Key>, std::greater<Key>> heap;
  // Latency: per-layer times within 0.1% of each other count as equal
  // (equal GPUs differ only by rounding), so equal stages share layers.
  auto bucket = [](double x) { return std::floor(std::log(x) / std::log(1.001)); };
  auto key = [&](int s) -> Key {
    const double load_next = fixed_time[s] + (e.layers[s] + 1) * per_layer[s];
    return latency ? Key{{bucket(per_layer[s]), load_next}, s} : Key{{load_next, per_layer[s]}, s};
  };
  for (int s = 0; s < pp; ++s)
    if (e.layers[s] < cap[s]) heap.push(key(s));
  for (int left = split_given ? 0 : L - pp; left > 0; --left) {
    const int s = heap.top().second;
    heap.pop();
    ++e.layers[s];
    if (e.layers[s] < cap[s]) heap.push(key(s));
  }
  // Predictions.
  std::vector<StageShape> shapes(pp);
  e.kv_tokens = std::numeric_limits<int64_t>::max();
  for (int s = 0; s < pp; ++s) {
    shapes[s] = Shape(*st[s], e.layers[s], s, pp);
    const double w = WeightBytesPerGpu(c.sizes, shapes[s]);
    const double a = ActivationBytesPerGpu(c.sizes, shapes[s], c.work);
    const double kvt = KvBytesPerTokenPerGpu(c.sizes, shapes[s]);
    const int64_t tokens = static_cast<int64_t>((static_cast<double>(st[s]->usable) - w - a) / kvt);
    e.kv_tokens = std::min(e.kv_tokens, tokens);
    e.weight.push_back(static_cast<int64_t>(w));
    e.act.push_back(static_cast<int64_t>(a));
    e.usable.push_back(st[s]->usable);
    const int64_t with_reserve = static_cast<int64_t>(w + a + static_cast<double>(c.min_kv) * kvt);
    if (e.peak == 0 || static_cast<double>(with_reserve) / static_cast<double>(st[s]->usable) >
                           static_cast<double>(e.peak) / static_cast<double>(e.peak_usable)) {
      e.peak = with_reserve;
      e.peak_usable = st[s]->usable;
    }
  }
  for (int s = 0; s < pp; ++s) {
    // The KV pool of every stage is sized for the replica's capacity; the
    // rest of a roomier stage stays free.
    e.kv.push_back(static_cast<int64_t>(static_cast<double>(e.kv_tokens) *
                                        KvBytesPerTokenPerGpu(c.sizes, shapes[s])));
    e.stage_seconds.push_back(StageSeconds(c.sizes, shapes[s], k, 1, 1, 0));
    e.latency += e.stage_seconds.back();
  }
  for (int s = 0; s + 1 < pp; ++s) {
    e.hop_seconds.push_back(HopSeconds(hidden_bytes, hops[s].bps, hops[s].latency, k));
    e.latency += e.hop_seconds.back();
  }
  // Throughput: b sequences of prompt P and output D in m micro-batches.
  const double P = static_cast<double>(c.prompt), D = static_cast<double>(c.output);
  e.batch = std::min<int64_t>(c.opt.max_batch, e.kv_tokens / (c.prompt + c.output));
  e.fits = true;
  if (e.batch < 1) return e;  // cannot happen with min_kv >= max_context; kept for safety
  const int max_m = static_cast<int>(std::min<int64_t>(e.batch, 2 * pp));
  for (int m = 1; m <= max_m; ++m) {
    const double bm = std::ceil(static_cast<double>(e.batch) / m);
    double dec = 0, pre = 0;
    for (int s = 0; s < pp; ++s) {
      const double hop_dec =
          s + 1 < pp ? HopSeconds(bm * hidden_bytes, hops[s].bps, hops[s].latency, k) : 0;
      const double hop_pre =
          s + 1 < pp ? HopSeconds(bm * P * hidden_bytes, hops[s].bps, hops[s].latency, k) : 0;
      dec = std::max(dec, StageSeconds(c.sizes, shapes[s], k, bm, bm, P + D / 2) + hop_dec);
      pre = std::max(pre, StageSeconds(c.sizes, shapes[s], k, bm * P, bm, P / 2) + hop_pre);
    }
    const double steps = m + pp - 1;
    const double thr = static_cast<double>(e.batch) * D / (steps * pre + D * steps * dec);
    if (thr > e.throughput) {
      e.throughput = thr;
      e.micro_batches = m;
    }
  }
  return e;
}

}  // namespace tessera::placement_internal
