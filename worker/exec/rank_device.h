// RankDevice: where one rank of a deployment computes, and the tensor-parallel
// communicator that goes with it. A rank runs on a CUDA backend (its GPU,
// the deployment's dtype, NCCL for its tp group) when asked to, or when
// asked for "auto" and the binary has the CUDA backend and the GPU is
// visible; otherwise on the CPU backend (F32, Gloo).
//
// The NCCL unique id of a tp group travels through the rendezvous Store the
// coordinator serves (rank 0 of the group publishes it under
// "<key_prefix>/nccl.tp.stage<k>/nccl_unique_id"), next to the Gloo keys.
//
// Thread-safety: a RankDevice belongs to the rank's owner thread.
#pragma once

#include <memory>
#include <string>

#include "common/base/dtype.h"
#include "common/base/status.h"
#include "common/format/model_config.h"
#include "common/net/store.h"
#include "kernels/backend.h"
#include "worker/comm/communicator.h"

namespace tessera {

enum class RankBackend { kAuto, kCpu, kCuda };

// "auto", "cpu" or "cuda". Errors: kInvalidArgument naming the value.
StatusOr<RankBackend> ParseRankBackend(const std::string& name);

// True when the binary has the CUDA backend and GPU `device` is visible.
bool CudaDeviceVisible(int device);

// The compute dtype of a CUDA rank: "" or "auto" -> the checkpoint's
// torch_dtype; "F32"/"f32"/"float32", "BF16"/"bf16"/"bfloat16",
// "F16"/"f16"/"float16".
// Errors: kInvalidArgument naming the value.
StatusOr<DType> ParseRuntimeDType(const std::string& name, const ModelConfig& config);

struct RankDevice {
  std::unique_ptr<kernels::Backend> owned;  // the CUDA backend, if any
  kernels::Backend* backend = nullptr;      // never null once made
  bool cuda() const { return owned != nullptr; }
};

// The backend of a rank on GPU `device` (CPU ranks ignore `device` and
// `dtype`: the CPU computes in F32). Errors: kUnavailable when `backend` is
// kCuda and the build has no CUDA backend or the GPU is not visible (naming
// the device); those of CreateCudaBackend.
StatusOr<RankDevice> MakeRankDevice(RankBackend backend, int device, DType dtype);

// The tp communicator of a CUDA rank: NCCL over `store`, group
// "nccl.tp.stage<stage>" under `key_prefix`, every call bounded by
// timeout_seconds. Errors: those of CreateNcclCommunicator.
StatusOr<std::unique_ptr<Communicator>> MakeNcclTpCommunicator(Store& store,
                                                               const std::string& key_prefix,
                                                               int stage, int tp_rank, int tp,
                                                               double timeout_seconds,
                                                               kernels::Backend& backend);

}  // namespace tessera
