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

// blockIdx.y = the masked row; threads stride over its vocab.
__global__ void MaskLogitsKernel(float* logits, int64_t vocab, const int64_t* __restrict__ rows,
                                 const uint32_t* __restrict__ words, int64_t words_per_row) {
  const int64_t i = blockIdx.y;
  float* l = logits + rows[i] * vocab;
  const uint32_t* w = words + i * words_per_row;
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < vocab;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x)
    if (((w[t >> 5] >> (t & 31)) & 1u) == 0) l[t] = kBannedLogit;
}

}  // namespace

cudaError_t LaunchMaskLogits(float* logits, int64_t vocab, const int64_t* rows,
                             const uint32_t* words, int64_t words_per_row, int64_t count,
                             cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  const unsigned x = Blocks(vocab, 256) < 64u ? Blocks(vocab, 256) : 64u;
  const dim3 grid(x, static_cast<unsigned>(count));
  MaskLogitsKernel<<<grid, 256, 0, stream>>>(logits, vocab, rows, words, words_per_row);
  return cudaGetLastError();
}

cudaError_t LaunchAdjustLogits(float* logits, int64_t vocab, const LogitAdjustment* entries,
                               int64_t count, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  const unsigned blocks = Blocks(count, 256) < 65535u ? Blocks(count, 256) : 65535u;
  AdjustLogitsKernel<<<blocks, 256, 0, stream>>>(logits, vocab, entries, count);
  return cudaGetLastError();
}

}  // namespace tessera::kernels::cuda
