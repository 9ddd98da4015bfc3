// RMSNorm (Zhang & Sennrich 2019; HF LlamaRMSNorm):
//   y[t, i] = x[t, i] / sqrt(mean_i(x[t, :]^2) + eps) * weight[i]
// computed in fp32.
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
Status RmsNorm(const Tensor& x, const Tensor& weight, float eps, Tensor& y);

// Fused residual add + RMSNorm: residual += x; y = RmsNorm(residual).
// Shapes: residual, x, y [tokens, hidden]; weight [hidden].
Status AddRmsNorm(Tensor& residual, const Tensor& x, const Tensor& weight, float eps, Tensor& y);

namespace cpu {
Status RmsNorm(const Tensor& x, const Tensor& weight, float eps, Tensor& y);
Status AddRmsNorm(Tensor& residual, const Tensor& x, const Tensor& weight, float eps, Tensor& y);
}  // namespace cpu
namespace cuda {
Status RmsNorm(const Tensor& x, const Tensor& weight, float eps, Tensor& y);
Status AddRmsNorm(Tensor& residual, const Tensor& x, const Tensor& weight, float eps, Tensor& y);
}  // namespace cuda

}  // namespace tessera::kernels
