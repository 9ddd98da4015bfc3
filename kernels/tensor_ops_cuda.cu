// Residual/bias add, scaling, row gather and the q|k|v column split
// (kernels/tensor_ops.h).
#include "kernels/cuda_common.cuh"
#include "kernels/cuda_launch.h"
#include "kernels/pdl.cuh"

namespace tessera::kernels::cuda {

namespace {

template <typename T>
__global__ void AddKernel(T* acc, const T* x, const T* bias, int64_t rows, int64_t cols) {
  PdlWait();  // kernels/pdl.cuh
  PdlLaunchDependents();
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

// Row r of src (w0 + w1 + w2 words) into row r of d0, d1, d2.
template <typename W>
__global__ void SplitColumnsKernel(const W* src, int64_t rows, int64_t w0, int64_t w1, int64_t w2,
                                   W* d0, W* d1, W* d2) {
  PdlWait();  // kernels/pdl.cuh
  PdlLaunchDependents();
  const int64_t total = w0 + w1 + w2;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const W* s = src + r * total;
    for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < total;
         j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
      const W v = s[j];
      if (j < w0) {
        d0[r * w0 + j] = v;
      } else if (j < w0 + w1) {
        d1[r * w1 + (j - w0)] = v;
      } else {
        d2[r * w2 + (j - w0 - w1)] = v;
      }
    }
  }
}

template <typename W>
cudaError_t LaunchSplitWords(const void* src, int64_t rows, const size_t bytes[3],
                             void* const dst[3], cudaStream_t stream) {
  const int64_t w0 = static_cast<int64_t>(bytes[0] / sizeof(W));
  const int64_t w1 = static_cast<int64_t>(bytes[1] / sizeof(W));
  const int64_t w2 = static_cast<int64_t>(bytes[2] / sizeof(W));
  const int64_t total = w0 + w1 + w2;
  const dim3 grid(Blocks(total, 256) < 65535u ? Blocks(total, 256) : 65535u,
                  rows < 65535 ? static_cast<unsigned>(rows) : 65535u);
  return LaunchWithPdl(rows <= kPdlMaxTokens, SplitColumnsKernel<W>, grid, dim3(256), 0, stream,
                       static_cast<const W*>(src), rows, w0, w1, w2, static_cast<W*>(dst[0]),
                       static_cast<W*>(dst[1]), static_cast<W*>(dst[2]));
}

// Whether every row width is a multiple of `w` bytes and every pointer
// aligned to it.
bool WordsOf(size_t w, const void* src, const size_t bytes[3], void* const dst[3]) {
  if (reinterpret_cast<uintptr_t>(src) % w != 0) return false;
  for (int i = 0; i < 3; ++i)
    if (bytes[i] % w != 0 || reinterpret_cast<uintptr_t>(dst[i]) % w != 0) return false;
  return true;
}

}  // namespace

cudaError_t LaunchSplitColumns(const void* src, int64_t rows, const size_t bytes[3],
                               void* const dst[3], cudaStream_t stream) {
  if (rows == 0 || bytes[0] + bytes[1] + bytes[2] == 0) return cudaSuccess;
  if (WordsOf(16, src, bytes, dst)) return LaunchSplitWords<uint4>(src, rows, bytes, dst, stream);
  if (WordsOf(4, src, bytes, dst)) return LaunchSplitWords<uint32_t>(src, rows, bytes, dst, stream);
  if (WordsOf(2, src, bytes, dst)) return LaunchSplitWords<uint16_t>(src, rows, bytes, dst, stream);
  return LaunchSplitWords<uint8_t>(src, rows, bytes, dst, stream);
}

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
  cudaError_t err = cudaSuccess;
  TESSERA_FLOAT_SWITCH(
      dtype, T,
      err = LaunchWithPdl(rows <= kPdlMaxTokens, AddKernel<T>, dim3(blocks), dim3(256), 0, stream,
                          static_cast<T*>(acc), static_cast<const T*>(x),
                          static_cast<const T*>(bias), rows, cols));
  return err;
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
