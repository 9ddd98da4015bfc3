// Mixture-of-experts routing and combining (the reference CPU path of the
// MoE layer, worker/model/moe_layer.h).
//
// MoeTopK: for each token t of router_logits [T, E] (F32),
//   p = softmax(router_logits[t]) in fp32,
//   (w, ids) = the top_k largest p, in descending order (ties: the lower
//   expert id first, as torch.topk on CPU),
//   w /= sum(w) when `renormalize` (Mixtral always; Qwen norm_topk_prob),
// as transformers' MixtralTopKRouter / Qwen2MoeTopKRouter / Qwen3MoeTopKRouter
// compute it. Outputs: expert_ids I32 [T, top_k], weights F32 [T, top_k].
//
// MoeScatterAdd: out[rows[i]] += scales[i] * src[i] for each row i of src
// [n, H] (F32), into out [T, H] (F32), as transformers' index_add_ of the
// weighted expert outputs.
//
// Shapes as above; F32 logits and weights, I32 ids. MoeTopK runs on the CPU
// and on CUDA (kernels/moe_routing_cuda.cu: one block per token, the same
// fp32 softmax and tie rule); MoeScatterAdd is the CPU layer's combine (the
// CUDA layer combines with MoeCombine, kernels/moe_experts.h).
// Thread-safety: stateless.
#pragma once

#include <cstdint>
#include <span>

#include "common/base/status.h"
#include "common/base/tensor.h"

namespace tessera::kernels {

// Errors: kInvalidArgument for shapes or dtypes other than the above, outputs
// on another device than the logits, or top_k outside [1, E]; on CUDA also
// more than 12288 experts (a token's probabilities live in shared memory);
// kUnavailable for a CUDA tensor in a build without the CUDA backend.
Status MoeTopK(const Tensor& router_logits, int64_t top_k, bool renormalize, Tensor& expert_ids,
               Tensor& weights);

namespace cpu {
Status MoeTopK(const Tensor& router_logits, int64_t top_k, bool renormalize, Tensor& expert_ids,
               Tensor& weights);
}
namespace cuda {
Status MoeTopK(const Tensor& router_logits, int64_t top_k, bool renormalize, Tensor& expert_ids,
               Tensor& weights);
}
// The shape, dtype and device checks of MoeTopK (every device).
Status CheckMoeTopK(const Tensor& router_logits, int64_t top_k, const Tensor& expert_ids,
                    const Tensor& weights);

// Errors: kInvalidArgument for mismatched shapes, a row outside [0, T), or
// rows/scales not src's row count; kUnimplemented for a non-CPU tensor.
Status MoeScatterAdd(const Tensor& src, std::span<const int64_t> rows,
                     std::span<const float> scales, Tensor& out);

}  // namespace tessera::kernels
