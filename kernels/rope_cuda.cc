// Tensor-level CUDA RoPE: checks, then kernels/rope_cuda.cu.
#include "kernels/cuda_context.h"
#include "kernels/cuda_launch.h"
#include "kernels/dispatch.h"
#include "kernels/rope.h"

namespace tessera::kernels::cuda {

Status ApplyRope(Tensor& x, const Tensor& positions, const Tensor& inv_freq) {
  TESSERA_RETURN_IF_ERROR(ExpectFloatTensor(x, 3, Device::kCUDA, "rope input"));
  TESSERA_RETURN_IF_ERROR(ExpectTensor(positions, 1, DType::kI32, "rope positions"));
  TESSERA_RETURN_IF_ERROR(ExpectTensor(inv_freq, 1, DType::kF32, "rope inv_freq"));
  if (positions.device() != Device::kCUDA || inv_freq.device() != Device::kCUDA ||
      inv_freq.dim(0) != x.dim(2) / 2 || positions.dim(0) != x.dim(0))
    return InvalidArgument("rope: x " + x.Describe() + " with inv_freq " + inv_freq.Describe() +
                           " and positions " + positions.Describe());
  TESSERA_ASSIGN_OR_RETURN(Context * ctx, Current());
  TESSERA_CUDA_LAUNCH_CHECK(
      LaunchRope(x.dtype(), x.raw(), positions.data<int32_t>(), inv_freq.data<float>(), x.dim(0),
                 x.dim(1), x.dim(2), ctx->stream()),
      "RopeKernel");
  return Status::Ok();
}

Status ApplyRopeQk(Tensor& q, Tensor& k, const Tensor& positions, const Tensor& inv_freq) {
  TESSERA_RETURN_IF_ERROR(ExpectFloatTensor(q, 3, Device::kCUDA, "rope q"));
  TESSERA_RETURN_IF_ERROR(ExpectFloatTensor(k, 3, Device::kCUDA, "rope k"));
  TESSERA_RETURN_IF_ERROR(ExpectTensor(positions, 1, DType::kI32, "rope positions"));
  TESSERA_RETURN_IF_ERROR(ExpectTensor(inv_freq, 1, DType::kF32, "rope inv_freq"));
  TESSERA_RETURN_IF_ERROR(ExpectDType(k, q.dtype(), "rope k", "q"));
  if (positions.device() != Device::kCUDA || inv_freq.device() != Device::kCUDA ||
      k.dim(2) != q.dim(2) || inv_freq.dim(0) != q.dim(2) / 2 || positions.dim(0) != q.dim(0) ||
      k.dim(0) != q.dim(0))
    return InvalidArgument("rope: q " + q.Describe() + ", k " + k.Describe() + " with inv_freq " +
                           inv_freq.Describe() + " and positions " + positions.Describe());
  TESSERA_ASSIGN_OR_RETURN(Context * ctx, Current());
  TESSERA_CUDA_LAUNCH_CHECK(
      LaunchRopeQk(q.dtype(), q.raw(), k.raw(), positions.data<int32_t>(), inv_freq.data<float>(),
                   q.dim(0), q.dim(1), k.dim(1), q.dim(2), ctx->stream()),
      "RopeKernel (q and k)");
  return Status::Ok();
}

}  // namespace tessera::kernels::cuda
