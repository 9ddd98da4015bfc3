// The CUDA UploadQueue (kernels/upload_queue.h): `threads` fill threads, 2 x threads pinned
// staging buffers (cudaHostAlloc), one non-blocking copy stream. A fill thread takes a task and
// a free buffer, waits for the buffer's last copy (its event), runs the fill, issues the
// cudaMemcpyAsync and records the buffer's event: while one buffer's bytes cross PCIe, the
// other threads read the next ones from the page cache.
#include <algorithm>
#include <condition_variable>
#include <deque>
#include <string>
#include <thread>
#include <vector>

#include "common/base/mutex.h"
#include "kernels/cuda_context.h"
#include "kernels/upload_queue.h"

namespace tessera::kernels::cuda {

namespace {

struct Staging {
  void* host = nullptr;
  cudaEvent_t copied = nullptr;
};

struct Task {
  Tensor dst;
  size_t offset = 0, bytes = 0;
  UploadQueue::Fill fill;
};

class PinnedUploadQueue final : public UploadQueue {
 public:
  PinnedUploadQueue(int device, size_t staging_bytes)
      : device_(device), staging_bytes_(staging_bytes) {}

  ~PinnedUploadQueue() override {
    (void)Finish();
    {
      MutexLock lock(&mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    for (std::thread& t : threads_) t.join();
    if (stream_) cudaStreamSynchronize(stream_);
    for (Staging& s : buffers_) {
      if (s.copied) cudaEventDestroy(s.copied);
      if (s.host) cudaFreeHost(s.host);
    }
    if (stream_) cudaStreamDestroy(stream_);
  }

  // Allocates the buffers and the stream and starts the threads.
  Status Start(int threads) {
    TESSERA_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    TESSERA_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    buffers_.resize(static_cast<size_t>(2 * threads));
    for (Staging& s : buffers_) {
      TESSERA_CUDA_RETURN_IF_ERROR(cudaHostAlloc(&s.host, staging_bytes_, cudaHostAllocDefault));
      TESSERA_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&s.copied, cudaEventDisableTiming));
    }
    {
      MutexLock lock(&mu_);
      for (Staging& s : buffers_) free_.push_back(&s);
    }
    max_waiting_ = static_cast<size_t>(2 * threads);
    for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Run(); });
    return Status::Ok();
  }

  size_t staging_bytes() const override { return staging_bytes_; }

  Status Enqueue(Tensor dst, size_t dst_offset, size_t bytes, Fill fill) override {
    if (bytes > staging_bytes_ || dst_offset + bytes > dst.nbytes())
      return InvalidArgument("upload: " + std::to_string(bytes) + " bytes at offset " +
                             std::to_string(dst_offset) + " of " + dst.Describe() +
                             " (staging buffers hold " + std::to_string(staging_bytes_) + ")");
    MutexLock lock(&mu_);
    cv_.wait(mu_, [&]() REQUIRES(mu_) { return tasks_.size() < max_waiting_ || !error_.ok(); });
    if (!error_.ok()) return error_;
    tasks_.push_back(Task{std::move(dst), dst_offset, bytes, std::move(fill)});
    ++pending_;
    cv_.notify_all();
    return Status::Ok();
  }

  Status Finish() override {
    {
      MutexLock lock(&mu_);
      cv_.wait(mu_, [&]() REQUIRES(mu_) { return pending_ == 0; });
      if (!error_.ok()) return error_;
    }
    if (stream_) TESSERA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    return Status::Ok();
  }

 private:
  void Run() {
    const cudaError_t set = cudaSetDevice(device_);
    for (;;) {
      Task task;
      Staging* buf = nullptr;
      {
        MutexLock lock(&mu_);
        cv_.wait(mu_,
                 [&]() REQUIRES(mu_) { return stopping_ || (!tasks_.empty() && !free_.empty()); });
        if (tasks_.empty() || free_.empty()) return;  // stopping (Finish emptied the queue)
        task = std::move(tasks_.front());
        tasks_.pop_front();
        buf = free_.back();
        free_.pop_back();
        if (!error_.ok()) task.fill = nullptr;  // dropped: an earlier task failed
      }
      cv_.notify_all();  // room for Enqueue
      Status s =
          set == cudaSuccess ? Status::Ok() : CudaError(set, "cudaSetDevice", __FILE__, __LINE__);
      if (s.ok() && task.fill) s = Copy(task, *buf);
      MutexLock lock(&mu_);
      if (!s.ok() && error_.ok()) error_ = s;
      free_.push_back(buf);
      --pending_;
      cv_.notify_all();
    }
  }

  Status Copy(Task& task, Staging& buf) {
    TESSERA_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(buf.copied));  // its last copy is done
    TESSERA_RETURN_IF_ERROR(task.fill(buf.host));
    TESSERA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(static_cast<char*>(task.dst.raw()) + task.offset,
                                                 buf.host, task.bytes, cudaMemcpyHostToDevice,
                                                 stream_));
    TESSERA_CUDA_RETURN_IF_ERROR(cudaEventRecord(buf.copied, stream_));
    return Status::Ok();
  }

  const int device_;
  const size_t staging_bytes_;
  cudaStream_t stream_ = nullptr;
  std::vector<Staging> buffers_;  // fixed after Start
  std::vector<std::thread> threads_;
  size_t max_waiting_ = 0;
  Mutex mu_;
  std::condition_variable_any cv_;
  std::deque<Task> tasks_ GUARDED_BY(mu_);
  std::vector<Staging*> free_ GUARDED_BY(mu_);
  int64_t pending_ GUARDED_BY(mu_) = 0;  // enqueued, not yet copied or dropped
  bool stopping_ GUARDED_BY(mu_) = false;
  Status error_ GUARDED_BY(mu_);
};

}  // namespace

StatusOr<std::unique_ptr<UploadQueue>> NewPinnedUploadQueue(Context& ctx,
                                                            const UploadOptions& options) {
  // The queue copies on its own stream: whatever the backend's stream has pending (the
  // allocations the tasks write into) completes first.
  TESSERA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(ctx.stream()));
  auto queue = std::make_unique<PinnedUploadQueue>(ctx.device(), options.staging_bytes);
  TESSERA_RETURN_IF_ERROR(queue->Start(std::max(1, options.threads)));
  return std::unique_ptr<UploadQueue>(std::move(queue));
}

}  // namespace tessera::kernels::cuda
