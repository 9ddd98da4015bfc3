// Linear with an FP8 weight on CUDA (kernels/linear_fp8.h): up to
// kSkinnyGemmMaxRows tokens run the FP8 skinny kernel (kernels/fp8_gemm_cuda.cu),
// more dequantize the weight into the scratch buffer and run cuBLASLt on it.
#include <string>

#include "kernels/cuda_context.h"
#include "kernels/cuda_launch.h"
#include "kernels/dispatch.h"
#include "kernels/linear.h"
#include "kernels/linear_fp8.h"

namespace tessera::kernels::cuda {

Status LinearFp8(const Tensor& x, const Tensor& w, const Fp8Scales& scales, const Tensor& bias,
                 Tensor& y, Tensor& scratch) {
  TESSERA_RETURN_IF_ERROR(ExpectFloatTensor(x, 2, Device::kCUDA, "fp8 linear input"));
  TESSERA_RETURN_IF_ERROR(ExpectFloatTensor(y, 2, Device::kCUDA, "fp8 linear output"));
  TESSERA_RETURN_IF_ERROR(CheckFp8Operands(w, scales, scratch, x.dtype()));
  const int64_t m = x.dim(0), k = x.dim(1), n = w.dim(0);
  if (w.dim(1) != k || y.dim(0) != m || y.dim(1) != n)
    return InvalidArgument("fp8 linear: x " + x.Describe() + " @ w^T " + w.Describe() + " -> y " +
                           y.Describe() + " do not agree");
  if (y.dtype() != x.dtype() && y.dtype() != DType::kF32)
    return InvalidArgument("fp8 linear: output " + y.Describe() +
                           " must have the input's dtype or F32");
  if (bias.defined()) {
    TESSERA_RETURN_IF_ERROR(ExpectFloatTensor(bias, 1, Device::kCUDA, "fp8 linear bias"));
    TESSERA_RETURN_IF_ERROR(ExpectDType(bias, x.dtype(), "fp8 linear bias", "the input"));
    if (bias.dim(0) != n)
      return InvalidArgument("fp8 linear: bias " + bias.Describe() + " does not match w " +
                             w.Describe());
  }
  Fp8GemmArgs a;
  a.x = x.raw();
  a.w = w.raw();
  a.scales = scales.scales.data<float>();
  a.scale_cols = scales.scales.dim(1);
  a.cols_per_scale = scales.cols_per_scale;
  a.col_phase = scales.col_phase;
  a.bias = bias.defined() ? bias.raw() : nullptr;
  a.y = y.raw();
  a.m = m;
  a.n = n;
  a.k = k;
  if (!Fp8GemmApplies(x.dtype(), a))
    return InvalidArgument("fp8 linear: the FP8 kernels need a BF16 or F16 input (got " +
                           x.Describe() + "), in_features % 16 == 0 (w " + w.Describe() +
                           ") and block scales in multiples of 16 columns (" +
                           std::to_string(scales.cols_per_scale) + ", phase " +
                           std::to_string(scales.col_phase) + ")");
  if (m == 0) return Status::Ok();
  TESSERA_ASSIGN_OR_RETURN(Context * ctx, Current());
  if (m <= kSkinnyGemmMaxRows && reinterpret_cast<uintptr_t>(x.raw()) % 16 == 0) {
    TESSERA_CUDA_LAUNCH_CHECK(LaunchFp8SkinnyGemm(x.dtype(), y.dtype(), a, ctx->stream()),
                              "Fp8SkinnyGemmKernel");
    return Status::Ok();
  }
  if (!scratch.defined())
    return InvalidArgument("fp8 linear: " + std::to_string(m) +
                           " tokens need a scratch buffer for the dequantized weight");
  Tensor dense = scratch.Reshape({scratch.numel()}).Slice0(0, n * k).Reshape({n, k});
  TESSERA_CUDA_LAUNCH_CHECK(LaunchFp8Dequantize(x.dtype(), a, dense.raw(), ctx->stream()),
                            "Fp8DequantizeKernel");
  return Linear(x, dense, bias, y);
}

}  // namespace tessera::kernels::cuda
