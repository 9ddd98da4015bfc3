// Rotary position embedding (Su et al. 2021, "RoFormer"), in the HF
// "rotate_half" layout: for i < head_dim/2, the pair (x[i], x[i + head_dim/2])
// is rotated by angle position * inv_freq[i].
//
// inv_freq follows transformers' modeling_rope_utils.py for each scaling type
// (see RopeScaling in common/model_config.h). Dynamic NTK scaling depends on
// the sequence length; RopeInvFreq takes it and callers pass
// max(position)+1 of the sequence being processed, which is what HF's
// dynamic_rope_update does for one sequence.
//
// Thread-safety: stateless.
#pragma once

#include <cstdint>
#include <vector>

#include "common/model_config.h"
#include "common/status.h"
#include "common/tensor.h"

namespace tessera::kernels {

// inv_freq [head_dim / 2] for `config` at sequence length `seq_len` (tokens).
std::vector<float> RopeInvFreq(const ModelConfig& config, int64_t seq_len);

// Rotates every row of x in place: token t by angle positions[t] * inv_freq.
// Shapes: x [tokens, heads, head_dim] (F32 on the CPU; F32, BF16 or F16 on
// CUDA, rotated in fp32); positions [tokens] I32 (absolute positions);
// inv_freq [head_dim / 2] F32; all on one device. Use Slice0 of x and
// positions to rotate one sequence with its own inv_freq (dynamic NTK).
Status ApplyRope(Tensor& x, const Tensor& positions, const Tensor& inv_freq);

namespace cpu {
Status ApplyRope(Tensor& x, const Tensor& positions, const Tensor& inv_freq);
}
namespace cuda {
Status ApplyRope(Tensor& x, const Tensor& positions, const Tensor& inv_freq);
}

}  // namespace tessera::kernels
