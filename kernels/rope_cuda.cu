// Rotary embedding (kernels/rope.h): one thread per rotated pair, the angle
// position * inv_freq[i] in fp32 as HF computes it, precise sincosf.
#include "kernels/cuda_common.cuh"
#include "kernels/cuda_launch.h"

namespace tessera::kernels::cuda {

namespace {

template <typename T>
__global__ void RopeKernel(T* x, const int32_t* __restrict__ positions,
                           const float* __restrict__ inv_freq, int64_t tokens, int heads,
                           int half) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t total = tokens * heads * half;
  if (idx >= total) return;
  const int i = static_cast<int>(idx % half);
  const int64_t th = idx / half;  // token * heads + head
  const int64_t t = th / heads;
  const float angle = static_cast<float>(positions[t]) * inv_freq[i];
  float s, c;
  sincosf(angle, &s, &c);
  T* v = x + th * 2 * half;
  const float a = ToF(v[i]), b = ToF(v[i + half]);
  v[i] = FromF<T>(a * c - b * s);
  v[i + half] = FromF<T>(b * c + a * s);
}

}  // namespace

cudaError_t LaunchRope(DType dtype, void* x, const int32_t* positions, const float* inv_freq,
                       int64_t tokens, int64_t heads, int64_t head_dim, cudaStream_t stream) {
  const int64_t total = tokens * heads * (head_dim / 2);
  if (total == 0) return cudaSuccess;
  TESSERA_FLOAT_SWITCH(dtype, T,
                       RopeKernel<T><<<Blocks(total, 256), 256, 0, stream>>>(
                           static_cast<T*>(x), positions, inv_freq, tokens, static_cast<int>(heads),
                           static_cast<int>(head_dim / 2)));
  return cudaGetLastError();
}

}  // namespace tessera::kernels::cuda
