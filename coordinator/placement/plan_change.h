// PlanChange: the computation half of live reconfiguration, kept apart from
// its application (coordinator/serving/plan_runner.h drains, loads and resumes):
//  - PlanRequest: what POST /admin/plan asks for (its body is parsed by
//    coordinator/api/plan_json.h);
//  - FitLayout: the layout a re-plan runs when the wanted one needs more
//    workers than are usable (the fault rule, docs/operations.md);
//  - PlaceRanks: which worker runs which rank of a new layout, preferring a
//    worker that already holds the rank's slice, so it reuses its weights;
//  - DescribePlanChange: what a change would do, as a typed PlanChange (the
//    dry-run answer; coordinator/api/plan_json.h renders it).
//
// Reuse: a worker keeps a decoder layer's weights when the new rank holds
// the same layer under the same tp slice (equal stage tp and tp_rank; with
// a tp per stage, the tp of the rank's stage in each plan); the
// embedding and lm_head likewise (the vocab-parallel slice is the same).
// The worker's loader applies the same rule per tensor (worker/model/weight_loader.h)
// and reports what it really reused in Loaded.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/base/status.h"
#include "common/format/model_config.h"
#include "common/model/parallel_config.h"
#include "coordinator/placement/planner.h"

namespace tessera {

// A POST /admin/plan body. Exactly one form:
//   {"tp": 2, "pp": 2}                                even layer split
//   {"tp": 1, "pp": 2, "layers_per_stage": [20, 10]}  explicit split
//   {"tp": [2, 1]}                                    a tp per stage (pp =
//                                                     its length; "pp", if
//                                                     given, must equal it)
//   {"auto": true, "objective": "latency"}            the placement planner
struct PlanRequest {
  bool auto_plan = false;
  Objective objective = Objective::kLatency;  // with auto_plan
  int tp = 0;                                 // 0 when tp_per_stage is set
  std::vector<int> tp_per_stage;              // "tp" given as a list, one entry per stage
  int pp = 0;
  std::vector<int> layers_per_stage;  // empty: even split
  // The replica to change (its index); -1 (absent): the only one (the
  // coordinator refuses an absent replica when it serves several).
  int replica = -1;

  // The layout of `model` this request asks for (not auto_plan):
  // ParallelConfig::Make, or MakePerStage for a tp list. Errors: theirs.
  StatusOr<ParallelConfig> Layout(const ModelConfig& model) const;
};

// The slice a worker holds now (from the plan it serves or served last).
struct HeldSlice {
  int tp = 0;  // the tp of the stage the slice belongs to
  int tp_rank = 0;
  int first_layer = 0;  // decoder layers [first_layer, end_layer)
  int end_layer = 0;
  bool embedding = false;  // holds model.embed_tokens
  bool lm_head = false;    // holds model.norm and lm_head
};

// One rank of a new plan and what its worker can reuse.
struct RankPlacement {
  std::string worker_id;
  int world_rank = 0;
  int stage = 0;
  int tp = 1;  // the tp of the rank's stage
  int tp_rank = 0;
  int first_layer = 0;  // decoder layers [first_layer, end_layer)
  int end_layer = 0;
  // Decoder layers [reused_first, reused_end) the worker already holds under
  // this tp slice (empty when equal).
  int reused_first = 0;
  int reused_end = 0;
  bool reuses_embedding = false;
  bool reuses_lm_head = false;
  int loaded_layers() const { return end_layer - first_layer - (reused_end - reused_first); }
};

// The rank slice `parallel` gives `world_rank` (no reuse filled in).
RankPlacement RankSlice(const ParallelConfig& parallel, int world_rank);

// Fills the reuse fields of `p` (a rank of a layout with `pp` stages, its
// worker_id set) from what its worker holds (`held`, by worker id; a worker
// not there reuses nothing). Pure.
void FillReuse(RankPlacement& p, int pp, const std::map<std::string, HeldSlice>& held);

// Assigns every rank of `parallel` to a worker of `candidates` (ids in
// preference order): greedily over all (rank, worker) pairs, the pair that
// reuses the most (decoder layers, then the embedding / lm_head) first
// (ties: the lower rank, then the earlier candidate); ranks that can reuse
// nothing take the remaining candidates in order. Errors:
// kFailedPrecondition naming both counts when there are fewer candidates
// than ranks.
StatusOr<std::vector<RankPlacement>> PlaceRanks(const ParallelConfig& parallel,
                                                const std::vector<std::string>& candidates,
                                                const std::map<std::string, HeldSlice>& held);

// The layout a re-plan runs on `available` usable workers when it wants
// `wanted`:
//  1. `wanted` itself (its layer split too) when tp * pp <= available;
//  2. else the layout with the most ranks (<= available) that passes
//     ParallelConfig's rules, its tp the largest divisor of that rank count
//     not above wanted.max_tp() (so tp shrinks only when it must; the
//     result has one tp for every stage), layers split evenly;
// and in both, every rank's weights must fit `max_rank_weight_bytes` (the
// smallest worker's memory; 0 = unknown, not checked).
// Errors: kFailedPrecondition when no layout fits ("no layout of the model
// fits N usable worker(s) (last reason: ...)"; the caller says the replica
// is degraded), naming the worker count and the last reason.
StatusOr<ParallelConfig> FitLayout(const ModelConfig& model, const ParallelConfig& wanted,
                                   int available, int64_t max_rank_weight_bytes = 0);

// What applying a layout over the running one does (the dry run of POST
// /admin/plan). A value type.
struct PlanChange {
  std::optional<ParallelConfig> from;  // the running layout; none before the first placement
  ParallelConfig to;                   // the new layout
  uint64_t plan_version = 0;           // the version the change would get
  std::vector<RankPlacement> ranks;    // one per world rank of `to`, in rank order
  // Workers of the running plan that the new one does not use, in the
  // running plan's rank order.
  std::vector<std::string> workers_released;
  int layers_reused = 0;  // decoder layers kept, summed over the ranks
  int layers_loaded = 0;  // decoder layers loaded, summed over the ranks
};

// The change of applying `to` (placed as `ranks`) over the running `from`
// (null: nothing runs), whose workers are `from_workers`; the change gets
// `next_version`. Pure.
PlanChange DescribePlanChange(const ParallelConfig* from, const ParallelConfig& to,
                              const std::vector<RankPlacement>& ranks,
                              const std::vector<std::string>& from_workers, uint64_t next_version);

}  // namespace tessera
