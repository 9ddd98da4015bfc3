#include <cublas_v2.h>

#include <atomic>
#include <cstring>
#include <string>

#include "kernels/cuda_context.h"

namespace tessera::kernels::cuda {

namespace {

std::string Where(const char* file, int line) {
  std::string f(file);
  const size_t k = f.rfind("/kernels/");
  const size_t w = f.rfind("/worker/");
  if (k != std::string::npos)
    f = f.substr(k + 1);
  else if (w != std::string::npos)
    f = f.substr(w + 1);
  return f + ":" + std::to_string(line);
}

constexpr size_t kWorkspaceBytes = size_t{32} << 20;  // cuBLASLt workspace
constexpr size_t kStagingSlots = 8;
constexpr size_t kStagingBytes = size_t{256} << 10;  // per slot; larger uploads are pageable

size_t RoundBlock(size_t bytes) {
  if (bytes == 0) bytes = 1;
  if (bytes < (size_t{1} << 20)) return (bytes + 511) / 512 * 512;
  const size_t mib2 = size_t{2} << 20;
  return (bytes + mib2 - 1) / mib2 * mib2;
}

thread_local Context* tls_current = nullptr;
std::atomic<Context*> last_created{nullptr};

}  // namespace

Status CudaError(cudaError_t err, const char* call, const char* file, int line) {
  std::string msg = std::string(call) + " failed: " + cudaGetErrorName(err) + " (" +
                    cudaGetErrorString(err) + ") at " + Where(file, line);
  if (err == cudaErrorMemoryAllocation) return ResourceExhausted(msg);
  return Internal(msg);
}

Status CublasError(cublasStatus_t st, const char* call, const char* file, int line) {
  std::string msg = std::string(call) + " failed: " + cublasGetStatusName(st) + " (" +
                    cublasGetStatusString(st) + ") at " + Where(file, line);
  if (st == CUBLAS_STATUS_ALLOC_FAILED) return ResourceExhausted(msg);
  if (st == CUBLAS_STATUS_NOT_SUPPORTED) return Unimplemented(msg);
  return Internal(msg);
}

DeviceAllocator::~DeviceAllocator() {
  int prev = 0;
  cudaGetDevice(&prev);
  cudaSetDevice(device_);
  cudaDeviceSynchronize();
  for (auto& [bytes, p] : free_) cudaFree(p);
  cudaSetDevice(prev);
}

StatusOr<void*> DeviceAllocator::Allocate(size_t bytes, size_t* block_bytes) {
  const size_t want = RoundBlock(bytes);
  std::shared_ptr<Pool> pool;
  {
    std::lock_guard<std::mutex> lock(mu_);
    pool = active_pool_;
    if (pool) {
      auto it = pool->free.lower_bound(want);
      if (it != pool->free.end() && it->first <= 2 * want) {
        void* p = it->second;
        *block_bytes = it->first;
        pool->free.erase(it);
        return p;
      }
    }
    auto it = free_.lower_bound(want);
    if (it != free_.end() && it->first <= 2 * want) {
      void* p = it->second;
      *block_bytes = it->first;
      free_.erase(it);
      in_use_ += static_cast<int64_t>(*block_bytes);
      peak_ = std::max(peak_, in_use_);
      if (pool) {
        pool->owned.emplace_back(p, *block_bytes);
        pool_of_[p] = pool.get();
      }
      return p;
    }
  }
  void* p = nullptr;
  cudaError_t err = cudaMalloc(&p, want);
  if (err == cudaErrorMemoryAllocation && !pool) {
    // (Not while recording a graph: releasing the cache synchronises.)
    (void)cudaGetLastError();  // clear the sticky-free allocation error
    TESSERA_RETURN_IF_ERROR(ReleaseCached());
    err = cudaMalloc(&p, want);
  }
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    Status s = CudaError(err, "cudaMalloc", __FILE__, __LINE__);
    return Status(s.code(), "cuda:" + std::to_string(device_) + ": allocating " +
                                std::to_string(want) + " bytes (" +
                                std::to_string(stats().in_use_bytes) + " in use): " + s.message());
  }
  std::lock_guard<std::mutex> lock(mu_);
  *block_bytes = want;
  reserved_ += static_cast<int64_t>(want);
  in_use_ += static_cast<int64_t>(want);
  peak_ = std::max(peak_, in_use_);
  if (pool) {
    pool->owned.emplace_back(p, want);
    pool_of_[p] = pool.get();
  }
  return p;
}

void DeviceAllocator::Free(void* ptr, size_t block_bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  auto owner = pool_of_.find(ptr);
  if (owner != pool_of_.end()) {
    owner->second->free.emplace(block_bytes, ptr);
    return;
  }
  free_.emplace(block_bytes, ptr);
  in_use_ -= static_cast<int64_t>(block_bytes);
}

void DeviceAllocator::BeginPool(std::shared_ptr<Pool> pool) {
  std::lock_guard<std::mutex> lock(mu_);
  active_pool_ = std::move(pool);
}

void DeviceAllocator::EndPool() {
  std::lock_guard<std::mutex> lock(mu_);
  active_pool_.reset();
}

void DeviceAllocator::ReleasePool(Pool& pool) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [p, bytes] : pool.owned) {
    pool_of_.erase(p);
    free_.emplace(bytes, p);
    in_use_ -= static_cast<int64_t>(bytes);
  }
  pool.owned.clear();
  pool.free.clear();
}

Status DeviceAllocator::ReleaseCached() {
  TESSERA_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [bytes, p] : free_) {
    TESSERA_CUDA_RETURN_IF_ERROR(cudaFree(p));
    reserved_ -= static_cast<int64_t>(bytes);
  }
  free_.clear();
  return Status::Ok();
}

MemoryStats DeviceAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return {in_use_, peak_, reserved_};
}

StatusOr<std::unique_ptr<Context>> Context::Create(int device) {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    Status s = CudaError(err, "cudaGetDeviceCount", __FILE__, __LINE__);
    return Unavailable("cuda:" + std::to_string(device) + ": " + s.message());
  }
  if (device < 0 || device >= count)
    return Unavailable("cuda:" + std::to_string(device) + ": no such device (" +
                       std::to_string(count) + " visible)");
  std::unique_ptr<Context> c(new Context());
  c->device_ = device;
  TESSERA_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  TESSERA_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&c->props_, device));
  TESSERA_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&c->stream_, cudaStreamNonBlocking));
  TESSERA_CUBLAS_RETURN_IF_ERROR(cublasLtCreate(&c->lt_));
  c->allocator_ = std::make_shared<DeviceAllocator>(device);
  TESSERA_CUDA_RETURN_IF_ERROR(cudaMalloc(&c->workspace_, kWorkspaceBytes));
  c->workspace_bytes_ = kWorkspaceBytes;
  c->staging_.resize(kStagingSlots);
  for (Staging& s : c->staging_) {
    TESSERA_CUDA_RETURN_IF_ERROR(cudaMallocHost(&s.host, kStagingBytes));
    s.bytes = kStagingBytes;
    TESSERA_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&s.done, cudaEventDisableTiming));
  }
  last_created.store(c.get());
  tls_current = c.get();
  return c;
}

GemmPlan::~GemmPlan() {
  if (a) cublasLtMatrixLayoutDestroy(a);
  if (b) cublasLtMatrixLayoutDestroy(b);
  if (c) cublasLtMatrixLayoutDestroy(c);
  if (desc) cublasLtMatmulDescDestroy(desc);
}

Context::~Context() {
  if (stream_) cudaStreamSynchronize(stream_);
  gemm_plans_.clear();
  for (Staging& s : staging_) {
    if (s.done) cudaEventDestroy(s.done);
    if (s.host) cudaFreeHost(s.host);
  }
  if (workspace_) cudaFree(workspace_);
  if (lt_) cublasLtDestroy(lt_);
  if (stream_) cudaStreamDestroy(stream_);
  Context* self = this;
  last_created.compare_exchange_strong(self, nullptr);
  if (tls_current == this) tls_current = nullptr;
}

StatusOr<Tensor> Context::Allocate(const std::vector<int64_t>& shape, DType dtype) {
  int64_t numel = 1;
  for (int64_t d : shape) {
    if (d < 0) return InvalidArgument("cuda allocate: negative dimension");
    numel *= d;
  }
  const size_t bytes = static_cast<size_t>(numel) * DTypeSize(dtype);
  size_t block = 0;
  TESSERA_ASSIGN_OR_RETURN(void* p, allocator_->Allocate(bytes, &block));
  std::shared_ptr<DeviceAllocator> alloc = allocator_;
  std::shared_ptr<void> owner(p, [alloc, block](void* q) { alloc->Free(q, block); });
  return Tensor::Wrap(p, shape, dtype, Device::kCUDA, std::move(owner));
}

StatusOr<Tensor> Context::UploadBytes(const void* data, size_t bytes, std::vector<int64_t> shape,
                                      DType dtype) {
  TESSERA_ASSIGN_OR_RETURN(Tensor t, Allocate(shape, dtype));
  TESSERA_RETURN_IF_ERROR(CopyToDevice(t.raw(), data, bytes));
  return t;
}

Status Context::CopyToDevice(void* dst, const void* data, size_t bytes) {
  if (bytes == 0) return Status::Ok();
  if (bytes > kStagingBytes) {
    // Pageable: cudaMemcpyAsync returns once the source has been staged.
    TESSERA_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(dst, data, bytes, cudaMemcpyHostToDevice, stream_));
    return Status::Ok();
  }
  Staging& s = staging_[next_staging_];
  next_staging_ = (next_staging_ + 1) % staging_.size();
  TESSERA_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(s.done));
  std::memcpy(s.host, data, bytes);
  TESSERA_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(dst, s.host, bytes, cudaMemcpyHostToDevice, stream_));
  TESSERA_CUDA_RETURN_IF_ERROR(cudaEventRecord(s.done, stream_));
  return Status::Ok();
}

StatusOr<Tensor> Context::UploadI32(const std::vector<int32_t>& values) {
  return UploadBytes(values.data(), values.size() * sizeof(int32_t),
                     {static_cast<int64_t>(values.size())}, DType::kI32);
}

StatusOr<Tensor> Context::UploadF32(const std::vector<float>& values) {
  return UploadBytes(values.data(), values.size() * sizeof(float),
                     {static_cast<int64_t>(values.size())}, DType::kF32);
}

StatusOr<Context*> Current() {
  Context* c = tls_current ? tls_current : last_created.load();
  if (c == nullptr)
    return FailedPrecondition(
        "a CUDA tensor reached a kernel but no CUDA backend is current on this thread");
  if (tls_current == nullptr) {
    TESSERA_CUDA_RETURN_IF_ERROR(cudaSetDevice(c->device()));
    tls_current = c;
  }
  return c;
}

void SetCurrent(Context* context) {
  tls_current = context;
  if (context) cudaSetDevice(context->device());
}

}  // namespace tessera::kernels::cuda
