#include "worker/model/rope_frequencies.h"

#include <cmath>

namespace tessera {

std::vector<float> RopeInvFreq(const ModelConfig& config, int64_t seq_len) {
  const int64_t dim = config.head_dim;
  const RopeScaling& rs = config.rope_scaling;
  double base = config.rope_theta;
  if (rs.type == RopeType::kDynamic && seq_len > config.max_position_embeddings) {
    // _compute_dynamic_ntk_parameters.
    const double ratio = rs.factor * static_cast<double>(seq_len) /
                             static_cast<double>(config.max_position_embeddings) -
                         (rs.factor - 1.0);
    base = base * std::pow(ratio, static_cast<double>(dim) / static_cast<double>(dim - 2));
  }
  std::vector<float> inv(static_cast<size_t>(dim / 2));
  // _compute_longrope_parameters: the short factors up to the pre-training
  // context, the long ones past it.
  const std::vector<double>* ext = nullptr;
  if (rs.type == RopeType::kLongRope) {
    ext = seq_len > rs.original_max_position_embeddings ? &rs.long_factor : &rs.short_factor;
  }
  for (int64_t i = 0; i < dim / 2; ++i) {
    // HF computes base ** (arange(0, dim, 2) / dim) in fp32.
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(dim);
    const float pw = std::pow(static_cast<float>(base), exponent);
    inv[static_cast<size_t>(i)] =
        ext ? 1.0f / (static_cast<float>((*ext)[static_cast<size_t>(i)]) * pw) : 1.0f / pw;
  }
  if (rs.type == RopeType::kLinear) {
    for (float& f : inv) f = static_cast<float>(f / rs.factor);
  } else if (rs.type == RopeType::kLlama3) {
    // _compute_llama3_parameters.
    const double old_ctx = static_cast<double>(rs.original_max_position_embeddings);
    const double low_wavelen = old_ctx / rs.low_freq_factor;
    const double high_wavelen = old_ctx / rs.high_freq_factor;
    for (float& f : inv) {
      const double wavelen = 2.0 * M_PI / f;
      double scaled = wavelen > low_wavelen ? f / rs.factor : f;
      const bool medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
      if (medium) {
        const double smooth =
            (old_ctx / wavelen - rs.low_freq_factor) / (rs.high_freq_factor - rs.low_freq_factor);
        scaled = (1.0 - smooth) * scaled / rs.factor + smooth * scaled;
      }
      f = static_cast<float>(scaled);
    }
  }
  return inv;
}

std::vector<float> LocalRopeInvFreq(const ModelConfig& config) {
  ModelConfig local = config;
  local.rope_theta = config.local_rope_theta;
  local.rope_scaling = RopeScaling{};
  return RopeInvFreq(local, config.max_position_embeddings);
}

}  // namespace tessera
