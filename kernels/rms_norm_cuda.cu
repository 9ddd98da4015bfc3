// RMSNorm and fused residual-add RMSNorm (kernels/rms_norm.h): one block per
// row, fp32 sum of squares, the scale (w_offset + w) in fp32, the output
// rounded once to the element type. Rows of 16-byte aligned, whole 16-byte
// vectors (hidden % 8 == 0 in bf16/fp16, % 4 in fp32) take RmsNormVecKernel:
// one pass over the row with the values kept in registers (at decode a norm
// is one block, so its time is its latency: one read of the row, not two).
#include <algorithm>

#include "kernels/cuda_common.cuh"
#include "kernels/cuda_launch.h"
#include "kernels/pdl.cuh"

namespace tessera::kernels::cuda {

namespace {

template <typename T>
__global__ void RmsNormKernel(const T* __restrict__ x, T* residual, const T* __restrict__ add,
                              const T* __restrict__ w, T* y, int hidden, float eps,
                              float w_offset) {
  __shared__ float scratch[32];
  PdlWait();  // kernels/pdl.cuh
  PdlLaunchDependents();
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

template <typename T>
__device__ __forceinline__ void Load16(const T* p, float (&out)[16 / sizeof(T)]) {
  constexpr int kV = 16 / sizeof(T);
  const uint4 raw = *reinterpret_cast<const uint4*>(p);
  const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
  for (int i = 0; i < kV; ++i) out[i] = ToF(e[i]);
}

// kVecs 16-byte vectors per thread at most; blockDim.x * kVecs * (16 / sizeof(T)) >= hidden.
template <typename T, int kVecs>
__global__ void RmsNormVecKernel(const T* __restrict__ x, T* residual, const T* __restrict__ add,
                                 const T* __restrict__ w, T* y, int hidden, float eps,
                                 float w_offset) {
  constexpr int kV = 16 / sizeof(T);
  __shared__ float scratch[32];
  PdlWait();  // kernels/pdl.cuh
  PdlLaunchDependents();
  const int64_t base = static_cast<int64_t>(blockIdx.x) * hidden;
  const int nvec = hidden / kV;
  float v[kVecs][kV];
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < kVecs; ++j) {
    const int vi = threadIdx.x + j * blockDim.x;
    if (vi >= nvec) break;
    const int64_t at = base + static_cast<int64_t>(vi) * kV;
    if (add != nullptr) {
      float a[kV];
      Load16(residual + at, v[j]);
      Load16(add + at, a);
      uint4 packed;
      T* out = reinterpret_cast<T*>(&packed);
#pragma unroll
      for (int i = 0; i < kV; ++i) {
        out[i] = FromF<T>(v[j][i] + a[i]);
        v[j][i] = ToF(out[i]);
      }
      *reinterpret_cast<uint4*>(residual + at) = packed;
    } else {
      Load16(x + at, v[j]);
    }
#pragma unroll
    for (int i = 0; i < kV; ++i) ss += v[j][i] * v[j][i];
  }
  ss = BlockSum(ss, scratch);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(hidden) + eps);
#pragma unroll
  for (int j = 0; j < kVecs; ++j) {
    const int vi = threadIdx.x + j * blockDim.x;
    if (vi >= nvec) break;
    float wf[kV];
    Load16(w + static_cast<int64_t>(vi) * kV, wf);
    uint4 packed;
    T* out = reinterpret_cast<T*>(&packed);
#pragma unroll
    for (int i = 0; i < kV; ++i) out[i] = FromF<T>((w_offset + wf[i]) * (v[j][i] * inv));
    *reinterpret_cast<uint4*>(y + base + static_cast<int64_t>(vi) * kV) = packed;
  }
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// The vectorized launch, or false where the row does not fit its layout.
template <typename T>
bool LaunchVec(const T* x, T* residual, const T* add, const T* w, T* y, int64_t rows,
               int64_t hidden, float eps, float w_offset, cudaStream_t stream, cudaError_t* err) {
  constexpr int64_t kV = 16 / sizeof(T);
  const T* in = add != nullptr ? residual : x;
  if (hidden % kV != 0 || !Aligned16(in) || !Aligned16(w) || !Aligned16(y) ||
      (add != nullptr && !Aligned16(add)))
    return false;
  const int64_t nvec = hidden / kV;
  const int vecs = nvec <= 1024 ? 1 : nvec <= 2048 ? 2 : nvec <= 4096 ? 4 : 0;
  if (vecs == 0) return false;
  const int threads =
      static_cast<int>(std::min<int64_t>(1024, ((nvec + vecs - 1) / vecs + 31) / 32 * 32));
  const dim3 blocks(static_cast<unsigned>(rows));
  const int h = static_cast<int>(hidden);
  auto* kernel = vecs == 1   ? RmsNormVecKernel<T, 1>
                 : vecs == 2 ? RmsNormVecKernel<T, 2>
                             : RmsNormVecKernel<T, 4>;
  *err = LaunchWithPdl(rows <= kPdlMaxTokens, kernel, blocks, dim3(threads), 0, stream, x, residual,
                       add, w, y, h, eps, w_offset);
  return true;
}

}  // namespace

cudaError_t LaunchRmsNorm(DType dtype, const void* x, void* residual, const void* add,
                          const void* w, void* y, int64_t rows, int64_t hidden, float eps,
                          float w_offset, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  bool vec = false;
  cudaError_t err = cudaSuccess;
  TESSERA_FLOAT_SWITCH(
      dtype, T,
      vec = LaunchVec<T>(static_cast<const T*>(x), static_cast<T*>(residual),
                         static_cast<const T*>(add), static_cast<const T*>(w), static_cast<T*>(y),
                         rows, hidden, eps, w_offset, stream, &err));
  if (vec) return err;
  const int threads = hidden >= 4096 ? 1024 : hidden >= 1024 ? 512 : 128;
  TESSERA_FLOAT_SWITCH(
      dtype, T,
      err = LaunchWithPdl(rows <= kPdlMaxTokens, RmsNormKernel<T>,
                          dim3(static_cast<unsigned>(rows)), dim3(threads), 0, stream,
                          static_cast<const T*>(x), static_cast<T*>(residual),
                          static_cast<const T*>(add), static_cast<const T*>(w), static_cast<T*>(y),
                          static_cast<int>(hidden), eps, w_offset));
  return err;
}

}  // namespace tessera::kernels::cuda
