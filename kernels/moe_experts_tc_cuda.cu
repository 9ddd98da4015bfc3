// The grouped expert GEMMs of the MoE layer on tensor cores
// (kernels/cuda_launch.h LaunchMoeGateUpTc, LaunchMoeDownTc): the path for
// many routed pairs per expert (large decode batches, prefill), where the
// CUDA-core kernels of moe_experts_cuda.cu re-read each expert's weights for
// every 4 slots.
//
// One launch per projection covers every held expert, as there: grid
// (column tiles of kTileN, min(held experts, slots)); block row j takes the
// j-th active expert (device memory) and returns at once past the count, so
// the grid depends on the widths, the held experts and the token count only
// and a step stays capturable as a CUDA graph. A block owns kTileN output
// columns of its expert and walks the expert's slots kTileM rows at a time:
//   out[s, c] = in[row(s)] . w_e[c]  over k, in steps of kTileK,
// row(s) = slot_token[s] for gate|up (x gathered per slot), s for down.
// Each step stages the A tile (kTileM slots x kTileK) and the B tiles
// (kTileN weight rows x kTileK; two, gate and up, for the gated form) in
// shared memory with 16-byte loads, and four warps each multiply the A tile by
// their 16 columns with WMMA 16x16x16 fragments, accumulating in fp32. The
// epilogue goes through shared memory: gate and up are each rounded to the
// dtype (as transformers' gate_proj and up_proj outputs are) and
// act = silu(g) * u is rounded once, the same arithmetic as the CUDA-core
// kernel; rows past the expert's slots and columns past n are not stored.
//
// kMFrags (1 or 4 fragments of 16 rows) sets kTileM: 16 when experts see a
// few slots each (a decode batch spread over many experts), 64 otherwise.
//
// Requirements (checked by the caller, moe_experts_cuda.cc): bf16 or fp16,
// k % kTileK == 0, every row of in and of the weights 16-byte aligned.
#include <mma.h>

#include "kernels/cuda_common.cuh"
#include "kernels/cuda_launch.h"

namespace tessera::kernels::cuda {

namespace {

namespace wmma = nvcuda::wmma;

constexpr int kTileN = 64;  // output columns per block: 4 warps x 16
constexpr int kTileK = 32;  // k per shared-memory step
constexpr int kPadK = 8;    // row padding of the staged tiles (bank spread; wmma ldm % 8 == 0)
constexpr int kPadC = 4;    // row padding of the fp32 epilogue tiles
constexpr int kThreads = 128;
constexpr int kVec = 8;  // 16-bit elements per 16-byte load

template <int kMFrags, bool kGated, typename T>
struct TcSmem {
  static constexpr int kTileM = 16 * kMFrags;
  static constexpr int kLd = kTileK + kPadK;
  static constexpr int kB = kGated ? 2 : 1;
  static constexpr size_t kStage = sizeof(T) * kLd * (kTileM + kB * kTileN);
  static constexpr size_t kEpilogue = sizeof(float) * kB * kTileM * (kTileN + kPadC);
  static constexpr size_t kBytes = kStage > kEpilogue ? kStage : kEpilogue;
};

template <typename T>
__device__ __forceinline__ const T* TableAddress(const int64_t* table, int64_t expert, int part) {
  return reinterpret_cast<const T*>(static_cast<uintptr_t>(table[expert * 3 + part]));
}

// Stages rows [0, rows) of a tile, kTileK columns from k0: row r's source is
// src(r) (null for a zero row). 16-byte loads, kTileK / kVec per row.
template <typename T, typename Src>
__device__ __forceinline__ void StageRows(T* dst, int rows, int64_t k0, Src src) {
  constexpr int kChunks = kTileK / kVec;
  for (int i = threadIdx.x; i < rows * kChunks; i += kThreads) {
    const int r = i / kChunks, c = i % kChunks;
    const T* p = src(r);
    int4 v = make_int4(0, 0, 0, 0);
    if (p != nullptr) v = *reinterpret_cast<const int4*>(p + k0 + c * kVec);
    *reinterpret_cast<int4*>(dst + r * (kTileK + kPadK) + c * kVec) = v;
  }
}

template <typename T, int kMFrags, bool kGated>
__global__ void __launch_bounds__(kThreads)
    MoeExpertTcKernel(const T* __restrict__ in, const int64_t* __restrict__ table,
                      const int32_t* __restrict__ expert_rows, const int32_t* __restrict__ active,
                      const int32_t* __restrict__ slot_token, T* __restrict__ out, int64_t k,
                      int64_t n) {
  using S = TcSmem<kMFrags, kGated, T>;
  constexpr int kTileM = S::kTileM, kLd = S::kLd;
  if (static_cast<int>(blockIdx.y) >= active[0]) return;
  const int64_t e = active[1 + blockIdx.y];
  const int begin = expert_rows[e], end = expert_rows[e + 1];
  const int64_t col0 = static_cast<int64_t>(blockIdx.x) * kTileN;
  const int warp = threadIdx.x >> 5;
  const T* w0 = TableAddress<T>(table, e, kGated ? 0 : 2);
  const T* w1 = kGated ? TableAddress<T>(table, e, 1) : nullptr;

  __shared__ alignas(128) unsigned char smem[S::kBytes];
  T* sa = reinterpret_cast<T*>(smem);
  T* sb0 = sa + kTileM * kLd;
  T* sb1 = sb0 + kTileN * kLd;  // gated only
  float* sc0 = reinterpret_cast<float*>(smem);
  float* sc1 = sc0 + kTileM * (kTileN + kPadC);  // gated only

  for (int m0 = begin; m0 < end; m0 += kTileM) {
    const int rows = end - m0 < kTileM ? end - m0 : kTileM;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc0[kMFrags], acc1[kGated ? kMFrags : 1];
#pragma unroll
    for (int i = 0; i < kMFrags; ++i) wmma::fill_fragment(acc0[i], 0.0f);
    if constexpr (kGated) {
#pragma unroll
      for (int i = 0; i < kMFrags; ++i) wmma::fill_fragment(acc1[i], 0.0f);
    }
    for (int64_t k0 = 0; k0 < k; k0 += kTileK) {
      StageRows(sa, kTileM, k0, [&](int r) -> const T* {
        if (r >= rows) return nullptr;
        const int64_t row = kGated ? slot_token[m0 + r] : m0 + r;
        return in + row * k;
      });
      StageRows(sb0, kTileN, k0,
                [&](int c) -> const T* { return col0 + c < n ? w0 + (col0 + c) * k : nullptr; });
      if constexpr (kGated)
        StageRows(sb1, kTileN, k0,
                  [&](int c) -> const T* { return col0 + c < n ? w1 + (col0 + c) * k : nullptr; });
      __syncthreads();
#pragma unroll
      for (int kk = 0; kk < kTileK; kk += 16) {
        // B (kk.., columns) is the weight rows staged row-major: column-major k x n.
        wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> b0, b1;
        wmma::load_matrix_sync(b0, sb0 + warp * 16 * kLd + kk, kLd);
        if constexpr (kGated) wmma::load_matrix_sync(b1, sb1 + warp * 16 * kLd + kk, kLd);
#pragma unroll
        for (int i = 0; i < kMFrags; ++i) {
          wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> a;
          wmma::load_matrix_sync(a, sa + i * 16 * kLd + kk, kLd);
          wmma::mma_sync(acc0[i], a, b0, acc0[i]);
          if constexpr (kGated) wmma::mma_sync(acc1[i], a, b1, acc1[i]);
        }
      }
      __syncthreads();
    }
    // Epilogue through shared memory (it reuses the staging space).
#pragma unroll
    for (int i = 0; i < kMFrags; ++i) {
      wmma::store_matrix_sync(sc0 + i * 16 * (kTileN + kPadC) + warp * 16, acc0[i], kTileN + kPadC,
                              wmma::mem_row_major);
      if constexpr (kGated)
        wmma::store_matrix_sync(sc1 + i * 16 * (kTileN + kPadC) + warp * 16, acc1[i],
                                kTileN + kPadC, wmma::mem_row_major);
    }
    __syncthreads();
    for (int i = threadIdx.x; i < rows * kTileN; i += kThreads) {
      const int r = i / kTileN, c = i % kTileN;
      const int64_t col = col0 + c;
      if (col >= n) continue;
      const int idx = r * (kTileN + kPadC) + c;
      T* o = out + static_cast<int64_t>(m0 + r) * n + col;
      if constexpr (kGated) {
        const float g = ToF(FromF<T>(sc0[idx])), u = ToF(FromF<T>(sc1[idx]));
        *o = FromF<T>(g / (1.0f + expf(-g)) * u);
      } else {
        *o = FromF<T>(sc0[idx]);
      }
    }
    __syncthreads();
  }
}

template <typename T, bool kGated>
void LaunchTc(const void* in, const int64_t* table, const int32_t* expert_rows,
              const int32_t* active, const int32_t* slot_token, void* out, int64_t grid_experts,
              int64_t k, int64_t n, bool wide_m, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((n + kTileN - 1) / kTileN),
                  static_cast<unsigned>(grid_experts));
  const T* x = static_cast<const T*>(in);
  T* y = static_cast<T*>(out);
  if (wide_m)
    MoeExpertTcKernel<T, 4, kGated>
        <<<grid, kThreads, 0, stream>>>(x, table, expert_rows, active, slot_token, y, k, n);
  else
    MoeExpertTcKernel<T, 1, kGated>
        <<<grid, kThreads, 0, stream>>>(x, table, expert_rows, active, slot_token, y, k, n);
}

}  // namespace

bool MoeTcShapeOk(DType dtype, int64_t hidden, int64_t inter) {
  return (dtype == DType::kBF16 || dtype == DType::kF16) && hidden % kTileK == 0 &&
         inter % kTileK == 0;
}

cudaError_t LaunchMoeGateUpTc(DType dtype, const void* x, const int64_t* table,
                              const int32_t* expert_rows, const int32_t* active,
                              const int32_t* slot_token, void* act, int64_t grid_experts,
                              int64_t hidden, int64_t inter, bool wide_m, cudaStream_t stream) {
  if (grid_experts < 1 || grid_experts > 65535 || inter < 1 || !MoeTcShapeOk(dtype, hidden, inter))
    return cudaErrorInvalidValue;
  if (dtype == DType::kBF16)
    LaunchTc<__nv_bfloat16, true>(x, table, expert_rows, active, slot_token, act, grid_experts,
                                  hidden, inter, wide_m, stream);
  else
    LaunchTc<__half, true>(x, table, expert_rows, active, slot_token, act, grid_experts, hidden,
                           inter, wide_m, stream);
  return cudaGetLastError();
}

cudaError_t LaunchMoeDownTc(DType dtype, const void* act, const int64_t* table,
                            const int32_t* expert_rows, const int32_t* active, void* y,
                            int64_t grid_experts, int64_t hidden, int64_t inter, bool wide_m,
                            cudaStream_t stream) {
  if (grid_experts < 1 || grid_experts > 65535 || hidden < 1 || !MoeTcShapeOk(dtype, hidden, inter))
    return cudaErrorInvalidValue;
  if (dtype == DType::kBF16)
    LaunchTc<__nv_bfloat16, false>(act, table, expert_rows, active, nullptr, y, grid_experts, inter,
                                   hidden, wide_m, stream);
  else
    LaunchTc<__half, false>(act, table, expert_rows, active, nullptr, y, grid_experts, inter,
                            hidden, wide_m, stream);
  return cudaGetLastError();
}

}  // namespace tessera::kernels::cuda
