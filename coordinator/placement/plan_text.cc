// PlanResult::ToText (coordinator/placement/placement_planner.h): the
// plan, its per-stage memory and time, and the runners-up, as text.
#include <cstdio>
#include <sstream>
#include <string>

#include "coordinator/placement/placement_planner.h"
#include "coordinator/placement/replica_eval.h"

namespace tessera {

namespace placement_internal {

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

}  // namespace placement_internal

using placement_internal::Bytes;
using placement_internal::Ms;
using placement_internal::Tps;

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
  if (p.quantization != "none") o << "  weights: " << p.quantization << "\n";
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
