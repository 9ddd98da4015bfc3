// Device helpers for the paged KV cache (kernels/paged_attention.h): an element as the cache of
// element type C stores it and reads it back, and where a (sequence, position, kv head) row lives.
//
// The fp8 KV cache (kernels/kv_quant.h): C is the compute type T or __nv_fp8_e4m3. A write stores
// e4m3(ToF(x) / scale) (cuda_fp8.h's conversion: round to nearest even, __NV_SATFINITE saturating
// to +-448, as the CPU's F32ToF8E4M3); a read gives float(e4m3) * scale.
// Used by kernels/paged_attention_cuda.cu and kernels/rope_write_kv_cuda.cu.
#pragma once

#include <cuda_fp8.h>

#include <cstdint>

#include "kernels/cuda_common.cuh"
#include "kernels/cuda_launch.h"

namespace tessera::kernels::cuda {

// A cache element in fp32: the compute type as is, e4m3 times its scale.
template <typename C>
__device__ __forceinline__ float KvF(C x, float) {
  return ToF(x);
}
template <>
__device__ __forceinline__ float KvF<__nv_fp8_e4m3>(__nv_fp8_e4m3 x, float scale) {
  return static_cast<float>(x) * scale;
}

// A K/V value as the cache of element type C stores it.
template <typename C, typename T>
__device__ __forceinline__ C KvStore(T x, float) {
  return x;
}
template <>
__device__ __forceinline__ __nv_fp8_e4m3 KvStore<__nv_fp8_e4m3, __nv_bfloat16>(__nv_bfloat16 x,
                                                                               float scale) {
  return __nv_fp8_e4m3(ToF(x) / scale);
}
template <>
__device__ __forceinline__ __nv_fp8_e4m3 KvStore<__nv_fp8_e4m3, __half>(__half x, float scale) {
  return __nv_fp8_e4m3(ToF(x) / scale);
}

// The element offset of (position p of the sequence with block table `table`, kv head kvh) in
// a layer's K or V cache [num_blocks, block_size, kv_heads, head_dim].
__device__ __forceinline__ int64_t SlotBase(const int32_t* table, int p, const AttentionShape& s,
                                            int kvh) {
  const int64_t block = table[p / s.block_size];
  return ((block * s.block_size + p % s.block_size) * s.kv_heads + kvh) * s.head_dim;
}

}  // namespace tessera::kernels::cuda
