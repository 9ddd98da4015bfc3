// Linear layer: y = x W^T + b, the matrix product behind every projection.
//
// Shapes: x [tokens, in_features], w [out_features, in_features] (the HF
// nn.Linear layout), bias [out_features] or undefined, y [tokens,
// out_features]. dtype F32 on the CPU (cblas_sgemm from OpenBLAS). On CUDA
// (cuBLASLt, fp32 accumulation): x, w and bias share one dtype (F32, BF16 or
// F16) and y has that dtype or F32 (e.g. bf16 lm_head -> fp32 logits); the
// weight stays in the nn.Linear layout, the "TN" GEMM cuBLAS runs fastest;
// the bias is a cuBLASLt epilogue.
// Thread-safety: stateless; callers own the output buffer.
#pragma once

#include "common/base/status.h"
#include "common/base/tensor.h"

namespace tessera::kernels {

// Errors: kInvalidArgument on mismatched shapes or dtypes (naming both shapes).
Status Linear(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& y);

namespace cpu {
Status Linear(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& y);
}
namespace cuda {
Status Linear(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& y);
}

}  // namespace tessera::kernels
