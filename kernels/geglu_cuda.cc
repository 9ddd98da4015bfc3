// Tensor-level CUDA GeGLU: checks, then kernels/geglu_cuda.cu.
#include "kernels/cuda_context.h"
#include "kernels/cuda_launch.h"
#include "kernels/dispatch.h"
#include "kernels/geglu.h"
#include "kernels/swiglu.h"

namespace tessera::kernels::cuda {

Status GeluTanhMul(const Tensor& gate, const Tensor& up, Tensor& out) {
  TESSERA_RETURN_IF_ERROR(ExpectFloatTensor(gate, 2, Device::kCUDA, "geglu gate"));
  if (up.shape() != gate.shape() || out.shape() != gate.shape() || up.dtype() != gate.dtype() ||
      out.dtype() != gate.dtype() || up.device() != Device::kCUDA || out.device() != Device::kCUDA)
    return InvalidArgument("geglu: gate " + gate.Describe() + ", up " + up.Describe() + ", out " +
                           out.Describe() + " do not agree");
  TESSERA_ASSIGN_OR_RETURN(Context * ctx, Current());
  TESSERA_CUDA_LAUNCH_CHECK(
      LaunchGeluTanhMul(gate.dtype(), gate.raw(), up.raw(), out.raw(), gate.numel(), ctx->stream()),
      "GeluTanhMulKernel");
  return Status::Ok();
}

Status GeluTanhMulFused(const Tensor& gate_up, Tensor& out) {
  TESSERA_RETURN_IF_ERROR(CheckGluFused(gate_up, out, "geglu (fused gate|up)"));
  TESSERA_RETURN_IF_ERROR(ExpectFloatTensor(gate_up, 2, Device::kCUDA, "geglu gate_up"));
  TESSERA_ASSIGN_OR_RETURN(Context * ctx, Current());
  TESSERA_CUDA_LAUNCH_CHECK(LaunchGeluTanhMulFused(gate_up.dtype(), gate_up.raw(), out.raw(),
                                                   out.dim(0), out.dim(1), ctx->stream()),
                            "GeluTanhMulFusedKernel");
  return Status::Ok();
}

}  // namespace tessera::kernels::cuda
