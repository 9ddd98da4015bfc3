// A tensor shard read from the checkpoint into a device tensor in chunks of whole rows, through
// a kernels::UploadQueue: the fill threads pread the chunks into pinned staging buffers while
// earlier chunks copy to the GPU (issue #34, loading at page-cache speed). Only the rank's bytes
// are read, as ReadSlice reads them: rows [begin, end) of a column-parallel shard, the column
// range of each row of a row-parallel one.
//
// Shapes: `dst` holds t.local_shape in the checkpoint's dtype (raw bytes, no conversion).
// Thread-safety: call from the loader's thread; the queue's threads read the checkpoint
// (Checkpoint reads are thread-safe) and the shard, which must outlive queue.Finish().
#pragma once

#include "common/base/status.h"
#include "common/base/tensor.h"
#include "common/format/checkpoint.h"
#include "common/model/shard_spec.h"
#include "kernels/upload_queue.h"

namespace tessera {

// Whether UploadShard takes this shard: rank >= 1, split_dim -1, 0 or 1, no zero-padding rows
// (a vocab-parallel shard past the vocabulary), the checkpoint's dtype equal to `dtype`, and one
// row within the queue's staging buffer.
bool ShardUploadApplies(const TensorShard& t, const TensorInfo& info, DType dtype,
                        size_t staging_bytes);

// Enqueues t's slice into `dst` in chunks of at most queue.staging_bytes() bytes of whole
// rows. The data is in place once queue.Finish() returns OK. Errors: kInvalidArgument when
// ShardUploadApplies is false or dst's bytes are not the shard's (naming the tensor); the
// queue's errors; read errors come from Finish, naming the tensor.
Status UploadShard(const Checkpoint& checkpoint, const TensorShard& t, const Tensor& dst,
                   kernels::UploadQueue& queue);

}  // namespace tessera
