// SwiGLU activation of the Llama MLP (Shazeer 2020, "GLU Variants Improve
// Transformer"): out = silu(gate) * up, silu(x) = x / (1 + exp(-x)).
//
// Shapes: gate, up, out [tokens, intermediate_local]; out may alias gate.
// SiluMulFused reads both from the output of the fused gate|up projection
// (worker/model/stage_weights.h): gate_up [tokens, 2 * intermediate_local],
// gate in columns [0, intermediate_local), up in the rest; out [tokens,
// intermediate_local] must not overlap gate_up.
// One dtype: F32 on the CPU; F32, BF16 or F16 on CUDA (computed in fp32).
// Errors: kInvalidArgument when the shapes, dtypes or devices disagree (an
// odd gate_up width included).
// Thread-safety: stateless.
#pragma once

#include "common/base/status.h"
#include "common/base/tensor.h"

namespace tessera::kernels {

Status SiluMul(const Tensor& gate, const Tensor& up, Tensor& out);
Status SiluMulFused(const Tensor& gate_up, Tensor& out);

namespace cpu {
Status SiluMul(const Tensor& gate, const Tensor& up, Tensor& out);
Status SiluMulFused(const Tensor& gate_up, Tensor& out);
}  // namespace cpu
namespace cuda {
Status SiluMul(const Tensor& gate, const Tensor& up, Tensor& out);
Status SiluMulFused(const Tensor& gate_up, Tensor& out);
}  // namespace cuda

// Shared argument check of SiluMulFused / GeluTanhMulFused (every device):
// gate_up [tokens, 2 * n] and out [tokens, n] of one floating dtype on one
// device. `what` names the operation in the error.
Status CheckGluFused(const Tensor& gate_up, const Tensor& out, const char* what);

}  // namespace tessera::kernels
