// Tensor-level CUDA embedding gather: checks, then kernels/embedding_cuda.cu.
#include "kernels/cuda_context.h"
#include "kernels/cuda_launch.h"
#include "kernels/dispatch.h"
#include "kernels/embedding.h"

namespace tessera::kernels::cuda {

Status EmbeddingLookup(const Tensor& ids, const Tensor& table, int64_t vocab_begin, Tensor& out) {
  TESSERA_RETURN_IF_ERROR(ExpectTensor(ids, 1, DType::kI32, "embedding ids"));
  TESSERA_RETURN_IF_ERROR(ExpectFloatTensor(table, 2, Device::kCUDA, "embedding table"));
  TESSERA_RETURN_IF_ERROR(ExpectFloatTensor(out, 2, Device::kCUDA, "embedding output"));
  TESSERA_RETURN_IF_ERROR(ExpectDType(out, table.dtype(), "embedding output", "the table"));
  if (ids.device() != Device::kCUDA || out.dim(0) != ids.dim(0) || out.dim(1) != table.dim(1))
    return InvalidArgument("embedding: out " + out.Describe() + " for ids " + ids.Describe() +
                           " and table " + table.Describe());
  TESSERA_ASSIGN_OR_RETURN(Context * ctx, Current());
  TESSERA_CUDA_LAUNCH_CHECK(
      LaunchEmbedding(table.dtype(), ids.data<int32_t>(), ids.dim(0), table.raw(), table.dim(0),
                      table.dim(1), vocab_begin, out.raw(), ctx->stream()),
      "EmbeddingKernel");
  return Status::Ok();
}

}  // namespace tessera::kernels::cuda
