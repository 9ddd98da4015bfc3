// The MoE router's top-k and the sort of the routed pairs by expert
// (kernels/cuda_launch.h LaunchMoeTopK, LaunchMoeSort).
//
// Top-k: one block per token. p = softmax(logits) in fp32 (max, exp, sum as
// block reductions; p = exp(l - max) / sum as on the CPU), then top_k rounds of
// a block arg-max over p (ties: the lower expert id, as the CPU's
// partial_sort and torch.topk), each marking its winner taken; thread 0 writes
// the winners in order and renormalises them by their sum (in k order) when
// asked. The router is a few KiB per token: this is launch-bound, not
// bandwidth-bound, so one simple block per token is the right shape.
//
// Sort: one block. Per-expert counts with shared-memory atomics, an exclusive
// scan by one thread (held experts are at most a few hundred) that also lists
// the experts with pairs (the grouped launches' blocks map to them), then each pair
// takes the next slot of its expert with an atomic: the order inside an
// expert is unspecified, and nothing downstream depends on it
// (kernels/moe_experts.h). No count leaves the device, so a decode step stays
// capturable as a CUDA graph.
#include <climits>
#include <cstdlib>
#include <cstring>

#include "common/base/env_switch.h"
#include "kernels/cuda_common.cuh"
#include "kernels/cuda_launch.h"
#include "kernels/pdl.cuh"

namespace tessera::kernels::cuda {

namespace {

constexpr int kTopKThreads = 128;
constexpr int kSortThreads = 1024;
constexpr int kRouteThreads = 256;  // at most this many (token, k) pairs; 8 warps
constexpr int kRoutePerLane = 16;   // at most 512 router experts
constexpr int kRouteMaxTokens = static_cast<int>(kPdlMaxTokens);  // a warp each
static_assert(kRouteMaxTokens * 32 <= kRouteThreads, "a warp per token");
constexpr int kRouteMaxHeld = 1024;

// Arg-max of (v, i) over the warp: the larger v, then the lower i.
__device__ __forceinline__ void WarpArgMax(float& v, int& i) {
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int oi = __shfl_xor_sync(0xffffffffu, i, o);
    if (ov > v || (ov == v && oi < i)) {
      v = ov;
      i = oi;
    }
  }
}

__global__ void __launch_bounds__(kTopKThreads)
    MoeTopKKernel(const float* __restrict__ logits, int64_t experts, int top_k, bool renormalize,
                  int32_t* __restrict__ ids, float* __restrict__ weights) {
  extern __shared__ float p[];  // [experts]
  __shared__ float scratch[32];
  __shared__ float best_v[kTopKThreads / 32];
  __shared__ int best_i[kTopKThreads / 32];
  PdlWait();  // kernels/pdl.cuh: the router's logits come from the kernel before
  PdlLaunchDependents();
  const int64_t t = blockIdx.x;
  const float* row = logits + t * experts;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float top = -FLT_MAX;
  for (int64_t e = threadIdx.x; e < experts; e += blockDim.x) top = fmaxf(top, row[e]);
  top = BlockMax(top, scratch);
  float sum = 0.0f;
  for (int64_t e = threadIdx.x; e < experts; e += blockDim.x) {
    p[e] = expf(row[e] - top);
    sum += p[e];
  }
  sum = BlockSum(sum, scratch);
  for (int64_t e = threadIdx.x; e < experts; e += blockDim.x) p[e] /= sum;
  __syncthreads();
  float picked = 0.0f;  // thread 0's running sum of the winners
  for (int k = 0; k < top_k; ++k) {
    // p >= 0 and taken entries are -1: the start value -2 loses to both.
    float v = -2.0f;
    int i = INT_MAX;
    for (int64_t e = threadIdx.x; e < experts; e += blockDim.x) {
      if (p[e] > v) {  // strictly: the lower id of this thread's ties stays
        v = p[e];
        i = static_cast<int>(e);
      }
    }
    WarpArgMax(v, i);
    if (lane == 0) {
      best_v[warp] = v;
      best_i[warp] = i;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int w = 1; w < kTopKThreads / 32; ++w)
        if (best_v[w] > v || (best_v[w] == v && best_i[w] < i)) {
          v = best_v[w];
          i = best_i[w];
        }
      if (i >= experts) {  // every candidate NaN: a valid, unused id, never a write past p
        i = k;
        v = 0.0f;
      }
      ids[t * top_k + k] = i;
      weights[t * top_k + k] = v;
      picked += v;
      p[i] = -1.0f;
    }
    __syncthreads();
  }
  if (threadIdx.x == 0 && renormalize)
    for (int k = 0; k < top_k; ++k) weights[t * top_k + k] /= picked;
}

__global__ void __launch_bounds__(kSortThreads)
    MoeSortKernel(const int32_t* __restrict__ ids, int64_t pairs, int64_t top_k,
                  int64_t expert_begin, int64_t experts, int32_t* __restrict__ expert_rows,
                  int32_t* __restrict__ slot_token, int32_t* __restrict__ token_slot,
                  int32_t* __restrict__ active, unsigned long long* __restrict__ token_totals) {
  PdlWait();  // kernels/pdl.cuh
  PdlLaunchDependents();
  extern __shared__ int32_t shared[];
  int32_t* count = shared;           // [experts]
  int32_t* next = shared + experts;  // [experts]
  for (int64_t e = threadIdx.x; e < experts; e += blockDim.x) count[e] = 0;
  __syncthreads();
  for (int64_t i = threadIdx.x; i < pairs; i += blockDim.x) {
    const int64_t e = ids[i] - expert_begin;
    if (e >= 0 && e < experts) atomicAdd(&count[e], 1);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int32_t running = 0, live = 0;
    for (int64_t e = 0; e < experts; ++e) {
      next[e] = running;
      expert_rows[e] = running;
      running += count[e];
      if (count[e] > 0) active[1 + live++] = static_cast<int32_t>(e);
    }
    expert_rows[experts] = running;
    active[0] = live;
  }
  __syncthreads();
  if (token_totals != nullptr)
    for (int64_t e = threadIdx.x; e < experts; e += blockDim.x)
      if (count[e] > 0) atomicAdd(&token_totals[e], static_cast<unsigned long long>(count[e]));
  for (int64_t i = threadIdx.x; i < pairs; i += blockDim.x) {
    const int64_t e = ids[i] - expert_begin;
    if (e < 0 || e >= experts) {
      token_slot[i] = -1;
      continue;
    }
    const int32_t slot = atomicAdd(&next[e], 1);
    token_slot[i] = slot;
    slot_token[slot] = static_cast<int32_t>(i / top_k);
  }
}

// Route: the top-k and the sort of a small step (at most kRouteMaxTokens tokens) in one block,
// one warp per token: a token's probabilities live in its warp's registers (kRoutePerLane per
// lane, so at most 32 * kRoutePerLane experts), each round is a warp arg-max (no block
// barrier), and the sort ranks each pair against the others (at most kRouteThreads pairs):
// its slot is the held pairs of lower experts plus its expert's earlier pairs, so the order
// inside an expert is the pairs' order, no atomics, and the active list is ranked the same way.
// The arithmetic of the top-k is that of MoeTopKKernel (softmax, ties, renormalisation in k
// order); only the sum of the softmax's denominator runs in another order.
__global__ void __launch_bounds__(kRouteThreads)
    MoeRouteKernel(const float* __restrict__ logits, int tokens, int experts, int top_k,
                   bool renormalize, int expert_begin, int held, int32_t* __restrict__ ids,
                   float* __restrict__ weights, int32_t* __restrict__ expert_rows,
                   int32_t* __restrict__ slot_token, int32_t* __restrict__ token_slot,
                   int32_t* __restrict__ active, unsigned long long* __restrict__ token_totals) {
  PdlWait();  // kernels/pdl.cuh: the router's logits come from the kernel before
  PdlLaunchDependents();
  __shared__ int32_t pair_expert[kRouteThreads];  // the held expert of each pair, or -1
  __shared__ int32_t pair_first[kRouteThreads];   // 1 for the first pair of its held expert
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int pairs = tokens * top_k;
  if (warp < tokens) {
    const float* row = logits + static_cast<int64_t>(warp) * experts;
    float p[kRoutePerLane];
    float top = -FLT_MAX;
#pragma unroll
    for (int i = 0; i < kRoutePerLane; ++i) {
      const int e = lane + 32 * i;
      p[i] = e < experts ? row[e] : -FLT_MAX;
      top = fmaxf(top, p[i]);
    }
    top = WarpMax(top);
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < kRoutePerLane; ++i) {
      if (lane + 32 * i < experts) {
        p[i] = expf(p[i] - top);
        sum += p[i];
      }
    }
    sum = WarpSum(sum);
#pragma unroll
    for (int i = 0; i < kRoutePerLane; ++i)
      p[i] = lane + 32 * i < experts ? p[i] / sum : -3.0f;  // past the experts: never picked
    float picked = 0.0f;
    for (int k = 0; k < top_k; ++k) {
      float v = -2.0f;  // loses to p >= 0 and to taken entries (-1), as in MoeTopKKernel
      int best = INT_MAX;
#pragma unroll
      for (int i = 0; i < kRoutePerLane; ++i)
        if (p[i] > v) {  // ascending ids per lane: the lower id of ties stays
          v = p[i];
          best = lane + 32 * i;
        }
      WarpArgMax(v, best);    // every lane ends with the same winner
      if (best >= experts) {  // every candidate NaN: a valid, unused id
        best = k;
        v = 0.0f;
      }
#pragma unroll
      for (int i = 0; i < kRoutePerLane; ++i)
        if (lane + 32 * i == best) p[i] = -1.0f;
      const int pair = warp * top_k + k;
      if (lane == 0) {
        ids[pair] = best;
        weights[pair] = v;
        const int e = best - expert_begin;
        pair_expert[pair] = e >= 0 && e < held ? e : -1;
      }
      picked += v;
    }
    if (lane == 0 && renormalize)
      for (int k = 0; k < top_k; ++k) weights[warp * top_k + k] /= picked;
  }
  __syncthreads();
  const int i = threadIdx.x;
  int e = -1, slot = 0, same = 0;
  if (i < pairs) {
    e = pair_expert[i];
    int before = 0;
    for (int j = 0; j < pairs; ++j) {
      const int ej = pair_expert[j];
      if (ej < 0) continue;
      if (ej < e) ++slot;
      if (ej == e) {
        ++same;
        if (j < i) ++before;
      }
    }
    slot += before;
    pair_first[i] = e >= 0 && before == 0;
    if (e < 0) {
      token_slot[i] = -1;
    } else {
      token_slot[i] = slot;
      slot_token[slot] = i / top_k;
    }
  }
  __syncthreads();
  if (i < pairs && pair_first[i]) {  // one thread per active expert: its rank among them
    int rank = 0;
    for (int j = 0; j < pairs; ++j) rank += pair_first[j] && pair_expert[j] < e;
    active[1 + rank] = e;
    if (token_totals != nullptr) atomicAdd(&token_totals[e], static_cast<unsigned long long>(same));
  }
  if (i == 0) {
    int live = 0;
    for (int j = 0; j < pairs; ++j) live += pair_first[j];
    active[0] = live;
  }
  for (int x = i; x <= held; x += blockDim.x) {  // expert_rows[x]: the held pairs below x
    int rows = 0;
    for (int j = 0; j < pairs; ++j) rows += pair_expert[j] >= 0 && pair_expert[j] < x;
    expert_rows[x] = rows;
  }
}

}  // namespace

bool MoePdl(int64_t tokens) {
  static const bool wanted = EnvSwitchOn("TESSERA_CUDA_MOE_PDL");
  return wanted && tokens <= kPdlMaxTokens;
}

cudaError_t LaunchMoeTopK(const float* logits, int64_t tokens, int64_t experts, int64_t top_k,
                          bool renormalize, int32_t* ids, float* weights, cudaStream_t stream) {
  if (tokens == 0) return cudaSuccess;
  const size_t shared = static_cast<size_t>(experts) * sizeof(float);
  if (top_k < 1 || top_k > experts || shared > 48 * 1024) return cudaErrorInvalidValue;
  return LaunchWithPdl(MoePdl(tokens), MoeTopKKernel, dim3(static_cast<unsigned>(tokens)),
                       dim3(kTopKThreads), shared, stream, logits, experts, static_cast<int>(top_k),
                       renormalize, ids, weights);
}

cudaError_t LaunchMoeSort(const int32_t* ids, int64_t pairs, int64_t top_k, int64_t expert_begin,
                          int64_t experts, int32_t* expert_rows, int32_t* slot_token,
                          int32_t* token_slot, int32_t* active, int64_t* token_totals,
                          cudaStream_t stream) {
  const size_t shared = 2 * static_cast<size_t>(experts) * sizeof(int32_t);
  if (experts < 1 || top_k < 1 || shared > 48 * 1024) return cudaErrorInvalidValue;
  return LaunchWithPdl(MoePdl(pairs / top_k), MoeSortKernel, dim3(1), dim3(kSortThreads), shared,
                       stream, ids, pairs, top_k, expert_begin, experts, expert_rows, slot_token,
                       token_slot, active, reinterpret_cast<unsigned long long*>(token_totals));
}

}  // namespace tessera::kernels::cuda

namespace tessera::kernels::cuda {

bool MoeRouteApplies(int64_t tokens, int64_t experts, int64_t top_k, int64_t held) {
  static const bool wanted = EnvSwitchOn("TESSERA_CUDA_MOE_FUSED_ROUTE");
  return wanted && tokens >= 1 && tokens <= kRouteMaxTokens && experts <= 32 * kRoutePerLane &&
         tokens * top_k <= kRouteThreads && held >= 1 && held <= kRouteMaxHeld;
}

cudaError_t LaunchMoeRoute(const float* logits, int64_t tokens, int64_t experts, int64_t top_k,
                           bool renormalize, int64_t expert_begin, int64_t held, int32_t* ids,
                           float* weights, int32_t* expert_rows, int32_t* slot_token,
                           int32_t* token_slot, int32_t* active, int64_t* token_totals,
                           cudaStream_t stream) {
  if (top_k < 1 || top_k > experts || !MoeRouteApplies(tokens, experts, top_k, held))
    return cudaErrorInvalidValue;
  return LaunchWithPdl(MoePdl(tokens), MoeRouteKernel, dim3(1), dim3(kRouteThreads), 0, stream,
                       logits, static_cast<int>(tokens), static_cast<int>(experts),
                       static_cast<int>(top_k), renormalize, static_cast<int>(expert_begin),
                       static_cast<int>(held), ids, weights, expert_rows, slot_token, token_slot,
                       active, reinterpret_cast<unsigned long long*>(token_totals));
}

}  // namespace tessera::kernels::cuda
