// Paged KV-cache writes and causal GQA attention over the paged cache
// (kernels/paged_attention.h), in fp32 arithmetic over any element type.
//
// Decode (few query tokens per sequence): one CTA per (query token, kv head,
// split of the context). The CTA holds the GQA group's queries in shared
// memory, so each K/V row is read once for the whole group; a warp computes
// one key's scores, softmax runs over the split in shared memory, and
// P.V is accumulated per head dimension. With several splits (flash-decoding)
// each split writes (max, sum, unnormalised output) and a second kernel
// combines them.
//
// Prefill (flash-style, Dao et al. 2022): one CTA per (tile of query rows,
// sequence, kv head), query rows being (token, head of the group) pairs, 64
// per tile. Key/value tiles of 32 positions are gathered from the paged
// cache into shared memory; scores, the running max/sum (online softmax)
// and the output accumulator stay in fp32; the causal mask (and the sliding
// window, when set) is applied per row, and key tiles wholly before every
// row's window are skipped. Scalar FMA, not tensor cores.
//
// Sliding window (AttentionShape::window > 0): a token at position p sees
// [max(0, p - window + 1), p]. A decode split takes the part of its range
// inside that window; a split wholly outside it contributes nothing to the
// combine, as a split past the context does.
//
// Soft-capping (AttentionShape::softcap > 0, Gemma 2): each scaled score s
// becomes softcap * tanh(s / softcap) where it is computed, before the mask,
// the running max and the softmax.
//
// KV writes: one CTA per (token, chunk of its K/V row), 16-byte vectors when
// the row and the pointers are 16-byte aligned (one scalar CTA per token
// otherwise).
//
// The fp8 KV cache (kernels/kv_quant.h): the cache element type C is the
// compute type T or __nv_fp8_e4m3. A write stores e4m3(ToF(x) / scale)
// (cuda_fp8.h's conversion: round to nearest even, __NV_SATFINITE saturating
// to +-448, as the CPU's F32ToF8E4M3); the kernels read float(e4m3) * scale
// where they read ToF(x) otherwise, so the arithmetic after the load is the
// same. Instantiated for T = BF16 and F16 only (the Hopper serving dtypes).
#include <cuda_fp8.h>

#include <algorithm>
#include <type_traits>

#include "kernels/cuda_common.cuh"
#include "kernels/cuda_launch.h"
#include "kernels/kv_cache.cuh"
#include "kernels/pdl.cuh"

namespace tessera::kernels::cuda {

namespace {

constexpr int kDecodeThreads = 256;  // 8 warps: two position groups of P.V at head_dim 128
constexpr int kPrefillThreads = 128;
constexpr int kPrefillRows = 64;
constexpr int kPrefillKeys = 32;
constexpr int kScoreStride = kPrefillKeys + 1;

__device__ __forceinline__ float SoftCapScore(float s, float cap) {
  return cap > 0.0f ? tanhf(s / cap) * cap : s;
}

template <typename T, typename C>
__global__ void WriteKvKernel(AttentionMetaDev meta, AttentionShape shape, const T* __restrict__ k,
                              const T* __restrict__ v, C* kc, C* vc) {
  PdlWait();  // kernels/pdl.cuh
  PdlLaunchDependents();
  const int t = blockIdx.x;
  const int seq = meta.token_seq[t], p = meta.token_pos[t];
  const int32_t* table = meta.tables + meta.seq_info[4 * seq + 3];
  const int64_t row = static_cast<int64_t>(shape.kv_heads) * shape.head_dim;
  const int64_t block = table[p / shape.block_size];
  const int64_t dst = (block * shape.block_size + p % shape.block_size) * row;
  for (int64_t i = threadIdx.x; i < row; i += blockDim.x) {
    kc[dst + i] = KvStore<C>(k[t * row + i], shape.k_scale);
    vc[dst + i] = KvStore<C>(v[t * row + i], shape.v_scale);
  }
}

// The same copy in 16-byte vectors, one CTA per (token, chunk of the row),
// so a single decode token's row is spread over several SMs. `row` counts
// vectors.
__global__ void WriteKvVecKernel(AttentionMetaDev meta, AttentionShape shape, int64_t row,
                                 const uint4* __restrict__ k, const uint4* __restrict__ v,
                                 uint4* kc, uint4* vc) {
  PdlWait();  // kernels/pdl.cuh
  PdlLaunchDependents();
  const int t = blockIdx.x;
  const int seq = meta.token_seq[t], p = meta.token_pos[t];
  const int32_t* table = meta.tables + meta.seq_info[4 * seq + 3];
  const int64_t block = table[p / shape.block_size];
  const int64_t dst = (block * shape.block_size + p % shape.block_size) * row;
  for (int64_t i = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x; i < row;
       i += static_cast<int64_t>(gridDim.y) * blockDim.x) {
    kc[dst + i] = k[t * row + i];
    vc[dst + i] = v[t * row + i];
  }
}

template <typename T, typename C, int MAXG>
__global__ void __launch_bounds__(kDecodeThreads)
    DecodeAttentionKernel(AttentionMetaDev meta, AttentionShape shape, const T* __restrict__ q,
                          const C* __restrict__ kc, const C* __restrict__ vc, T* out, float scale,
                          int partition, int num_splits, float* partials) {
  extern __shared__ float smem[];
  const int D = shape.head_dim, H = shape.heads, G = shape.heads / shape.kv_heads;
  float* q_s = smem;                       // [G][D], pre-scaled
  float* scores = q_s + G * D;             // [G][partition]
  float* red = scores + G * partition;     // [kDecodeThreads]
  float* bscratch = red + kDecodeThreads;  // [32]
  float* stats = bscratch + 32;            // [MAXG][2]: max, sum

  const int t = blockIdx.x, kvh = blockIdx.y, split = blockIdx.z;
  const int tid = threadIdx.x;
  const int seq = meta.token_seq[t];
  const int ctx = meta.token_pos[t] + 1;
  const int lo = shape.window > 0 ? max(0, ctx - shape.window) : 0;  // first visible position
  const int p0 = max(split * partition, lo);
  const int n = min(ctx, split * partition + partition) - p0;
  const int64_t slots = static_cast<int64_t>(meta.num_tokens) * H * num_splits;
  float* part_ml = partials;
  float* part_acc = partials + 2 * slots;
  if (n <= 0) {  // only with several splits: this split lies past the context or the window
    if (tid < G) {
      const int64_t idx = (static_cast<int64_t>(t) * H + kvh * G + tid) * num_splits + split;
      part_ml[2 * idx] = -FLT_MAX;
      part_ml[2 * idx + 1] = 0.0f;
    }
    return;
  }
  const int32_t* table = meta.tables + meta.seq_info[4 * seq + 3];
  for (int i = tid; i < G * D; i += blockDim.x) {
    const int g = i / D, d = i % D;
    q_s[i] = ToF(q[(static_cast<int64_t>(t) * H + kvh * G + g) * D + d]) * scale;
  }
  __syncthreads();

  // Scores: one warp per key position, lanes split the head dimension.
  const int warp = tid >> 5, lane = tid & 31, nwarps = blockDim.x >> 5;
  for (int i = warp; i < n; i += nwarps) {
    const C* krow = kc + SlotBase(table, p0 + i, shape, kvh);
    float dots[MAXG];
#pragma unroll
    for (int g = 0; g < MAXG; ++g) dots[g] = 0.0f;
    for (int d = lane; d < D; d += 32) {
      const float kv = KvF(krow[d], shape.k_scale);
#pragma unroll
      for (int g = 0; g < MAXG; ++g)
        if (g < G) dots[g] += q_s[g * D + d] * kv;
    }
#pragma unroll
    for (int g = 0; g < MAXG; ++g) {
      if (g < G) {
        const float s = WarpSum(dots[g]);
        if (lane == 0) scores[g * partition + i] = SoftCapScore(s, shape.softcap);
      }
    }
  }
  __syncthreads();

  // Softmax over this split, per head of the group.
  for (int g = 0; g < G; ++g) {
    float m = -FLT_MAX;
    for (int i = tid; i < n; i += blockDim.x) m = fmaxf(m, scores[g * partition + i]);
    m = BlockMax(m, bscratch);
    float s = 0.0f;
    for (int i = tid; i < n; i += blockDim.x) {
      const float e = expf(scores[g * partition + i] - m);
      scores[g * partition + i] = e;
      s += e;
    }
    s = BlockSum(s, bscratch);
    if (tid == 0) {
      stats[2 * g] = m;
      stats[2 * g + 1] = s;
    }
  }
  __syncthreads();

  // P.V: thread -> (head-dim element, group of positions).
  const int groups = D >= kDecodeThreads ? 1 : kDecodeThreads / D;
  const int grp = D >= kDecodeThreads ? 0 : tid / D;
  const int d0 = D >= kDecodeThreads ? tid : tid % D;
  const bool active = grp < groups;
  float acc[MAXG][2];
#pragma unroll
  for (int g = 0; g < MAXG; ++g) acc[g][0] = acc[g][1] = 0.0f;
  if (active) {
    for (int i = grp; i < n; i += groups) {
      const C* vrow = vc + SlotBase(table, p0 + i, shape, kvh);
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int d = d0 + j * kDecodeThreads;
        if (d < D && (j == 0 || D > kDecodeThreads)) {
          const float vv = KvF(vrow[d], shape.v_scale);
#pragma unroll
          for (int g = 0; g < MAXG; ++g)
            if (g < G) acc[g][j] += scores[g * partition + i] * vv;
        }
      }
    }
  }
#pragma unroll
  for (int g = 0; g < MAXG; ++g) {
    if (g >= G) break;
    if (groups > 1) {
      __syncthreads();
      red[tid] = active ? acc[g][0] : 0.0f;
      __syncthreads();
      if (grp == 0) {
        float s = 0.0f;
        for (int k = 0; k < groups; ++k) s += red[k * D + d0];
        acc[g][0] = s;
      }
    }
    if (grp != 0) continue;
    const int h = kvh * G + g;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int d = d0 + j * kDecodeThreads;
      if (d >= D || (j == 1 && D <= kDecodeThreads)) continue;
      if (num_splits == 1) {
        out[(static_cast<int64_t>(t) * H + h) * D + d] = FromF<T>(acc[g][j] / stats[2 * g + 1]);
      } else {
        const int64_t idx = (static_cast<int64_t>(t) * H + h) * num_splits + split;
        part_acc[idx * D + d] = acc[g][j];
        if (d == 0) {
          part_ml[2 * idx] = stats[2 * g];
          part_ml[2 * idx + 1] = stats[2 * g + 1];
        }
      }
    }
  }
}

template <typename T>
__global__ void CombineSplitsKernel(int num_tokens, int heads, int head_dim, int num_splits,
                                    const float* __restrict__ partials, T* out) {
  const int t = blockIdx.x, h = blockIdx.y;
  const int64_t slots = static_cast<int64_t>(num_tokens) * heads * num_splits;
  const float* ml = partials;
  const float* acc = partials + 2 * slots;
  const int64_t base = (static_cast<int64_t>(t) * heads + h) * num_splits;
  float m = -FLT_MAX;
  for (int s = 0; s < num_splits; ++s)
    if (ml[2 * (base + s) + 1] > 0.0f) m = fmaxf(m, ml[2 * (base + s)]);
  float l = 0.0f;
  for (int s = 0; s < num_splits; ++s) {
    const float ls = ml[2 * (base + s) + 1];
    if (ls > 0.0f) l += ls * expf(ml[2 * (base + s)] - m);
  }
  for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
    float o = 0.0f;
    for (int s = 0; s < num_splits; ++s) {
      const float ls = ml[2 * (base + s) + 1];
      if (ls > 0.0f) o += acc[(base + s) * head_dim + d] * expf(ml[2 * (base + s)] - m);
    }
    out[(static_cast<int64_t>(t) * heads + h) * head_dim + d] = FromF<T>(o / l);
  }
}

template <typename T, typename C>
__global__ void __launch_bounds__(kPrefillThreads)
    PrefillAttentionKernel(AttentionMetaDev meta, AttentionShape shape, const T* __restrict__ q,
                           const C* __restrict__ kc, const C* __restrict__ vc, T* out,
                           float scale) {
  extern __shared__ float smem[];
  const int D = shape.head_dim, H = shape.heads, G = shape.heads / shape.kv_heads;
  const int DS = D + 1;  // padded rows: no bank conflicts across rows
  const int tokens_per_tile = max(1, kPrefillRows / G);
  const int seq = blockIdx.y, kvh = blockIdx.z, tid = threadIdx.x;
  const int32_t* info = meta.seq_info + 4 * seq;
  const int token_begin = info[0], num_tokens = info[1], start_pos = info[2];
  const int t0 = blockIdx.x * tokens_per_tile;
  if (t0 >= num_tokens) return;
  const int nt = min(tokens_per_tile, num_tokens - t0);
  const int rows = nt * G;
  const int32_t* table = meta.tables + info[3];
  float* Qs = smem;                    // [64][DS]
  float* Ks = Qs + kPrefillRows * DS;  // [32][DS]
  float* Vs = Ks + kPrefillKeys * DS;  // [32][DS]
  float* Os = Vs + kPrefillKeys * DS;  // [64][DS]
  float* S = Os + kPrefillRows * DS;   // [64][33]
  float* row_m = S + kPrefillRows * kScoreStride;
  float* row_l = row_m + kPrefillRows;
  float* row_a = row_l + kPrefillRows;

  for (int i = tid; i < kPrefillRows * D; i += blockDim.x) {
    const int r = i / D, d = i % D;
    float v = 0.0f;
    if (r < rows) {
      const int tok = token_begin + t0 + r / G, h = kvh * G + r % G;
      v = ToF(q[(static_cast<int64_t>(tok) * H + h) * D + d]) * scale;
    }
    Qs[r * DS + d] = v;
    Os[r * DS + d] = 0.0f;
  }
  if (tid < kPrefillRows) {
    row_m[tid] = -FLT_MAX;
    row_l[tid] = 0.0f;
  }
  const int last_pos = start_pos + t0 + nt - 1;
  // The tile's first row sees the earliest positions; tiles before its
  // window hold no visible key for any row.
  const int first_key =
      shape.window > 0 ? max(0, start_pos + t0 - shape.window + 1) / kPrefillKeys * kPrefillKeys
                       : 0;
  const int tr = tid / 8, tc = tid % 8;  // 16 x 8 threads, 4 x 4 outputs each
  for (int k0 = first_key; k0 <= last_pos; k0 += kPrefillKeys) {
    __syncthreads();
    for (int i = tid; i < kPrefillKeys * D; i += blockDim.x) {
      const int c = i / D, d = i % D, p = k0 + c;
      float kv = 0.0f, vv = 0.0f;
      if (p <= last_pos) {
        const int64_t base = SlotBase(table, p, shape, kvh);
        kv = KvF(kc[base + d], shape.k_scale);
        vv = KvF(vc[base + d], shape.v_scale);
      }
      Ks[c * DS + d] = kv;
      Vs[c * DS + d] = vv;
    }
    __syncthreads();
    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;
    for (int d = 0; d < D; ++d) {
      float a[4], b[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) a[i] = Qs[(tr + 16 * i) * DS + d];
#pragma unroll
      for (int j = 0; j < 4; ++j) b[j] = Ks[(tc + 8 * j) * DS + d];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] += a[i] * b[j];
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int r = tr + 16 * i;
      const int pos_r = start_pos + t0 + r / G;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int c = tc + 8 * j;
        const bool visible =
            r < rows && k0 + c <= pos_r && (shape.window <= 0 || k0 + c > pos_r - shape.window);
        S[r * kScoreStride + c] = visible ? SoftCapScore(acc[i][j], shape.softcap) : -INFINITY;
      }
    }
    __syncthreads();
    if (tid < kPrefillRows) {
      const int r = tid;
      const float m_old = row_m[r];
      float mx = m_old;
      for (int c = 0; c < kPrefillKeys; ++c) mx = fmaxf(mx, S[r * kScoreStride + c]);
      const float alpha = expf(m_old - mx);
      float l = row_l[r] * alpha;
      for (int c = 0; c < kPrefillKeys; ++c) {
        const float s = S[r * kScoreStride + c];
        const float e = s == -INFINITY ? 0.0f : expf(s - mx);
        S[r * kScoreStride + c] = e;
        l += e;
      }
      row_m[r] = mx;
      row_l[r] = l;
      row_a[r] = alpha;
    }
    __syncthreads();
    for (int db = 0; db < D; db += 32) {
      float o[4][4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int r = tr + 16 * i;
#pragma unroll
        for (int jj = 0; jj < 4; ++jj) {
          const int d = db + tc + 8 * jj;
          o[i][jj] = d < D ? Os[r * DS + d] * row_a[r] : 0.0f;
        }
      }
      for (int c = 0; c < kPrefillKeys; ++c) {
        float sv[4], vv[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) sv[i] = S[(tr + 16 * i) * kScoreStride + c];
#pragma unroll
        for (int jj = 0; jj < 4; ++jj) {
          const int d = db + tc + 8 * jj;
          vv[jj] = d < D ? Vs[c * DS + d] : 0.0f;
        }
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int jj = 0; jj < 4; ++jj) o[i][jj] += sv[i] * vv[jj];
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int r = tr + 16 * i;
#pragma unroll
        for (int jj = 0; jj < 4; ++jj) {
          const int d = db + tc + 8 * jj;
          if (d < D) Os[r * DS + d] = o[i][jj];
        }
      }
    }
  }
  __syncthreads();
  for (int i = tid; i < rows * D; i += blockDim.x) {
    const int r = i / D, d = i % D;
    const int tok = token_begin + t0 + r / G, h = kvh * G + r % G;
    out[(static_cast<int64_t>(tok) * H + h) * D + d] = FromF<T>(Os[r * DS + d] / row_l[r]);
  }
}

size_t PrefillSharedBytes(int head_dim) {
  const size_t ds = static_cast<size_t>(head_dim) + 1;
  return sizeof(float) * ((2 * kPrefillRows + 2 * kPrefillKeys) * ds + kPrefillRows * kScoreStride +
                          3 * kPrefillRows);
}

// Raises a kernel's dynamic shared-memory limit when it needs more than the
// default 48 KiB (once per kernel and size).
template <typename Kernel>
cudaError_t AllowSharedBytes(Kernel kernel, size_t bytes, size_t& allowed) {
  if (bytes <= 48 * 1024 || bytes <= allowed) return cudaSuccess;
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(bytes));
  if (e == cudaSuccess) allowed = bytes;
  return e;
}

template <typename T, typename C, int MAXG>
cudaError_t LaunchDecodeTyped(const AttentionMetaDev& meta, const AttentionShape& shape,
                              const void* q, const void* kc, const void* vc, void* out, float scale,
                              int partition, int num_splits, float* partials, cudaStream_t stream) {
  static size_t allowed = 0;
  const size_t smem = DecodeAttentionSharedBytes(shape, partition);
  cudaError_t e = AllowSharedBytes(DecodeAttentionKernel<T, C, MAXG>, smem, allowed);
  if (e != cudaSuccess) return e;
  const dim3 grid(static_cast<unsigned>(meta.num_tokens), static_cast<unsigned>(shape.kv_heads),
                  static_cast<unsigned>(num_splits));
  DecodeAttentionKernel<T, C, MAXG><<<grid, kDecodeThreads, smem, stream>>>(
      meta, shape, static_cast<const T*>(q), static_cast<const C*>(kc), static_cast<const C*>(vc),
      static_cast<T*>(out), scale, partition, num_splits, partials);
  e = cudaGetLastError();
  if (e != cudaSuccess || num_splits == 1) return e;
  const dim3 cgrid(static_cast<unsigned>(meta.num_tokens), static_cast<unsigned>(shape.heads));
  CombineSplitsKernel<T><<<cgrid, shape.head_dim >= 128 ? 128 : 64, 0, stream>>>(
      meta.num_tokens, shape.heads, shape.head_dim, num_splits, partials, static_cast<T*>(out));
  return cudaGetLastError();
}

template <typename T>
cudaError_t LaunchPrefillTyped(const AttentionMetaDev& meta, const AttentionShape& shape,
                               const void* q, const void* kc, const void* vc, void* out,
                               float scale, bool fp8_cache, cudaStream_t stream) {
  const int g = shape.heads / shape.kv_heads;
  const int tokens_per_tile = kPrefillRows / g > 0 ? kPrefillRows / g : 1;
  const unsigned tiles =
      static_cast<unsigned>((meta.max_seq_tokens + tokens_per_tile - 1) / tokens_per_tile);
  const dim3 grid(tiles, static_cast<unsigned>(meta.num_seqs),
                  static_cast<unsigned>(shape.kv_heads));
  const size_t smem = PrefillSharedBytes(shape.head_dim);
  const auto launch = [&](auto kernel, const auto* k, const auto* v) {
    static size_t allowed = 0;
    cudaError_t e = AllowSharedBytes(kernel, smem, allowed);
    if (e != cudaSuccess) return e;
    kernel<<<grid, kPrefillThreads, smem, stream>>>(meta, shape, static_cast<const T*>(q), k, v,
                                                    static_cast<T*>(out), scale);
    return cudaGetLastError();
  };
  if (fp8_cache) {
    if constexpr (std::is_same_v<T, float>) {
      return cudaErrorInvalidValue;  // fp8 KV is instantiated for 16-bit compute only
    } else {
      return launch(PrefillAttentionKernel<T, __nv_fp8_e4m3>, static_cast<const __nv_fp8_e4m3*>(kc),
                    static_cast<const __nv_fp8_e4m3*>(vc));
    }
  }
  return launch(PrefillAttentionKernel<T, T>, static_cast<const T*>(kc), static_cast<const T*>(vc));
}

}  // namespace

cudaError_t LaunchWriteKv(DType dtype, const AttentionMetaDev& meta, const AttentionShape& shape,
                          const void* k, const void* v, void* k_cache, void* v_cache,
                          DType cache_dtype, cudaStream_t stream) {
  if (meta.num_tokens == 0) return cudaSuccess;
  const bool pdl = meta.num_tokens <= kPdlMaxTokens;
  if (cache_dtype == DType::kF8E4M3) {
    const unsigned grid = static_cast<unsigned>(meta.num_tokens);
    auto* kc = static_cast<__nv_fp8_e4m3*>(k_cache);
    auto* vc = static_cast<__nv_fp8_e4m3*>(v_cache);
    if (dtype == DType::kBF16)
      return LaunchWithPdl(pdl, WriteKvKernel<__nv_bfloat16, __nv_fp8_e4m3>, dim3(grid), dim3(128),
                           0, stream, meta, shape, static_cast<const __nv_bfloat16*>(k),
                           static_cast<const __nv_bfloat16*>(v), kc, vc);
    if (dtype == DType::kF16)
      return LaunchWithPdl(pdl, WriteKvKernel<__half, __nv_fp8_e4m3>, dim3(grid), dim3(128), 0,
                           stream, meta, shape, static_cast<const __half*>(k),
                           static_cast<const __half*>(v), kc, vc);
    return cudaErrorInvalidValue;
  }
  if (cache_dtype != dtype) return cudaErrorInvalidValue;
  const size_t row_bytes =
      static_cast<size_t>(shape.kv_heads) * static_cast<size_t>(shape.head_dim) * DTypeSize(dtype);
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  if (row_bytes % 16 == 0 && aligned(k) && aligned(v) && aligned(k_cache) && aligned(v_cache)) {
    const int64_t row = static_cast<int64_t>(row_bytes / 16);
    const unsigned chunks = static_cast<unsigned>(std::min<int64_t>((row + 127) / 128, 16));
    return LaunchWithPdl(
        pdl, WriteKvVecKernel, dim3(static_cast<unsigned>(meta.num_tokens), chunks), dim3(128), 0,
        stream, meta, shape, row, static_cast<const uint4*>(k), static_cast<const uint4*>(v),
        static_cast<uint4*>(k_cache), static_cast<uint4*>(v_cache));
  }
  cudaError_t err = cudaSuccess;
  TESSERA_FLOAT_SWITCH(
      dtype, T,
      err = LaunchWithPdl(pdl, WriteKvKernel<T, T>, dim3(static_cast<unsigned>(meta.num_tokens)),
                          dim3(128), 0, stream, meta, shape, static_cast<const T*>(k),
                          static_cast<const T*>(v), static_cast<T*>(k_cache),
                          static_cast<T*>(v_cache)));
  return err;
}

size_t DecodeAttentionSharedBytes(const AttentionShape& shape, int partition) {
  const size_t g = static_cast<size_t>(shape.heads / shape.kv_heads);
  return sizeof(float) * (g * static_cast<size_t>(shape.head_dim) +
                          g * static_cast<size_t>(partition) + kDecodeThreads + 32 + 2 * 16);
}

cudaError_t LaunchDecodeAttention(DType dtype, const AttentionMetaDev& meta,
                                  const AttentionShape& shape, const void* q, const void* k_cache,
                                  const void* v_cache, DType cache_dtype, void* out, float scale,
                                  int partition, int num_splits, float* partials,
                                  cudaStream_t stream) {
  if (meta.num_tokens == 0) return cudaSuccess;
  const int g = shape.heads / shape.kv_heads;
  if (shape.head_dim > 256 || g > 16) return cudaErrorInvalidValue;
  const bool fp8 = cache_dtype == DType::kF8E4M3;
  if (!fp8 && cache_dtype != dtype) return cudaErrorInvalidValue;
#define TESSERA_DECODE_AS(T, C, MAXG)                                                            \
  return (LaunchDecodeTyped<T, C, MAXG>(meta, shape, q, k_cache, v_cache, out, scale, partition, \
                                        num_splits, partials, stream))
#define TESSERA_DECODE(MAXG)                                                               \
  if (fp8 && dtype == DType::kBF16) TESSERA_DECODE_AS(__nv_bfloat16, __nv_fp8_e4m3, MAXG); \
  if (fp8 && dtype == DType::kF16) TESSERA_DECODE_AS(__half, __nv_fp8_e4m3, MAXG);         \
  if (fp8) return cudaErrorInvalidValue;                                                   \
  TESSERA_FLOAT_SWITCH(dtype, T, TESSERA_DECODE_AS(T, T, MAXG))
  if (g <= 1) {
    TESSERA_DECODE(1);
  } else if (g <= 2) {
    TESSERA_DECODE(2);
  } else if (g <= 4) {
    TESSERA_DECODE(4);
  } else if (g <= 8) {
    TESSERA_DECODE(8);
  } else {
    TESSERA_DECODE(16);
  }
#undef TESSERA_DECODE
#undef TESSERA_DECODE_AS
  return cudaSuccess;
}

cudaError_t LaunchPrefillAttention(DType dtype, const AttentionMetaDev& meta,
                                   const AttentionShape& shape, const void* q, const void* k_cache,
                                   const void* v_cache, DType cache_dtype, void* out, float scale,
                                   cudaStream_t stream) {
  if (meta.num_tokens == 0) return cudaSuccess;
  const int g = shape.heads / shape.kv_heads;
  if (shape.head_dim > 256 || g > kPrefillRows) return cudaErrorInvalidValue;
  const bool fp8 = cache_dtype == DType::kF8E4M3;
  if (!fp8 && cache_dtype != dtype) return cudaErrorInvalidValue;
  TESSERA_FLOAT_SWITCH(
      dtype, T,
      return LaunchPrefillTyped<T>(meta, shape, q, k_cache, v_cache, out, scale, fp8, stream));
  return cudaSuccess;
}

}  // namespace tessera::kernels::cuda
