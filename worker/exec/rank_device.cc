#include "worker/exec/rank_device.h"

#include <algorithm>

#include "kernels/cuda_runtime.h"
#include "worker/comm/nccl_communicator.h"

namespace tessera {

StatusOr<RankBackend> ParseRankBackend(const std::string& name) {
  if (name == "auto") return RankBackend::kAuto;
  if (name == "cpu") return RankBackend::kCpu;
  if (name == "cuda") return RankBackend::kCuda;
  return InvalidArgument("backend '" + name + "': expected auto, cpu or cuda");
}

bool CudaDeviceVisible(int device) {
  if (!kernels::CudaCompiledIn() || device < 0) return false;
  auto n = kernels::CudaDeviceCount();
  return n.ok() && device < *n;
}

StatusOr<DType> ParseRuntimeDType(const std::string& name, const ModelConfig& config) {
  if (name.empty() || name == "auto") return config.torch_dtype;
  if (name == "F32" || name == "f32" || name == "float32") return DType::kF32;
  if (name == "BF16" || name == "bf16" || name == "bfloat16") return DType::kBF16;
  if (name == "F16" || name == "f16" || name == "float16") return DType::kF16;
  return InvalidArgument("dtype '" + name + "': expected auto, f32, bf16 or f16");
}

StatusOr<RankDevice> MakeRankDevice(RankBackend backend, int device, DType dtype) {
  RankDevice d;
  const bool cuda =
      backend == RankBackend::kCuda || (backend == RankBackend::kAuto && CudaDeviceVisible(device));
  if (!cuda) {
    d.backend = &kernels::CpuBackend();
    return d;
  }
  if (!CudaDeviceVisible(device))
    return Unavailable("backend cuda: GPU " + std::to_string(device) +
                       (kernels::CudaCompiledIn()
                            ? " is not visible"
                            : " asked for, but this build has no CUDA backend"));
  TESSERA_ASSIGN_OR_RETURN(d.owned, kernels::CreateCudaBackend(device, dtype));
  d.backend = d.owned.get();
  return d;
}

StatusOr<std::unique_ptr<Communicator>> MakeNcclTpCommunicator(Store& store,
                                                               const std::string& key_prefix,
                                                               int stage, int tp_rank, int tp,
                                                               double timeout_seconds,
                                                               kernels::Backend& backend) {
  NcclCommunicatorOptions o;
  o.group = "nccl.tp.stage" + std::to_string(stage);
  o.key_prefix = key_prefix;
  o.rank = tp_rank;
  o.size = tp;
  o.timeout_seconds = timeout_seconds;
  o.connect_timeout_seconds = std::max(60.0, timeout_seconds);
  return CreateNcclCommunicator(store, o, backend);
}

}  // namespace tessera
