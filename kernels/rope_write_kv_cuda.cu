// The fused per-head norms, RoPE and KV write of kernels/rope_write_kv.h: one warp per (token,
// row) where a token's rows are its q heads, then its k heads, then its v heads; kRowsPerBlock
// rows per block. A q or k warp normalises its row (when the weight is given) as
// HeadRmsNormKernel does, rotates it as RopeKernel does (each lane owns the pairs (i, i + half)
// for i = lane, lane + 32, ...), writes it back in place and, for k, into its cache slot; a v
// warp copies its row into the cache. Every intermediate is rounded to the compute dtype where
// the separate kernels store it, so the results are theirs bit for bit (tests/gpu
// NormRopeWriteKv.*).
#include "kernels/cuda_common.cuh"
#include "kernels/cuda_launch.h"
#include "kernels/kv_cache.cuh"
#include "kernels/pdl.cuh"

namespace tessera::kernels::cuda {

namespace {

constexpr int kRowsPerBlock = 8;

struct NormRopeArgs {
  const void* q_norm;  // [head_dim] or null
  const void* k_norm;  // [head_dim] or null
  float eps, w_offset;
  const int32_t* positions;  // [tokens]
  const float* inv_freq;     // [head_dim / 2]
};

// 1 / sqrt(mean(x^2) + eps) of a head_dim row, summed in HeadRmsNormKernel's order.
template <typename T>
__device__ __forceinline__ float RowInvRms(const T* x, int head_dim, float eps) {
  float ss = 0.0f;
  for (int i = threadIdx.x; i < head_dim; i += 32) {
    const float f = ToF(x[i]);
    ss = fmaf(f, f, ss);
  }
  ss = WarpSum(ss);
  return 1.0f / sqrtf(ss / static_cast<float>(head_dim) + eps);
}

template <typename T, typename C>
__global__ void NormRopeWriteKvKernel(AttentionMetaDev meta, AttentionShape shape, T* q, T* k,
                                      const T* __restrict__ v, NormRopeArgs a, C* kc, C* vc) {
  const int hq = shape.heads, hkv = shape.kv_heads, D = shape.head_dim, half = D / 2;
  const int rows_per_token = hq + 2 * hkv;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.y;
  if (r >= static_cast<int64_t>(meta.num_tokens) * rows_per_token) return;  // kernels/pdl.cuh
  PdlWait();
  PdlLaunchDependents();  // a whole warp leaves together: WarpSum stays full
  const int t = static_cast<int>(r / rows_per_token), h = static_cast<int>(r % rows_per_token);
  const int lane = threadIdx.x;
  const int p = meta.token_pos[t];
  const int32_t* table = meta.tables + meta.seq_info[4 * meta.token_seq[t] + 3];
  if (h >= hq + hkv) {  // v: the row into its slot
    const int kvh = h - hq - hkv;
    const T* src = v + (static_cast<int64_t>(t) * hkv + kvh) * D;
    C* dst = vc + SlotBase(table, p, shape, kvh);
    for (int i = lane; i < D; i += 32) dst[i] = KvStore<C>(src[i], shape.v_scale);
    return;
  }
  const bool is_q = h < hq;
  const int kvh = h - hq;
  T* x = is_q ? q + (static_cast<int64_t>(t) * hq + h) * D
              : k + (static_cast<int64_t>(t) * hkv + kvh) * D;
  const T* w = static_cast<const T*>(is_q ? a.q_norm : a.k_norm);
  const float inv = w != nullptr ? RowInvRms(x, D, a.eps) : 1.0f;
  C* dst = is_q ? nullptr : kc + SlotBase(table, p, shape, kvh);
  const float pos = static_cast<float>(a.positions[t]);
  for (int i = lane; i < half; i += 32) {
    float lo = ToF(x[i]), hi = ToF(x[i + half]);
    if (w != nullptr) {  // rounded to T, as HeadRmsNormKernel stores it
      lo = ToF(FromF<T>((a.w_offset + ToF(w[i])) * (lo * inv)));
      hi = ToF(FromF<T>((a.w_offset + ToF(w[i + half])) * (hi * inv)));
    }
    float s, c;
    sincosf(pos * a.inv_freq[i], &s, &c);
    // Explicit fmas, as RopeKernel: the compiler may contract a * c - b * s either way.
    const T out_lo = FromF<T>(fmaf(lo, c, -(hi * s))), out_hi = FromF<T>(fmaf(hi, c, lo * s));
    x[i] = out_lo;
    x[i + half] = out_hi;
    if (dst != nullptr) {
      dst[i] = KvStore<C>(out_lo, shape.k_scale);
      dst[i + half] = KvStore<C>(out_hi, shape.k_scale);
    }
  }
}

template <typename T, typename C>
cudaError_t Launch(const AttentionMetaDev& meta, const AttentionShape& shape, void* q, void* k,
                   const void* v, const NormRopeArgs& a, void* k_cache, void* v_cache,
                   cudaStream_t stream) {
  const int64_t rows = static_cast<int64_t>(meta.num_tokens) * (shape.heads + 2 * shape.kv_heads);
  return LaunchWithPdl(meta.num_tokens <= kPdlMaxTokens, NormRopeWriteKvKernel<T, C>,
                       dim3(Blocks(rows, kRowsPerBlock)), dim3(32, kRowsPerBlock), 0, stream, meta,
                       shape, static_cast<T*>(q), static_cast<T*>(k), static_cast<const T*>(v), a,
                       static_cast<C*>(k_cache), static_cast<C*>(v_cache));
}

}  // namespace

cudaError_t LaunchNormRopeWriteKv(DType dtype, const AttentionMetaDev& meta,
                                  const AttentionShape& shape, void* q, void* k, const void* v,
                                  const void* q_norm, const void* k_norm, float eps, float w_offset,
                                  const int32_t* positions, const float* inv_freq, void* k_cache,
                                  void* v_cache, DType cache_dtype, cudaStream_t stream) {
  if (meta.num_tokens == 0) return cudaSuccess;
  if (shape.head_dim % 2 != 0) return cudaErrorInvalidValue;
  const NormRopeArgs a{q_norm, k_norm, eps, w_offset, positions, inv_freq};
  if (cache_dtype == DType::kF8E4M3) {
    if (dtype == DType::kBF16)
      return Launch<__nv_bfloat16, __nv_fp8_e4m3>(meta, shape, q, k, v, a, k_cache, v_cache,
                                                  stream);
    if (dtype == DType::kF16)
      return Launch<__half, __nv_fp8_e4m3>(meta, shape, q, k, v, a, k_cache, v_cache, stream);
    return cudaErrorInvalidValue;
  }
  if (cache_dtype != dtype) return cudaErrorInvalidValue;
  cudaError_t err = cudaErrorInvalidValue;
  TESSERA_FLOAT_SWITCH(dtype, T,
                       err = Launch<T, T>(meta, shape, q, k, v, a, k_cache, v_cache, stream));
  return err;
}

}  // namespace tessera::kernels::cuda
