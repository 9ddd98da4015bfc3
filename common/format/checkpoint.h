// Checkpoint: the weights of a Hugging Face model directory, for loading
// whole tensors or the tp/pp shard of a tensor a rank owns.
//
// A model directory holds either `model.safetensors` (one file) or
// `model.safetensors.index.json` plus the shard files it names
// ({"weight_map": {"<tensor>": "<shard file>", ...}}). When both exist the
// single file wins, as in transformers. Open() checks that every shard the
// index names exists and is a valid safetensors file, and that every tensor the
// index names lies in the shard it says.
//
// ReadSlice never materialises a full tensor and never touches the mmap: it
// preads exactly the bytes of the requested slice, straight into `dst` when no
// conversion is needed, else through a reused staging buffer of at most
// `staging_bytes` (default 4 MiB) that is converted into `dst` chunk by chunk.
// A column-parallel shard (rows of W[out, in]) is one contiguous read; a
// row-parallel shard (columns of W[out, in]) is one pread per row, and a full
// width range is read as one run. Process RSS therefore grows only by `dst`
// and the staging buffers.
//
// Thread-safety: immutable after Open(); Find/Has/TensorNames/ReadSlice/
// ReadAll/BytesRead may be called concurrently (each concurrent ReadSlice takes
// its own staging buffer from a mutex-guarded pool).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/base/dtype.h"
#include "common/base/status.h"
#include "common/format/safetensors.h"

namespace tessera {

class Checkpoint {
 public:
  static constexpr size_t kDefaultStagingBytes = size_t{4} << 20;

  // Opens `model_dir`. `staging_bytes` bounds each conversion staging buffer
  // (rounded down to a multiple of 8, at least 8). Errors: kNotFound naming the
  // directory when it holds neither file, or naming the missing shard and the
  // index; kNotFound naming tensor, shard and index when the shard lacks a
  // tensor the index assigns to it; kInvalidArgument for a malformed index
  // (naming the index file and key) or shard (see SafetensorsFile::Open).
  static StatusOr<std::unique_ptr<Checkpoint>> Open(const std::string& model_dir,
                                                    size_t staging_bytes = kDefaultStagingBytes);

  ~Checkpoint();
  Checkpoint(const Checkpoint&) = delete;
  Checkpoint& operator=(const Checkpoint&) = delete;

  const std::string& dir() const { return dir_; }

  // Where tensor `name` lies. Errors: kNotFound naming the tensor and directory.
  StatusOr<TensorInfo> Find(const std::string& name) const;
  bool Has(const std::string& name) const;
  // All tensor names, sorted.
  std::vector<std::string> TensorNames() const;

  // Reads elements [begin, end) along dimension `dim` of tensor `name` into
  // `dst`, row-major, with shape = the tensor's shape except shape[dim] =
  // end - begin. For W[rows, cols]: dim 0 selects rows [begin, end) (dst is
  // [end-begin, cols]), dim 1 selects columns (dst is [rows, end-begin]); a
  // 1-D tensor allows dim 0; higher ranks follow the same rule.
  // `out_dtype` is kF32 (source F32, F16, BF16 or F8_E4M3, converted exactly as
  // ConvertToF32) or the source dtype (raw copy). `dst` must hold
  // (numel of the slice) * DTypeSize(out_dtype) bytes.
  // Errors: kNotFound (tensor, directory); kInvalidArgument naming the tensor
  // and its shape for a bad `dim`, or naming the tensor and dtypes for an
  // unsupported conversion; kOutOfRange naming the tensor and its shape when
  // !(0 <= begin <= end <= shape[dim]); kIoError from pread.
  Status ReadSlice(const std::string& name, int dim, int64_t begin, int64_t end, DType out_dtype,
                   void* dst) const;
  // The part of that slice at outer indices [outer_begin, outer_end), where the outer index
  // runs over the product of the dimensions before `dim` (for dim 1 of W[rows, cols]: rows
  // [outer_begin, outer_end) of the column slice): the loader reads a shard in chunks of whole
  // rows this way. dim 0 has one outer index (0..1). Errors: as ReadSlice, and kOutOfRange
  // naming the tensor when !(0 <= outer_begin <= outer_end <= outer size).
  Status ReadSliceRows(const std::string& name, int dim, int64_t begin, int64_t end,
                       int64_t outer_begin, int64_t outer_end, DType out_dtype, void* dst) const;
  // ReadSlice within one entry of a stacked tensor: elements [begin, end)
  // along dimension `dim` (>= 1) of the sub-tensor name[index] (index along
  // dim 0), e.g. expert e's rows or columns of a transformers 5
  // gate_up_proj [experts, 2*intermediate, hidden]. `dst` holds the slice of
  // name[index], shaped like it except along `dim`. Errors: as ReadSlice,
  // and kOutOfRange naming the tensor when index is outside dim 0;
  // kInvalidArgument for a tensor of rank < 2 or dim 0.
  Status ReadSliceAt(const std::string& name, int64_t index, int dim, int64_t begin, int64_t end,
                     DType out_dtype, void* dst) const;
  // The whole tensor (ReadSlice over all of dim 0; scalars too).
  Status ReadAll(const std::string& name, DType out_dtype, void* dst) const;

  // Total bytes pread from tensor data since Open (all shards). Headers read
  // during Open are not counted.
  int64_t BytesRead() const;

 private:
  struct Location {
    const SafetensorsFile* file;
    const TensorInfo* info;
  };
  // `count` byte runs of `run_bytes` each, the i-th at file offset
  // `offset + i * stride`; their concatenation is the slice in output order.
  struct Runs {
    uint64_t offset;
    uint64_t run_bytes;
    uint64_t stride;
    uint64_t count;
  };

  Checkpoint() = default;
  Status OpenSingle(const std::string& path);
  Status OpenIndex(const std::string& index_path);
  StatusOr<Location> Locate(const std::string& name) const;
  Status ReadRuns(const Location& loc, const Runs& runs, DType out_dtype, void* dst) const;
  std::unique_ptr<uint8_t[]> TakeStaging() const;
  void ReturnStaging(std::unique_ptr<uint8_t[]> buf) const;

  std::string dir_;
  size_t staging_bytes_ = kDefaultStagingBytes;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, Location> tensors_;  // by tensor name

  mutable std::mutex staging_mu_;
  // Free staging buffers of staging_bytes_ each; guarded by staging_mu_.
  mutable std::vector<std::unique_ptr<uint8_t[]>> staging_pool_;
};

}  // namespace tessera
