// Tanh soft-capping (kernels/softcap.h): x = cap * tanh(x / cap) in fp32.
#include "kernels/cuda_common.cuh"
#include "kernels/cuda_launch.h"

namespace tessera::kernels::cuda {

namespace {

template <typename T>
__global__ void SoftCapKernel(T* x, int64_t count, float cap) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    x[i] = FromF<T>(tanhf(ToF(x[i]) / cap) * cap);
}

}  // namespace

cudaError_t LaunchSoftCap(DType dtype, void* x, int64_t count, float cap, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  const unsigned blocks = Blocks(count, 256) < 65535u ? Blocks(count, 256) : 65535u;
  TESSERA_FLOAT_SWITCH(
      dtype, T, SoftCapKernel<T><<<blocks, 256, 0, stream>>>(static_cast<T*>(x), count, cap));
  return cudaGetLastError();
}

}  // namespace tessera::kernels::cuda
