// The grouped expert GEMMs and the combine of the MoE layer
// (kernels/cuda_launch.h LaunchMoeGateUp, LaunchMoeDown, LaunchMoeCombine).
//
// One launch per projection covers every held expert: grid (column tiles,
// min(held experts, slots)). Block row j takes the j-th expert with pairs from
// the sort's `active` list (device memory) and returns at once past its count,
// then reads that expert's slot range from expert_rows; so the grid depends on
// the widths, the held experts and the token count only (a decode step stays
// capturable as a CUDA graph), and at decode (a few active experts among
// many) no block is launched for the idle ones.
//
// Decode shape (the reason for this design): a few pairs per active expert,
// so the product is the read of the active experts' weights. As in the skinny
// GEMM (kernels/skinny_gemm_cuda.cu), each warp streams R = 2 weight rows with
// 16-byte loads, kUnroll in flight per row, and dots them with up to kMaxRows
// (4) slots at once (the slots' input rows are a few KiB, served by L1/L2), so
// an expert with at most 4 pairs reads its weights exactly once. An expert
// with more pairs (large decode batches, prefill) walks them 4 at a time,
// reading the weights again (mostly from L2) on each pass: correct, not tuned
// for that regime, which from 4 pairs per held expert on average goes to the
// tensor-core kernels of moe_experts_tc_cuda.cu instead (moe_experts_cuda.cc).
//
// Gate/up: a warp owns R / 2 intermediate columns i and streams gate_e[i] and
// up_e[i]; the two sums are rounded to the dtype (as transformers' gate_proj
// and up_proj outputs are), then act = silu(g) * u is rounded once: SwiGLU
// fused into the grouped GEMM. Down: a warp owns R hidden columns.
// Combine: one block per token sums its pairs in k order in fp32.
#include <algorithm>
#include <cstdlib>
#include <string>
#include <utility>

#include "common/base/env_switch.h"
#include "kernels/cuda_common.cuh"
#include "kernels/cuda_launch.h"
#include "kernels/pdl.cuh"

namespace tessera::kernels::cuda {

namespace {

constexpr int kWarps = 8;
constexpr int kMaxRows = 4;
constexpr int kUnroll = 4;
// At least two blocks per SM (at most 128 registers a thread): the kernel's
// register count is that of its widest pass, which would otherwise leave one
// block per SM for the 1-slot passes of decode too. (An 8-slot pass spilled
// in bf16 under this bound: the widest pass is 4 slots.)
constexpr int kMinBlocks = 2;

template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

template <typename T>
__device__ __forceinline__ const T* Address(const int64_t* table, int64_t expert, int part) {
  return reinterpret_cast<const T*>(static_cast<uintptr_t>(table[expert * 3 + part]));
}

// acc[m][r] += in_rows[m] . w[r] over `chunks` packs of V elements; lane-strided, kUnroll packs
// of each of the R weight rows in flight per lane.
template <typename T, int V, int M, int R>
__device__ __forceinline__ void DotRows(const T* const (&in_rows)[kMaxRows], const T* const (&w)[R],
                                        int64_t chunks, int lane, float (&acc)[M][R]) {
  using P = Pack<T, V>;
  for (int64_t base = lane; base < chunks; base += 32 * kUnroll) {
    P wv[kUnroll][R];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t c = base + 32 * u;
      if (c < chunks) {
#pragma unroll
        for (int r = 0; r < R; ++r) wv[u][r] = reinterpret_cast<const P*>(w[r])[c];
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t c = base + 32 * u;
      if (c >= chunks) break;
#pragma unroll
      for (int m = 0; m < M; ++m) {
        const P xv = reinterpret_cast<const P*>(in_rows[m])[c];
#pragma unroll
        for (int v = 0; v < V; ++v) {
          const float xf = ToF(xv.v[v]);
#pragma unroll
          for (int r = 0; r < R; ++r) acc[m][r] = fmaf(xf, ToF(wv[u][r].v[v]), acc[m][r]);
        }
      }
    }
  }
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int r = 0; r < R; ++r) acc[m][r] = WarpSum(acc[m][r]);
}

// Slots [s0, s0 + rows) of one expert, rows <= M, against the warp's R weight rows: gated, the
// (gate, up) rows of R / 2 columns from col; plain, the rows of R columns from col (those past n
// repeat the last and are not stored). Lane 0 stores the results.
template <typename T, int V, bool kGated, int M, int R>
__device__ __forceinline__ void Pass(const T* in, const int32_t* slot_token, T* out, int64_t k,
                                     int64_t n, int64_t col, const T* const (&w)[R], int s0,
                                     int rows, int lane) {
  const T* in_rows[kMaxRows];
#pragma unroll
  for (int m = 0; m < kMaxRows; ++m) {
    const int slot = s0 + (m < rows ? m : rows - 1);
    const int64_t src = kGated ? slot_token[slot] : slot;
    in_rows[m] = in + src * k;
  }
  float acc[M][R];
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int r = 0; r < R; ++r) acc[m][r] = 0.0f;
  DotRows<T, V, M, R>(in_rows, w, k / V, lane, acc);
  if (lane != 0) return;
#pragma unroll
  for (int m = 0; m < M; ++m) {
    if (m >= rows) break;
    T* o = out + static_cast<int64_t>(s0 + m) * n;
#pragma unroll
    for (int j = 0; j < (kGated ? R / 2 : R); ++j) {
      if (col + j >= n) break;
      if (kGated) {
        const float g = ToF(FromF<T>(acc[m][2 * j])), u = ToF(FromF<T>(acc[m][2 * j + 1]));
        o[col + j] = FromF<T>(g / (1.0f + expf(-g)) * u);
      } else {
        o[col + j] = FromF<T>(acc[m][j]);
      }
    }
  }
}

// Gated: in = x [tokens, k = hidden] gathered through slot_token, out = act [slots, n = inter],
// a warp per R / 2 columns (their gate and up rows). Plain: in = act [slots, k = inter], out = y
// [slots, n = hidden], a warp per R columns (R = 2: four rows a warp, 205 registers a thread in
// bf16, were 8% slower at batch 1 of the Qwen3-30B-A3B shape on an H100 and 34% at batch 8,
// bench/results/NOTES.md 2026-12-07j). A block takes `iters` tiles of kWarps such column groups in
// turn: the chain of reads before a warp's first weight load (active -> the expert -> its rows and
// table entry) is paid once per block, not once per tile (decode's short rows: a warp per two 1.5
// KiB rows of Qwen3-MoE's down projection left the kernel at 44% of the bandwidth,
// bench/results/NOTES.md 2026-12-07g).
template <typename T, int V, bool kGated, int R>
__global__ void __launch_bounds__(kWarps * 32, kMinBlocks)
    MoeExpertGemmKernel(const T* __restrict__ in, const int64_t* __restrict__ table,
                        const int32_t* __restrict__ expert_rows, const int32_t* __restrict__ active,
                        const int32_t* __restrict__ slot_token, T* __restrict__ out, int64_t k,
                        int64_t n, int iters) {
  constexpr int kCols = kGated ? R / 2 : R;  // output columns per warp
  PdlWait();  // kernels/pdl.cuh: active, the rows and `in` come from the kernels before
  PdlLaunchDependents();
  if (static_cast<int>(blockIdx.y) >= active[0]) return;
  const int64_t e = active[1 + blockIdx.y];
  const int begin = expert_rows[e], end = expert_rows[e + 1];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const T* gate = Address<T>(table, e, kGated ? 0 : 2);
  const T* up = kGated ? Address<T>(table, e, 1) : gate;
  for (int it = 0; it < iters; ++it) {
    const int64_t col = ((static_cast<int64_t>(blockIdx.x) * iters + it) * kWarps + warp) * kCols;
    if (col >= n) return;
    const T* w[R];
#pragma unroll
    for (int j = 0; j < kCols; ++j) {
      const int64_t c = col + j < n ? col + j : n - 1;  // past n: repeat the last (not stored)
      if (kGated) {
        w[2 * j] = gate + c * k;
        w[2 * j + 1] = up + c * k;
      } else {
        w[j] = gate + c * k;
      }
    }
    for (int s0 = begin; s0 < end; s0 += kMaxRows) {
      const int rows = end - s0 < kMaxRows ? end - s0 : kMaxRows;
      if (rows == 1) {
        Pass<T, V, kGated, 1, R>(in, slot_token, out, k, n, col, w, s0, rows, lane);
      } else if (rows == 2) {
        Pass<T, V, kGated, 2, R>(in, slot_token, out, k, n, col, w, s0, rows, lane);
      } else {
        Pass<T, V, kGated, kMaxRows, R>(in, slot_token, out, k, n, col, w, s0, rows, lane);
      }
    }
  }
}

// Tiles per block: enough for about kWarpBytes of weights per warp, while the grid keeps at
// least kMinTileBlocks blocks per expert; TESSERA_CUDA_MOE_ITERS=N in the environment fixes it
// (A/B runs; 1 is one tile per block, the kernel before 2026-12-07g).
constexpr int64_t kWarpBytes = 12 * 1024;
constexpr int64_t kMinTileBlocks = 16;
constexpr int kMaxIters = 8;

int FixedIters() {  // TESSERA_CUDA_MOE_ITERS, or 0
  static const int fixed = [] {
    const char* v = std::getenv("TESSERA_CUDA_MOE_ITERS");
    return v == nullptr ? 0 : std::max(0, std::atoi(v));
  }();
  return fixed;
}

int TileIters(int64_t n, int64_t cols_per_block, int64_t warp_tile_bytes) {
  if (FixedIters() >= 1) return FixedIters();
  int iters = static_cast<int>(std::min<int64_t>(
      kMaxIters, std::max<int64_t>(1, (kWarpBytes + warp_tile_bytes - 1) / warp_tile_bytes)));
  while (iters > 1 && (n + cols_per_block * iters - 1) / (cols_per_block * iters) < kMinTileBlocks)
    --iters;
  return iters;
}

template <typename T, int V, bool kGated, int R>
cudaError_t LaunchExpertGemmKernel(const T* x, const int64_t* table, const int32_t* expert_rows,
                                   const int32_t* active, const int32_t* slot_token, T* y,
                                   int64_t grid_experts, int64_t k, int64_t n, bool pdl,
                                   cudaStream_t stream) {
  const auto kernel = MoeExpertGemmKernel<T, V, kGated, R>;
  const int64_t cols_per_block = kWarps * (kGated ? R / 2 : R);
  const int iters = TileIters(n, cols_per_block, R * k * static_cast<int64_t>(sizeof(T)));
  const int64_t span = cols_per_block * iters;
  const dim3 grid(static_cast<unsigned>((n + span - 1) / span),
                  static_cast<unsigned>(grid_experts));
  return LaunchWithPdl(pdl, kernel, grid, dim3(kWarps * 32), 0, stream, x, table, expert_rows,
                       active, slot_token, y, k, n, iters);
}

template <typename T, bool kGated, int R>
cudaError_t LaunchExpertGemmRows(const T* x, const int64_t* table, const int32_t* expert_rows,
                                 const int32_t* active, const int32_t* slot_token, T* y,
                                 int64_t grid_experts, int64_t k, int64_t n, bool vec, bool pdl,
                                 cudaStream_t stream) {
  constexpr int kVec = 16 / static_cast<int>(sizeof(T));
  if (vec)
    return LaunchExpertGemmKernel<T, kVec, kGated, R>(x, table, expert_rows, active, slot_token, y,
                                                      grid_experts, k, n, pdl, stream);
  return LaunchExpertGemmKernel<T, 1, kGated, R>(x, table, expert_rows, active, slot_token, y,
                                                 grid_experts, k, n, pdl, stream);
}

template <typename T, bool kGated>
cudaError_t LaunchExpertGemm(const void* in, const int64_t* table, const int32_t* expert_rows,
                             const int32_t* active, const int32_t* slot_token, void* out,
                             int64_t grid_experts, int64_t k, int64_t n, bool vec, bool pdl,
                             cudaStream_t stream) {
  const T* x = static_cast<const T*>(in);
  T* y = static_cast<T*>(out);
  return LaunchExpertGemmRows<T, kGated, 2>(x, table, expert_rows, active, slot_token, y,
                                            grid_experts, k, n, vec, pdl, stream);
}

template <typename T>
__global__ void MoeCombineKernel(const T* __restrict__ y, const int32_t* __restrict__ token_slot,
                                 const float* __restrict__ weights, int64_t top_k,
                                 const T* __restrict__ shared,
                                 const float* __restrict__ shared_gate, T* __restrict__ out,
                                 int64_t hidden) {
  PdlWait();  // kernels/pdl.cuh
  PdlLaunchDependents();
  const int64_t t = blockIdx.x;
  const float g = shared != nullptr ? 1.0f / (1.0f + expf(-shared_gate[t])) : 0.0f;
  for (int64_t h = threadIdx.x; h < hidden; h += blockDim.x) {
    float acc = 0.0f;
    for (int64_t j = 0; j < top_k; ++j) {
      const int32_t slot = token_slot[t * top_k + j];
      if (slot >= 0) acc = fmaf(weights[t * top_k + j], ToF(y[slot * hidden + h]), acc);
    }
    if (shared != nullptr) acc = fmaf(g, ToF(shared[t * hidden + h]), acc);
    out[t * hidden + h] = FromF<T>(acc);
  }
}

// The combine with 16-byte loads: grid (tokens, column chunks / kCombineThreads), a thread per
// 16 bytes of a token's output row. The token's slots and weights are read once into shared
// memory, so the y rows of its pairs are independent loads; each sum runs in k order in fp32, as
// MoeCombineKernel's (the same bits).
constexpr int kCombineThreads = 128;
constexpr int kCombineMaxK = 64;

template <typename T>
__global__ void __launch_bounds__(kCombineThreads)
    MoeCombineVecKernel(const T* __restrict__ y, const int32_t* __restrict__ token_slot,
                        const float* __restrict__ weights, int64_t top_k,
                        const T* __restrict__ shared, const float* __restrict__ shared_gate,
                        T* __restrict__ out, int64_t hidden) {
  constexpr int V = 16 / static_cast<int>(sizeof(T));
  using P = Pack<T, V>;
  __shared__ int32_t slots[kCombineMaxK];
  __shared__ float scales[kCombineMaxK];
  PdlWait();  // kernels/pdl.cuh
  PdlLaunchDependents();
  const int64_t t = blockIdx.x;
  for (int64_t j = threadIdx.x; j < top_k; j += blockDim.x) {
    slots[j] = token_slot[t * top_k + j];
    scales[j] = weights[t * top_k + j];
  }
  __syncthreads();
  const int64_t c = static_cast<int64_t>(blockIdx.y) * kCombineThreads + threadIdx.x;
  if (c * V >= hidden) return;
  float acc[V];
#pragma unroll
  for (int v = 0; v < V; ++v) acc[v] = 0.0f;
#pragma unroll 4
  for (int64_t j = 0; j < top_k; ++j) {
    const int32_t slot = slots[j];
    if (slot < 0) continue;
    const P row = reinterpret_cast<const P*>(y + static_cast<int64_t>(slot) * hidden)[c];
#pragma unroll
    for (int v = 0; v < V; ++v) acc[v] = fmaf(scales[j], ToF(row.v[v]), acc[v]);
  }
  if (shared != nullptr) {
    const float g = 1.0f / (1.0f + expf(-shared_gate[t]));
    const P row = reinterpret_cast<const P*>(shared + t * hidden)[c];
#pragma unroll
    for (int v = 0; v < V; ++v) acc[v] = fmaf(g, ToF(row.v[v]), acc[v]);
  }
  P o;
#pragma unroll
  for (int v = 0; v < V; ++v) o.v[v] = FromF<T>(acc[v]);
  reinterpret_cast<P*>(out + t * hidden)[c] = o;
}

// The down projection and the combine in one launch, for decode (LaunchMoeDownCombine): grid
// (hidden / kWarps, tokens), a warp per output column h of token t. The block first resolves the
// token's pairs once, in parallel (slot, expert, the expert's down matrix: one chain of dependent
// reads per block, into shared memory); then each warp walks the pairs in k order, kDcPairs at a
// time: each pair's expert row down_e[h] (1.5 KiB in Qwen3-MoE) streams in with the others'
// (kDcPairs loads in flight per lane; 128 registers in bf16, two blocks per SM, ptxas -v), against
// the pair's act row (L1: the block's warps share it). Each pair's dot runs as
// MoeExpertGemmKernel's (lane-strided packs in ascending order, then WarpSum) and is rounded to T
// as its y row is stored; the sum over pairs then runs in k order in fp32 as MoeCombineVecKernel's,
// the shared expert last: the same bits as MoeGroupedDown followed by MoeCombine, without y's write
// and read or the combine's launch.
constexpr int kDcPairs = 8;
constexpr int kDcUnroll = 1;
constexpr int kDcMaxK = 64;  // top_k the shared-memory prologue holds (LaunchMoeDownCombine)

template <typename T>
__global__ void __launch_bounds__(kWarps * 32, kMinBlocks)
    MoeDownCombineKernel(const T* __restrict__ act, const int64_t* __restrict__ table,
                         const int32_t* __restrict__ token_slot,
                         const int32_t* __restrict__ expert_ids, int64_t expert_begin,
                         const float* __restrict__ weights, int64_t top_k,
                         const T* __restrict__ shared, const float* __restrict__ shared_gate,
                         T* __restrict__ out, int64_t hidden, int64_t inter) {
  constexpr int V = 16 / static_cast<int>(sizeof(T));
  using P = Pack<T, V>;
  __shared__ const T* down_of[kDcMaxK];  // the pair's expert's down [hidden, inter]; null: skip
  __shared__ const T* act_of[kDcMaxK];   // the pair's act row
  __shared__ float scale_of[kDcMaxK];
  PdlWait();  // kernels/pdl.cuh: the routing and act come from the kernels before
  PdlLaunchDependents();
  const int64_t t = blockIdx.y;
  for (int64_t j = threadIdx.x; j < top_k; j += blockDim.x) {
    const int32_t slot = token_slot[t * top_k + j];
    const bool live = slot >= 0;
    down_of[j] = live ? Address<T>(table, expert_ids[t * top_k + j] - expert_begin, 2) : nullptr;
    act_of[j] = live ? act + static_cast<int64_t>(slot) * inter : nullptr;
    scale_of[j] = weights[t * top_k + j];
  }
  __syncthreads();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t h = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
  if (h >= hidden) return;
  const int64_t chunks = inter / V;
  float total = 0.0f;
  for (int64_t j0 = 0; j0 < top_k; j0 += kDcPairs) {
    const P* w[kDcPairs];
    const P* a[kDcPairs];
#pragma unroll
    for (int p = 0; p < kDcPairs; ++p) {
      const T* d = j0 + p < top_k ? down_of[j0 + p] : nullptr;
      w[p] = d != nullptr ? reinterpret_cast<const P*>(d + h * inter) : nullptr;
      a[p] = d != nullptr ? reinterpret_cast<const P*>(act_of[j0 + p]) : nullptr;
    }
    float acc[kDcPairs];
#pragma unroll
    for (int p = 0; p < kDcPairs; ++p) acc[p] = 0.0f;
    for (int64_t base = lane; base < chunks; base += 32 * kDcUnroll) {
      P wv[kDcUnroll][kDcPairs];
#pragma unroll
      for (int u = 0; u < kDcUnroll; ++u) {
        const int64_t c = base + 32 * u;
#pragma unroll
        for (int p = 0; p < kDcPairs; ++p)
          if (w[p] != nullptr && c < chunks) wv[u][p] = w[p][c];
      }
#pragma unroll
      for (int u = 0; u < kDcUnroll; ++u) {
        const int64_t c = base + 32 * u;
        if (c >= chunks) break;
#pragma unroll
        for (int p = 0; p < kDcPairs; ++p) {
          if (w[p] == nullptr) continue;
          const P xv = a[p][c];
#pragma unroll
          for (int v = 0; v < V; ++v) acc[p] = fmaf(ToF(xv.v[v]), ToF(wv[u][p].v[v]), acc[p]);
        }
      }
    }
#pragma unroll
    for (int p = 0; p < kDcPairs; ++p) {
      acc[p] = WarpSum(acc[p]);
      if (w[p] != nullptr) total = fmaf(scale_of[j0 + p], ToF(FromF<T>(acc[p])), total);
    }
  }
  if (lane != 0) return;
  if (shared != nullptr) {
    const float g = 1.0f / (1.0f + expf(-shared_gate[t]));
    total = fmaf(g, ToF(shared[t * hidden + h]), total);
  }
  out[t * hidden + h] = FromF<T>(total);
}

}  // namespace

cudaError_t LaunchMoeGateUp(DType dtype, const void* x, const int64_t* table,
                            const int32_t* expert_rows, const int32_t* active,
                            const int32_t* slot_token, void* act, int64_t grid_experts,
                            int64_t hidden, int64_t inter, bool vec, int64_t tokens,
                            cudaStream_t stream) {
  if (grid_experts < 1 || grid_experts > 65535 || inter < 1) return cudaErrorInvalidValue;
  cudaError_t err = cudaErrorInvalidValue;
  TESSERA_FLOAT_SWITCH(
      dtype, T,
      err = LaunchExpertGemm<T, true>(x, table, expert_rows, active, slot_token, act, grid_experts,
                                      hidden, inter, vec, MoePdl(tokens), stream));
  return err;
}

cudaError_t LaunchMoeDown(DType dtype, const void* act, const int64_t* table,
                          const int32_t* expert_rows, const int32_t* active, void* y,
                          int64_t grid_experts, int64_t hidden, int64_t inter, bool vec,
                          int64_t tokens, cudaStream_t stream) {
  if (grid_experts < 1 || grid_experts > 65535 || hidden < 1) return cudaErrorInvalidValue;
  cudaError_t err = cudaErrorInvalidValue;
  TESSERA_FLOAT_SWITCH(
      dtype, T,
      err = LaunchExpertGemm<T, false>(act, table, expert_rows, active, nullptr, y, grid_experts,
                                       inter, hidden, vec, MoePdl(tokens), stream));
  return err;
}

cudaError_t LaunchMoeCombine(DType dtype, const void* y, const int32_t* token_slot,
                             const float* weights, int64_t top_k, const void* shared,
                             const float* shared_gate, void* out, int64_t tokens, int64_t hidden,
                             cudaStream_t stream) {
  if (tokens == 0 || hidden == 0) return cudaSuccess;
  cudaError_t err = cudaErrorInvalidValue;
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const int64_t chunk = 16 / static_cast<int64_t>(DTypeSize(dtype));
  // TESSERA_CUDA_MOE_COMBINE_VEC=0: the scalar kernel (A/B).
  static const bool vec_wanted = EnvSwitchOn("TESSERA_CUDA_MOE_COMBINE_VEC");
  if (vec_wanted && top_k <= kCombineMaxK && hidden % chunk == 0 && aligned(y) && aligned(out) &&
      (shared == nullptr || aligned(shared)) && tokens <= 0x7fffffff) {
    const dim3 grid(
        static_cast<unsigned>(tokens),
        static_cast<unsigned>((hidden / chunk + kCombineThreads - 1) / kCombineThreads));
    TESSERA_FLOAT_SWITCH(
        dtype, T,
        err = LaunchWithPdl(MoePdl(tokens), MoeCombineVecKernel<T>, grid, dim3(kCombineThreads), 0,
                            stream, static_cast<const T*>(y), token_slot, weights, top_k,
                            static_cast<const T*>(shared), shared_gate, static_cast<T*>(out),
                            hidden));
    return err;
  }
  const int threads = hidden >= 256 ? 256 : 128;
  TESSERA_FLOAT_SWITCH(
      dtype, T,
      err = LaunchWithPdl(MoePdl(tokens), MoeCombineKernel<T>, dim3(static_cast<unsigned>(tokens)),
                          dim3(threads), 0, stream, static_cast<const T*>(y), token_slot, weights,
                          top_k, static_cast<const T*>(shared), shared_gate, static_cast<T*>(out),
                          hidden));
  return err;
}

cudaError_t LaunchMoeDownCombine(DType dtype, const void* act, const int64_t* table,
                                 const int32_t* token_slot, const int32_t* expert_ids,
                                 int64_t expert_begin, const float* weights, int64_t top_k,
                                 const void* shared, const float* shared_gate, void* out,
                                 int64_t tokens, int64_t hidden, int64_t inter,
                                 cudaStream_t stream) {
  if (tokens < 1 || tokens > 65535 || hidden < 1 || top_k < 1 || top_k > kDcMaxK ||
      inter % (16 / static_cast<int64_t>(DTypeSize(dtype))) != 0)
    return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>((hidden + kWarps - 1) / kWarps),
                  static_cast<unsigned>(tokens));
  cudaError_t err = cudaErrorInvalidValue;
  TESSERA_FLOAT_SWITCH(
      dtype, T,
      err = LaunchWithPdl(MoePdl(tokens), MoeDownCombineKernel<T>, grid, dim3(kWarps * 32), 0,
                          stream, static_cast<const T*>(act), table, token_slot, expert_ids,
                          expert_begin, weights, top_k, static_cast<const T*>(shared), shared_gate,
                          static_cast<T*>(out), hidden, inter));
  return err;
}

}  // namespace tessera::kernels::cuda
