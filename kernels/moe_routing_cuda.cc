// Tensor-level CUDA router top-k: checks, then kernels/moe_routing_cuda.cu.
#include "kernels/cuda_context.h"
#include "kernels/cuda_launch.h"
#include "kernels/moe_routing.h"

namespace tessera::kernels::cuda {

Status MoeTopK(const Tensor& router_logits, int64_t top_k, bool renormalize, Tensor& expert_ids,
               Tensor& weights) {
  TESSERA_RETURN_IF_ERROR(CheckMoeTopK(router_logits, top_k, expert_ids, weights));
  if (router_logits.dim(1) > 12 * 1024)
    return InvalidArgument("moe: " + router_logits.Describe() +
                           ": the CUDA top-k holds a token's experts in 48 KiB of shared memory "
                           "(at most 12288 experts)");
  TESSERA_ASSIGN_OR_RETURN(Context * ctx, Current());
  TESSERA_CUDA_LAUNCH_CHECK(
      LaunchMoeTopK(router_logits.data<float>(), router_logits.dim(0), router_logits.dim(1), top_k,
                    renormalize, expert_ids.data<int32_t>(), weights.data<float>(), ctx->stream()),
      "MoeTopKKernel");
  return Status::Ok();
}

}  // namespace tessera::kernels::cuda
