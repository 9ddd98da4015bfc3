// Backend: the device a rank computes on, and how its tensors are made and
// moved. The model allocates every weight, KV-cache block and temporary
// through its Backend, so the same forward code runs on the CPU (host memory,
// F32) and on a CUDA device (device memory from a caching allocator, one
// stream per rank, BF16/F16/F32 compute dtype with fp32 accumulation).
//
// Ordering: everything a backend does (copies, kernels launched while it is
// the current backend of the calling thread) runs in one stream order, so a
// temporary freed on the host can be reused by the next kernel safely (the
// caching-allocator rule of PyTorch's CUDA allocator). A Copy into host
// memory has completed when it returns; a Copy into device memory may still
// be in flight, but later work on the backend sees its result.
//
// Thread-safety: a backend belongs to its rank's owner thread. Tensors it
// allocated may be released from any thread (the allocator locks).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/base/dtype.h"
#include "common/base/status.h"
#include "common/base/tensor.h"
#include "kernels/upload_queue.h"

namespace tessera::kernels {

struct MemoryStats {
  int64_t in_use_bytes = 0;    // bytes of live tensors allocated by the backend
  int64_t peak_bytes = 0;      // maximum of in_use_bytes since creation
  int64_t reserved_bytes = 0;  // bytes held from the driver (in use + cached)
};

// Device work recorded once and replayed many times (a CUDA graph). Owned
// by the thread that owns its Backend; it must not outlive the Backend.
class CapturedWork {
 public:
  virtual ~CapturedWork() = default;
  // Enqueues the recorded work on the backend's stream in stream order with
  // everything else, and returns without waiting. Errors: the device call,
  // named.
  virtual Status Replay() = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual Device device() const = 0;
  // The dtype of activations, weights and the KV cache (F32 on the CPU;
  // F32, BF16 or F16 on CUDA). Matrix products and reductions accumulate in
  // fp32 whatever this is.
  virtual DType compute_dtype() const = 0;
  // "cpu" or "cuda:0 (NVIDIA H200)".
  virtual std::string name() const = 0;
  // The device's streaming multiprocessors (0 on the CPU): how many CTAs a
  // kernel needs per wave to fill it (DecodeWorkItems, kernels/attention_meta.h).
  virtual int64_t multiprocessors() const { return 0; }
  // Whether FP8 projections (an FP8 checkpoint, or model.quantization =
  // "fp8") stay FP8 on this backend and run kernels::LinearFp8
  // (kernels/linear_fp8.h), instead of being dequantized to the compute dtype
  // at load. CUDA in BF16 or F16 (TESSERA_CUDA_FP8=0 turns it off: the A/B of
  // bench/results); never the CPU backend, whose dequantized fp32 is the
  // reference.
  virtual bool keeps_fp8_weights() const { return false; }

  // An uninitialised tensor of `shape` and `dtype` on this backend's device.
  // Errors: kResourceExhausted naming the bytes asked for when memory runs out.
  virtual StatusOr<Tensor> Allocate(const std::vector<int64_t>& shape, DType dtype) = 0;
  // As Allocate, filled with zero bytes.
  virtual StatusOr<Tensor> Zeros(const std::vector<int64_t>& shape, DType dtype) = 0;

  // Copies src into dst: same dtype and numel (shapes may differ), either
  // tensor on the host or on this backend's device. Errors: kInvalidArgument
  // naming both tensors; device errors naming the call.
  virtual Status Copy(Tensor& dst, const Tensor& src) = 0;

  // Waits until every operation issued so far has completed.
  virtual Status Synchronize() = 0;

  virtual MemoryStats memory_stats() const = 0;

  // Copies `bytes` bytes at host address `src` into the first bytes of
  // `dst` (a tensor of this backend), in stream order and without waiting
  // for the device: `src` may be reused as soon as this returns.
  // Errors: kInvalidArgument when dst holds fewer than `bytes` bytes.
  virtual Status CopyFromHost(Tensor& dst, const void* src, size_t bytes);

  // Records the device work that `body` issues on this backend (kernels,
  // copies and collectives on its stream) into a CapturedWork without
  // running it. Temporaries that `body` allocates come from a pool private
  // to the recording and stay reserved until the CapturedWork is destroyed,
  // so a replay never writes memory handed out since; no tensor allocated
  // inside `body` may outlive it. Host-side effects of `body` happen once,
  // now. Errors: those of `body`; kUnimplemented on the CPU backend; the
  // device call that failed, named.
  virtual StatusOr<std::unique_ptr<CapturedWork>> Capture(const std::function<Status()>& body);

  // A queue that fills host data on several threads and copies it into this backend's tensors
  // (kernels/upload_queue.h): pinned staging buffers and a copy stream on CUDA; on the CPU
  // (and by default) the synchronous queue. Errors: the device call that failed, named.
  virtual StatusOr<std::unique_ptr<UploadQueue>> NewUploadQueue(const UploadOptions& options);

  // Allocate + Copy: `host` (any device) placed on this backend.
  StatusOr<Tensor> Upload(const Tensor& host);
  // Allocate on the host + Copy: `t` as a host tensor (t itself when it is
  // already on the host).
  StatusOr<Tensor> ToHost(const Tensor& t);
};

// The process-wide CPU backend (F32). Never null, lives for the process.
Backend& CpuBackend();

// A CUDA backend on device `device` computing in `compute_dtype` (F32, BF16
// or F16). It becomes the current backend of the calling thread (the one
// CUDA kernels use); call MakeCurrent() on another thread before using it
// there. Errors: kUnavailable when the build has no CUDA backend or the
// device is missing (naming the CUDA call); kInvalidArgument for another
// compute dtype.
StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(int device, DType compute_dtype);

// Makes `backend` (a CUDA backend) the current one of the calling thread.
// A no-op for the CPU backend.
Status MakeCurrent(Backend& backend);

}  // namespace tessera::kernels
