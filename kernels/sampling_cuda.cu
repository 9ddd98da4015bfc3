// Token sampling on the device (kernels/sampling.h).
//
// Greedy rows: a block-wide argmax (first index of the maximum). Every row
// goes through the argmax first, which also ORs !isfinite over the row and
// writes kNonFiniteRowToken (-1, kernels/cuda_launch.h) for a row with a NaN or an infinity; the
// draw below skips such rows. Other rows:
// CUB's segmented radix sort orders every row by logit, descending and
// stable (equal logits keep the lower id first, as the CPU sort does); then
// one block per row computes the temperature-scaled probabilities of the
// top_k prefix in fp64, finds the top_p cut and the drawn index with
// block-wide prefix sums, exactly the CPU's arithmetic up to summation order;
// then the min_p cut (and tokens of probability 0) shortens the kept prefix.
#include <climits>
#include <cub/device/device_segmented_radix_sort.cuh>

#include "kernels/cuda_common.cuh"
#include "kernels/cuda_launch.h"
#include "kernels/pdl.cuh"

namespace tessera::kernels::cuda {

namespace {

constexpr int kArgmaxThreads = 1024;
constexpr int kSampleThreads = 1024;

__device__ __forceinline__ void Better(float& v, int& i, float ov, int oi) {
  if (ov > v || (ov == v && oi < i)) {
    v = ov;
    i = oi;
  }
}

__global__ void __launch_bounds__(kArgmaxThreads)
    ArgmaxKernel(const float* __restrict__ logits, int64_t vocab, int32_t* out) {
  __shared__ float sv[32];
  __shared__ int si[32];
  PdlWait();  // kernels/pdl.cuh
  PdlLaunchDependents();
  const float* l = logits + static_cast<int64_t>(blockIdx.x) * vocab;
  float best = -INFINITY;
  int idx = INT_MAX;
  bool bad = false;  // a NaN or an infinity in this row
  // Each thread scans its indices in increasing order and keeps the first maximum; with 16-byte
  // rows (vocab % 4 == 0, an aligned buffer) it reads them as float4s: four times fewer loads.
  const bool vec = vocab % 4 == 0 && reinterpret_cast<uintptr_t>(logits) % 16 == 0;
  const int64_t scalar_from = vec ? vocab : 0;
  if (vec) {
    const float4* l4 = reinterpret_cast<const float4*>(l);
    for (int64_t i = threadIdx.x; i < vocab / 4; i += blockDim.x) {
      const float4 q = l4[i];
      const float e[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        bad |= !isfinite(e[j]);
        if (e[j] > best) {
          best = e[j];
          idx = static_cast<int>(4 * i + j);
        }
      }
    }
  }
  for (int64_t i = scalar_from + threadIdx.x; i < vocab; i += blockDim.x) {
    const float v = l[i];
    bad |= !isfinite(v);
    if (v > best) {
      best = v;
      idx = static_cast<int>(i);
    }
  }
  const bool row_bad = __syncthreads_or(bad) != 0;
  for (int o = 16; o > 0; o >>= 1)
    Better(best, idx, __shfl_xor_sync(0xffffffffu, best, o), __shfl_xor_sync(0xffffffffu, idx, o));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) {
    sv[warp] = best;
    si[warp] = idx;
  }
  __syncthreads();
  if (warp == 0) {
    const int warps = blockDim.x >> 5;
    best = lane < warps ? sv[lane] : -INFINITY;
    idx = lane < warps ? si[lane] : INT_MAX;
    for (int o = 16; o > 0; o >>= 1)
      Better(best, idx, __shfl_xor_sync(0xffffffffu, best, o),
             __shfl_xor_sync(0xffffffffu, idx, o));
    if (lane == 0) out[blockIdx.x] = row_bad ? kNonFiniteRowToken : (idx == INT_MAX ? 0 : idx);
  }
}

__global__ void IotaKernel(int32_t* values, int32_t* offsets, int64_t rows, int64_t vocab) {
  const int64_t n = rows * vocab;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    values[i] = static_cast<int32_t>(i % vocab);
  const int64_t g = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (g <= rows) offsets[g] = static_cast<int32_t>(g * vocab);
}

// Inclusive block-wide prefix sum of doubles; `carry` (shared) holds the
// running total of earlier chunks and is advanced by this chunk's total.
__device__ double BlockInclusiveSum(double v, double* warp_sums, double* carry) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  for (int o = 1; o < 32; o <<= 1) {
    const double u = __shfl_up_sync(0xffffffffu, v, o);
    if (lane >= o) v += u;
  }
  if (lane == 31) warp_sums[warp] = v;
  __syncthreads();
  if (warp == 0) {
    double w = lane < warps ? warp_sums[lane] : 0.0;
    for (int o = 1; o < 32; o <<= 1) {
      const double u = __shfl_up_sync(0xffffffffu, w, o);
      if (lane >= o) w += u;
    }
    if (lane < warps) warp_sums[lane] = w;  // inclusive scan of warp totals
  }
  __syncthreads();
  const double before = *carry + (warp > 0 ? warp_sums[warp - 1] : 0.0);
  const double total = warp_sums[warps - 1];
  __syncthreads();
  if (threadIdx.x == 0) *carry += total;
  __syncthreads();
  return before + v;
}

__device__ int BlockMinInt(int v, int* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  for (int o = 16; o > 0; o >>= 1) v = min(v, __shfl_xor_sync(0xffffffffu, v, o));
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : INT_MAX;
  for (int o = 16; o > 0; o >>= 1) v = min(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();
  return v;
}

__global__ void __launch_bounds__(kSampleThreads)
    SampleKernel(const float* __restrict__ keys, const int32_t* __restrict__ ids, int64_t vocab,
                 const SampleRowDev* __restrict__ params, int32_t* out) {
  __shared__ double warp_sums[32];
  __shared__ double carry;
  __shared__ double found_sum;
  __shared__ int iscratch[32];
  const SampleRowDev p = params[blockIdx.x];
  if (p.greedy) return;
  // The argmax kernel ran first on this stream and flagged a row with a NaN
  // or an infinity: no token is drawn from it.
  if (out[blockIdx.x] == kNonFiniteRowToken) return;
  const float* k = keys + static_cast<int64_t>(blockIdx.x) * vocab;
  const int32_t* id = ids + static_cast<int64_t>(blockIdx.x) * vocab;
  const int keep = (p.top_k > 0 && p.top_k < vocab) ? p.top_k : static_cast<int>(vocab);
  const double inv_t = 1.0 / static_cast<double>(p.temperature);
  const double max_logit = static_cast<double>(k[0]) * inv_t;

  // Total mass of the top-k prefix.
  if (threadIdx.x == 0) carry = 0.0;
  __syncthreads();
  double part = 0.0;
  for (int i = threadIdx.x; i < keep; i += blockDim.x)
    part += exp(static_cast<double>(k[i]) * inv_t - max_logit);
  for (int o = 16; o > 0; o >>= 1) part += __shfl_xor_sync(0xffffffffu, part, o);
  if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x >> 5] = part;
  __syncthreads();
  double total = 0.0;
  for (int w = 0; w < static_cast<int>(blockDim.x >> 5); ++w) total += warp_sums[w];
  __syncthreads();

  // First index whose cumulative probability satisfies the cut; returns the
  // index (or INT_MAX) and leaves that cumulative sum in found_sum.
  auto first_index = [&](int limit, bool top_p_cut, double threshold) {
    if (threadIdx.x == 0) carry = 0.0;
    __syncthreads();
    for (int base = 0; base < limit; base += blockDim.x) {
      const int i = base + threadIdx.x;
      const double v = i < limit ? exp(static_cast<double>(k[i]) * inv_t - max_logit) : 0.0;
      const double incl = BlockInclusiveSum(v, warp_sums, &carry);
      const bool hit = i < limit && (top_p_cut ? incl / total >= threshold : incl > threshold);
      const int m = BlockMinInt(hit ? i : INT_MAX, iscratch);
      if (m != INT_MAX) {
        if (i == m) found_sum = incl;
        __syncthreads();
        return m;
      }
    }
    return INT_MAX;
  };

  int n = keep;
  double mass = total;
  if (p.top_p < 1.0f) {
    const int cut = first_index(keep, true, static_cast<double>(p.top_p));
    if (cut != INT_MAX) {
      n = cut + 1;
      mass = found_sum;
    }
  }
  // min_p (HF MinPLogitsWarper, after top-p) and zero-probability tokens
  // (a banned logit, kernels/logit_adjust_entry.h): the sorted weights
  // w_i = exp(l_i / T - l_max / T) fall, so the kept set is a prefix; w_0 = 1.
  {
    int cut = INT_MAX;
    for (int base = 0; base < n && cut == INT_MAX; base += blockDim.x) {
      const int i = base + threadIdx.x;
      bool drop = false;
      if (i < n) {
        const double w = exp(static_cast<double>(k[i]) * inv_t - max_logit);
        drop = !(w > 0.0 && w >= static_cast<double>(p.min_p));
      }
      cut = BlockMinInt(drop ? i : INT_MAX, iscratch);
    }
    if (cut != INT_MAX && cut > 0) {
      n = cut;
      if (p.min_p > 0.0f) {  // zero weights leave the mass as it was
        double part_n = 0.0;
        for (int i = threadIdx.x; i < n; i += blockDim.x)
          part_n += exp(static_cast<double>(k[i]) * inv_t - max_logit);
        for (int o = 16; o > 0; o >>= 1) part_n += __shfl_xor_sync(0xffffffffu, part_n, o);
        if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x >> 5] = part_n;
        __syncthreads();
        mass = 0.0;
        for (int w = 0; w < static_cast<int>(blockDim.x >> 5); ++w) mass += warp_sums[w];
        __syncthreads();
      }
    }
  }
  const int pick = first_index(n, false, p.uniform * mass);
  if (threadIdx.x == 0) out[blockIdx.x] = id[pick == INT_MAX ? n - 1 : pick];
}

size_t Align256(size_t x) { return (x + 255) / 256 * 256; }

size_t CubTempBytes(int64_t rows, int64_t vocab) {
  size_t bytes = 0;
  cub::DeviceSegmentedRadixSort::SortPairsDescending(
      static_cast<void*>(nullptr), bytes, static_cast<const float*>(nullptr),
      static_cast<float*>(nullptr), static_cast<const int32_t*>(nullptr),
      static_cast<int32_t*>(nullptr), static_cast<int>(rows * vocab), static_cast<int>(rows),
      static_cast<const int32_t*>(nullptr), static_cast<const int32_t*>(nullptr));
  return bytes;
}

}  // namespace

cudaError_t LaunchArgmax(const float* logits, int64_t rows, int64_t vocab, int32_t* out,
                         cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  return LaunchWithPdl(rows <= kPdlMaxTokens, ArgmaxKernel, dim3(static_cast<unsigned>(rows)),
                       dim3(kArgmaxThreads), 0, stream, logits, vocab, out);
}

size_t SampleScratchBytes(int64_t rows, int64_t vocab) {
  const size_t n = static_cast<size_t>(rows * vocab);
  return Align256(n * sizeof(float)) + 2 * Align256(n * sizeof(int32_t)) +
         Align256(static_cast<size_t>(rows + 1) * sizeof(int32_t)) +
         Align256(CubTempBytes(rows, vocab));
}

cudaError_t LaunchSampleRows(const float* logits, int64_t rows, int64_t vocab,
                             const SampleRowDev* params, int32_t* out, void* scratch,
                             size_t scratch_bytes, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  if (scratch_bytes < SampleScratchBytes(rows, vocab)) return cudaErrorInvalidValue;
  const size_t n = static_cast<size_t>(rows * vocab);
  char* p = static_cast<char*>(scratch);
  auto* keys_out = reinterpret_cast<float*>(p);
  p += Align256(n * sizeof(float));
  auto* values_in = reinterpret_cast<int32_t*>(p);
  p += Align256(n * sizeof(int32_t));
  auto* values_out = reinterpret_cast<int32_t*>(p);
  p += Align256(n * sizeof(int32_t));
  auto* offsets = reinterpret_cast<int32_t*>(p);
  p += Align256(static_cast<size_t>(rows + 1) * sizeof(int32_t));
  size_t temp_bytes = CubTempBytes(rows, vocab);
  const unsigned blocks =
      Blocks(static_cast<int64_t>(n) > rows + 1 ? static_cast<int64_t>(n) : rows + 1, 256);
  const unsigned grid = blocks < 65535u ? blocks : 65535u;
  IotaKernel<<<grid, 256, 0, stream>>>(values_in, offsets, rows, vocab);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  e = cub::DeviceSegmentedRadixSort::SortPairsDescending(
      static_cast<void*>(p), temp_bytes, logits, keys_out, values_in, values_out,
      static_cast<int>(n), static_cast<int>(rows), offsets, offsets + 1, 0, 32, stream);
  if (e != cudaSuccess) return e;
  SampleKernel<<<static_cast<unsigned>(rows), kSampleThreads, 0, stream>>>(keys_out, values_out,
                                                                           vocab, params, out);
  return cudaGetLastError();
}

}  // namespace tessera::kernels::cuda
