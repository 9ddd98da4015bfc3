// UploadQueue: host data into a backend's tensors, filled by several host threads while earlier
// fills copy to the device: the weight loader's path to the GPU (issue #34, "weights at 5 GB/s").
//
// A task is (dst tensor, byte offset in it, byte count, fill). `fill(staging)` writes the bytes
// into a host buffer of the queue (on CUDA: page-locked, so the copy is a DMA that overlaps the
// next fill; for the synchronous queue: a plain host buffer); the queue then copies them to dst.
// On CUDA, `threads` fill threads each take a staging buffer of `staging_bytes`, run fill (a
// pread from the page cache, say), issue cudaMemcpyAsync on the queue's own copy stream and
// record an event; a buffer is reused once its event has completed. Host memory held is
// threads x 2 x staging_bytes of pinned buffers, whatever the model's size.
//
// Ordering: nothing is promised about the order of tasks; each task writes its own bytes. After
// Finish() returns OK, every task has been filled and copied, and later work on the backend
// sees the data.
//
// Thread-safety: Enqueue and Finish belong to one thread (the loader's); fills run on the
// queue's threads and may run concurrently with each other, so they must touch only their own
// staging buffer and thread-safe state (Checkpoint reads are).
//
// Errors: Enqueue returns kInvalidArgument when bytes exceed staging_bytes or the range
// exceeds dst; a fill's error, or a device error naming the call, is returned by Finish (the
// first one; later tasks are dropped once one failed) and by later Enqueue calls.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>

#include "common/base/status.h"
#include "common/base/tensor.h"

namespace tessera::kernels {

class Backend;

struct UploadOptions {
  int threads = 4;                     // fill threads (CUDA); the synchronous queue has none
  size_t staging_bytes = 32ull << 20;  // bytes per staging buffer: the largest task
};

class UploadQueue {
 public:
  using Fill = std::function<Status(void* staging)>;
  virtual ~UploadQueue() = default;
  // The largest task, in bytes.
  virtual size_t staging_bytes() const = 0;
  // Queues `fill` to write `bytes` bytes that land at byte `dst_offset` of dst. Blocks while
  // every fill thread is busy and the queue holds 2 x threads waiting tasks.
  virtual Status Enqueue(Tensor dst, size_t dst_offset, size_t bytes, Fill fill) = 0;
  // Waits for every task; the first error of any.
  virtual Status Finish() = 0;
};

// Runs each task on the calling thread: fill into a host buffer, then Backend::CopyFromHost
// (the CPU backend's and any backend's fallback; the CPU tests drive the loader through it).
std::unique_ptr<UploadQueue> NewSyncUploadQueue(Backend& backend, const UploadOptions& options);

}  // namespace tessera::kernels
