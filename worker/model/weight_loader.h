// Loads the weights one rank owns, and nothing else, from a checkpoint.
//
// For every tensor in the rank's ShardSpec the loader reads exactly the byte
// ranges of its slice (rows for column- and vocab-parallel tensors, a strided
// column range for row-parallel ones) through Checkpoint::ReadSlice, which
// uses pread with a bounded staging buffer. No full tensor is materialised on
// a rank that needs a slice, so peak RSS stays near the shard's own bytes.
// Tensors are loaded in the backend's compute dtype: read raw when the
// checkpoint already has it, else converted on the host (bf16/f16 -> F32 for
// the CPU backend as they are read; F32/F16 -> BF16 etc. through fp32), then
// uploaded to the backend's device one tensor at a time, so host memory
// holds at most one tensor beyond the staging buffers. On a device backend a
// shard already in the compute dtype skips the host tensor: it is read in
// chunks of rows into pinned staging buffers by several threads while earlier
// chunks copy to the device (worker/model/shard_upload.h,
// kernels/upload_queue.h), so loading runs at page-cache and PCIe speed with
// a fixed amount of pinned host memory.
//
// Fused projections (stage_weights.h): per layer the loader first allocates
// qkv_proj and gate_up_proj (and the fused biases) on the device, then reads
// each part's own slice (q, k, v; gate, up) into its rows, so the rank holds
// every byte once. A checkpoint that fuses them already (Phi-3's qkv_proj,
// gate_up_proj) is read the same way: the ShardSpec names this rank's rows of
// each part.
//
// Thread-safety: a free function; the Checkpoint may be shared (reads use
// pread and are safe to issue concurrently).
#pragma once

#include <functional>
#include <map>
#include <string>
#include <tuple>

#include "common/base/status.h"
#include "common/format/checkpoint.h"
#include "common/format/model_config.h"
#include "common/model/shard_spec.h"
#include "kernels/backend.h"
#include "worker/model/stage_weights.h"

namespace tessera {

// Called after each tensor: (bytes loaded so far, total bytes of the shard).
using LoadProgressFn = std::function<void(int64_t loaded_bytes, int64_t total_bytes)>;

// Tensors a rank already holds, keyed by (checkpoint tensor name, begin,
// end) of the range read along the split dimension (0, 0 for a replicated
// tensor). A shard of a later load with the same key, the same local shape,
// and the backend's device and compute dtype is the same slice (the same
// layer under the same tp slice, where the backend keeps it), so it is taken
// from here instead of being read again (Tensors share their storage; a
// fused tensor whose parts are all held one after the other, as an earlier
// load fused them, is taken whole; a held part of a fused tensor that is not
// is copied into its rows, on the device). The
// tensors live wherever the backend that loaded them put them (host memory
// for the CPU, device memory for CUDA): reuse them only with that backend.
using HeldWeights = std::map<std::tuple<std::string, int64_t, int64_t>, Tensor>;

// `held` (optional): tensors to reuse, see HeldWeights; StageWeights'
// reused_bytes / reused_tensors count what was taken from it.
// Errors: kNotFound naming the tensor and the checkpoint directory when a
// tensor the shard needs is missing; kInvalidArgument when a tensor's shape
// disagrees with config.json (naming both); I/O errors from the checkpoint;
// device allocation and copy errors naming the tensor. `backend` null means
// the CPU backend.
StatusOr<StageWeights> LoadStageWeights(const Checkpoint& checkpoint, const ModelConfig& config,
                                        const ParallelConfig& parallel, const ShardSpec& spec,
                                        const LoadProgressFn& progress = {},
                                        kernels::Backend* backend = nullptr,
                                        const HeldWeights* held = nullptr);

// Every tensor of `weights` (loaded for `spec`), keyed as HeldWeights, for
// the `held` argument of a later load. Errors: kInternal when a shard of
// `spec` has no place in StageWeights (a spec / weights mismatch).
StatusOr<HeldWeights> HoldWeights(const StageWeights& weights, const ShardSpec& spec);

}  // namespace tessera
