// Logits processing on the device (kernels/logit_adjust.h): one thread per
// entry applies kernels/logit_adjust_entry.h's formula to its logit.
#include "kernels/cuda_common.cuh"
#include "kernels/cuda_launch.h"

namespace tessera::kernels::cuda {

namespace {

__global__ void AdjustLogitsKernel(float* logits, int64_t vocab,
                                   const LogitAdjustment* __restrict__ entries, int64_t count) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const LogitAdjustment e = entries[i];
    float* l = logits + e.row * vocab + e.token;
    *l = AdjustedLogit(*l, e);
  }
}

}  // namespace

cudaError_t LaunchAdjustLogits(float* logits, int64_t vocab, const LogitAdjustment* entries,
                               int64_t count, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  const unsigned blocks = Blocks(count, 256) < 65535u ? Blocks(count, 256) : 65535u;
  AdjustLogitsKernel<<<blocks, 256, 0, stream>>>(logits, vocab, entries, count);
  return cudaGetLastError();
}

}  // namespace tessera::kernels::cuda
