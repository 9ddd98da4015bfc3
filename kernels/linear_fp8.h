// Linear with an FP8 weight: y = x (W * scales)^T + b, the projections of an
// FP8 checkpoint (or of model.quantization = "fp8") on a backend that keeps
// them in FP8 (Backend::keeps_fp8_weights; worker/model/quantized_weight.h
// has the formats, docs/architecture.md "FP8 weights" the design).
//
// Shapes: x [tokens, in_features], w [out_features, in_features] F8E4M3
// (e4m3fn, the nn.Linear layout), scales.scales [out_features, scale_cols]
// F32 on w's device, bias [out_features] in x's dtype or undefined, y
// [tokens, out_features] in x's dtype or F32. W[r, c] = e4m3(w[r, c]) x
// scales[r, (c + col_phase) / cols_per_scale] (fp32 multiply, as transformers
// dequantizes): a per-channel or per-tensor scale is one column; a block
// scale (HF fp8's 128 x 128 weight_scale_inv) is one column per block of
// columns, repeated for each row of its block, and col_phase is the offset
// of the slice's first column inside its checkpoint block (a row-parallel tp
// slice that cuts a block).
//
// CUDA: x BF16 or F16; fp32 accumulation. Up to 8 tokens, a skinny kernel
// dequantizes in registers and reads each weight byte once (half the bytes
// of bf16: the decode step's bound); more tokens dequantize w into `scratch`
// (>= out_features x in_features elements of x's dtype) and run the dense
// GEMM (kernels/linear.h) on it. Requires in_features % 16 == 0 and block
// scales whose block and phase are multiples of 16 columns.
// CPU: x F32; w is dequantized into `scratch` (F32) and multiplied by
// OpenBLAS, the reference the CUDA kernels are tested against.
// Thread-safety: stateless; callers own y and scratch (one per owner thread).
#pragma once

#include <cstdint>

#include "common/base/status.h"
#include "common/base/tensor.h"

namespace tessera::kernels {

// Tokens up to which the CUDA kernel needs no scratch (kSkinnyGemmMaxRows).
inline constexpr int64_t kFp8SkinnyMaxTokens = 8;

struct Fp8Scales {
  Tensor scales;               // F32 [out_features, scale_cols]
  int64_t cols_per_scale = 1;  // columns of W per scale column (>= in_features + phase: one)
  int64_t col_phase = 0;       // the slice's first column inside its scale block
};

// Errors: kInvalidArgument naming the tensor whose shape, dtype or device
// disagrees, or the scale layout the kernels do not take.
Status LinearFp8(const Tensor& x, const Tensor& w, const Fp8Scales& scales, const Tensor& bias,
                 Tensor& y, Tensor& scratch);

// The operand checks both backends share: w F8E4M3 [n, k] and F32 scales
// covering its k columns on w's device, a scratch of at least n * k
// elements of `scratch_dtype` there when it is defined.
Status CheckFp8Operands(const Tensor& w, const Fp8Scales& scales, const Tensor& scratch,
                        DType scratch_dtype);

namespace cpu {
Status LinearFp8(const Tensor& x, const Tensor& w, const Fp8Scales& scales, const Tensor& bias,
                 Tensor& y, Tensor& scratch);
}
namespace cuda {
Status LinearFp8(const Tensor& x, const Tensor& w, const Fp8Scales& scales, const Tensor& bias,
                 Tensor& y, Tensor& scratch);
}

}  // namespace tessera::kernels
