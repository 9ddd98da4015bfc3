// Skinny GEMM for decode (kernels/cuda_launch.h LaunchSkinnyGemm): y[m, n] = x[m, k] w[n, k]^T
// (+ bias) for m <= kSkinnyGemmMaxRows tokens, bf16 or fp16 in, fp32 accumulation.
//
// At decode batch sizes the step is the weight read (bytes of w / HBM bandwidth), and cuBLASLt's
// tensor-core tiles (64 or 128 rows of x, mostly padding here) plus its split-K reduce kernels
// reach 55-65% of the bandwidth on the Llama shapes (bench/results/ncu_decode_llama4096x8.txt).
// This kernel streams each weight row once with 16-byte loads that bypass L1
// (ld.global.nc.L1::no_allocate), kRowsPerWarp rows per warp and kUnroll loads in flight per row,
// so that each SM keeps tens of KiB of reads outstanding (Little's law: bandwidth x latency);
// products of few rows (o_proj and down_proj: n = hidden) split k over 2 or 4 warps of a block
// so that every SM has warps streaming (ncu on the H100: o_proj and down_proj ran at 2.1-2.2
// TB/s with one warp per row pair, gate_up and lm_head at 2.9-3.0);
// x (m x k, a few KiB) is read through L1 and reused across the warp's rows. Launched with PDL
// (kernels/pdl.cuh), the first weight loads are issued before the wait for the kernel before.
// Each lane sums 8-element chunks k/8/32 apart, then the warp reduces with shuffles: the sum
// order differs from cuBLASLt's, within the dtype's rounding (tests/gpu LinearMatchesCpu).
#include <utility>

#include "kernels/cuda_common.cuh"
#include "kernels/cuda_launch.h"
#include "kernels/pdl.cuh"

namespace tessera::kernels::cuda {

namespace {

constexpr int kWarpsPerBlock = 8;
constexpr int kRowsPerWarp = 2;
constexpr int kUnroll = 4;

__device__ __forceinline__ uint4 LoadStreaming(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// x is the output of the kernel before this one, which may still run when this one starts
// (kernels/pdl.cuh): read it with plain (coherent, L1-cached) loads after PdlWait, never through
// the non-coherent read-only path.
__device__ __forceinline__ uint4 LoadCoherent(const uint4* p) { return __ldca(p); }

__device__ __forceinline__ float2 Pair(uint32_t bits, __nv_bfloat16*) {
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&bits));
}
__device__ __forceinline__ float2 Pair(uint32_t bits, __half*) {
  return __half22float2(*reinterpret_cast<const __half2*>(&bits));
}

// 8 elements of x (as fp32) dotted with 8 elements of w, added to acc.
template <typename T>
__device__ __forceinline__ float Dot8(const float (&xf)[8], uint4 wv, float acc) {
  const uint32_t words[4] = {wv.x, wv.y, wv.z, wv.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 w2 = Pair(words[i], static_cast<T*>(nullptr));
    acc = fmaf(xf[2 * i], w2.x, acc);
    acc = fmaf(xf[2 * i + 1], w2.y, acc);
  }
  return acc;
}

template <typename T>
__device__ __forceinline__ void Unpack8(uint4 v, float (&out)[8]) {
  const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = Pair(words[i], static_cast<T*>(nullptr));
    out[2 * i] = f.x;
    out[2 * i + 1] = f.y;
  }
}

// Grid: ceil(n / (kWarpsPerBlock / kSplit * kRowsPerWarp)) blocks of kWarpsPerBlock warps.
// The block's warps form kWarpsPerBlock / kSplit row groups of kSplit warps; the kSplit warps of
// a group take interleaved 512-byte spans of the same rows (k split inside the block) and sum
// through shared memory. Requires k % 8 == 0 and 16-byte aligned x and w rows (the launcher
// checks).
//
// kGlu (LaunchSkinnyGemmSwiGlu): w holds the fused gate|up weight [2n, k]; a warp's two rows are
// gate row i and up row n + i, and its epilogue writes y[m, i] = silu(g) * u from the two sums
// rounded to T, as the separate GEMM and SiluMulFused compute it (the same bits).
template <typename T, typename To, int M, int kSplit, bool kGlu>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    SkinnyGemmKernel(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ bias,
                     To* __restrict__ y, int64_t n, int64_t k) {
  constexpr int kGroups = kWarpsPerBlock / kSplit;
  __shared__ float partial[kSplit > 1 ? kWarpsPerBlock * M * kRowsPerWarp : 1];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int group = warp / kSplit, slice = warp % kSplit;
  const int64_t warp_index = static_cast<int64_t>(blockIdx.x) * kGroups + group;
  const int64_t row0 = kGlu ? warp_index : warp_index * kRowsPerWarp;
  const bool rows_here = row0 < n;
  if (kSplit == 1 && !rows_here) return;         // an exited block counts as launched-dependents
  const int64_t chunks = rows_here ? k / 8 : 0;  // a group past n reads nothing
  const uint4* wrow[kRowsPerWarp];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    // Glu: gate row i, up row n + i. Otherwise rows row0, row0 + 1 (a last odd row repeats; not
    // stored).
    const int64_t row =
        kGlu ? (rows_here ? row0 : n - 1) + r * n : (row0 + r < n ? row0 + r : n - 1);
    wrow[r] = reinterpret_cast<const uint4*>(w + row * k);
  }
  const uint4* xrow = reinterpret_cast<const uint4*>(x);
  const int64_t x_chunks = k / 8;
  float acc[M][kRowsPerWarp];
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) acc[m][r] = 0.0f;

  constexpr int64_t kStride = 32 * kSplit;  // chunks between one warp's consecutive loads
  uint4 wv[kUnroll][kRowsPerWarp];
  const auto load = [&](int64_t base) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t c = base + kStride * u;
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r)
        wv[u][r] = c < chunks ? LoadStreaming(wrow[r] + c) : make_uint4(0, 0, 0, 0);
    }
  };
  // The first weights stream in while the kernel before this one finishes (kernels/pdl.cuh);
  // x is that kernel's output, read after PdlWait.
  load(slice * 32 + lane);
  PdlWait();
  PdlLaunchDependents();
  for (int64_t base = slice * 32 + lane; base < chunks; base += kStride * kUnroll) {
    if (base != slice * 32 + lane) load(base);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t c = base + kStride * u;
      if (c >= chunks) break;
#pragma unroll
      for (int m = 0; m < M; ++m) {
        float xf[8];
        Unpack8<T>(LoadCoherent(xrow + m * x_chunks + c), xf);
#pragma unroll
        for (int r = 0; r < kRowsPerWarp; ++r) acc[m][r] = Dot8<T>(xf, wv[u][r], acc[m][r]);
      }
    }
  }
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) acc[m][r] = WarpSum(acc[m][r]);
  if (kSplit > 1) {
    // Each warp's sums to shared memory; the group's first warp adds the others'.
    if (lane == 0) {
#pragma unroll
      for (int m = 0; m < M; ++m)
#pragma unroll
        for (int r = 0; r < kRowsPerWarp; ++r)
          partial[(warp * M + m) * kRowsPerWarp + r] = acc[m][r];
    }
    __syncthreads();
    if (slice != 0 || lane != 0 || !rows_here) return;
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r)
#pragma unroll
        for (int s = 1; s < kSplit; ++s)
          acc[m][r] += partial[((warp + s) * M + m) * kRowsPerWarp + r];
  } else if (lane != 0) {
    return;
  }
  if constexpr (kGlu) {
    const float bg = bias != nullptr ? ToF(bias[row0]) : 0.0f;
    const float bu = bias != nullptr ? ToF(bias[n + row0]) : 0.0f;
#pragma unroll
    for (int m = 0; m < M; ++m) {
      const float g = ToF(FromF<T>(acc[m][0] + bg)), u = ToF(FromF<T>(acc[m][1] + bu));
      y[m * n + row0] = FromF<To>(g / (1.0f + expf(-g)) * u);
    }
  } else {
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const int64_t row = row0 + r;
      if (row >= n) break;
      const float b = bias != nullptr ? ToF(bias[row]) : 0.0f;
#pragma unroll
      for (int m = 0; m < M; ++m) y[m * n + row] = FromF<To>(acc[m][r] + b);
    }
  }
}

// Warps resident at once on an H100/H200 (132 SMs x 32, with this kernel's registers): a
// product of fewer rows than that splits k inside the block, so that every SM streams.
constexpr int64_t kTargetWarps = 132 * 32;

template <typename T, typename To, int M, int kSplit, bool kGlu>
cudaError_t LaunchSplit(const void* x, const void* w, const void* bias, void* y, int64_t n,
                        int64_t k, cudaStream_t stream) {
  const int64_t rows_per_block = kWarpsPerBlock / kSplit * (kGlu ? 1 : kRowsPerWarp);
  const auto blocks = static_cast<unsigned>((n + rows_per_block - 1) / rows_per_block);
  return LaunchWithPdl(/*pdl=*/true, SkinnyGemmKernel<T, To, M, kSplit, kGlu>, dim3(blocks),
                       dim3(kWarpsPerBlock * 32), 0, stream, static_cast<const T*>(x),
                       static_cast<const T*>(w), static_cast<const T*>(bias), static_cast<To*>(y),
                       n, k);
}

// n: output columns (kGlu: the intermediate width, half of w's rows). The k split depends on the
// warps alone, so the GLU form splits as the plain GEMM of w's 2n rows does (the same sums).
template <typename T, typename To, int M, bool kGlu>
cudaError_t Launch(const void* x, const void* w, const void* bias, void* y, int64_t n, int64_t k,
                   cudaStream_t stream) {
  const int64_t warps = kGlu ? n : (n + kRowsPerWarp - 1) / kRowsPerWarp;
  if (warps * 2 > kTargetWarps || k < 8 * 32 * 2 * kUnroll)
    return LaunchSplit<T, To, M, 1, kGlu>(x, w, bias, y, n, k, stream);
  if (warps * 4 > kTargetWarps || k < 8 * 32 * 4 * kUnroll)
    return LaunchSplit<T, To, M, 2, kGlu>(x, w, bias, y, n, k, stream);
  return LaunchSplit<T, To, M, 4, kGlu>(x, w, bias, y, n, k, stream);
}

// Launch<T, To, m, kGlu> for the runtime m in 1..kSkinnyGemmMaxRows.
template <typename T, typename To, bool kGlu, int... Ms>
cudaError_t LaunchRows(std::integer_sequence<int, Ms...>, int64_t m, const void* x, const void* w,
                       const void* bias, void* y, int64_t n, int64_t k, cudaStream_t stream) {
  cudaError_t err = cudaErrorInvalidValue;
  ((m == Ms + 1 ? (err = Launch<T, To, Ms + 1, kGlu>(x, w, bias, y, n, k, stream), true) : false) ||
   ...);
  return err;
}

template <typename T, typename To, bool kGlu = false>
cudaError_t LaunchRows(int64_t m, const void* x, const void* w, const void* bias, void* y,
                       int64_t n, int64_t k, cudaStream_t stream) {
  return LaunchRows<T, To, kGlu>(std::make_integer_sequence<int, kSkinnyGemmMaxRows>{}, m, x, w,
                                 bias, y, n, k, stream);
}

}  // namespace

bool SkinnyGemmApplies(DType in, int64_t m, int64_t k, const void* x, const void* w) {
  if (in != DType::kBF16 && in != DType::kF16) return false;
  if (m < 1 || m > kSkinnyGemmMaxRows || k % 8 != 0) return false;
  return reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(w) % 16 == 0;
}

cudaError_t LaunchSkinnyGemm(DType in, DType out, const void* x, const void* w, const void* bias,
                             void* y, int64_t m, int64_t n, int64_t k, cudaStream_t stream) {
  if (!SkinnyGemmApplies(in, m, k, x, w) || n <= 0) return cudaErrorInvalidValue;
  const bool f32_out = out == DType::kF32;
  if (!f32_out && out != in) return cudaErrorInvalidValue;
  if (in == DType::kBF16)
    return f32_out ? LaunchRows<__nv_bfloat16, float>(m, x, w, bias, y, n, k, stream)
                   : LaunchRows<__nv_bfloat16, __nv_bfloat16>(m, x, w, bias, y, n, k, stream);
  return f32_out ? LaunchRows<__half, float>(m, x, w, bias, y, n, k, stream)
                 : LaunchRows<__half, __half>(m, x, w, bias, y, n, k, stream);
}

cudaError_t LaunchSkinnyGemmSwiGlu(DType in, const void* x, const void* w, const void* bias,
                                   void* act, int64_t m, int64_t inter, int64_t k,
                                   cudaStream_t stream) {
  if (!SkinnyGemmApplies(in, m, k, x, w) || inter <= 0) return cudaErrorInvalidValue;
  if (in == DType::kBF16)
    return LaunchRows<__nv_bfloat16, __nv_bfloat16, true>(m, x, w, bias, act, inter, k, stream);
  return LaunchRows<__half, __half, true>(m, x, w, bias, act, inter, k, stream);
}

}  // namespace tessera::kernels::cuda
