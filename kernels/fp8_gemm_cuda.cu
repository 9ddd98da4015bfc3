// FP8 weight GEMMs for decode (kernels/cuda_launch.h LaunchFp8SkinnyGemm, LaunchFp8Dequantize):
// y[m, n] = x[m, k] (w[n, k] * scale)^T (+ bias), w in float8 e4m3fn, x and y bf16 or fp16,
// fp32 accumulation. The weight is dequantized in registers (weight-only FP8, "W8A16"): a decode
// step reads each weight byte once, half the bytes of bf16, and the activations stay in the
// compute dtype, as the CPU reference computes them (fp32 products of the dequantized weight).
//
// Scales (kernels/linear_fp8.h Fp8Scales): one fp32 row per weight row, scales[row, j] covering
// the columns [j * cols_per_scale - col_phase, (j + 1) * cols_per_scale - col_phase) of the
// local slice; col_phase is where the slice starts inside its first checkpoint block (a
// row-parallel tp slice that cuts a 128-block). A per-channel or per-tensor scale is one column
// (cols_per_scale >= k + col_phase) and multiplies the row's sum once.
//
// The skinny kernel streams each weight row once with 16-byte L1-bypassing loads (16 weights),
// kRowsPerWarp rows per warp, as the bf16 skinny GEMM does (kernels/skinny_gemm_cuda.cu), and
// splits k over 2 or 4 warps for products of few rows. Larger m either quantizes x per token
// (LaunchFp8QuantizeRows) for cuBLASLt's FP8 tensor-core GEMM, or dequantizes w into a bf16/fp16
// buffer once per call (LaunchFp8Dequantize) and runs cuBLASLt on it (kernels/linear_fp8_cuda.cc
// chooses).
#include <cuda_fp8.h>

#include <utility>

#include "kernels/cuda_common.cuh"
#include "kernels/cuda_launch.h"
#include "kernels/pdl.cuh"

namespace tessera::kernels::cuda {

namespace {

constexpr int kWarpsPerBlock = 8;
constexpr int kRowsPerWarp = 2;
constexpr int kUnroll = 4;
constexpr int kChunk = 16;  // weights per 16-byte load

__device__ __forceinline__ uint4 LoadStreaming(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// x, the output of the kernel before (which may still run, kernels/pdl.cuh): an L1-cached
// coherent load after PdlWait, never the non-coherent read-only path.
__device__ __forceinline__ uint4 LoadCoherent(const uint4* p) { return __ldca(p); }

// Two e4m3 values (the low and high byte of `bits`) as fp32.
__device__ __forceinline__ float2 Fp8Pair(uint16_t bits) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(bits, __NV_E4M3);
  return __half22float2(*reinterpret_cast<const __half2*>(&h));
}

__device__ __forceinline__ float2 Pair(uint32_t bits, __nv_bfloat16*) {
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&bits));
}
__device__ __forceinline__ float2 Pair(uint32_t bits, __half*) {
  return __half22float2(*reinterpret_cast<const __half2*>(&bits));
}

// 16 elements of x (two 16-byte words of T) dotted with 16 e4m3 weights.
template <typename T>
__device__ __forceinline__ float Dot16(uint4 xa, uint4 xb, uint4 wv) {
  const uint32_t xs[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
  const uint32_t ws[4] = {wv.x, wv.y, wv.z, wv.w};
  float acc = 0.0f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 w01 = Fp8Pair(static_cast<uint16_t>(ws[i] & 0xffffu));
    const float2 w23 = Fp8Pair(static_cast<uint16_t>(ws[i] >> 16));
    const float2 x01 = Pair(xs[2 * i], static_cast<T*>(nullptr));
    const float2 x23 = Pair(xs[2 * i + 1], static_cast<T*>(nullptr));
    acc = fmaf(x01.x, w01.x, acc);
    acc = fmaf(x01.y, w01.y, acc);
    acc = fmaf(x23.x, w23.x, acc);
    acc = fmaf(x23.y, w23.y, acc);
  }
  return acc;
}

// Grid and k split as SkinnyGemmKernel (kernels/skinny_gemm_cuda.cu). Requires k % 16 == 0,
// 16-byte aligned x and w rows, and (block scales) cols_per_scale % 16 == 0 and
// col_phase % 16 == 0, so that each 16-weight chunk lies in one scale block (the launcher checks).
template <typename T, typename To, int M, int kSplit>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    Fp8SkinnyGemmKernel(const T* __restrict__ x, const uint8_t* __restrict__ w,
                        const float* __restrict__ scales, int scale_cols, int cols_per_scale,
                        int col_phase, const T* __restrict__ bias, To* __restrict__ y, int64_t n,
                        int64_t k) {
  constexpr int kGroups = kWarpsPerBlock / kSplit;
  __shared__ float partial[kSplit > 1 ? kWarpsPerBlock * M * kRowsPerWarp : 1];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int group = warp / kSplit, slice = warp % kSplit;
  const int64_t row0 = (static_cast<int64_t>(blockIdx.x) * kGroups + group) * kRowsPerWarp;
  const bool rows_here = row0 < n;
  if (kSplit == 1 && !rows_here) return;
  const int chunks = rows_here ? static_cast<int>(k / kChunk) : 0;
  const bool per_row = scale_cols == 1;  // one scale per row: applied once at the end
  const uint4* wrow[kRowsPerWarp];
  const float* srow[kRowsPerWarp];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int64_t row = row0 + r < n ? row0 + r : n - 1;  // a last odd row repeats; not stored
    wrow[r] = reinterpret_cast<const uint4*>(w + row * k);
    srow[r] = scales + row * scale_cols;
  }
  const uint4* xrow = reinterpret_cast<const uint4*>(x);
  const int x_words = static_cast<int>(k / 8);  // 16-byte words of T per x row
  float acc[M][kRowsPerWarp];
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) acc[m][r] = 0.0f;

  constexpr int kStride = 32 * kSplit;
  uint4 wv[kUnroll][kRowsPerWarp];
  const auto load = [&](int base) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int c = base + kStride * u;
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r)
        wv[u][r] = c < chunks ? LoadStreaming(wrow[r] + c) : make_uint4(0, 0, 0, 0);
    }
  };
  // The first weights stream in while the kernel before this one finishes (kernels/pdl.cuh);
  // x is that kernel's output, read after PdlWait with coherent loads.
  load(slice * 32 + lane);
  PdlWait();
  PdlLaunchDependents();
  for (int base = slice * 32 + lane; base < chunks; base += kStride * kUnroll) {
    if (base != slice * 32 + lane) load(base);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int c = base + kStride * u;
      if (c >= chunks) break;
      float s[kRowsPerWarp];
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r)
        s[r] = per_row ? 1.0f : __ldg(srow[r] + (c * kChunk + col_phase) / cols_per_scale);
#pragma unroll
      for (int m = 0; m < M; ++m) {
        const uint4 xa = LoadCoherent(xrow + m * x_words + 2 * c);
        const uint4 xb = LoadCoherent(xrow + m * x_words + 2 * c + 1);
#pragma unroll
        for (int r = 0; r < kRowsPerWarp; ++r)
          acc[m][r] = fmaf(s[r], Dot16<T>(xa, xb, wv[u][r]), acc[m][r]);
      }
    }
  }
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) acc[m][r] = WarpSum(acc[m][r]);
  if (kSplit > 1) {
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
        for (int sl = 1; sl < kSplit; ++sl)
          acc[m][r] += partial[((warp + sl) * M + m) * kRowsPerWarp + r];
  } else if (lane != 0) {
    return;
  }
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int64_t row = row0 + r;
    if (row >= n) break;
    const float scale = per_row ? srow[r][0] : 1.0f;
    const float b = bias != nullptr ? ToF(bias[row]) : 0.0f;
#pragma unroll
    for (int m = 0; m < M; ++m) y[m * n + row] = FromF<To>(fmaf(acc[m][r], scale, b));
  }
}

constexpr int64_t kTargetWarps = 132 * 32;

template <typename T, typename To, int M, int kSplit>
cudaError_t LaunchSplit(const Fp8GemmArgs& a, cudaStream_t stream) {
  const int64_t rows_per_block = kWarpsPerBlock / kSplit * kRowsPerWarp;
  const auto blocks = static_cast<unsigned>((a.n + rows_per_block - 1) / rows_per_block);
  return LaunchWithPdl(/*pdl=*/true, Fp8SkinnyGemmKernel<T, To, M, kSplit>, dim3(blocks),
                       dim3(kWarpsPerBlock * 32), 0, stream, static_cast<const T*>(a.x),
                       static_cast<const uint8_t*>(a.w), a.scales, static_cast<int>(a.scale_cols),
                       static_cast<int>(a.cols_per_scale), static_cast<int>(a.col_phase),
                       static_cast<const T*>(a.bias), static_cast<To*>(a.y), a.n, a.k);
}

template <typename T, typename To, int M>
cudaError_t Launch(const Fp8GemmArgs& a, cudaStream_t stream) {
  const int64_t warps = (a.n + kRowsPerWarp - 1) / kRowsPerWarp;
  if (warps * 2 > kTargetWarps || a.k < kChunk * 32 * 2 * kUnroll)
    return LaunchSplit<T, To, M, 1>(a, stream);
  if (warps * 4 > kTargetWarps || a.k < kChunk * 32 * 4 * kUnroll)
    return LaunchSplit<T, To, M, 2>(a, stream);
  return LaunchSplit<T, To, M, 4>(a, stream);
}

template <typename T, typename To, int... Ms>
cudaError_t LaunchRows(std::integer_sequence<int, Ms...>, const Fp8GemmArgs& a,
                       cudaStream_t stream) {
  cudaError_t err = cudaErrorInvalidValue;
  ((a.m == Ms + 1 ? (err = Launch<T, To, Ms + 1>(a, stream), true) : false) || ...);
  return err;
}

template <typename T, typename To>
cudaError_t LaunchRows(const Fp8GemmArgs& a, cudaStream_t stream) {
  return LaunchRows<T, To>(std::make_integer_sequence<int, kSkinnyGemmMaxRows>{}, a, stream);
}

// out[r, c] = e4m3(w[r, c]) * scale(r, c), 16 weights per thread.
template <typename T>
__global__ void Fp8DequantizeKernel(const uint8_t* __restrict__ w, const float* __restrict__ scales,
                                    int scale_cols, int cols_per_scale, int col_phase,
                                    T* __restrict__ out, int64_t n, int64_t k) {
  const int64_t chunks_per_row = k / kChunk;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n * chunks_per_row) return;
  const int64_t row = i / chunks_per_row;
  const int c = static_cast<int>(i % chunks_per_row);
  const float s =
      scales[row * scale_cols + (scale_cols == 1 ? 0 : (c * kChunk + col_phase) / cols_per_scale)];
  const uint4 wv = reinterpret_cast<const uint4*>(w)[i];
  const uint32_t ws[4] = {wv.x, wv.y, wv.z, wv.w};
  T vals[kChunk];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float2 a = Fp8Pair(static_cast<uint16_t>(ws[j] & 0xffffu));
    const float2 b = Fp8Pair(static_cast<uint16_t>(ws[j] >> 16));
    vals[4 * j] = FromF<T>(a.x * s);
    vals[4 * j + 1] = FromF<T>(a.y * s);
    vals[4 * j + 2] = FromF<T>(b.x * s);
    vals[4 * j + 3] = FromF<T>(b.y * s);
  }
  uint4* dst = reinterpret_cast<uint4*>(out + row * k + static_cast<int64_t>(c) * kChunk);
  dst[0] = *reinterpret_cast<const uint4*>(&vals[0]);
  dst[1] = *reinterpret_cast<const uint4*>(&vals[8]);
}

// One block per row of x [m, k]: scale = max|x[row, :]| / 448 (e4m3's largest finite value; 1
// for an all-zero row), xq[row, c] = e4m3(x[row, c] / scale) rounded to nearest, saturating.
// 8 elements (16 bytes) per load; k % 8 == 0.
template <typename T>
__global__ void Fp8QuantizeRowsKernel(const T* __restrict__ x, int64_t k, uint8_t* __restrict__ xq,
                                      float* __restrict__ x_scales) {
  __shared__ float red[32];
  const int64_t row = blockIdx.x;
  const uint4* src = reinterpret_cast<const uint4*>(x + row * k);
  const int64_t words = k / 8;
  float amax = 0.0f;
  for (int64_t i = threadIdx.x; i < words; i += blockDim.x) {
    const uint4 v = src[i];
    const T* e = reinterpret_cast<const T*>(&v);
#pragma unroll
    for (int j = 0; j < 8; ++j) amax = fmaxf(amax, fabsf(ToF(e[j])));
  }
  amax = BlockMax(amax, red);
  const float scale = amax > 0.0f ? amax / 448.0f : 1.0f;
  const float inv = 1.0f / scale;
  if (threadIdx.x == 0) x_scales[row] = scale;
  uint2* dst = reinterpret_cast<uint2*>(xq + row * k);
  for (int64_t i = threadIdx.x; i < words; i += blockDim.x) {
    const uint4 v = src[i];
    const T* e = reinterpret_cast<const T*>(&v);
    uint32_t packed[2];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      uint32_t word = 0;
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        const __nv_fp8_storage_t q =
            __nv_cvt_float_to_fp8(ToF(e[4 * j + b]) * inv, __NV_SATFINITE, __NV_E4M3);
        word |= static_cast<uint32_t>(q) << (8 * b);
      }
      packed[j] = word;
    }
    dst[i] = make_uint2(packed[0], packed[1]);
  }
}

bool ScalesFit(const Fp8GemmArgs& a) {
  if (a.scale_cols < 1 || a.cols_per_scale < 1 || a.col_phase < 0) return false;
  if (a.scale_cols == 1) return true;
  return a.cols_per_scale % kChunk == 0 && a.col_phase % kChunk == 0 &&
         a.scale_cols >= (a.k + a.col_phase + a.cols_per_scale - 1) / a.cols_per_scale;
}

}  // namespace

bool Fp8GemmApplies(DType in, const Fp8GemmArgs& a) {
  if (in != DType::kBF16 && in != DType::kF16) return false;
  if (a.k % kChunk != 0 || a.k >= (int64_t{1} << 30) || !ScalesFit(a)) return false;
  return reinterpret_cast<uintptr_t>(a.w) % 16 == 0;
}

cudaError_t LaunchFp8SkinnyGemm(DType in, DType out, const Fp8GemmArgs& a, cudaStream_t stream) {
  if (!Fp8GemmApplies(in, a) || a.m < 1 || a.m > kSkinnyGemmMaxRows || a.n <= 0)
    return cudaErrorInvalidValue;
  if (reinterpret_cast<uintptr_t>(a.x) % 16 != 0) return cudaErrorInvalidValue;
  const bool f32_out = out == DType::kF32;
  if (!f32_out && out != in) return cudaErrorInvalidValue;
  if (in == DType::kBF16)
    return f32_out ? LaunchRows<__nv_bfloat16, float>(a, stream)
                   : LaunchRows<__nv_bfloat16, __nv_bfloat16>(a, stream);
  return f32_out ? LaunchRows<__half, float>(a, stream) : LaunchRows<__half, __half>(a, stream);
}

cudaError_t LaunchFp8Dequantize(DType out_dtype, const Fp8GemmArgs& a, void* out,
                                cudaStream_t stream) {
  if (!Fp8GemmApplies(out_dtype, a) || a.n <= 0 || reinterpret_cast<uintptr_t>(out) % 16 != 0)
    return cudaErrorInvalidValue;
  const int64_t total = a.n * (a.k / kChunk);
  const auto blocks = static_cast<unsigned>((total + 255) / 256);
  const auto* w = static_cast<const uint8_t*>(a.w);
  const int sc = static_cast<int>(a.scale_cols), cps = static_cast<int>(a.cols_per_scale),
            ph = static_cast<int>(a.col_phase);
  if (out_dtype == DType::kBF16)
    Fp8DequantizeKernel<__nv_bfloat16><<<blocks, 256, 0, stream>>>(
        w, a.scales, sc, cps, ph, static_cast<__nv_bfloat16*>(out), a.n, a.k);
  else
    Fp8DequantizeKernel<__half>
        <<<blocks, 256, 0, stream>>>(w, a.scales, sc, cps, ph, static_cast<__half*>(out), a.n, a.k);
  return cudaGetLastError();
}

cudaError_t LaunchFp8QuantizeRows(DType in, const void* x, int64_t m, int64_t k, void* xq,
                                  float* x_scales, cudaStream_t stream) {
  if ((in != DType::kBF16 && in != DType::kF16) || m < 1 || k < 8 || k % 8 != 0 ||
      reinterpret_cast<uintptr_t>(x) % 16 != 0 || reinterpret_cast<uintptr_t>(xq) % 8 != 0)
    return cudaErrorInvalidValue;
  const int threads = k >= 2048 ? 256 : 128;
  auto* q = static_cast<uint8_t*>(xq);
  if (in == DType::kBF16)
    Fp8QuantizeRowsKernel<<<static_cast<unsigned>(m), threads, 0, stream>>>(
        static_cast<const __nv_bfloat16*>(x), k, q, x_scales);
  else
    Fp8QuantizeRowsKernel<<<static_cast<unsigned>(m), threads, 0, stream>>>(
        static_cast<const __half*>(x), k, q, x_scales);
  return cudaGetLastError();
}

}  // namespace tessera::kernels::cuda
