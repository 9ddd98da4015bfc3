// Internals of the placement planner (coordinator/placement/placement_planner.cc),
// not a public API: the slot types a model's stages can be placed on (a tp
// group of one GPU class, with its slowest GPU, link and usable memory),
// the evaluation of one replica on a sequence of them (replica_eval.cc), and
// the number formats of the plan's text (plan_text.cc).
//
// Thread-safety: pure functions and plain structs.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "coordinator/placement/placement_planner.h"

namespace tessera::placement_internal {

constexpr double kInf = std::numeric_limits<double>::infinity();

// "1.2 GB", "35 MB", "1.25 MB", "12 KB".
std::string Bytes(double b);
// "3.25 ms" for seconds.
std::string Ms(double s);
// "120 tok/s".
std::string Tps(double t);

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

struct Context {
  const ModelConfig* model = nullptr;
  const ClusterModel* cluster = nullptr;
  PlanOptions opt;
  ModelSizes sizes;
  WorkloadShape work;
  int64_t max_context = 0, min_kv = 0, prompt = 0, output = 0;
};

// Groups of `tp` local GPUs on `node`: inside NVLink islands first, then (when
// allowed) the remaining GPUs over PCIe, PCIe groups first.
std::vector<std::vector<int>> TpGroups(const ClusterNode& node, int tp, bool allow_pcie);

// The slot type of `gpus` (tp = gpus.size() per host, over `hosts` hosts) of
// GPU class `cls`.
SlotType MakeSlotType(const Context& c, int cls, int tp, int hosts, const std::vector<int>& gpus);

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
  // The replica of stage slot types `sig` (one SlotType index per stage):
  // whether it fits, its layer split and its predicted latency/throughput.
  ReplicaEval Evaluate(const std::vector<int>& sig) const;
};

}  // namespace tessera::placement_internal
