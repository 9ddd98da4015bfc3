// The mixture-of-experts block of a sparse decoder layer (Mixtral,
// Qwen2-MoE, Qwen3-MoE), on one tp rank, before the group's all-reduce.
//
//   logits = x Wr^T                              [tokens, num_experts]
//   (w, ids) = top-k of softmax(logits), renormalised when norm_topk_prob
//   out = sum over the top-k (e, w) of w * down_e(silu(gate_e x) * up_e x)
//   out += sigmoid(x Wsg^T) * down_s(silu(gate_s x) * up_s x)  (shared expert)
// as transformers' MixtralSparseMoeBlock / Qwen2MoeSparseMoeBlock /
// Qwen3MoeSparseMoeBlock compute it.
//
// The split (ParallelConfig::expert_parallel; docs/architecture.md "The MoE
// layer"): every rank routes every token (x and the router are replicated).
// Without expert parallelism each rank holds a column/row slice of every
// expert and of the shared expert, so `out` is its partial sum, as the dense
// MLP's down projection; with it a rank holds whole experts and `out` holds
// the contributions of its own experts only. Either way the caller's
// all-reduce of `out` over the tp group gives the layer's output.
//
// On CUDA (MoeDeviceLayer below) the same block runs as a few launches whose
// grids do not depend on the routing, so decode steps record as CUDA graphs:
// logits (Linear, F32) -> router top-k kernel -> sort of the (token, expert)
// pairs by held expert on the device -> one grouped gate|up+SwiGLU launch and
// one grouped down launch over every held expert -> the weighted combine back
// to token order, with the shared expert's sigmoid-gated output
// (kernels/moe_routing.h, kernels/moe_experts.h; docs/architecture.md).
//
// Thread-safety: a free function; `stats` belongs to the caller.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "common/base/status.h"
#include "common/base/tensor.h"
#include "common/format/model_config.h"
#include "kernels/backend.h"
#include "kernels/moe_experts.h"
#include "worker/model/stage_weights.h"

namespace tessera {

// Tokens each expert a rank holds has run, summed over the stage's sparse
// layers and over steps (tessera_moe_expert_tokens_total). Written by the
// model's owner thread, read by the metrics scrape: relaxed atomics, so a
// read sees every count a step finished before it, or a later one.
class MoeTokenCounts {
 public:
  // The experts [expert_begin, expert_end) the rank holds.
  MoeTokenCounts(int64_t expert_begin, int64_t expert_end);
  int64_t expert_begin() const { return begin_; }
  int64_t expert_end() const { return end_; }
  // Precondition: expert_begin <= expert < expert_end.
  void Add(int64_t expert, int64_t tokens);
  int64_t Tokens(int64_t expert) const;
  // Sets expert expert_begin + i to totals[i] (running totals kept on a
  // device, MoeDeviceLayer::token_totals). Precondition: totals.size() is the
  // held experts.
  void Publish(std::span<const int64_t> totals);

 private:
  int64_t begin_, end_;
  std::unique_ptr<std::atomic<int64_t>[]> counts_;
};

// What a sparse layer needs on a CUDA backend, made once before the first
// step (never while a graph is being recorded): the held experts' weights as
// one table, and the device counters of the tokens each held expert ran
// (shared by the stage's sparse layers; the model publishes them to
// MoeTokenCounts now and then, as reading them waits for the device).
struct MoeDeviceLayer {
  kernels::MoeExpertTable table;
  Tensor* token_totals = nullptr;  // I64 [held experts] on the device, or null
};
// Errors: those of MakeMoeExpertTable, naming the layer.
StatusOr<kernels::MoeExpertTable> MakeMoeDeviceTable(kernels::Backend& backend,
                                                     const LayerWeights& w, int layer);

// x [tokens, hidden] (the post-attention RMSNorm of the layer's input) ->
// out [tokens, hidden] (this rank's partial, to be all-reduced). On the CPU
// (device == null) x and out are F32 and `counts` (optional) accumulates the
// tokens each held expert ran; on CUDA `device` is required and x and out
// have the compute dtype. Errors: a CUDA backend without `device`
// (kFailedPrecondition); shape errors of the kernels, naming the layer.
Status MoeForward(const ModelConfig& config, const LayerWeights& w, int layer,
                  kernels::Backend& backend, const Tensor& x, Tensor& out, MoeTokenCounts* counts,
                  const MoeDeviceLayer* device = nullptr);

}  // namespace tessera
