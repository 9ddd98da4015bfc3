// The one place that maps a (pipeline stage, tensor-parallel rank) pair to a
// world rank and back.
//
// Tessera runs one process per rank. Ranks are laid out pp-outermost, then tp:
//
//   world_rank = stage * tp + tp_rank,   0 <= stage < pp, 0 <= tp_rank < tp
//
// so the tp ranks of one stage are contiguous (stage 0 holds world ranks
// 0..tp-1, stage 1 holds tp..2*tp-1, ...). World size is tp * pp.
//
// Thread-safety: pure functions.
#pragma once

namespace tessera {

// World rank of tensor-parallel rank `tp_rank` in pipeline stage `stage`,
// with `tp` ranks per stage.
inline int WorldRank(int stage, int tp_rank, int tp) { return stage * tp + tp_rank; }

// Pipeline stage that holds `world_rank` (inverse of WorldRank).
inline int StageOf(int world_rank, int tp) { return world_rank / tp; }

// Tensor-parallel rank of `world_rank` within its stage (inverse of WorldRank).
inline int TpRankOf(int world_rank, int tp) { return world_rank % tp; }

}  // namespace tessera
