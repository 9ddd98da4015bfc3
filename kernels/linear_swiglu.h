// The Llama MLP's fused gate|up projection and its SwiGLU in one call:
//   act = silu(x w_gate^T + b_gate) * (x w_up^T + b_up),   silu(g) = g / (1 + exp(-g))
// (Shazeer 2020, "GLU Variants Improve Transformer"), where w is the fused gate|up weight of
// worker/model/stage_weights.h: w_gate its rows [0, inter), w_up its rows [inter, 2 * inter).
// The result equals, bit for bit, Linear(x, w, bias, gate_up) then SiluMulFused(gate_up, act):
// the two sums are rounded to the dtype before the activation, as the separate calls store them.
//
// On CUDA it is the skinny GEMM (kernels/skinny_gemm_cuda.cu) with each warp streaming gate row i
// and up row inter + i, and writing act[:, i] from its epilogue: the fused-activation kernel and
// the gate_up buffer's write and read disappear from a decode step (one launch a layer).
// LinearSiluMulFuses says when a model takes it: the shapes allow it, unless
// TESSERA_CUDA_FUSED_SWIGLU=0 (or TESSERA_CUDA_SKINNY_GEMM=0) is set, for A/B runs against the two
// kernels (an H100: 0.7% faster at batch 1 and 2% at batch 64 on the Llama-2-7B shape,
// bench/results/NOTES.md 2026-12-07j). LinearSiluMul itself runs whenever the shapes allow,
// switch or not (the GPU tests call it).
//
// Shapes: x [tokens, k]; w [2 * inter, k]; bias [2 * inter] or undefined; act [tokens, inter]; one
// dtype (F32 on the CPU; BF16 or F16 on CUDA, with 1 <= tokens <= kSkinnyGemmMaxRows, k % 8 == 0,
// x and w 16-byte aligned).
// Errors: kInvalidArgument naming the tensor whose shape, dtype or device does not match;
// kFailedPrecondition for a CUDA call the skinny GEMM does not take (more than 8 rows,
// misaligned operands).
// Thread-safety: stateless; callers own act.
#pragma once

#include "common/base/status.h"
#include "common/base/tensor.h"

namespace tessera::kernels {

// True when a model should take the CUDA form for x and w: the switch is on and the shapes allow
// it (false for CPU tensors: the CPU composes the two calls, which a model makes itself).
bool LinearSiluMulFuses(const Tensor& x, const Tensor& w);

Status LinearSiluMul(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& act);

namespace cpu {
Status LinearSiluMul(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& act);
}
namespace cuda {
bool LinearSiluMulFuses(const Tensor& x, const Tensor& w);
Status LinearSiluMul(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& act);
}  // namespace cuda

}  // namespace tessera::kernels
