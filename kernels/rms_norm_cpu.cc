#include <cmath>

#include "kernels/dispatch.h"
#include "kernels/rms_norm.h"

namespace tessera::kernels {

Status RmsNorm(const Tensor& x, const Tensor& weight, float eps, Tensor& y, float weight_offset) {
  return TESSERA_DISPATCH(x.device(), RmsNorm, x, weight, eps, y, weight_offset);
}

Status AddRmsNorm(Tensor& residual, const Tensor& x, const Tensor& weight, float eps, Tensor& y,
                  float weight_offset) {
  return TESSERA_DISPATCH(x.device(), AddRmsNorm, residual, x, weight, eps, y, weight_offset);
}

namespace cpu {

static Status CheckNormShapes(const Tensor& x, const Tensor& weight, const Tensor& y) {
  TESSERA_RETURN_IF_ERROR(ExpectTensor(x, 2, DType::kF32, "rms_norm input"));
  TESSERA_RETURN_IF_ERROR(ExpectTensor(weight, 1, DType::kF32, "rms_norm weight"));
  TESSERA_RETURN_IF_ERROR(ExpectTensor(y, 2, DType::kF32, "rms_norm output"));
  if (weight.dim(0) != x.dim(1) || y.shape() != x.shape())
    return InvalidArgument("rms_norm: x " + x.Describe() + ", weight " + weight.Describe() +
                           ", y " + y.Describe() + " do not agree");
  return Status::Ok();
}

Status RmsNorm(const Tensor& x, const Tensor& weight, float eps, Tensor& y, float weight_offset) {
  TESSERA_RETURN_IF_ERROR(CheckNormShapes(x, weight, y));
  const int64_t tokens = x.dim(0), hidden = x.dim(1);
  const float* w = weight.data<float>();
  for (int64_t t = 0; t < tokens; ++t) {
    const float* in = x.data<float>() + t * hidden;
    float* out = y.data<float>() + t * hidden;
    double sum = 0.0;
    for (int64_t i = 0; i < hidden; ++i) sum += static_cast<double>(in[i]) * in[i];
    const float inv = 1.0f / std::sqrt(static_cast<float>(sum / static_cast<double>(hidden)) + eps);
    for (int64_t i = 0; i < hidden; ++i) out[i] = (weight_offset + w[i]) * (in[i] * inv);
  }
  return Status::Ok();
}

Status AddRmsNorm(Tensor& residual, const Tensor& x, const Tensor& weight, float eps, Tensor& y,
                  float weight_offset) {
  TESSERA_RETURN_IF_ERROR(CheckNormShapes(x, weight, y));
  if (residual.shape() != x.shape())
    return InvalidArgument("add_rms_norm: residual " + residual.Describe() + " vs x " +
                           x.Describe());
  float* r = residual.data<float>();
  const float* in = x.data<float>();
  for (int64_t i = 0; i < x.numel(); ++i) r[i] += in[i];
  return RmsNorm(residual, weight, eps, y, weight_offset);
}

}  // namespace cpu
}  // namespace tessera::kernels
