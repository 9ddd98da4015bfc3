// Tanh soft-capping (Gemma 2's final_logit_softcapping; the attention
// scores' attn_logit_softcapping is applied inside PagedAttention,
// kernels/paged_attention.h):
//   x = cap * tanh(x / cap)
// in place, elementwise, in fp32, as transformers computes it
// (logits / cap, tanh, * cap). |x| < cap afterwards; small values pass
// almost unchanged.
//
// Shapes: any contiguous tensor. Dtypes: F32 on the CPU; F32, BF16 or F16 on
// CUDA (the logits the model produces are F32 on both).
// Thread-safety: stateless.
#pragma once

#include "common/base/status.h"
#include "common/base/tensor.h"

namespace tessera::kernels {

// Errors: kInvalidArgument for a cap that is not positive and finite, or a
// tensor of another dtype.
Status SoftCap(Tensor& x, float cap);

namespace cpu {
Status SoftCap(Tensor& x, float cap);
}
namespace cuda {
Status SoftCap(Tensor& x, float cap);
}

// The shared argument check (every device).
Status CheckSoftCap(const Tensor& x, float cap);

}  // namespace tessera::kernels
