#include <cstring>

#include "kernels/backend.h"

namespace tessera::kernels {

StatusOr<Tensor> Backend::Upload(const Tensor& host) {
  TESSERA_ASSIGN_OR_RETURN(Tensor t, Allocate(host.shape(), host.dtype()));
  TESSERA_RETURN_IF_ERROR(Copy(t, host));
  return t;
}

StatusOr<Tensor> Backend::ToHost(const Tensor& t) {
  if (t.device() == Device::kCPU) return t;
  Tensor host = Tensor::Empty(t.shape(), t.dtype());
  TESSERA_RETURN_IF_ERROR(Copy(host, t));
  return host;
}

Status Backend::CopyFromHost(Tensor& dst, const void* src, size_t bytes) {
  if (bytes > dst.nbytes())
    return InvalidArgument("copy from host: " + std::to_string(bytes) + " bytes into " +
                           dst.Describe());
  if (bytes == 0) return Status::Ok();
  Tensor d =
      Tensor::Wrap(dst.raw(), {static_cast<int64_t>(bytes)}, DType::kU8, dst.device(), nullptr);
  const Tensor s = Tensor::Wrap(const_cast<void*>(src), {static_cast<int64_t>(bytes)}, DType::kU8,
                                Device::kCPU, nullptr);
  return Copy(d, s);
}

StatusOr<std::unique_ptr<CapturedWork>> Backend::Capture(const std::function<Status()>&) {
  return Unimplemented("capture: the " + name() + " backend cannot record device work");
}

namespace {

class CpuBackendImpl final : public Backend {
 public:
  Device device() const override { return Device::kCPU; }
  DType compute_dtype() const override { return DType::kF32; }
  std::string name() const override { return "cpu"; }

  StatusOr<Tensor> Allocate(const std::vector<int64_t>& shape, DType dtype) override {
    return Tensor::Empty(shape, dtype);
  }
  StatusOr<Tensor> Zeros(const std::vector<int64_t>& shape, DType dtype) override {
    return Tensor::Zeros(shape, dtype);
  }
  Status Copy(Tensor& dst, const Tensor& src) override {
    if (dst.dtype() != src.dtype() || dst.numel() != src.numel())
      return InvalidArgument("copy: dst " + dst.Describe() + " vs src " + src.Describe());
    if (dst.device() != Device::kCPU || src.device() != Device::kCPU)
      return InvalidArgument("copy on the cpu backend: dst " + dst.Describe() + ", src " +
                             src.Describe() + " (a device tensor needs its CUDA backend)");
    if (dst.raw() != src.raw() && src.nbytes() > 0)
      std::memmove(dst.raw(), src.raw(), src.nbytes());
    return Status::Ok();
  }
  Status Synchronize() override { return Status::Ok(); }
  MemoryStats memory_stats() const override { return {}; }
};

}  // namespace

Backend& CpuBackend() {
  static CpuBackendImpl* backend = new CpuBackendImpl();  // never destroyed: outlives every tensor
  return *backend;
}

#ifndef TESSERA_WITH_CUDA
StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(int device, DType) {
  return Unavailable("cuda:" + std::to_string(device) + ": this build has no CUDA backend");
}
Status MakeCurrent(Backend&) { return Status::Ok(); }
#endif

}  // namespace tessera::kernels
