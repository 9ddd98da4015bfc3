// The CUDA side of a Backend: the device, its stream, the cuBLASLt handle
// and workspace, and the caching device allocator. Included only by
// kernels/*_cuda.cc (built when TESSERA_WITH_CUDA); the kernels in
// kernels/*_cuda.cu see raw pointers and the stream only (cuda_launch.h).
//
// Errors: every CUDA, cuBLAS and NCCL call is checked; a failure becomes a
// Status naming the call, its error name and string, and file:line.
// cudaErrorMemoryAllocation maps to kResourceExhausted, the rest to kInternal.
//
// Thread-safety: a Context is used by one thread at a time (the rank's
// owner thread), except DeviceAllocator::Free, which may run on any thread.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "common/base/status.h"
#include "common/base/tensor.h"
#include "kernels/backend.h"

namespace tessera::kernels::cuda {

Status CudaError(cudaError_t err, const char* call, const char* file, int line);
Status CublasError(cublasStatus_t st, const char* call, const char* file, int line);

}  // namespace tessera::kernels::cuda

#define TESSERA_CUDA_RETURN_IF_ERROR(call)                                                \
  do {                                                                                    \
    cudaError_t _tessera_ce = (call);                                                     \
    if (_tessera_ce != cudaSuccess)                                                       \
      return ::tessera::kernels::cuda::CudaError(_tessera_ce, #call, __FILE__, __LINE__); \
  } while (0)

#define TESSERA_CUBLAS_RETURN_IF_ERROR(call)                                                \
  do {                                                                                      \
    cublasStatus_t _tessera_cb = (call);                                                    \
    if (_tessera_cb != CUBLAS_STATUS_SUCCESS)                                               \
      return ::tessera::kernels::cuda::CublasError(_tessera_cb, #call, __FILE__, __LINE__); \
  } while (0)

// After a kernel launch: the launch configuration error, naming the kernel.
#define TESSERA_CUDA_LAUNCH_CHECK(launch, kernel_name)                                          \
  do {                                                                                          \
    cudaError_t _tessera_ce = (launch);                                                         \
    if (_tessera_ce != cudaSuccess)                                                             \
      return ::tessera::kernels::cuda::CudaError(_tessera_ce, kernel_name, __FILE__, __LINE__); \
  } while (0)

namespace tessera::kernels::cuda {

// Caching allocator for one device. Blocks are rounded up (512 B below
// 1 MiB, 2 MiB above) and kept on free lists when released; a request takes
// the smallest cached block that is large enough and at most twice its size.
// When cudaMalloc fails, the cache is returned to the driver and the
// allocation is retried once. All work on the device is ordered on one
// stream, so a block released on the host is safe to hand to the next
// kernel.
class DeviceAllocator {
 public:
  explicit DeviceAllocator(int device) : device_(device) {}
  ~DeviceAllocator();
  DeviceAllocator(const DeviceAllocator&) = delete;
  DeviceAllocator& operator=(const DeviceAllocator&) = delete;

  // Errors: kResourceExhausted naming the bytes and the device.
  StatusOr<void*> Allocate(size_t bytes, size_t* block_bytes);
  void Free(void* ptr, size_t block_bytes);

  // A private pool for the temporaries of one CUDA graph. While a pool is
  // active, Allocate serves from it (growing it from the shared cache or the
  // driver) and blocks freed back return to it, so they are reused inside
  // the recording but never handed to anyone else: a replay may write them
  // at any later point of the stream.
  struct Pool {
    std::multimap<size_t, void*> free;            // block bytes -> block
    std::vector<std::pair<void*, size_t>> owned;  // every block of the pool
  };
  void BeginPool(std::shared_ptr<Pool> pool);
  void EndPool();
  // Returns the pool's blocks to the shared cache (its graph is gone; work
  // queued before on the stream is ordered before any reuse).
  void ReleasePool(Pool& pool);
  // Returns every cached block to the driver (after a device synchronise).
  Status ReleaseCached();
  MemoryStats stats() const;

 private:
  const int device_;
  mutable std::mutex mu_;
  std::multimap<size_t, void*> free_;  // block bytes -> block
  int64_t in_use_ = 0, peak_ = 0, reserved_ = 0;
  std::shared_ptr<Pool> active_pool_;
  std::unordered_map<void*, Pool*> pool_of_;  // blocks owned by a pool
};

// A cuBLASLt matmul set up once per problem shape (descriptors, layouts and
// the heuristic's algorithm), reused by every later call of that shape.
struct GemmPlan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool bias_epilogue = false;  // false: the bias is added by a separate kernel
  // cuBLASLt had no algorithm for the shape (kept so the heuristic is asked
  // once; the FP8 tensor-core path then falls back, kernels/linear_fp8.h).
  Status unsupported;
  GemmPlan() = default;
  GemmPlan(const GemmPlan&) = delete;
  GemmPlan& operator=(const GemmPlan&) = delete;
  ~GemmPlan();
};

// The per-rank CUDA state. Owned by a CUDA Backend.
class Context {
 public:
  // Errors: kUnavailable naming the device when it does not exist.
  static StatusOr<std::unique_ptr<Context>> Create(int device);
  ~Context();

  int device() const { return device_; }
  cudaStream_t stream() const { return stream_; }
  cublasLtHandle_t lt() const { return lt_; }
  void* workspace() const { return workspace_; }
  size_t workspace_bytes() const { return workspace_bytes_; }
  DeviceAllocator& allocator() { return *allocator_; }
  const std::shared_ptr<DeviceAllocator>& shared_allocator() const { return allocator_; }
  const cudaDeviceProp& props() const { return props_; }

  // An uninitialised device tensor; its block returns to the cache when the
  // last handle is dropped.
  StatusOr<Tensor> Allocate(const std::vector<int64_t>& shape, DType dtype);
  // A device I32 tensor holding `values` (copied on the stream from a
  // pinned staging buffer, so `values` may be reused at once).
  StatusOr<Tensor> UploadI32(const std::vector<int32_t>& values);
  StatusOr<Tensor> UploadF32(const std::vector<float>& values);
  // `bytes` bytes of `data` as a device tensor of `shape` and `dtype`.
  StatusOr<Tensor> UploadBytes(const void* data, size_t bytes, std::vector<int64_t> shape,
                               DType dtype);
  // Copies `bytes` bytes of host `data` to device address `dst` on the
  // stream (through the pinned staging ring when small enough), so `data`
  // may be reused on return.
  Status CopyToDevice(void* dst, const void* data, size_t bytes);

  // Linear's cuBLASLt plans, keyed by (m, n, k, input dtype, output dtype,
  // has bias, pointer alignment).
  using GemmKey = std::tuple<int64_t, int64_t, int64_t, int, int, int, int>;
  std::map<GemmKey, std::unique_ptr<GemmPlan>>& gemm_plans() { return gemm_plans_; }

 private:
  Context() = default;

  int device_ = 0;
  cudaDeviceProp props_{};
  cudaStream_t stream_ = nullptr;
  cublasLtHandle_t lt_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  std::shared_ptr<DeviceAllocator> allocator_;
  std::map<GemmKey, std::unique_ptr<GemmPlan>> gemm_plans_;
  // Pinned staging ring for small uploads; a slot is reused only after the
  // event recorded behind its last copy has completed.
  struct Staging {
    void* host = nullptr;
    size_t bytes = 0;
    cudaEvent_t done = nullptr;
  };
  std::vector<Staging> staging_;
  size_t next_staging_ = 0;
};

// The context of the calling thread's current CUDA backend. Errors:
// kFailedPrecondition when no CUDA backend was created or made current.
StatusOr<Context*> Current();
void SetCurrent(Context* context);

// The pinned, multi-threaded UploadQueue of a CUDA backend (kernels/upload_queue_cuda.cc); it
// first waits for ctx's stream. Errors: the CUDA call that failed (cudaHostAlloc, ...), named.
StatusOr<std::unique_ptr<UploadQueue>> NewPinnedUploadQueue(Context& ctx,
                                                            const UploadOptions& options);

}  // namespace tessera::kernels::cuda
