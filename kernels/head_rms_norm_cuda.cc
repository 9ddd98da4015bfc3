// Tensor-level CUDA per-head RMSNorm: checks, then kernels/head_rms_norm_cuda.cu.
#include "kernels/cuda_context.h"
#include "kernels/cuda_launch.h"
#include "kernels/dispatch.h"
#include "kernels/head_rms_norm.h"

namespace tessera::kernels::cuda {

Status HeadRmsNorm(Tensor& x, const Tensor& weight, float eps, float weight_offset) {
  TESSERA_RETURN_IF_ERROR(ExpectFloatTensor(x, 3, Device::kCUDA, "head_rms_norm input"));
  TESSERA_RETURN_IF_ERROR(ExpectFloatTensor(weight, 1, Device::kCUDA, "head_rms_norm weight"));
  TESSERA_RETURN_IF_ERROR(ExpectDType(weight, x.dtype(), "head_rms_norm weight", "the input"));
  if (weight.dim(0) != x.dim(2))
    return InvalidArgument("head_rms_norm: x " + x.Describe() + " with weight " +
                           weight.Describe() + ": the weight must have head_dim elements");
  TESSERA_ASSIGN_OR_RETURN(Context * ctx, Current());
  TESSERA_CUDA_LAUNCH_CHECK(LaunchHeadRmsNorm(x.dtype(), x.raw(), weight.raw(), x.dim(0) * x.dim(1),
                                              x.dim(2), eps, weight_offset, ctx->stream()),
                            "HeadRmsNormKernel");
  return Status::Ok();
}

}  // namespace tessera::kernels::cuda
