// SwiGLU activation of the Llama MLP (Shazeer 2020, "GLU Variants Improve
// Transformer"): out = silu(gate) * up, silu(x) = x / (1 + exp(-x)).
//
// Shapes: gate, up, out [tokens, intermediate_local]; out may alias gate.
// One dtype: F32 on the CPU; F32, BF16 or F16 on CUDA (computed in fp32).
// Thread-safety: stateless.
#pragma once

#include "common/base/status.h"
#include "common/base/tensor.h"

namespace tessera::kernels {

Status SiluMul(const Tensor& gate, const Tensor& up, Tensor& out);

namespace cpu {
Status SiluMul(const Tensor& gate, const Tensor& up, Tensor& out);
}
namespace cuda {
Status SiluMul(const Tensor& gate, const Tensor& up, Tensor& out);
}

}  // namespace tessera::kernels
