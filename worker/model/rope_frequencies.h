// The rotary inverse frequencies of a model (kernels/rope.h applies them).
//
// inv_freq follows transformers' modeling_rope_utils.py for each scaling type
// (see RopeScaling in common/format/model_config.h). Dynamic NTK scaling
// depends on the sequence length; RopeInvFreq takes it and callers pass
// max(position)+1 of the sequence being processed, which is what HF's
// dynamic_rope_update does for one sequence. Longrope (Phi-3) switches from
// its short to its long factors once seq_len passes
// original_max_position_embeddings, as HF's longrope_frequency_update does;
// its attention_factor (which scales cos and sin of q and k alike) is applied
// by the model as attention_factor^2 on the attention scale.
//
// Thread-safety: pure function.
#pragma once

#include <cstdint>
#include <vector>

#include "common/format/model_config.h"

namespace tessera {

// inv_freq [head_dim / 2] F32 for `config` at sequence length `seq_len`
// (tokens).
std::vector<float> RopeInvFreq(const ModelConfig& config, int64_t seq_len);

// Gemma 3's sliding layers: default RoPE at config.local_rope_theta
// (rope_local_base_freq), whatever rope_scaling the global layers have.
// inv_freq [head_dim / 2] F32; requires local_rope_theta > 0.
std::vector<float> LocalRopeInvFreq(const ModelConfig& config);

}  // namespace tessera
