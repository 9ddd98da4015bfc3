// SwiGLU (kernels/swiglu.h): out = silu(gate) * up elementwise in fp32.
#include "kernels/cuda_common.cuh"
#include "kernels/cuda_launch.h"
#include "kernels/glu_fused.cuh"

namespace tessera::kernels::cuda {

namespace {

template <typename T>
__global__ void SiluMulKernel(const T* gate, const T* up, T* out, int64_t count) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g = ToF(gate[i]);
    out[i] = FromF<T>(g / (1.0f + expf(-g)) * ToF(up[i]));
  }
}

struct Silu {
  __device__ float operator()(float g) const { return g / (1.0f + expf(-g)); }
};

}  // namespace

cudaError_t LaunchSiluMulFused(DType dtype, const void* gate_up, void* out, int64_t rows,
                               int64_t cols, cudaStream_t stream) {
  TESSERA_FLOAT_SWITCH(dtype, T,
                       return (LaunchGluFused<T, Silu>(gate_up, out, rows, cols, stream)));
  return cudaGetLastError();
}

cudaError_t LaunchSiluMul(DType dtype, const void* gate, const void* up, void* out, int64_t count,
                          cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  const unsigned blocks = Blocks(count, 256) < 65535u ? Blocks(count, 256) : 65535u;
  TESSERA_FLOAT_SWITCH(
      dtype, T,
      SiluMulKernel<T><<<blocks, 256, 0, stream>>>(
          static_cast<const T*>(gate), static_cast<const T*>(up), static_cast<T*>(out), count));
  return cudaGetLastError();
}

}  // namespace tessera::kernels::cuda
