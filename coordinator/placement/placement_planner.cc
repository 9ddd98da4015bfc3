#include "coordinator/placement/placement_planner.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <queue>
#include <set>
#include <sstream>
#include <unordered_map>

namespace tessera {

const char* ObjectiveName(Objective objective) {
  return objective == Objective::kLatency ? "latency" : "throughput";
}

StatusOr<Objective> ParseObjective(const std::string& name) {
  if (name == "latency") return Objective::kLatency;
  if (name == "throughput") return Objective::kThroughput;
  return InvalidArgument("objective '" + name + "' is not one of: latency, throughput");
}

StatusOr<ParallelConfig> PlacementPlan::ParallelConfigOf(const ModelConfig& model, int r) const {
  if (r < 0 || static_cast<size_t>(r) >= replicas.size())
    return OutOfRange("replica " + std::to_string(r) + " of " + std::to_string(replicas.size()));
  const PlannedReplica& rep = replicas[r];
  std::vector<int> tps, layers;
  for (const PlannedStage& s : rep.stages) {
    tps.push_back(s.tp);
    layers.push_back(s.layers());
  }
  // Equal tps give the uniform layout; different ones a per-stage layout.
  auto pc = ParallelConfig::MakePerStage(model, tps, layers);
  if (!pc.ok()) return pc.status().WithContext("replica " + std::to_string(r));
  return pc;
}

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

std::string Bytes(double b) {
  char buf[32];
  if (b >= 1e9) {
    std::snprintf(buf, sizeof buf, "%.1f GB", b / 1e9);
  } else if (b >= 1e7) {
    std::snprintf(buf, sizeof buf, "%.0f MB", b / 1e6);
  } else if (b >= 1e6) {
    std::snprintf(buf, sizeof buf, "%.2f MB", b / 1e6);
  } else {
    std::snprintf(buf, sizeof buf, "%.0f KB", b / 1e3);
  }
  return buf;
}

std::string Ms(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f ms", s * 1e3);
  return buf;
}

std::string Tps(double t) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.0f tok/s", t);
  return buf;
}

// A tp group pattern: stage slot type for (class, tp, group index).
struct SlotType {
  int cls = 0;
  int tp = 1;
  int hosts = 1;          // > 1: the group spans this many hosts (cross-node tp)
  std::vector<int> gpus;  // local GPU indices on each host of the unit
  GpuSpec spec;           // slowest GPU of the group (lowest HBM bandwidth)
  std::string gpu_name;
  int64_t usable = 0;      // smallest usable memory in the group
  double link_bps = kInf;  // slowest link inside the group
  double step_s = 0;
  std::string link_name = "-";
};

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

struct Context {
  const ModelConfig* model = nullptr;
  const ClusterModel* cluster = nullptr;
  PlanOptions opt;
  ModelSizes sizes;
  WorkloadShape work;
  int64_t max_context = 0, min_kv = 0, prompt = 0, output = 0;
};

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

// One replica's evaluation (memoised by its signature).
struct ReplicaEval {
  bool fits = false;
  std::string why;                    // when it does not fit
  std::vector<int> layers;            // per stage
  std::vector<double> stage_seconds;  // batch-1 tau_s
  std::vector<double> hop_seconds;
  std::vector<std::string> hop_links;
  std::vector<int64_t> weight, kv, act, usable;
  double latency = 0;
  double throughput = 0;
  int64_t kv_tokens = 0;
  int64_t batch = 0;
  int micro_batches = 1;
  int64_t peak = 0, peak_usable = 0;  // largest predicted use with the KV reserve, its usable
};

struct Hop {
  double bps = kInf;
  double latency = 0;
  std::string link;
};

struct Evaluator {
  const Context& c;
  const std::vector<SlotType>& types;

  StageShape Shape(const SlotType& st, int layers, int s, int pp) const {
    StageShape sh;
    sh.spec = st.spec;
    sh.tp = st.tp;
    sh.layers = layers;
    sh.first = s == 0;
    sh.last = s == pp - 1;
    sh.single_stage = pp == 1;
    sh.link_bytes_per_s = st.link_bps;
    sh.link_step_s = st.step_s;
    return sh;
  }

  // sig = [type0, same0, type1, same1, ..., type_{pp-1}]: same_s is 1 when
  // stage s and s+1 share a host unit.
  ReplicaEval Evaluate(const std::vector<int>& sig) const {
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
      per_layer[s] =
          StageSeconds(c.sizes, one, k, 1, 1, 0) - StageSeconds(c.sizes, zero, k, 1, 1, 0);
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
                  ", tp=" + std::to_string(st[s]->tp) + ") is given " +
                  std::to_string(e.layers[s]) + " layers but holds at most " +
                  std::to_string(cap[s]) + " with a KV reserve of " + std::to_string(c.min_kv) +
                  " tokens (usable per GPU " + Bytes(static_cast<double>(st[s]->usable)) + ")";
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
      return latency ? Key{{bucket(per_layer[s]), load_next}, s}
                     : Key{{load_next, per_layer[s]}, s};
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
      const int64_t tokens =
          static_cast<int64_t>((static_cast<double>(st[s]->usable) - w - a) / kvt);
      e.kv_tokens = std::min(e.kv_tokens, tokens);
      e.weight.push_back(static_cast<int64_t>(w));
      e.act.push_back(static_cast<int64_t>(a));
      e.usable.push_back(st[s]->usable);
      const int64_t with_reserve =
          static_cast<int64_t>(w + a + static_cast<double>(c.min_kv) * kvt);
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
};

struct VecHash {
  size_t operator()(const std::vector<int>& v) const {
    size_t h = 1469598103934665603ull;
    for (int x : v) h = (h ^ static_cast<size_t>(x + 0x9e3779b9)) * 1099511628211ull;
    return h;
  }
};

// A slot: a tp group on a host unit.
struct Slot {
  int type = 0;
  int unit = 0;
};

struct Candidate {
  std::vector<int> tp_of_shape;  // 0: shape unused
  bool interleaved = false;
  int pp = 0;
  int replicas = 0;
  int idle_replicas = 0;
  int gpus_used = 0;
  double latency = 0;
  double throughput = 0;
  int64_t peak = 0, peak_usable = 1;
  std::string layout;
};

}  // namespace

StatusOr<PlanResult> PlacementPlanner::Plan(const ModelConfig& model, const ClusterModel& cluster,
                                            const PlanOptions& options) {
  Context c;
  c.model = &model;
  c.cluster = &cluster;
  c.opt = options;
  const PlanOptions& o = options;
  if (!(o.gpu_memory_fraction > 0 && o.gpu_memory_fraction <= 1))
    return InvalidArgument("gpu_memory_fraction must be in (0, 1], got " +
                           std::to_string(o.gpu_memory_fraction));
  if (o.max_context < 0 || o.min_kv_tokens < 0 || o.prompt_tokens < 1 || o.output_tokens < 1 ||
      o.max_batch < 1 || o.prefill_chunk_tokens < 1 || o.max_pp < 0 || o.top_candidates < 1)
    return InvalidArgument(
        "plan options: max_context, min_kv_tokens, max_pp must be >= 0 and prompt_tokens, "
        "output_tokens, "
        "max_batch, prefill_chunk_tokens, top_candidates >= 1");
  if (o.fixed_tp < 0 || o.fixed_pp < 0 || o.max_replicas < 0)
    return InvalidArgument("plan options: fixed_tp, fixed_pp and max_replicas must be >= 0");
  if (!o.fixed_layers_per_stage.empty()) {
    if (o.fixed_pp <= 0 || static_cast<int>(o.fixed_layers_per_stage.size()) != o.fixed_pp)
      return InvalidArgument("plan options: fixed_layers_per_stage needs fixed_pp entries");
    TESSERA_RETURN_IF_ERROR_CTX(
        ParallelConfig::Make(model, 1, o.fixed_pp, o.fixed_layers_per_stage).status(),
        "fixed_layers_per_stage");
  }
  TESSERA_RETURN_IF_ERROR_CTX(ParallelConfig::Make(model, 1, 1).status(), "model");
  if (model.vocab_size < 1 || model.hidden_size < 1)
    return InvalidArgument("model: vocab_size and hidden_size must be >= 1");
  if (cluster.nodes.empty() || cluster.total_gpus() == 0)
    return InvalidArgument("cluster has no GPU");
  const DType wdt = o.weight_dtype.value_or(model.torch_dtype);
  const DType kdt = o.kv_dtype.value_or(wdt);
  c.sizes = ModelSizes::From(model, wdt, kdt);
  c.work.prefill_chunk_tokens = o.prefill_chunk_tokens;
  c.work.max_batch = o.max_batch;
  c.max_context = o.max_context > 0 ? o.max_context : ModelContextLimit(model).default_tokens;
  c.min_kv = o.min_kv_tokens > 0 ? o.min_kv_tokens : c.max_context;
  PlanResult result;
  Explanation& ex = result.explanation;
  ex.objective = o.objective;
  ex.notes = cluster.notes;
  c.output = std::min(o.output_tokens, std::max<int64_t>(1, c.max_context / 2));
  c.prompt = std::min(o.prompt_tokens, std::max<int64_t>(1, c.max_context - c.output));
  if (c.output != o.output_tokens || c.prompt != o.prompt_tokens)
    ex.notes.push_back("throughput workload clamped to max_context " +
                       std::to_string(c.max_context) + ": " + std::to_string(c.prompt) +
                       " prompt + " + std::to_string(c.output) + " output tokens");
  if (c.min_kv < c.prompt + c.output) c.min_kv = c.prompt + c.output;
  {
    char buf[256];
    std::snprintf(buf, sizeof buf,
                  "model: %lld layers, %s per layer, %s total at %s; KV %s per token (%s); reserve "
                  "%lld KV tokens "
                  "per replica",
                  static_cast<long long>(c.sizes.layers), Bytes(c.sizes.layer_bytes).c_str(),
                  Bytes(c.sizes.TotalBytes()).c_str(), DTypeName(wdt),
                  Bytes(static_cast<double>(c.sizes.layers) * 2 * c.sizes.kv_heads *
                        c.sizes.head_dim * c.sizes.kv_dtype_bytes)
                      .c_str(),
                  DTypeName(kdt), static_cast<long long>(c.min_kv));
    ex.notes.insert(ex.notes.begin(), buf);
  }

  // 1. Slot types per (class, tp) and valid tps per shape.
  const int nshapes = cluster.num_shapes();
  std::vector<std::string> shape_name(nshapes);
  std::vector<int> shape_hosts(nshapes, 0);
  for (const ClusterNode& n : cluster.nodes) ++shape_hosts[n.shape_id];
  for (int sh = 0; sh < nshapes; ++sh) {
    const ClusterNode& rep = cluster.nodes[cluster.shape_nodes[sh]];
    std::string gpu = rep.gpus.empty() ? "" : rep.gpus[0].name;
    if (gpu.rfind("NVIDIA ", 0) == 0) gpu = gpu.substr(7);
    shape_name[sh] =
        rep.gpus.empty() ? "no-GPU hosts" : std::to_string(rep.gpus.size()) + "x" + gpu;
  }
  std::vector<SlotType> types;
  // type ids of (class, tp): list of group type ids.
  std::map<std::pair<int, int>, std::vector<int>> class_tp_types;
  std::vector<std::vector<int>> valid_tp(nshapes);
  std::set<std::string> rejected_tp_seen;
  for (int sh = 0; sh < nshapes; ++sh) {
    const ClusterNode& rep = cluster.nodes[cluster.shape_nodes[sh]];
    const int G = static_cast<int>(rep.gpus.size());
    if (G == 0) continue;
    std::vector<int> tps;
    for (int t = 1; t <= G; ++t) tps.push_back(t);
    if (o.allow_cross_node_tp)
      for (int kh = 2; kh <= shape_hosts[sh] && kh * G <= 1024; ++kh) tps.push_back(kh * G);
    int largest_island = 0;
    for (const auto& isl : rep.nvlink_islands)
      largest_island = std::max<int>(largest_island, isl.size());
    if (o.fixed_tp > 0) {
      const bool listed = std::find(tps.begin(), tps.end(), o.fixed_tp) != tps.end();
      tps.clear();
      if (listed) {
        tps.push_back(o.fixed_tp);
      } else {
        const std::string why = o.fixed_tp > G && !o.allow_cross_node_tp
                                    ? "tp larger than a host's " + std::to_string(G) +
                                          " GPUs would span hosts; allow_cross_node_tp is off"
                                    : "a host of " + shape_name[sh] + " has " + std::to_string(G) +
                                          " GPU(s) and " + std::to_string(shape_hosts[sh]) +
                                          " host(s) of its shape: no tp group of " +
                                          std::to_string(o.fixed_tp) + " fits";
        ex.rejected.push_back(
            {"tp=" + std::to_string(o.fixed_tp) + (nshapes > 1 ? " on " + shape_name[sh] : ""),
             why});
      }
    }
    for (int t : tps) {
      const std::string what =
          "tp=" + std::to_string(t) + (nshapes > 1 ? " on " + shape_name[sh] : "");
      auto pc = ParallelConfig::Make(model, t, 1);
      if (!pc.ok()) {
        std::string why = pc.status().message();
        if (rejected_tp_seen.insert(why).second) ex.rejected.push_back({what, why});
        continue;
      }
      const int hosts = t > G ? t / G : 1;
      std::vector<std::vector<int>> groups;
      if (hosts > 1) {
        std::vector<int> all(G);
        for (int g = 0; g < G; ++g) all[g] = g;
        groups.push_back(all);
      } else {
        groups = TpGroups(rep, t, o.allow_pcie_tp);
      }
      if (groups.empty()) {
        ex.rejected.push_back(
            {what, "no group of " + std::to_string(t) + " GPUs inside an NVLink island (largest " +
                       std::to_string(largest_island) + ") and tp over PCIe is not allowed"});
        continue;
      }
      valid_tp[sh].push_back(t);
      for (int cls = 0; cls < cluster.num_classes(); ++cls) {
        if (cluster.nodes[cluster.class_nodes[cls]].shape_id != sh) continue;
        std::vector<int>& ids = class_tp_types[{cls, t}];
        for (const auto& g : groups) {
          ids.push_back(static_cast<int>(types.size()));
          types.push_back(MakeSlotType(c, cls, t, hosts, g));
        }
      }
    }
    if (o.fixed_tp == 0 && !o.allow_cross_node_tp && G < static_cast<int>(c.sizes.heads) &&
        cluster.nodes.size() > 1) {
      // Say why larger tps were not tried.
      const std::string why = "tp larger than a host's " + std::to_string(G) +
                              " GPUs would span hosts; allow_cross_node_tp is off";
      if (rejected_tp_seen.insert(why).second)
        ex.rejected.push_back({"tp>" + std::to_string(G), why});
    }
  }

  // 2. Enumerate tp assignments.
  std::vector<int> used_shapes;
  for (int sh = 0; sh < nshapes; ++sh)
    if (!valid_tp[sh].empty()) used_shapes.push_back(sh);
  if (used_shapes.empty()) {
    std::string why;
    for (const Rejection& r : ex.rejected) why += "\n  " + r.what + ": " + r.why;
    return ResourceExhausted("no valid tp for this model on any host:" + why);
  }
  const bool allow_unused = used_shapes.size() > 1;
  double combos = 1;
  for (int sh : used_shapes)
    combos *= static_cast<double>(valid_tp[sh].size() + (allow_unused ? 1 : 0));
  std::vector<std::vector<int>> assignments;
  if (combos <= 4096) {
    std::vector<int> idx(used_shapes.size(), 0);
    while (true) {
      std::vector<int> a(nshapes, 0);
      bool any = false;
      for (size_t i = 0; i < used_shapes.size(); ++i) {
        const auto& v = valid_tp[used_shapes[i]];
        const int choice = idx[i];
        a[used_shapes[i]] = choice < static_cast<int>(v.size()) ? v[choice] : 0;
        any = any || a[used_shapes[i]] > 0;
      }
      if (any) assignments.push_back(a);
      size_t i = 0;
      for (; i < used_shapes.size(); ++i) {
        const int n = static_cast<int>(valid_tp[used_shapes[i]].size()) + (allow_unused ? 1 : 0);
        if (++idx[i] < n) break;
        idx[i] = 0;
      }
      if (i == used_shapes.size()) break;
    }
  } else {
    // Too many shapes to try every combination: every shape gets the same
    // target tp (or its largest valid tp below it).
    ex.notes.push_back(
        std::to_string(used_shapes.size()) +
        " host shapes: tried one common tp target for all of them instead of every combination");
    std::set<int> targets;
    for (int sh : used_shapes) targets.insert(valid_tp[sh].begin(), valid_tp[sh].end());
    for (int target : targets) {
      std::vector<int> a(nshapes, 0);
      for (int sh : used_shapes) {
        for (int t : valid_tp[sh])
          if (t <= target) a[sh] = t;
        if (a[sh] == 0) a[sh] = valid_tp[sh][0];
      }
      assignments.push_back(a);
    }
  }

  if (o.uniform_tp) {
    std::vector<std::vector<int>> uniform;
    bool dropped = false;
    for (const auto& a : assignments) {
      int t0 = 0;
      bool same = true;
      for (int t : a) {
        if (t == 0) continue;
        if (t0 == 0) t0 = t;
        same = same && t == t0;
      }
      if (same) {
        uniform.push_back(a);
      } else {
        dropped = true;
      }
    }
    if (dropped)
      ex.notes.push_back(
          "layouts with a different tp per host shape were not tried: the serving runtime runs "
          "one tp on every stage");
    assignments = std::move(uniform);
  }

  // Hosts of each shape in index order.
  std::vector<std::vector<int>> hosts_of_shape(nshapes);
  for (int i = 0; i < static_cast<int>(cluster.nodes.size()); ++i)
    hosts_of_shape[cluster.nodes[i].shape_id].push_back(i);

  auto layout_of = [&](const std::vector<int>& a, bool interleaved, int pp) {
    std::vector<int> on;
    for (int sh = 0; sh < nshapes; ++sh)
      if (a[sh] > 0) on.push_back(sh);
    std::string s;
    if (on.size() == 1 && nshapes == 1) {
      s = "tp=" + std::to_string(a[on[0]]) + " pp=" + std::to_string(pp);
    } else {
      for (size_t i = 0; i < on.size(); ++i)
        s += (i ? ", " : "") + std::string("tp=") + std::to_string(a[on[i]]) + " on " +
             shape_name[on[i]];
      s += "; pp=" + std::to_string(pp);
      if (on.size() > 1) s += interleaved ? " (hosts interleaved)" : " (hosts grouped)";
      if (on.size() < used_shapes.size()) s += " (other hosts idle)";
    }
    return s;
  };

  // Builds the slot sequence and the host units.
  auto build_slots = [&](const std::vector<int>& a, bool interleaved, std::vector<Slot>* slots,
                         std::vector<std::vector<int>>* units) {
    slots->clear();
    units->clear();
    std::vector<std::vector<std::vector<int>>> shape_units(nshapes);
    for (int sh = 0; sh < nshapes; ++sh) {
      if (a[sh] == 0) continue;
      const int G = static_cast<int>(cluster.nodes[cluster.shape_nodes[sh]].gpus.size());
      const int k = a[sh] > G ? a[sh] / G : 1;
      const auto& hs = hosts_of_shape[sh];
      for (size_t i = 0; i + k <= hs.size(); i += k)
        shape_units[sh].emplace_back(hs.begin() + i, hs.begin() + i + k);
    }
    std::vector<std::vector<int>> order;
    if (interleaved) {
      for (size_t round = 0;; ++round) {
        bool any = false;
        for (int sh = 0; sh < nshapes; ++sh) {
          if (round < shape_units[sh].size()) {
            order.push_back(shape_units[sh][round]);
            any = true;
          }
        }
        if (!any) break;
      }
    } else {
      for (int sh = 0; sh < nshapes; ++sh)
        for (auto& u : shape_units[sh]) order.push_back(u);
    }
    for (auto& u : order) {
      const int cls = cluster.nodes[u[0]].class_id;
      const int t = a[cluster.nodes[u[0]].shape_id];
      const int unit = static_cast<int>(units->size());
      units->push_back(u);
      for (int type : class_tp_types[{cls, t}]) slots->push_back({type, unit});
    }
  };

  Evaluator ev{c, types};
  std::unordered_map<std::vector<int>, ReplicaEval, VecHash> memo;
  auto eval_sig = [&](const std::vector<int>& sig) -> const ReplicaEval& {
    auto it = memo.find(sig);
    if (it == memo.end()) it = memo.emplace(sig, ev.Evaluate(sig)).first;
    return it->second;
  };
  auto make_sig = [&](const std::vector<Slot>& slots, size_t begin, int pp, std::vector<int>* sig) {
    sig->clear();
    for (int s = 0; s < pp; ++s) {
      sig->push_back(slots[begin + s].type);
      if (s + 1 < pp) sig->push_back(slots[begin + s].unit == slots[begin + s + 1].unit ? 1 : 0);
    }
  };

  std::vector<Candidate> fitting;
  const int max_pp_opt = o.max_pp > 0 ? o.max_pp : static_cast<int>(c.sizes.layers);
  std::vector<Slot> slots;
  std::vector<std::vector<int>> units;
  std::vector<int> sig;
  for (const auto& a : assignments) {
    int shapes_on = 0;
    for (int sh = 0; sh < nshapes; ++sh) shapes_on += a[sh] > 0;
    for (int inter = 0; inter < (shapes_on > 1 ? 2 : 1); ++inter) {
      build_slots(a, inter == 1, &slots, &units);
      const int S = static_cast<int>(slots.size());
      const int max_pp = std::min({max_pp_opt, S, static_cast<int>(c.sizes.layers)});
      std::vector<std::pair<int, std::string>> failures;  // pp, why
      if (o.fixed_pp > max_pp) {
        ex.rejected.push_back(
            {layout_of(a, inter == 1, o.fixed_pp),
             "needs " + std::to_string(o.fixed_pp) + " stages but the cluster has " +
                 std::to_string(S) + " group(s) of this tp" +
                 (o.fixed_pp > static_cast<int>(c.sizes.layers)
                      ? " and the model " + std::to_string(c.sizes.layers) + " layers"
                      : "")});
      }
      for (int pp = 1; pp <= max_pp; ++pp) {
        if (o.fixed_pp > 0 && pp != o.fixed_pp) continue;
        ++ex.candidates_evaluated;
        Candidate cand;
        cand.tp_of_shape = a;
        cand.interleaved = inter == 1;
        cand.pp = pp;
        std::string why;
        for (int r = 0; r + pp <= S; r += pp) {
          if (o.max_replicas > 0 && cand.replicas >= o.max_replicas) break;
          make_sig(slots, r, pp, &sig);
          const ReplicaEval& e = eval_sig(sig);
          if (!e.fits) {
            ++cand.idle_replicas;
            if (why.empty()) why = e.why;
            continue;
          }
          ++cand.replicas;
          for (int s = 0; s < pp; ++s)
            cand.gpus_used += static_cast<int>(types[slots[r + s].type].gpus.size()) *
                              types[slots[r + s].type].hosts;
          cand.latency = std::max(cand.latency, e.latency);
          cand.throughput += e.throughput;
          if (static_cast<double>(e.peak) / static_cast<double>(e.peak_usable) >
              static_cast<double>(cand.peak) / static_cast<double>(cand.peak_usable)) {
            cand.peak = e.peak;
            cand.peak_usable = e.peak_usable;
          }
        }
        if (cand.replicas == 0) {
          failures.push_back({pp, why});
          continue;
        }
        cand.layout = layout_of(a, inter == 1, pp);
        fitting.push_back(std::move(cand));
      }
      // Rejections: runs of consecutive failing pps share one line.
      for (size_t i = 0; i < failures.size();) {
        size_t j = i;
        while (j + 1 < failures.size() && failures[j + 1].first == failures[j].first + 1) ++j;
        std::string lay = layout_of(a, inter == 1, failures[j].first);
        if (i != j) {
          const size_t at = lay.find("pp=");
          lay = lay.substr(0, at) + "pp=" + std::to_string(failures[i].first) + ".." +
                lay.substr(at + 3);
        }
        ex.rejected.push_back({lay, "does not fit: " + failures[j].second});
        i = j + 1;
      }
    }
  }
  ex.candidates_fitting = static_cast<int>(fitting.size());
  if (fitting.empty()) {
    std::string why;
    for (const Rejection& r : ex.rejected) why += "\n  " + r.what + ": " + r.why;
    return ResourceExhausted("no placement of the model fits this cluster:" + why);
  }

  // 3. Rank.
  const bool lat = o.objective == Objective::kLatency;
  auto better = [&](const Candidate& x, const Candidate& y) {
    const double px = lat ? x.latency : -x.throughput, py = lat ? y.latency : -y.throughput;
    if (px != py) return px < py;
    const double sx = lat ? -x.throughput : x.latency, sy = lat ? -y.throughput : y.latency;
    if (sx != sy) return sx < sy;
    if (x.idle_replicas != y.idle_replicas) return x.idle_replicas < y.idle_replicas;
    if (x.pp != y.pp) return x.pp < y.pp;
    return x.layout < y.layout;
  };
  std::sort(fitting.begin(), fitting.end(), better);
  const Candidate& best = fitting[0];
  const size_t ntop = std::min<size_t>(fitting.size(), static_cast<size_t>(o.top_candidates));
  for (size_t i = 0; i < ntop; ++i) {
    const Candidate& f = fitting[i];
    CandidateSummary s;
    s.layout = f.layout;
    s.pp = f.pp;
    s.replicas = f.replicas;
    s.gpus_used = f.gpus_used;
    s.decode_latency_s = f.latency;
    s.throughput_tokens_per_s = f.throughput;
    s.peak_gpu_bytes = f.peak;
    s.usable_gpu_bytes = f.peak_usable;
    if (f.idle_replicas > 0)
      s.note = std::to_string(f.idle_replicas) + " replica(s) of slots do not fit and stay idle";
    if (i > 0) {
      char buf[160];
      if (lat) {
        std::snprintf(buf, sizeof buf, "latency %+.1f%% vs chosen",
                      (f.latency / best.latency - 1) * 100);
      } else {
        std::snprintf(buf, sizeof buf, "throughput %+.1f%% vs chosen",
                      (f.throughput / best.throughput - 1) * 100);
      }
      s.note = buf + (s.note.empty() ? "" : "; " + s.note);
    }
    ex.top.push_back(s);
  }
  if (fitting.size() > ntop) {
    const Candidate& worst = fitting.back();
    char buf[200];
    std::snprintf(buf, sizeof buf, "%zu more layouts fit but rank lower (the last: %s, %s, %s)",
                  fitting.size() - ntop, worst.layout.c_str(), Ms(worst.latency).c_str(),
                  Tps(worst.throughput).c_str());
    ex.notes.push_back(buf);
  }

  // 4. Materialise the chosen plan.
  PlacementPlan& plan = result.plan;
  plan.objective = o.objective;
  plan.layout = best.layout;
  plan.gpus_total = cluster.total_gpus();
  build_slots(best.tp_of_shape, best.interleaved, &slots, &units);
  const int S = static_cast<int>(slots.size());
  for (int r = 0; r + best.pp <= S; r += best.pp) {
    if (o.max_replicas > 0 && static_cast<int>(plan.replicas.size()) >= o.max_replicas) break;
    make_sig(slots, r, best.pp, &sig);
    const ReplicaEval& e = eval_sig(sig);
    if (!e.fits) continue;
    PlannedReplica rep;
    int layer = 0;
    for (int s = 0; s < best.pp; ++s) {
      const Slot& sl = slots[r + s];
      const SlotType& st = types[sl.type];
      PlannedStage ps;
      for (int host : units[sl.unit]) {
        ps.hosts.push_back(cluster.nodes[host].hostname);
        for (int g : st.gpus) ps.gpus.push_back({host, g});
      }
      ps.tp = st.tp;
      ps.first_layer = layer;
      layer += e.layers[s];
      ps.end_layer = layer;
      ps.embedding = s == 0;
      ps.lm_head = s == best.pp - 1;
      ps.gpu_name = st.gpu_name;
      ps.tp_link = st.tp > 1 ? st.link_name : "-";
      ps.weight_bytes = e.weight[s];
      ps.kv_bytes = e.kv[s];
      ps.activation_bytes = e.act[s];
      ps.usable_bytes = e.usable[s];
      ps.decode_seconds = e.stage_seconds[s];
      rep.stages.push_back(std::move(ps));
    }
    rep.hop_seconds = e.hop_seconds;
    rep.hop_links = e.hop_links;
    rep.decode_latency_s = e.latency;
    rep.throughput_tokens_per_s = e.throughput;
    rep.kv_tokens = e.kv_tokens;
    rep.batch = e.batch;
    rep.micro_batches = e.micro_batches;
    for (const PlannedStage& ps : rep.stages) plan.gpus_used += static_cast<int>(ps.gpus.size());
    plan.decode_latency_s = std::max(plan.decode_latency_s, rep.decode_latency_s);
    plan.throughput_tokens_per_s += rep.throughput_tokens_per_s;
    plan.replicas.push_back(std::move(rep));
  }
  return result;
}

// ---------------------------------------------------------------------------
// Text

std::string PlanResult::ToText() const {
  std::ostringstream o;
  const PlacementPlan& p = plan;
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "Plan (objective: %s): %s\n  %zu replica(s), %d of %d GPUs; decode %s/token "
                "(slowest replica), %s in total\n",
                ObjectiveName(p.objective), p.layout.c_str(), p.replicas.size(), p.gpus_used,
                p.gpus_total, Ms(p.decode_latency_s).c_str(),
                Tps(p.throughput_tokens_per_s).c_str());
  o << buf;
  // Replicas with the same stage shapes print once.
  std::string last_key;
  size_t shown = 0;
  for (size_t r = 0; r < p.replicas.size(); ++r) {
    const PlannedReplica& rep = p.replicas[r];
    std::ostringstream key;
    for (const PlannedStage& s : rep.stages)
      key << s.tp << ':' << s.first_layer << '-' << s.end_layer << ':' << s.gpu_name << ':'
          << s.weight_bytes << ';';
    for (const std::string& h : rep.hop_links) key << h << ';';
    size_t same = 1;
    while (r + same < p.replicas.size()) {
      std::ostringstream k2;
      for (const PlannedStage& s : p.replicas[r + same].stages)
        k2 << s.tp << ':' << s.first_layer << '-' << s.end_layer << ':' << s.gpu_name << ':'
           << s.weight_bytes << ';';
      for (const std::string& h : p.replicas[r + same].hop_links) k2 << h << ';';
      if (k2.str() != key.str()) break;
      ++same;
    }
    if (shown >= 8) {
      o << "  ... " << p.replicas.size() - r << " more replica(s)\n";
      break;
    }
    ++shown;
    std::snprintf(buf, sizeof buf,
                  "\n  replica %zu%s: decode %s/token at batch 1; KV %lld tokens; %s at batch %lld "
                  "in %d micro-batch(es)\n",
                  r,
                  same > 1 ? (" (and " + std::to_string(same - 1) + " more like it)").c_str() : "",
                  Ms(rep.decode_latency_s).c_str(), static_cast<long long>(rep.kv_tokens),
                  Tps(rep.throughput_tokens_per_s).c_str(), static_cast<long long>(rep.batch),
                  rep.micro_batches);
    o << buf;
    for (int s = 0; s < rep.pp(); ++s) {
      const PlannedStage& st = rep.stages[s];
      std::string hosts;
      for (size_t i = 0; i < st.hosts.size(); ++i) hosts += (i ? "+" : "") + st.hosts[i];
      std::string gpus;
      for (size_t i = 0; i < st.gpus.size(); ++i)
        gpus += (i ? "," : "") + std::to_string(st.gpus[i].gpu);
      std::string extra = st.embedding ? " +embed" : "";
      if (st.lm_head) extra += " +lm_head";
      std::snprintf(
          buf, sizeof buf,
          "    stage %d  %-14s GPUs %-16s tp=%d (%s)  layers [%d, %d) %-3d%s\n"
          "             per GPU: weights %s + KV %s + act %s = %s of %s usable; %s/token\n",
          s, hosts.c_str(), gpus.c_str(), st.tp, st.tp_link.c_str(), st.first_layer, st.end_layer,
          st.layers(), extra.c_str(), Bytes(static_cast<double>(st.weight_bytes)).c_str(),
          Bytes(static_cast<double>(st.kv_bytes)).c_str(),
          Bytes(static_cast<double>(st.activation_bytes)).c_str(),
          Bytes(static_cast<double>(st.weight_bytes + st.kv_bytes + st.activation_bytes)).c_str(),
          Bytes(static_cast<double>(st.usable_bytes)).c_str(), Ms(st.decode_seconds).c_str());
      o << buf;
      if (s + 1 < rep.pp()) {
        std::snprintf(buf, sizeof buf, "             -> hop over %s: %.1f us\n",
                      rep.hop_links[s].c_str(), rep.hop_seconds[s] * 1e6);
        o << buf;
      }
    }
    r += same - 1;
  }
  const Explanation& e = explanation;
  o << "\nWhy: " << e.candidates_fitting << " of " << e.candidates_evaluated
    << " layouts fit; ranked by "
    << (e.objective == Objective::kLatency ? "decode latency (then throughput)"
                                           : "throughput (then decode latency)")
    << ".\n";
  o << "  #  layout                                               replicas  GPUs  latency     "
       "throughput     peak GPU memory\n";
  for (size_t i = 0; i < e.top.size(); ++i) {
    const CandidateSummary& s = e.top[i];
    std::snprintf(buf, sizeof buf, "  %zu%s %-52s %-9d %-5d %-11s %-14s %s / %s%s%s\n", i + 1,
                  i == 0 ? "*" : " ", s.layout.c_str(), s.replicas, s.gpus_used,
                  Ms(s.decode_latency_s).c_str(), Tps(s.throughput_tokens_per_s).c_str(),
                  Bytes(static_cast<double>(s.peak_gpu_bytes)).c_str(),
                  Bytes(static_cast<double>(s.usable_gpu_bytes)).c_str(),
                  s.note.empty() ? "" : "  ", s.note.c_str());
    o << buf;
  }
  if (!e.rejected.empty()) {
    // Invalid tps first (they explain the search space), then at most 12
    // layouts that do not fit.
    o << "Rejected:\n";
    size_t memory = 0;
    for (const Rejection& r : e.rejected) {
      const bool fit = r.why.rfind("does not fit", 0) == 0;
      if (fit && ++memory > 12) continue;
      o << "  " << r.what << ": " << r.why << "\n";
    }
    if (memory > 12) o << "  ... and " << memory - 12 << " more layouts that do not fit\n";
  }
  for (const std::string& n : e.notes) o << "Note: " << n << "\n";
  return o.str();
}

}  // namespace tessera
