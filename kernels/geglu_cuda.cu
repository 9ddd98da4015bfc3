// GeGLU (kernels/geglu.h): out = gelu_tanh(gate) * up elementwise in fp32.
#include "kernels/cuda_common.cuh"
#include "kernels/cuda_launch.h"
#include "kernels/glu_fused.cuh"

namespace tessera::kernels::cuda {

namespace {

template <typename T>
__global__ void GeluTanhMulKernel(const T* gate, const T* up, T* out, int64_t count) {
  constexpr float kBeta = 0.7978845608028654f;  // sqrt(2 / pi)
  constexpr float kKappa = 0.044715f;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float x = ToF(gate[i]);
    const float inner = kBeta * (x + kKappa * x * x * x);
    out[i] = FromF<T>(0.5f * x * (1.0f + tanhf(inner)) * ToF(up[i]));
  }
}

struct GeluTanh {
  __device__ float operator()(float x) const {
    constexpr float kBeta = 0.7978845608028654f;  // sqrt(2 / pi)
    constexpr float kKappa = 0.044715f;
    return 0.5f * x * (1.0f + tanhf(kBeta * (x + kKappa * x * x * x)));
  }
};

}  // namespace

cudaError_t LaunchGeluTanhMulFused(DType dtype, const void* gate_up, void* out, int64_t rows,
                                   int64_t cols, cudaStream_t stream) {
  TESSERA_FLOAT_SWITCH(dtype, T,
                       return (LaunchGluFused<T, GeluTanh>(gate_up, out, rows, cols, stream)));
  return cudaGetLastError();
}

cudaError_t LaunchGeluTanhMul(DType dtype, const void* gate, const void* up, void* out,
                              int64_t count, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  const unsigned blocks = Blocks(count, 256) < 65535u ? Blocks(count, 256) : 65535u;
  TESSERA_FLOAT_SWITCH(
      dtype, T,
      GeluTanhMulKernel<T><<<blocks, 256, 0, stream>>>(
          static_cast<const T*>(gate), static_cast<const T*>(up), static_cast<T*>(out), count));
  return cudaGetLastError();
}

}  // namespace tessera::kernels::cuda
