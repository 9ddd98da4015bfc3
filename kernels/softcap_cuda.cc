// Tensor-level CUDA soft-capping: checks, then kernels/softcap_cuda.cu.
#include "kernels/cuda_context.h"
#include "kernels/cuda_launch.h"
#include "kernels/dispatch.h"
#include "kernels/softcap.h"

namespace tessera::kernels::cuda {

Status SoftCap(Tensor& x, float cap) {
  TESSERA_RETURN_IF_ERROR(CheckSoftCap(x, cap));
  TESSERA_RETURN_IF_ERROR(ExpectFloatTensor(x, x.rank(), Device::kCUDA, "soft-cap input"));
  TESSERA_ASSIGN_OR_RETURN(Context * ctx, Current());
  TESSERA_CUDA_LAUNCH_CHECK(LaunchSoftCap(x.dtype(), x.raw(), x.numel(), cap, ctx->stream()),
                            "SoftCapKernel");
  return Status::Ok();
}

}  // namespace tessera::kernels::cuda
