#include "worker/model/shard_upload.h"

#include <algorithm>
#include <string>

namespace tessera {

namespace {

int64_t Rows(const TensorShard& t) { return t.local_shape.empty() ? 0 : t.local_shape[0]; }

}  // namespace

bool ShardUploadApplies(const TensorShard& t, const TensorInfo& info, DType dtype,
                        size_t staging_bytes) {
  if (info.dtype != dtype || t.local_shape.empty() || t.split_dim < -1 || t.split_dim > 1)
    return false;
  const int64_t rows = Rows(t);
  if (rows <= 0) return false;
  if (t.split_dim == 0 && t.end - t.begin != rows) return false;  // zero-padded vocab rows
  const size_t row_bytes = static_cast<size_t>(t.local_numel() / rows) * DTypeSize(dtype);
  return row_bytes > 0 && row_bytes <= staging_bytes;
}

Status UploadShard(const Checkpoint& checkpoint, const TensorShard& t, const Tensor& dst,
                   kernels::UploadQueue& queue) {
  TESSERA_ASSIGN_OR_RETURN(TensorInfo info, checkpoint.Find(t.name));
  if (!ShardUploadApplies(t, info, dst.dtype(), queue.staging_bytes()))
    return InvalidArgument("upload of tensor '" + t.name + "': the shard cannot be read in rows");
  const int64_t rows = Rows(t);
  const size_t row_bytes = static_cast<size_t>(t.local_numel() / rows) * DTypeSize(dst.dtype());
  if (row_bytes * static_cast<size_t>(rows) != dst.nbytes())
    return InvalidArgument("upload of tensor '" + t.name + "' into " + dst.Describe() +
                           ": not the shard's " +
                           std::to_string(row_bytes * static_cast<size_t>(rows)) + " bytes");
  const int64_t per_chunk =
      std::max<int64_t>(1, static_cast<int64_t>(queue.staging_bytes() / row_bytes));
  const Checkpoint* ckpt = &checkpoint;
  const TensorShard* shard = &t;
  const DType dtype = dst.dtype();
  for (int64_t r0 = 0; r0 < rows; r0 += per_chunk) {
    const int64_t r1 = std::min(rows, r0 + per_chunk);
    auto fill = [ckpt, shard, dtype, r0, r1](void* staging) -> Status {
      Status s;
      switch (shard->split_dim) {
        case 1:  // rows [r0, r1) of the column range
          s = ckpt->ReadSliceRows(shard->name, 1, shard->begin, shard->end, r0, r1, dtype, staging);
          break;
        case 0:
          s = ckpt->ReadSlice(shard->name, 0, shard->begin + r0, shard->begin + r1, dtype, staging);
          break;
        default:
          s = ckpt->ReadSlice(shard->name, 0, r0, r1, dtype, staging);
      }
      return s.ok() ? s : s.WithContext("loading tensor '" + shard->name + "'");
    };
    TESSERA_RETURN_IF_ERROR(queue.Enqueue(dst, static_cast<size_t>(r0) * row_bytes,
                                          static_cast<size_t>(r1 - r0) * row_bytes, fill));
  }
  return Status::Ok();
}

}  // namespace tessera
