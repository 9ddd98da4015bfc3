// The work plan of FlashInfer's Hopper (sm90, FlashAttention-3) paged prefill
// (kernels/flashinfer_launch.h, LaunchFlashInferPrefillSm90): which query tiles of which heads
// each persistent CTA computes, and in what order.
//
// The kernel launches one CTA per SM; CTA c walks work items work_indptr[c] ..
// work_indptr[c + 1] - 1. A work item is one query tile (tile_q consecutive query rows) of one
// sequence under one query head, attending causally to its sequence's context: query row i of a
// sequence with q_len rows and kv_len positions sits at position kv_len - q_len + i, so tile t
// reads min(kv_len, kv_len - q_len + (t + 1) * tile_q) positions.
//
// The assignment is longest-processing-time first (Graham, "Bounds on multiprocessing timing
// anomalies", SIAM J. Appl. Math. 17(2), 1969): items sorted by cost, largest first, each given
// to the CTA with the least work so far, which bounds the longest CTA at 4/3 of the optimum.
// Cost of an item: the positions it reads plus tile_q (its own rows: the Q load, the softmax
// and the output store, measured in units of one key position).
//
// Host code only (no device); stateless; thread-safe.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace tessera::kernels {

// One sequence of the step as the plan sees it.
struct PrefillWorkSeq {
  int32_t q_begin = 0;   // first query row of the sequence in the step's q / out
  int32_t q_len = 0;     // query rows (>= 0; 0: the sequence has no work)
  int32_t kv_begin = 0;  // its keys: the offset of its block table in the step's page
                         // indices (paged), or its first row of the step's K/V (ragged)
  int32_t kv_len = 0;    // context positions, these rows included (>= q_len)
  int32_t batch = 0;     // the sequence's index in the step (FlashInfer's batch_idx)
};

// The plan, packed as the kernel's eight I32 arrays in one buffer (`values`), W = works:
//   work_indptr [ctas + 1], then qo_tile, qo_indptr, kv_indptr, qo_len, kv_len, head, batch,
//   each [W]. qo_indptr and kv_indptr of an item are its sequence's q_begin and kv_begin.
struct PrefillWorkPlan {
  int64_t ctas = 0, works = 0;
  int64_t max_cta_cost = 0, total_cost = 0;  // in key positions (see above)
  std::vector<int32_t> values;

  enum Field { kQoTile = 0, kQoIndptr, kKvIndptr, kQoLen, kKvLen, kHead, kBatch };
  // Offset in `values` of a per-item array.
  int64_t Offset(Field f) const { return ctas + 1 + static_cast<int64_t>(f) * works; }
};

// Plans `seqs` under `heads` query heads for `ctas` persistent CTAs (the device's SM count) with
// query tiles of tile_q rows. Preconditions (TESSERA_CHECKed): heads, ctas, tile_q > 0;
// 0 <= q_len <= kv_len for every sequence.
PrefillWorkPlan PlanPrefillWork(std::span<const PrefillWorkSeq> seqs, int64_t heads, int64_t ctas,
                                int64_t tile_q);

}  // namespace tessera::kernels
