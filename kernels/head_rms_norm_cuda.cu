// Per-head RMSNorm (kernels/head_rms_norm.h): one warp per (token, head) row,
// kRowsPerBlock rows per block, fp32 sum of squares, the output rounded once.
// A head is short (64 to 256 elements), so a warp per row keeps every lane
// busy where a block per row would leave most of it idle.
#include "kernels/cuda_common.cuh"
#include "kernels/cuda_launch.h"
#include "kernels/pdl.cuh"

namespace tessera::kernels::cuda {

namespace {

constexpr int kRowsPerBlock = 8;

template <typename T>
__global__ void HeadRmsNormKernel(T* x, const T* __restrict__ w, int64_t rows, int head_dim,
                                  float eps, float w_offset) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.y;
  if (row >= rows) return;  // exits count as launched-dependents (kernels/pdl.cuh)
  PdlWait();                // kernels/pdl.cuh
  PdlLaunchDependents();    // a whole warp leaves together: WarpSum stays full
  T* v = x + row * head_dim;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < head_dim; i += 32) {
    const float f = ToF(v[i]);
    ss = fmaf(f, f, ss);
  }
  ss = WarpSum(ss);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(head_dim) + eps);
  for (int i = threadIdx.x; i < head_dim; i += 32)
    v[i] = FromF<T>((w_offset + ToF(w[i])) * (ToF(v[i]) * inv));
}

}  // namespace

cudaError_t LaunchHeadRmsNorm(DType dtype, void* x, const void* w, int64_t rows, int64_t head_dim,
                              float eps, float w_offset, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  const dim3 block(32, kRowsPerBlock);
  cudaError_t err = cudaSuccess;
  TESSERA_FLOAT_SWITCH(
      dtype, T,
      err = LaunchWithPdl(/*pdl=*/false, HeadRmsNormKernel<T>, dim3(Blocks(rows, kRowsPerBlock)),
                          block, 0, stream, static_cast<T*>(x), static_cast<const T*>(w), rows,
                          static_cast<int>(head_dim), eps, w_offset));
  return err;
}

}  // namespace tessera::kernels::cuda
