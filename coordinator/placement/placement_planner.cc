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

#include "coordinator/placement/replica_eval.h"

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

using namespace placement_internal;  // NOLINT: the planner's own internals

// The note explaining an MoE model's expert split at `tp` (the chosen
// layout's first stage): what a decode step reads at batch 1 and at 64, and
// why whole experts or slices.
std::string ExpertSplitNote(const ModelConfig& m, const ModelSizes& sizes, int tp,
                            const PlanOptions& o) {
  const double k = static_cast<double>(m.num_experts_per_tok),
               n = static_cast<double>(m.num_experts);
  const double at64 = 1.0 - std::pow(1.0 - k / n, 64.0);
  const bool ep = sizes.ExpertParallelAt(tp);
  const int64_t slice = m.moe_intermediate_size / tp;
  std::string why;
  if (o.expert_parallel.has_value()) {
    why = "as configured (parallel.expert_parallel)";
  } else if (tp == 1) {
    why = "tp 1 holds every expert whole either way";
  } else if (m.moe_intermediate_size % tp != 0) {
    why = "tp " + std::to_string(tp) + " does not divide moe_intermediate_size " +
          std::to_string(m.moe_intermediate_size) + ": whole experts need no split";
  } else if (ep) {
    why = "a 1/" + std::to_string(tp) + " slice of an expert is " + std::to_string(slice) +
          " columns, under " + std::to_string(kMinExpertSliceColumns) +
          ": whole experts keep each expert GEMM full width";
  } else {
    why = "a 1/" + std::to_string(tp) + " slice of an expert is " + std::to_string(slice) +
          " columns: slices keep every rank's share of a decode step equal whatever the routing";
  }
  char buf[400];
  std::snprintf(buf, sizeof buf,
                "MoE: %lld experts, top-%lld; memory holds every expert, a decode step reads "
                "%.0f%% of a sparse layer's experts at batch 1 and %.0f%% at batch 64; "
                "expert_parallel %s at tp %d: %s",
                static_cast<long long>(m.num_experts),
                static_cast<long long>(m.num_experts_per_tok), 100.0 * k / n, 100.0 * at64,
                ep ? "on" : "off", tp, why.c_str());
  return buf;
}

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
  c.sizes = ModelSizes::From(model, wdt, kdt, o.keeps_fp8 && wdt != DType::kF32);
  c.work.prefill_chunk_tokens = o.prefill_chunk_tokens;
  c.work.max_batch = o.max_batch;
  c.max_context = o.max_context > 0 ? o.max_context : ModelContextLimit(model).default_tokens;
  c.min_kv = o.min_kv_tokens > 0 ? o.min_kv_tokens : c.max_context;
  PlanResult result;
  Explanation& ex = result.explanation;
  ex.objective = o.objective;
  ex.notes = cluster.notes;
  if (model.is_moe()) {
    // Configured, or chosen at each tp the search costs.
    c.sizes.expert_parallel = o.expert_parallel.value_or(false);
    c.sizes.expert_parallel_auto = !o.expert_parallel.has_value();
  }
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
      auto pc = ParallelConfig::Make(model, t, 1, {}, c.sizes.ExpertParallelAt(t));
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
    return ResourceExhausted("no placement of the model (" + Bytes(c.sizes.TotalBytes()) +
                             " of weights at " + DTypeName(wdt) + ", " +
                             std::to_string(cluster.total_gpus()) +
                             " GPUs) fits this cluster:" + why);
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
  plan.quantization = model.quantization.Describe();
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
  if (model.is_moe() && !plan.replicas.empty() && !plan.replicas[0].stages.empty()) {
    const int tp = plan.replicas[0].stages[0].tp;
    result.expert_parallel = c.sizes.ExpertParallelAt(tp);
    ex.notes.push_back(ExpertSplitNote(model, c.sizes, tp, o));
  }
  return result;
}

}  // namespace tessera
