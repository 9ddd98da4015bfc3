// Per-head RMSNorm (HF Qwen3RMSNorm(head_dim) applied as q_norm / k_norm to
// q and k viewed as [tokens, heads, head_dim], before RoPE):
//   x[t, h, i] = x[t, h, :] / sqrt(mean_i(x[t, h, :]^2) + eps) * weight[i]
// in place, in fp32 (sums of squares in fp32, the result rounded once).
//
// Each head is normalised on its own with the same weight, so under tensor
// parallelism a rank normalises its local heads with the whole (replicated)
// weight and no communication.
//
// Shapes: x [tokens, heads, head_dim], weight [head_dim], one dtype: F32 on
// the CPU; F32, BF16 or F16 on CUDA.
// Thread-safety: stateless.
#pragma once

#include "common/base/status.h"
#include "common/base/tensor.h"

namespace tessera::kernels {

// Errors: kInvalidArgument on shape/dtype mismatch.
Status HeadRmsNorm(Tensor& x, const Tensor& weight, float eps);

namespace cpu {
Status HeadRmsNorm(Tensor& x, const Tensor& weight, float eps);
}  // namespace cpu
namespace cuda {
Status HeadRmsNorm(Tensor& x, const Tensor& weight, float eps);
}  // namespace cuda

}  // namespace tessera::kernels
