#include <cmath>

#include "kernels/dispatch.h"
#include "kernels/rope.h"

namespace tessera::kernels {

Status ApplyRope(Tensor& x, const Tensor& positions, const Tensor& inv_freq) {
  return TESSERA_DISPATCH(x.device(), ApplyRope, x, positions, inv_freq);
}

Status ApplyRopeQk(Tensor& q, Tensor& k, const Tensor& positions, const Tensor& inv_freq) {
  if (q.device() != k.device())
    return InvalidArgument("rope: q " + q.Describe() + " and k " + k.Describe() +
                           " on different devices");
  return TESSERA_DISPATCH(q.device(), ApplyRopeQk, q, k, positions, inv_freq);
}

namespace cpu {

Status ApplyRope(Tensor& x, const Tensor& positions, const Tensor& inv_freq_t) {
  TESSERA_RETURN_IF_ERROR(ExpectTensor(x, 3, DType::kF32, "rope input"));
  TESSERA_RETURN_IF_ERROR(ExpectTensor(positions, 1, DType::kI32, "rope positions"));
  TESSERA_RETURN_IF_ERROR(ExpectTensor(inv_freq_t, 1, DType::kF32, "rope inv_freq"));
  const int64_t heads = x.dim(1), head_dim = x.dim(2), half = head_dim / 2;
  if (inv_freq_t.dim(0) != half || positions.dim(0) != x.dim(0))
    return InvalidArgument("rope: x " + x.Describe() + " with inv_freq " + inv_freq_t.Describe() +
                           " and positions " + positions.Describe());
  const float* inv_freq = inv_freq_t.data<float>();
  std::vector<float> cos_v(static_cast<size_t>(half)), sin_v(static_cast<size_t>(half));
  for (int64_t t = 0; t < x.dim(0); ++t) {
    const float pos = static_cast<float>(positions.data<int32_t>()[t]);
    for (int64_t i = 0; i < half; ++i) {
      const float angle = pos * inv_freq[i];  // fp32 product, as HF
      cos_v[static_cast<size_t>(i)] = std::cos(angle);
      sin_v[static_cast<size_t>(i)] = std::sin(angle);
    }
    for (int64_t h = 0; h < heads; ++h) {
      float* v = x.data<float>() + (t * heads + h) * head_dim;
      for (int64_t i = 0; i < half; ++i) {
        const float a = v[i], b = v[i + half];
        v[i] = a * cos_v[static_cast<size_t>(i)] - b * sin_v[static_cast<size_t>(i)];
        v[i + half] = b * cos_v[static_cast<size_t>(i)] + a * sin_v[static_cast<size_t>(i)];
      }
    }
  }
  return Status::Ok();
}

Status ApplyRopeQk(Tensor& q, Tensor& k, const Tensor& positions, const Tensor& inv_freq) {
  TESSERA_RETURN_IF_ERROR(ApplyRope(q, positions, inv_freq).WithContext("q"));
  return ApplyRope(k, positions, inv_freq).WithContext("k");
}

}  // namespace cpu
}  // namespace tessera::kernels
