// Per-head RMSNorm (HF Qwen3RMSNorm(head_dim) or Gemma3RMSNorm(head_dim)
// applied as q_norm / k_norm to q and k viewed as [tokens, heads, head_dim],
// before RoPE):
//   x[t, h, i] = x[t, h, :] / sqrt(mean_i(x[t, h, :]^2) + eps) * (weight_offset + weight[i])
// in place, in fp32 (sums of squares and the scale in fp32, the result
// rounded once). weight_offset: 0 (Qwen3) or 1 (Gemma 3's 1 + weight).
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
Status HeadRmsNorm(Tensor& x, const Tensor& weight, float eps, float weight_offset = 0.0f);

namespace cpu {
Status HeadRmsNorm(Tensor& x, const Tensor& weight, float eps, float weight_offset = 0.0f);
}  // namespace cpu
namespace cuda {
Status HeadRmsNorm(Tensor& x, const Tensor& weight, float eps, float weight_offset = 0.0f);
}  // namespace cuda

}  // namespace tessera::kernels
