#include <cstdlib>
#include <cstring>
#include <string>

#include "common/base/env_switch.h"
#include "kernels/backend.h"
#include "kernels/cuda_context.h"

namespace tessera::kernels {

namespace {

// A CUDA graph and the private allocator pool its temporaries live in.
class CudaGraphWork final : public CapturedWork {
 public:
  CudaGraphWork(cuda::Context* ctx, cudaGraph_t graph, cudaGraphExec_t exec,
                std::shared_ptr<cuda::DeviceAllocator::Pool> pool)
      : ctx_(ctx),
        allocator_(ctx->shared_allocator()),
        graph_(graph),
        exec_(exec),
        pool_(std::move(pool)) {}
  ~CudaGraphWork() override {
    cudaGraphExecDestroy(exec_);
    cudaGraphDestroy(graph_);
    allocator_->ReleasePool(*pool_);
  }
  Status Replay() override {
    TESSERA_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(exec_, ctx_->stream()));
    return Status::Ok();
  }

 private:
  cuda::Context* ctx_;
  std::shared_ptr<cuda::DeviceAllocator> allocator_;
  cudaGraph_t graph_;
  cudaGraphExec_t exec_;
  std::shared_ptr<cuda::DeviceAllocator::Pool> pool_;
};

class CudaBackendImpl final : public Backend {
 public:
  CudaBackendImpl(std::unique_ptr<cuda::Context> ctx, DType dtype)
      : ctx_(std::move(ctx)), dtype_(dtype) {}

  Device device() const override { return Device::kCUDA; }
  DType compute_dtype() const override { return dtype_; }
  std::string name() const override {
    return "cuda:" + std::to_string(ctx_->device()) + " (" + ctx_->props().name + ")";
  }
  int64_t multiprocessors() const override { return ctx_->props().multiProcessorCount; }
  bool keeps_fp8_weights() const override {
    static const bool on = EnvSwitchOn("TESSERA_CUDA_FP8");
    return on && dtype_ != DType::kF32;
  }
  cuda::Context* context() { return ctx_.get(); }

  StatusOr<Tensor> Allocate(const std::vector<int64_t>& shape, DType dtype) override {
    return ctx_->Allocate(shape, dtype);
  }
  StatusOr<Tensor> Zeros(const std::vector<int64_t>& shape, DType dtype) override {
    TESSERA_ASSIGN_OR_RETURN(Tensor t, ctx_->Allocate(shape, dtype));
    if (t.nbytes() > 0)
      TESSERA_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(t.raw(), 0, t.nbytes(), ctx_->stream()));
    return t;
  }
  Status Copy(Tensor& dst, const Tensor& src) override {
    if (dst.dtype() != src.dtype() || dst.numel() != src.numel())
      return InvalidArgument("copy: dst " + dst.Describe() + " vs src " + src.Describe());
    if (src.nbytes() == 0 || dst.raw() == src.raw()) return Status::Ok();
    const bool dd = dst.device() == Device::kCUDA, sd = src.device() == Device::kCUDA;
    const cudaMemcpyKind kind = dd && sd ? cudaMemcpyDeviceToDevice
                                : dd     ? cudaMemcpyHostToDevice
                                : sd     ? cudaMemcpyDeviceToHost
                                         : cudaMemcpyHostToHost;
    TESSERA_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(dst.raw(), src.raw(), src.nbytes(), kind, ctx_->stream()));
    // Host destinations are complete on return; pageable host sources have
    // been staged by the time cudaMemcpyAsync returns.
    if (!dd) TESSERA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(ctx_->stream()));
    return Status::Ok();
  }
  Status Synchronize() override {
    TESSERA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(ctx_->stream()));
    return Status::Ok();
  }
  MemoryStats memory_stats() const override { return ctx_->allocator().stats(); }

  Status CopyFromHost(Tensor& dst, const void* src, size_t bytes) override {
    if (bytes > dst.nbytes())
      return InvalidArgument("copy from host: " + std::to_string(bytes) + " bytes into " +
                             dst.Describe());
    if (dst.device() != Device::kCUDA) return Backend::CopyFromHost(dst, src, bytes);
    return ctx_->CopyToDevice(dst.raw(), src, bytes);
  }

  StatusOr<std::unique_ptr<UploadQueue>> NewUploadQueue(const UploadOptions& options) override {
    return cuda::NewPinnedUploadQueue(*ctx_, options);
  }

  StatusOr<std::unique_ptr<CapturedWork>> Capture(const std::function<Status()>& body) override {
    auto pool = std::make_shared<cuda::DeviceAllocator::Pool>();
    cuda::DeviceAllocator& alloc = ctx_->allocator();
    alloc.BeginPool(pool);
    // Relaxed: the NCCL watchdog thread keeps querying events meanwhile.
    cudaError_t err = cudaStreamBeginCapture(ctx_->stream(), cudaStreamCaptureModeRelaxed);
    Status s = err == cudaSuccess
                   ? body()
                   : cuda::CudaError(err, "cudaStreamBeginCapture", __FILE__, __LINE__);
    cudaGraph_t graph = nullptr;
    if (err == cudaSuccess) {
      err = cudaStreamEndCapture(ctx_->stream(), &graph);
      if (s.ok() && err != cudaSuccess)
        s = cuda::CudaError(err, "cudaStreamEndCapture", __FILE__, __LINE__);
    }
    alloc.EndPool();
    cudaGraphExec_t exec = nullptr;
    if (s.ok()) {
      err = cudaGraphInstantiate(&exec, graph, 0);
      if (err != cudaSuccess) s = cuda::CudaError(err, "cudaGraphInstantiate", __FILE__, __LINE__);
    }
    if (!s.ok()) {
      (void)cudaGetLastError();
      if (graph) cudaGraphDestroy(graph);
      alloc.ReleasePool(*pool);
      return s.WithContext("recording a CUDA graph on " + name());
    }
    return std::unique_ptr<CapturedWork>(new CudaGraphWork(ctx_.get(), graph, exec, pool));
  }

 private:
  std::unique_ptr<cuda::Context> ctx_;
  DType dtype_;
};

}  // namespace

StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(int device, DType compute_dtype) {
  if (compute_dtype != DType::kF32 && compute_dtype != DType::kBF16 && compute_dtype != DType::kF16)
    return InvalidArgument(std::string("cuda backend: compute dtype ") + DTypeName(compute_dtype) +
                           " (supported: F32, BF16, F16)");
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<cuda::Context> ctx, cuda::Context::Create(device));
  return std::unique_ptr<Backend>(new CudaBackendImpl(std::move(ctx), compute_dtype));
}

Status MakeCurrent(Backend& backend) {
  if (backend.device() != Device::kCUDA) return Status::Ok();
  cuda::SetCurrent(static_cast<CudaBackendImpl&>(backend).context());
  return Status::Ok();
}

}  // namespace tessera::kernels
