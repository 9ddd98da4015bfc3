// Rotary position embedding (Su et al. 2021, "RoFormer"), in the HF
// "rotate_half" layout: for i < head_dim/2, the pair (x[i], x[i + head_dim/2])
// is rotated by angle position * inv_freq[i].
//
// inv_freq comes from the model's rope scaling: RopeInvFreq in
// worker/model/rope_frequencies.h.
//
// Thread-safety: stateless.
#pragma once

#include <cstdint>
#include <vector>

#include "common/base/status.h"
#include "common/base/tensor.h"

namespace tessera::kernels {

// Rotates every row of x in place: token t by angle positions[t] * inv_freq.
// Shapes: x [tokens, heads, head_dim] (F32 on the CPU; F32, BF16 or F16 on
// CUDA, rotated in fp32); positions [tokens] I32 (absolute positions);
// inv_freq [head_dim / 2] F32; all on one device. Use Slice0 of x and
// positions to rotate one sequence with its own inv_freq (dynamic NTK).
Status ApplyRope(Tensor& x, const Tensor& positions, const Tensor& inv_freq);

// ApplyRope of q [tokens, q_heads, head_dim] and of k [tokens, kv_heads, head_dim] with the same
// positions and inv_freq: one kernel on CUDA, two calls on the CPU. q and k share a dtype and
// head_dim. Errors: as ApplyRope, naming q or k.
Status ApplyRopeQk(Tensor& q, Tensor& k, const Tensor& positions, const Tensor& inv_freq);

namespace cpu {
Status ApplyRope(Tensor& x, const Tensor& positions, const Tensor& inv_freq);
Status ApplyRopeQk(Tensor& q, Tensor& k, const Tensor& positions, const Tensor& inv_freq);
}  // namespace cpu
namespace cuda {
Status ApplyRope(Tensor& x, const Tensor& positions, const Tensor& inv_freq);
Status ApplyRopeQk(Tensor& q, Tensor& k, const Tensor& positions, const Tensor& inv_freq);
}  // namespace cuda

}  // namespace tessera::kernels
