#include <cmath>

#include "kernels/dispatch.h"
#include "kernels/head_rms_norm.h"

namespace tessera::kernels {

Status HeadRmsNorm(Tensor& x, const Tensor& weight, float eps, float weight_offset) {
  return TESSERA_DISPATCH(x.device(), HeadRmsNorm, x, weight, eps, weight_offset);
}

namespace cpu {

Status HeadRmsNorm(Tensor& x, const Tensor& weight, float eps, float weight_offset) {
  TESSERA_RETURN_IF_ERROR(ExpectTensor(x, 3, DType::kF32, "head_rms_norm input"));
  TESSERA_RETURN_IF_ERROR(ExpectTensor(weight, 1, DType::kF32, "head_rms_norm weight"));
  if (weight.dim(0) != x.dim(2))
    return InvalidArgument("head_rms_norm: x " + x.Describe() + " with weight " +
                           weight.Describe() + ": the weight must have head_dim elements");
  const int64_t rows = x.dim(0) * x.dim(1), head_dim = x.dim(2);
  const float* w = weight.data<float>();
  for (int64_t r = 0; r < rows; ++r) {
    float* v = x.data<float>() + r * head_dim;
    double sum = 0.0;
    for (int64_t i = 0; i < head_dim; ++i) sum += static_cast<double>(v[i]) * v[i];
    const float inv =
        1.0f / std::sqrt(static_cast<float>(sum / static_cast<double>(head_dim)) + eps);
    for (int64_t i = 0; i < head_dim; ++i) v[i] = (weight_offset + w[i]) * (v[i] * inv);
  }
  return Status::Ok();
}

}  // namespace cpu
}  // namespace tessera::kernels
