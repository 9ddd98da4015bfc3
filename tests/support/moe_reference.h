// The reference the grouped expert kernels (kernels/moe_experts.h) are tested
// against: the MoE block's routed experts computed one (token, expert) pair at
// a time by plain loops over host F32 tensors, written from the formula of
// worker/model/moe_layer.h, not from the kernels. `round` (F32 = none) rounds
// the values the grouped kernels store in the compute dtype: each gate and up
// sum, the activation, the expert's output; the combine sums in fp32.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "common/base/dtype.h"
#include "common/base/tensor.h"

namespace tessera::testing {

inline float RoundTo(DType dtype, float v) {
  if (dtype == DType::kF32) return v;
  uint16_t bits = 0;
  ConvertFromF32(dtype, &v, &bits, 1);
  float out = 0.0f;
  ConvertToF32(dtype, &bits, &out, 1);
  return out;
}

// One held expert's weights: gate, up [I, H], down [H, I], F32 host.
struct MoeRefExpert {
  Tensor gate, up, down;
};

// x [T, H]; ids I32 / weights F32 [T, K] (global expert ids); experts[e] is
// global expert expert_begin + e; shared / shared_gate (optional): the shared
// expert's output [T, H] and gate logits [T, 1]. Returns out [T, H] F32.
inline std::vector<float> MoeReference(const Tensor& x, const Tensor& ids, const Tensor& weights,
                                       const std::vector<MoeRefExpert>& experts,
                                       int64_t expert_begin, const Tensor& shared,
                                       const Tensor& shared_gate, DType round) {
  const int64_t T = x.dim(0), H = x.dim(1), K = ids.dim(1);
  std::vector<float> out(static_cast<size_t>(T * H), 0.0f);
  for (int64_t t = 0; t < T; ++t) {
    const float* xr = x.data<float>() + t * H;
    for (int64_t j = 0; j < K; ++j) {
      const int64_t e = ids.data<int32_t>()[t * K + j] - expert_begin;
      if (e < 0 || e >= static_cast<int64_t>(experts.size())) continue;
      const MoeRefExpert& ex = experts[static_cast<size_t>(e)];
      const int64_t I = ex.gate.dim(0);
      std::vector<float> act(static_cast<size_t>(I));
      for (int64_t i = 0; i < I; ++i) {
        double g = 0, u = 0;
        for (int64_t h = 0; h < H; ++h) {
          g += static_cast<double>(xr[h]) * ex.gate.data<float>()[i * H + h];
          u += static_cast<double>(xr[h]) * ex.up.data<float>()[i * H + h];
        }
        const float gf = RoundTo(round, static_cast<float>(g));
        const float uf = RoundTo(round, static_cast<float>(u));
        act[static_cast<size_t>(i)] = RoundTo(round, gf / (1.0f + std::exp(-gf)) * uf);
      }
      const float w = weights.data<float>()[t * K + j];
      for (int64_t h = 0; h < H; ++h) {
        double y = 0;
        for (int64_t i = 0; i < I; ++i)
          y += static_cast<double>(act[static_cast<size_t>(i)]) * ex.down.data<float>()[h * I + i];
        out[static_cast<size_t>(t * H + h)] += w * RoundTo(round, static_cast<float>(y));
      }
    }
    if (shared.defined()) {
      const float g = 1.0f / (1.0f + std::exp(-shared_gate.data<float>()[t]));
      for (int64_t h = 0; h < H; ++h)
        out[static_cast<size_t>(t * H + h)] += g * shared.data<float>()[t * H + h];
    }
  }
  for (float& v : out) v = RoundTo(round, v);
  return out;
}

}  // namespace tessera::testing
