// The MoE layer's down projection and combine (kernels/moe_experts.h MoeGroupedDown, then
// MoeCombine) as one call:
//   out[t] = sum over k, in k order, of weights[t, k] * round(act[token_slot[t, k]] . down_e[h])
//            (+ sigmoid(shared_gate[t]) * shared[t]),   e = expert_ids[t, k] - expert_begin,
// pairs with token_slot -1 (another rank's expert) skipped, each product rounded to the dtype as
// MoeGroupedDown stores y, the sum in fp32 rounded once: the same bits as the two calls.
//
// On CUDA a decode step (at most kMoeDownCombineMaxTokens tokens, top_k <= 64, rows 16-byte
// aligned, the CUDA-core grouped kernel's regime) runs it as one launch
// (kernels/moe_experts_cuda.cu MoeDownCombineKernel: a warp per output column of a token, its
// pairs' expert rows in flight together): y [slots, hidden] is neither written nor read, and the
// combine's launch goes. Other steps, and the CPU, run the two calls with y allocated on `backend`.
// MoeDownCombineEnabled says whether a model should take this call: TESSERA_CUDA_MOE_DOWN_COMBINE=1
// in the environment (off by default until a GPU run has measured it against the two kernels).
//
// Names and shapes as kernels/moe_experts.h: T tokens, K = top_k, S = T * K slots, H hidden, I the
// intermediate columns held. act [S, I]; expert_ids I32 [T, K] (the router's global ids, as
// MoeRoute wrote them; the held ones start at expert_begin); weights F32 [T, K]; shared [T, H] and
// shared_gate F32 [T, 1], or both undefined; out [T, H]. act, shared, out and the table share one
// floating dtype (F32 on the CPU; F32, BF16, F16 on CUDA).
// Errors: kInvalidArgument naming the tensor whose shape, dtype or device is wrong; errors of the
// allocation and the launch.
// Thread-safety: stateless; callers own out.
#pragma once

#include <cstdint>

#include "common/base/status.h"
#include "common/base/tensor.h"
#include "kernels/backend.h"
#include "kernels/moe_experts.h"

namespace tessera::kernels {

inline constexpr int64_t kMoeDownCombineMaxTokens = 8;

// TESSERA_CUDA_MOE_DOWN_COMBINE=1 (read once).
bool MoeDownCombineEnabled();

Status MoeDownCombine(Backend& backend, const Tensor& act, const MoeExpertTable& table,
                      const MoeRouting& routing, const Tensor& expert_ids, int64_t expert_begin,
                      const Tensor& weights, const Tensor& shared, const Tensor& shared_gate,
                      Tensor& out);

// The checks above (kernels/moe_experts.cc).
Status CheckMoeDownCombine(const Tensor& act, const MoeExpertTable& table,
                           const MoeRouting& routing, const Tensor& expert_ids,
                           int64_t expert_begin, const Tensor& weights, const Tensor& shared,
                           const Tensor& shared_gate, const Tensor& out);

namespace cuda {
// Whether the one launch takes this step (the conditions above).
bool MoeDownCombineFuses(const Tensor& act, const MoeExpertTable& table, const MoeRouting& routing);
// The one launch; kernels::MoeDownCombine calls it after the checks, when MoeDownCombineFuses.
Status MoeDownCombine(const Tensor& act, const MoeExpertTable& table, const MoeRouting& routing,
                      const Tensor& expert_ids, int64_t expert_begin, const Tensor& weights,
                      const Tensor& shared, const Tensor& shared_gate, Tensor& out);
}  // namespace cuda

}  // namespace tessera::kernels
