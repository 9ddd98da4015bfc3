// RMSNorm and fused residual-add RMSNorm (kernels/rms_norm.h): one block per
// row, fp32 sum of squares, the scale (w_offset + w) in fp32, the output
// rounded once to the element type.
#include "kernels/cuda_common.cuh"
#include "kernels/cuda_launch.h"

namespace tessera::kernels::cuda {

namespace {

template <typename T>
__global__ void RmsNormKernel(const T* __restrict__ x, T* residual, const T* __restrict__ add,
                              const T* __restrict__ w, T* y, int hidden, float eps,
                              float w_offset) {
  __shared__ float scratch[32];
  const int64_t base = static_cast<int64_t>(blockIdx.x) * hidden;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
    float v;
    if (add != nullptr) {
      const T r = FromF<T>(ToF(residual[base + i]) + ToF(add[base + i]));
      residual[base + i] = r;
      v = ToF(r);
    } else {
      v = ToF(x[base + i]);
    }
    ss += v * v;
  }
  ss = BlockSum(ss, scratch);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(hidden) + eps);
  const T* in = add != nullptr ? residual : x;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x)
    y[base + i] = FromF<T>((w_offset + ToF(w[i])) * (ToF(in[base + i]) * inv));
}

}  // namespace

cudaError_t LaunchRmsNorm(DType dtype, const void* x, void* residual, const void* add,
                          const void* w, void* y, int64_t rows, int64_t hidden, float eps,
                          float w_offset, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  const int threads = hidden >= 4096 ? 1024 : hidden >= 1024 ? 512 : 128;
  TESSERA_FLOAT_SWITCH(
      dtype, T,
      RmsNormKernel<T><<<static_cast<unsigned>(rows), threads, 0, stream>>>(
          static_cast<const T*>(x), static_cast<T*>(residual), static_cast<const T*>(add),
          static_cast<const T*>(w), static_cast<T*>(y), static_cast<int>(hidden), eps, w_offset));
  return cudaGetLastError();
}

}  // namespace tessera::kernels::cuda
