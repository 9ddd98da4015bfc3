// Linear layer: y = x W^T + b, the matrix product behind every projection.
//
// Shapes: x [tokens, in_features], w [out_features, in_features] (the HF
// nn.Linear layout), bias [out_features] or undefined, y [tokens,
// out_features]. dtype F32 on the CPU (cblas_sgemm from OpenBLAS).
// Thread-safety: stateless; callers own the output buffer.
#pragma once

#include "common/status.h"
#include "common/tensor.h"

namespace tessera::kernels {

// Errors: kInvalidArgument on mismatched shapes or dtypes (naming both shapes).
Status Linear(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& y);

namespace cpu {
Status Linear(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& y);
}

}  // namespace tessera::kernels
