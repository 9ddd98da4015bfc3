// Tensor-level CUDA RMSNorm: checks, then kernels/rms_norm_cuda.cu.
#include "kernels/cuda_context.h"
#include "kernels/cuda_launch.h"
#include "kernels/dispatch.h"
#include "kernels/rms_norm.h"

namespace tessera::kernels::cuda {

namespace {

Status CheckNorm(const Tensor& x, const Tensor& weight, const Tensor& y) {
  TESSERA_RETURN_IF_ERROR(ExpectFloatTensor(x, 2, Device::kCUDA, "rms_norm input"));
  TESSERA_RETURN_IF_ERROR(ExpectFloatTensor(weight, 1, Device::kCUDA, "rms_norm weight"));
  TESSERA_RETURN_IF_ERROR(ExpectFloatTensor(y, 2, Device::kCUDA, "rms_norm output"));
  TESSERA_RETURN_IF_ERROR(ExpectDType(weight, x.dtype(), "rms_norm weight", "the input"));
  TESSERA_RETURN_IF_ERROR(ExpectDType(y, x.dtype(), "rms_norm output", "the input"));
  if (weight.dim(0) != x.dim(1) || y.shape() != x.shape())
    return InvalidArgument("rms_norm: x " + x.Describe() + ", weight " + weight.Describe() +
                           ", y " + y.Describe() + " do not agree");
  return Status::Ok();
}

}  // namespace

Status RmsNorm(const Tensor& x, const Tensor& weight, float eps, Tensor& y, float weight_offset) {
  TESSERA_RETURN_IF_ERROR(CheckNorm(x, weight, y));
  TESSERA_ASSIGN_OR_RETURN(Context * ctx, Current());
  TESSERA_CUDA_LAUNCH_CHECK(
      LaunchRmsNorm(x.dtype(), x.raw(), nullptr, nullptr, weight.raw(), y.raw(), x.dim(0), x.dim(1),
                    eps, weight_offset, ctx->stream()),
      "RmsNormKernel");
  return Status::Ok();
}

Status AddRmsNorm(Tensor& residual, const Tensor& x, const Tensor& weight, float eps, Tensor& y,
                  float weight_offset) {
  TESSERA_RETURN_IF_ERROR(CheckNorm(x, weight, y));
  TESSERA_RETURN_IF_ERROR(ExpectFloatTensor(residual, 2, Device::kCUDA, "add_rms_norm residual"));
  if (residual.shape() != x.shape() || residual.dtype() != x.dtype())
    return InvalidArgument("add_rms_norm: residual " + residual.Describe() + " vs x " +
                           x.Describe());
  TESSERA_ASSIGN_OR_RETURN(Context * ctx, Current());
  TESSERA_CUDA_LAUNCH_CHECK(
      LaunchRmsNorm(x.dtype(), nullptr, residual.raw(), x.raw(), weight.raw(), y.raw(), x.dim(0),
                    x.dim(1), eps, weight_offset, ctx->stream()),
      "RmsNormKernel (fused residual add)");
  return Status::Ok();
}

}  // namespace tessera::kernels::cuda
