// Device helpers shared by kernels/*_cuda.cu: fp32 conversion of the three
// floating element types, warp/block reductions, and the dtype switch that
// instantiates a kernel for F32, BF16 and F16.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cfloat>
#include <cstdint>

#include "common/base/dtype.h"

namespace tessera::kernels::cuda {

__device__ __forceinline__ float ToF(float x) { return x; }
__device__ __forceinline__ float ToF(__half x) { return __half2float(x); }
__device__ __forceinline__ float ToF(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__device__ __forceinline__ T FromF(float x);
template <>
__device__ __forceinline__ float FromF<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __half FromF<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ __forceinline__ __nv_bfloat16 FromF<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

__device__ __forceinline__ float WarpSum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float WarpMax(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum (or max) over the block; every thread gets the result. `scratch`
// holds 32 floats; blockDim.x is a multiple of 32.
__device__ __forceinline__ float BlockSum(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = WarpSum(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : 0.0f;
  return WarpSum(v);
}
__device__ __forceinline__ float BlockMax(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = WarpMax(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : -FLT_MAX;
  return WarpMax(v);
}

inline unsigned Blocks(int64_t n, int threads) {
  return static_cast<unsigned>((n + threads - 1) / threads);
}

}  // namespace tessera::kernels::cuda

// Runs the statement with `T` bound to the element type of `dtype`; other
// dtypes return cudaErrorInvalidValue from the enclosing launcher.
#define TESSERA_FLOAT_SWITCH(dtype, T, ...) \
  switch (dtype) {                          \
    case ::tessera::DType::kF32: {          \
      using T = float;                      \
      __VA_ARGS__;                          \
      break;                                \
    }                                       \
    case ::tessera::DType::kBF16: {         \
      using T = __nv_bfloat16;              \
      __VA_ARGS__;                          \
      break;                                \
    }                                       \
    case ::tessera::DType::kF16: {          \
      using T = __half;                     \
      __VA_ARGS__;                          \
      break;                                \
    }                                       \
    default:                                \
      return cudaErrorInvalidValue;         \
  }
