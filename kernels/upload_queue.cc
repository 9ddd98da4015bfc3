// The synchronous UploadQueue (kernels/upload_queue.h) and Backend's default NewUploadQueue.
#include "kernels/upload_queue.h"

#include <string>
#include <vector>

#include "kernels/backend.h"

namespace tessera::kernels {

namespace {

class SyncUploadQueue final : public UploadQueue {
 public:
  SyncUploadQueue(Backend& backend, const UploadOptions& options)
      : backend_(backend), staging_(options.staging_bytes) {}

  size_t staging_bytes() const override { return staging_.size(); }

  Status Enqueue(Tensor dst, size_t dst_offset, size_t bytes, Fill fill) override {
    TESSERA_RETURN_IF_ERROR(first_error_);
    if (bytes > staging_.size() || dst_offset + bytes > dst.nbytes())
      return InvalidArgument("upload: " + std::to_string(bytes) + " bytes at offset " +
                             std::to_string(dst_offset) + " of " + dst.Describe() +
                             " (staging buffers hold " + std::to_string(staging_.size()) + ")");
    Status s = fill(staging_.data());
    if (s.ok()) {
      Tensor at = Tensor::Wrap(static_cast<char*>(dst.raw()) + dst_offset,
                               {static_cast<int64_t>(bytes)}, DType::kU8, dst.device(), nullptr);
      s = backend_.CopyFromHost(at, staging_.data(), bytes);
    }
    if (!s.ok()) first_error_ = s;
    return s;
  }

  Status Finish() override { return first_error_; }

 private:
  Backend& backend_;
  std::vector<char> staging_;
  Status first_error_;
};

}  // namespace

std::unique_ptr<UploadQueue> NewSyncUploadQueue(Backend& backend, const UploadOptions& options) {
  return std::make_unique<SyncUploadQueue>(backend, options);
}

StatusOr<std::unique_ptr<UploadQueue>> Backend::NewUploadQueue(const UploadOptions& options) {
  return NewSyncUploadQueue(*this, options);
}

}  // namespace tessera::kernels
