// Residual/bias add, scaling and row gather (kernels/tensor_ops.h).
#include "kernels/cuda_common.cuh"
#include "kernels/cuda_launch.h"

namespace tessera::kernels::cuda {

namespace {

template <typename T>
__global__ void AddKernel(T* acc, const T* x, const T* bias, int64_t rows, int64_t cols) {
  const int64_t n = rows * cols;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float v = ToF(acc[i]);
    if (x != nullptr) v += ToF(x[i]);
    if (bias != nullptr) v += ToF(bias[i % cols]);
    acc[i] = FromF<T>(v);
  }
}

template <typename T>
__global__ void ScaleKernel(T* x, int64_t count, float scale) {
  const float s = ToF(FromF<T>(scale));  // the scale in x's dtype, as transformers rounds it
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    x[i] = FromF<T>(ToF(x[i]) * s);
}

template <typename W>
__global__ void GatherKernel(const W* src, const int32_t* rows, int64_t words, W* out) {
  const int64_t r = blockIdx.x;
  const W* s = src + static_cast<int64_t>(rows[r]) * words;
  W* o = out + r * words;
  for (int64_t i = threadIdx.x; i < words; i += blockDim.x) o[i] = s[i];
}

}  // namespace

cudaError_t LaunchScale(DType dtype, void* x, int64_t count, float scale, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  const unsigned blocks = Blocks(count, 256) < 65535u ? Blocks(count, 256) : 65535u;
  TESSERA_FLOAT_SWITCH(
      dtype, T, ScaleKernel<T><<<blocks, 256, 0, stream>>>(static_cast<T*>(x), count, scale));
  return cudaGetLastError();
}

cudaError_t LaunchAddInPlace(DType dtype, void* acc, const void* x, const void* bias, int64_t rows,
                             int64_t cols, cudaStream_t stream) {
  const int64_t n = rows * cols;
  if (n == 0) return cudaSuccess;
  const unsigned blocks = Blocks(n, 256) < 65535u ? Blocks(n, 256) : 65535u;
  TESSERA_FLOAT_SWITCH(dtype, T,
                       AddKernel<T>
                       <<<blocks, 256, 0, stream>>>(static_cast<T*>(acc), static_cast<const T*>(x),
                                                    static_cast<const T*>(bias), rows, cols));
  return cudaGetLastError();
}

cudaError_t LaunchGatherRows(const void* src, const int32_t* rows, int64_t num_rows,
                             size_t row_bytes, void* out, cudaStream_t stream) {
  if (num_rows == 0 || row_bytes == 0) return cudaSuccess;
  const unsigned grid = static_cast<unsigned>(num_rows);
  if (row_bytes % 16 == 0 && reinterpret_cast<uintptr_t>(src) % 16 == 0 &&
      reinterpret_cast<uintptr_t>(out) % 16 == 0) {
    GatherKernel<uint4><<<grid, 256, 0, stream>>>(static_cast<const uint4*>(src), rows,
                                                  static_cast<int64_t>(row_bytes / 16),
                                                  static_cast<uint4*>(out));
  } else if (row_bytes % 2 == 0) {
    GatherKernel<uint16_t><<<grid, 256, 0, stream>>>(static_cast<const uint16_t*>(src), rows,
                                                     static_cast<int64_t>(row_bytes / 2),
                                                     static_cast<uint16_t*>(out));
  } else {
    GatherKernel<uint8_t><<<grid, 256, 0, stream>>>(static_cast<const uint8_t*>(src), rows,
                                                    static_cast<int64_t>(row_bytes),
                                                    static_cast<uint8_t*>(out));
  }
  return cudaGetLastError();
}

}  // namespace tessera::kernels::cuda
