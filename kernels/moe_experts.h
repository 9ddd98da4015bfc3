// The grouped expert computation of the MoE layer (worker/model/moe_layer.h):
// the routed (token, expert) pairs sorted by expert, then one launch per
// projection covering every expert a rank holds, then a weighted combine back
// to token order. This is the CUDA path of the layer; the CPU implementations
// of the same operations are the reference the tests compare it with (the
// CPU backend's MoE layer runs its experts one by one with Linear).
//
// Names: T tokens, K = top_k, S = T * K slots (an upper bound on the pairs a
// rank computes), E_local experts held (the experts [expert_begin,
// expert_end) of the router's rows), H hidden, I the expert intermediate
// columns the rank holds (moe_inter_local).
//
//   MoeSortByExpert: expert_ids I32 [T, K] -> MoeRouting (all I32, device of
//     expert_ids): expert_rows [E_local + 1] (exclusive offsets of each held
//     expert's slots; expert_rows[E_local] = the pairs held), slot_token [S]
//     (the token of each slot; slots past expert_rows[E_local] are unused),
//     token_slot [T, K] (the slot of each pair, -1 for another rank's
//     expert), active [E_local + 1] (active[0] = the held experts with at
//     least one pair, active[1..] their indices, ascending: the grouped
//     launches' grid covers min(E_local, S) experts, so a decode step with a
//     few active experts among many launches no empty blocks for the rest). Within an expert the
//     order of its slots is unspecified; no result below depends on it (each slot's row is computed
//     alone, and the combine sums a token's pairs in k order). When `token_totals` (I64 [E_local],
//     same device) is given, each held expert's pair count is added to it.
//   MoeGroupedGateUp: act[s, i] = silu(g) * u with g = x[slot_token[s]] .
//     gate_e[i], u = x[slot_token[s]] . up_e[i] (each rounded to the dtype
//     first, as transformers' gate_proj / up_proj outputs are), e the expert
//     of slot s; x [T, H], act [S, I].
//   MoeGroupedDown: y[s, h] = act[s] . down_e[h]; act [S, I], y [S, H].
//   MoeCombine: out[t] = sum over k (in k order) of weights[t, k] *
//     y[token_slot[t, k]] (pairs with slot -1 skipped), plus, when `shared`
//     is defined, sigmoid(shared_gate[t]) * shared[t] (Qwen2-MoE's shared
//     expert); y [S, H], weights F32 [T, K], shared [T, H], shared_gate F32
//     [T, 1], out [T, H]. Sums in fp32, rounded to out's dtype once.
//
// Dtypes: x, act, y, shared, out and the experts' weights share one floating
// dtype: F32 on the CPU; F32, BF16 or F16 on CUDA, accumulating in fp32.
// The CUDA launches take their grids from T, E_local and the widths alone
// (never from the counts, which stay on the device), so a decode step that
// runs them can be recorded as a CUDA graph and replayed.
//
// Errors: kInvalidArgument naming the tensor whose shape, dtype or device is
// wrong; MakeMoeExpertTable: kInvalidArgument naming the expert whose weight
// does not match, errors of the upload.
// Thread-safety: stateless; the table is immutable once made.
#pragma once

#include <cstdint>
#include <span>

#include "common/base/status.h"
#include "common/base/tensor.h"
#include "kernels/backend.h"

namespace tessera::kernels {

// The weights of the experts a rank holds, as one table the grouped launches
// read: their addresses on the backend's device (the tensors stay owned by
// the caller and must outlive the table).
struct MoeExpertTable {
  Tensor pointers;  // I64 [E_local, 3]: gate, up, down addresses (on the weights' device)
  DType dtype = DType::kF32;
  int64_t experts = 0;       // E_local
  int64_t hidden = 0;        // H
  int64_t intermediate = 0;  // I
  // Every weight row starts on a 16-byte boundary (vector loads on CUDA).
  bool aligned16 = false;
};

// gate[e], up[e] [I, H] and down[e] [H, I] of held expert e, all of one
// dtype on `backend`'s device. Errors: as above.
StatusOr<MoeExpertTable> MakeMoeExpertTable(Backend& backend, std::span<const Tensor> gate,
                                            std::span<const Tensor> up,
                                            std::span<const Tensor> down);

struct MoeRouting {
  Tensor expert_rows;  // I32 [E_local + 1]
  Tensor slot_token;   // I32 [S]
  Tensor token_slot;   // I32 [T, K]
  Tensor active;       // I32 [E_local + 1]
};

// Allocates `routing` on `backend` and fills it (see above). Errors: an id
// outside [0, num_experts) is not checked on CUDA (the router's top-k makes
// them); the CPU path returns kInvalidArgument naming it.
Status MoeSortByExpert(Backend& backend, const Tensor& expert_ids, int64_t expert_begin,
                       int64_t expert_end, MoeRouting& routing, Tensor* token_totals);
// MoeTopK (kernels/moe_routing.h) of router_logits F32 [T, E] into expert_ids and weights, then
// MoeSortByExpert of those ids into `routing`, as one call. On CUDA a step of at most 8 tokens
// (at most 512 router experts, 256 pairs, 1024 held experts) runs both in one launch
// (kernels/moe_routing_cuda.cu MoeRouteKernel: one block, a warp per token), with an expert's
// slots in pair order; other steps, and the CPU, run the two operations. Errors: those of the two.
Status MoeRoute(Backend& backend, const Tensor& router_logits, int64_t top_k, bool renormalize,
                int64_t expert_begin, int64_t expert_end, Tensor& expert_ids, Tensor& weights,
                MoeRouting& routing, Tensor* token_totals);
Status MoeGroupedGateUp(const Tensor& x, const MoeExpertTable& table, const MoeRouting& routing,
                        Tensor& act);
Status MoeGroupedDown(const Tensor& act, const MoeExpertTable& table, const MoeRouting& routing,
                      Tensor& y);
Status MoeCombine(const Tensor& y, const MoeRouting& routing, const Tensor& weights,
                  const Tensor& shared, const Tensor& shared_gate, Tensor& out);

namespace cpu {
Status MoeSortByExpert(const Tensor& expert_ids, int64_t expert_begin, int64_t expert_end,
                       MoeRouting& routing, Tensor* token_totals);
Status MoeRoute(const Tensor& router_logits, int64_t top_k, bool renormalize,
                int64_t expert_begin, int64_t expert_end, Tensor& expert_ids, Tensor& weights,
                MoeRouting& routing, Tensor* token_totals);
Status MoeGroupedGateUp(const Tensor& x, const MoeExpertTable& table, const MoeRouting& routing,
                        Tensor& act);
Status MoeGroupedDown(const Tensor& act, const MoeExpertTable& table, const MoeRouting& routing,
                      Tensor& y);
Status MoeCombine(const Tensor& y, const MoeRouting& routing, const Tensor& weights,
                  const Tensor& shared, const Tensor& shared_gate, Tensor& out);
}  // namespace cpu
namespace cuda {
Status MoeSortByExpert(const Tensor& expert_ids, int64_t expert_begin, int64_t expert_end,
                       MoeRouting& routing, Tensor* token_totals);
Status MoeRoute(const Tensor& router_logits, int64_t top_k, bool renormalize,
                int64_t expert_begin, int64_t expert_end, Tensor& expert_ids, Tensor& weights,
                MoeRouting& routing, Tensor* token_totals);
Status MoeGroupedGateUp(const Tensor& x, const MoeExpertTable& table, const MoeRouting& routing,
                        Tensor& act);
Status MoeGroupedDown(const Tensor& act, const MoeExpertTable& table, const MoeRouting& routing,
                      Tensor& y);
Status MoeCombine(const Tensor& y, const MoeRouting& routing, const Tensor& weights,
                  const Tensor& shared, const Tensor& shared_gate, Tensor& out);
}  // namespace cuda

// Shape and dtype checks shared by both devices (kernels/moe_experts.cc, with
// the table and the dispatch).
Status CheckMoeGateUp(const Tensor& x, const MoeExpertTable& table, const MoeRouting& routing,
                      const Tensor& act);
Status CheckMoeDown(const Tensor& act, const MoeExpertTable& table, const MoeRouting& routing,
                    const Tensor& y);
Status CheckMoeCombine(const Tensor& y, const MoeRouting& routing, const Tensor& weights,
                       const Tensor& shared, const Tensor& shared_gate, const Tensor& out);

}  // namespace tessera::kernels
