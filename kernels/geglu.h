// GeGLU activation of the Gemma MLP (Shazeer 2020, "GLU Variants Improve
// Transformer"; HF Gemma2MLP / Gemma3MLP with hidden_activation
// gelu_pytorch_tanh): out = gelu_tanh(gate) * up, with PyTorch's tanh
// approximation of GELU,
//   gelu_tanh(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
//
// Shapes: gate, up, out [tokens, intermediate_local]; out may alias gate.
// GeluTanhMulFused reads both from the fused gate|up projection's output,
// gate_up [tokens, 2 * intermediate_local] (gate columns first, as
// SiluMulFused in kernels/swiglu.h); out [tokens, intermediate_local] must not
// overlap it.
// One dtype: F32 on the CPU; F32, BF16 or F16 on CUDA (computed in fp32, the
// result rounded once).
// Thread-safety: stateless.
#pragma once

#include "common/base/status.h"
#include "common/base/tensor.h"

namespace tessera::kernels {

// Errors: kInvalidArgument when the shapes, dtypes or devices differ.
Status GeluTanhMul(const Tensor& gate, const Tensor& up, Tensor& out);
Status GeluTanhMulFused(const Tensor& gate_up, Tensor& out);

namespace cpu {
Status GeluTanhMul(const Tensor& gate, const Tensor& up, Tensor& out);
Status GeluTanhMulFused(const Tensor& gate_up, Tensor& out);
}  // namespace cpu
namespace cuda {
Status GeluTanhMul(const Tensor& gate, const Tensor& up, Tensor& out);
Status GeluTanhMulFused(const Tensor& gate_up, Tensor& out);
}  // namespace cuda

}  // namespace tessera::kernels
