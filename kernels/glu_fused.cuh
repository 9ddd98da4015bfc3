// The fused gate|up GLU kernel shared by kernels/swiglu_cuda.cu and
// kernels/geglu_cuda.cu: out[r, j] = act(gate_up[r, j]) * gate_up[r, cols + j]
// in fp32, rounded once. Rows of 16-byte aligned, 16-byte multiple widths are
// read and written 16 bytes at a time.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda_common.cuh"
#include "kernels/pdl.cuh"

namespace tessera::kernels::cuda {

template <typename T, int V>
struct alignas(sizeof(T) * V) GluPack {
  T v[V];
};

// Act: a default-constructible functor, float operator()(float gate).
// `cols` is a multiple of V.
template <typename T, int V, typename Act>
__global__ void GluFusedKernel(const T* gate_up, T* out, int64_t rows, int64_t cols) {
  using P = GluPack<T, V>;
  const int64_t packs = cols / V;
  const Act act{};
  PdlWait();  // kernels/pdl.cuh
  PdlLaunchDependents();
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const P* g = reinterpret_cast<const P*>(gate_up + r * 2 * cols);
    const P* u = reinterpret_cast<const P*>(gate_up + r * 2 * cols + cols);
    P* o = reinterpret_cast<P*>(out + r * cols);
    for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < packs;
         j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
      const P gv = g[j], uv = u[j];
      P ov;
#pragma unroll
      for (int k = 0; k < V; ++k) ov.v[k] = FromF<T>(act(ToF(gv.v[k])) * ToF(uv.v[k]));
      o[j] = ov;
    }
  }
}

template <typename T, typename Act>
cudaError_t LaunchGluFused(const void* gate_up, void* out, int64_t rows, int64_t cols,
                           cudaStream_t stream) {
  if (rows == 0 || cols == 0) return cudaSuccess;
  constexpr int kVec = 16 / static_cast<int>(sizeof(T));
  const bool vec = cols % kVec == 0 && reinterpret_cast<uintptr_t>(gate_up) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(out) % 16 == 0;
  const int64_t packs = vec ? cols / kVec : cols;
  const dim3 grid(Blocks(packs, 256) < 65535u ? Blocks(packs, 256) : 65535u,
                  rows < 65535 ? static_cast<unsigned>(rows) : 65535u);
  const T* in = static_cast<const T*>(gate_up);
  T* o = static_cast<T*>(out);
  if (vec)
    return LaunchWithPdl(rows <= kPdlMaxTokens, GluFusedKernel<T, kVec, Act>, grid, dim3(256), 0,
                         stream, in, o, rows, cols);
  return LaunchWithPdl(rows <= kPdlMaxTokens, GluFusedKernel<T, 1, Act>, grid, dim3(256), 0, stream,
                       in, o, rows, cols);
}

}  // namespace tessera::kernels::cuda
