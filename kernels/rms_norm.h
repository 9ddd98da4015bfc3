// RMSNorm (Zhang & Sennrich 2019; HF LlamaRMSNorm):
//   y[t, i] = x[t, i] / sqrt(mean_i(x[t, :]^2) + eps) * (weight_offset + weight[i])
// computed in fp32. weight_offset is 0 (Llama, ...) or 1 (Gemma's RMSNorm,
// which scales by 1 + weight: HF Gemma2RMSNorm / Gemma3RMSNorm, whose
// weights are stored as offsets from 1 and the sum taken in fp32).
//
// Shapes: x [tokens, hidden], weight [hidden], y [tokens, hidden] (y may
// alias x), one dtype: F32 on the CPU; F32, BF16 or F16 on CUDA (sums of
// squares in fp32, the result rounded once).
// Thread-safety: stateless.
#pragma once

#include "common/base/status.h"
#include "common/base/tensor.h"

namespace tessera::kernels {

// Errors: kInvalidArgument on shape/dtype mismatch.
Status RmsNorm(const Tensor& x, const Tensor& weight, float eps, Tensor& y,
               float weight_offset = 0.0f);

// Fused residual add + RMSNorm: residual += x (rounded to the dtype); y =
// RmsNorm(residual). Shapes: residual, x, y [tokens, hidden]; weight [hidden].
Status AddRmsNorm(Tensor& residual, const Tensor& x, const Tensor& weight, float eps, Tensor& y,
                  float weight_offset = 0.0f);

namespace cpu {
Status RmsNorm(const Tensor& x, const Tensor& weight, float eps, Tensor& y,
               float weight_offset = 0.0f);
Status AddRmsNorm(Tensor& residual, const Tensor& x, const Tensor& weight, float eps, Tensor& y,
                  float weight_offset = 0.0f);
}  // namespace cpu
namespace cuda {
Status RmsNorm(const Tensor& x, const Tensor& weight, float eps, Tensor& y,
               float weight_offset = 0.0f);
Status AddRmsNorm(Tensor& residual, const Tensor& x, const Tensor& weight, float eps, Tensor& y,
                  float weight_offset = 0.0f);
}  // namespace cuda

}  // namespace tessera::kernels
