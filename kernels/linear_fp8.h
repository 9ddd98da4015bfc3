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
// of bf16: the decode step's bound). More tokens with one scale per weight
// row run on FP8 tensor cores (Fp8QuantizesActivations: x quantized per
// token into `scratch`); the rest dequantize w into `scratch` and run the
// dense GEMM (kernels/linear.h) on it. `scratch` holds at least
// Fp8ScratchElements elements of x's dtype. Requires in_features % 16 == 0
// and block scales whose block and phase are multiples of 16 columns.
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

// Whether LinearFp8 on CUDA runs x [m, k] @ w [n, k]^T as W8A8 on FP8
// tensor cores: m > kFp8SkinnyMaxTokens, one scale column (per-channel or
// per-tensor weight scales), n % 16 == 0, k % 16 == 0, and the environment
// variable TESSERA_CUDA_FP8_GEMM is not "0" (on by default since an H100
// run checked it: bench/results/NOTES.md, "W8A8 FP8 runs"; "0" keeps W8A16,
// whose results are closer to the unquantized model's). Then each token
// row of x is quantized to e4m3 with a dynamic scale max|x_row| / 448 (the
// per-token dynamic activation scheme of vLLM's and compressed-tensors' FP8
// "dynamic" activations), and cuBLASLt multiplies e4m3 x e4m3 with fp32
// accumulation, applying the weight-row and token scale vectors in its
// epilogue (CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F, cuBLAS >= 12.9 on
// sm_90). Otherwise x keeps its dtype (W8A16). Thread-safe (reads the
// environment once). Should cuBLASLt have no algorithm for a shape, that
// shape falls back to W8A16 (dequantized weight, a warning logged once, and
// Fp8TensorCoreFallbacks counts it), so serving never fails on it.
bool Fp8QuantizesActivations(int64_t m, int64_t n, int64_t k, const Fp8Scales& scales);

// Products that Fp8QuantizesActivations chose for tensor cores but that ran
// W8A16 because cuBLASLt had no algorithm, since the process started.
// Thread-safe.
int64_t Fp8TensorCoreFallbacks();
void CountFp8TensorCoreFallback();  // for the CUDA implementation

// Elements of `dtype` (x's on CUDA, F32 on the CPU) that LinearFp8 needs in
// `scratch` for x [m, k] @ w [n, k]^T on `device`: 0 up to 8 CUDA tokens;
// m x k bytes of e4m3 (16-byte aligned) + m fp32 token scales for W8A8;
// n x k (the dequantized weight) otherwise.
int64_t Fp8ScratchElements(Device device, DType dtype, int64_t m, int64_t n, int64_t k,
                           const Fp8Scales& scales);

// Errors: kInvalidArgument naming the tensor whose shape, dtype or device
// disagrees, or the scale layout the kernels do not take.
Status LinearFp8(const Tensor& x, const Tensor& w, const Fp8Scales& scales, const Tensor& bias,
                 Tensor& y, Tensor& scratch);

// The operand checks both backends share: w F8E4M3 [n, k] and F32 scales
// covering its k columns on w's device, a scratch of at least
// `scratch_elements` elements of `scratch_dtype` there when it is defined.
Status CheckFp8Operands(const Tensor& w, const Fp8Scales& scales, const Tensor& scratch,
                        DType scratch_dtype, int64_t scratch_elements);

namespace cpu {
Status LinearFp8(const Tensor& x, const Tensor& w, const Fp8Scales& scales, const Tensor& bias,
                 Tensor& y, Tensor& scratch);
}
namespace cuda {
Status LinearFp8(const Tensor& x, const Tensor& w, const Fp8Scales& scales, const Tensor& bias,
                 Tensor& y, Tensor& scratch);
}

}  // namespace tessera::kernels
