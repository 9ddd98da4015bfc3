// Vocab-parallel embedding gather (kernels/embedding.h): one block per token;
// ids outside this rank's rows give zero rows.
#include "kernels/cuda_common.cuh"
#include "kernels/cuda_launch.h"
#include "kernels/pdl.cuh"

namespace tessera::kernels::cuda {

namespace {

template <typename T>
__global__ void EmbeddingKernel(const int32_t* __restrict__ ids, const T* __restrict__ table,
                                int64_t rows, int64_t hidden, int64_t vocab_begin, T* out) {
  PdlWait();  // kernels/pdl.cuh
  PdlLaunchDependents();
  const int64_t t = blockIdx.x;
  const int64_t local = static_cast<int64_t>(ids[t]) - vocab_begin;
  const bool mine = local >= 0 && local < rows;
  T* dst = out + t * hidden;
  const T* src = table + (mine ? local : 0) * hidden;
  for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x)
    dst[i] = mine ? src[i] : FromF<T>(0.0f);
}

}  // namespace

cudaError_t LaunchEmbedding(DType dtype, const int32_t* ids, int64_t tokens, const void* table,
                            int64_t rows, int64_t hidden, int64_t vocab_begin, void* out,
                            cudaStream_t stream) {
  if (tokens == 0) return cudaSuccess;
  cudaError_t err = cudaSuccess;
  TESSERA_FLOAT_SWITCH(dtype, T,
                       err = LaunchWithPdl(tokens <= kPdlMaxTokens, EmbeddingKernel<T>,
                                           dim3(static_cast<unsigned>(tokens)), dim3(256), 0,
                                           stream, ids, static_cast<const T*>(table), rows, hidden,
                                           vocab_begin, static_cast<T*>(out)));
  return err;
}

}  // namespace tessera::kernels::cuda
