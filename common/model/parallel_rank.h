// The one place that maps a (pipeline stage, tensor-parallel rank) pair to a
// world rank and back.
//
// Tessera runs one process per rank. Ranks are laid out pp-outermost, then tp:
// the ranks of stage 0 come first, then those of stage 1, and so on, and the
// tp ranks of one stage are contiguous. With tp_s ranks in stage s:
//
//   world_rank = (tp_0 + tp_1 + ... + tp_{stage-1}) + tp_rank,   0 <= tp_rank < tp_stage
//   world size = tp_0 + ... + tp_{pp-1}
//
// With the same tp on every stage (the usual layout) this is
//
//   world_rank = stage * tp + tp_rank,   stage = world_rank / tp,   tp_rank = world_rank % tp
//
// (stage 0 holds world ranks 0..tp-1, stage 1 holds tp..2*tp-1, ...), which
// the uniform overloads below compute in O(1). A mixed layout such as
// tp = [4, 2] holds stage 0 on world ranks 0..3 and stage 1 on 4..5.
//
// Thread-safety: pure functions.
#pragma once

#include <span>

namespace tessera {

// --- Uniform tp: `tp` ranks in every stage. ---

// World rank of tensor-parallel rank `tp_rank` in pipeline stage `stage`,
// with `tp` ranks per stage.
inline int WorldRank(int stage, int tp_rank, int tp) { return stage * tp + tp_rank; }

// Pipeline stage that holds `world_rank` (inverse of WorldRank).
inline int StageOf(int world_rank, int tp) { return world_rank / tp; }

// Tensor-parallel rank of `world_rank` within its stage (inverse of WorldRank).
inline int TpRankOf(int world_rank, int tp) { return world_rank % tp; }

// --- Per-stage tp: stage s has tp_per_stage[s] ranks. ---
// Preconditions (callers pass a validated layout): every entry >= 1,
// 0 <= stage < tp_per_stage.size(), 0 <= world_rank < the sum of the entries.

// World rank of the first (tp_rank 0) rank of `stage`: the prefix sum
// tp_0 + ... + tp_{stage-1}.
inline int StageFirstRank(int stage, std::span<const int> tp_per_stage) {
  int first = 0;
  for (int s = 0; s < stage; ++s) first += tp_per_stage[static_cast<size_t>(s)];
  return first;
}

// World rank of tensor-parallel rank `tp_rank` in `stage`.
inline int WorldRank(int stage, int tp_rank, std::span<const int> tp_per_stage) {
  return StageFirstRank(stage, tp_per_stage) + tp_rank;
}

// Pipeline stage that holds `world_rank` (inverse of WorldRank); -1 when
// world_rank is past the last stage.
inline int StageOf(int world_rank, std::span<const int> tp_per_stage) {
  int end = 0;
  for (size_t s = 0; s < tp_per_stage.size(); ++s) {
    end += tp_per_stage[s];
    if (world_rank < end) return static_cast<int>(s);
  }
  return -1;
}

// Tensor-parallel rank of `world_rank` within its stage (inverse of WorldRank).
inline int TpRankOf(int world_rank, std::span<const int> tp_per_stage) {
  return world_rank - StageFirstRank(StageOf(world_rank, tp_per_stage), tp_per_stage);
}

}  // namespace tessera
