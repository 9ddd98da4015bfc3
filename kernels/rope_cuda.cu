// Rotary embedding (kernels/rope.h): one thread per rotated pair, the angle
// position * inv_freq[i] in fp32 as HF computes it, precise sincosf. q and k
// rotate in one launch (ApplyRopeQk): one kernel fewer per layer.
#include "kernels/cuda_common.cuh"
#include "kernels/cuda_launch.h"
#include "kernels/pdl.cuh"

namespace tessera::kernels::cuda {

namespace {

// Rows of two tensors in one launch: q [tokens, q_heads, 2 * half], then k [tokens, k_heads,
// 2 * half] (k_heads may be 0).
template <typename T>
__global__ void RopeKernel(T* q, T* k, const int32_t* __restrict__ positions,
                           const float* __restrict__ inv_freq, int64_t tokens, int q_heads,
                           int k_heads, int half) {
  PdlWait();  // kernels/pdl.cuh
  PdlLaunchDependents();
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int heads = q_heads + k_heads;
  const int64_t total = tokens * heads * half;
  if (idx >= total) return;
  const int i = static_cast<int>(idx % half);
  const int64_t th = idx / half;  // token * heads + head
  const int64_t t = th / heads;
  const int h = static_cast<int>(th % heads);
  const float angle = static_cast<float>(positions[t]) * inv_freq[i];
  float s, c;
  sincosf(angle, &s, &c);
  T* v =
      h < q_heads ? q + (t * q_heads + h) * 2 * half : k + (t * k_heads + (h - q_heads)) * 2 * half;
  const float a = ToF(v[i]), b = ToF(v[i + half]);
  // Explicit fmas: the fused kernel (rope_write_kv_cuda.cu) rounds the same way, bit for bit.
  v[i] = FromF<T>(fmaf(a, c, -(b * s)));
  v[i + half] = FromF<T>(fmaf(b, c, a * s));
}

}  // namespace

cudaError_t LaunchRopeQk(DType dtype, void* q, void* k, const int32_t* positions,
                         const float* inv_freq, int64_t tokens, int64_t q_heads, int64_t k_heads,
                         int64_t head_dim, cudaStream_t stream) {
  const int64_t total = tokens * (q_heads + k_heads) * (head_dim / 2);
  if (total == 0) return cudaSuccess;
  cudaError_t err = cudaSuccess;
  TESSERA_FLOAT_SWITCH(
      dtype, T,
      err = LaunchWithPdl(tokens <= kPdlMaxTokens, RopeKernel<T>, dim3(Blocks(total, 256)),
                          dim3(256), 0, stream, static_cast<T*>(q), static_cast<T*>(k), positions,
                          inv_freq, tokens, static_cast<int>(q_heads), static_cast<int>(k_heads),
                          static_cast<int>(head_dim / 2)));
  return err;
}

cudaError_t LaunchRope(DType dtype, void* x, const int32_t* positions, const float* inv_freq,
                       int64_t tokens, int64_t heads, int64_t head_dim, cudaStream_t stream) {
  return LaunchRopeQk(dtype, x, nullptr, positions, inv_freq, tokens, heads, 0, head_dim, stream);
}

}  // namespace tessera::kernels::cuda
