// Tensor-level CUDA logits processing: checks, upload of the entries, then
// kernels/logit_adjust_cuda.cu.
#include "kernels/cuda_context.h"
#include "kernels/cuda_launch.h"
#include "kernels/dispatch.h"
#include "kernels/logit_adjust.h"

namespace tessera::kernels::cuda {

Status AdjustLogits(Tensor& logits, const std::vector<LogitAdjustment>& entries) {
  TESSERA_RETURN_IF_ERROR(CheckLogitAdjustments(logits, entries));
  if (logits.device() != Device::kCUDA)
    return InvalidArgument("adjusted logits " + logits.Describe() + " are not on a CUDA device");
  if (entries.empty()) return Status::Ok();
  TESSERA_ASSIGN_OR_RETURN(Context * ctx, Current());
  const int64_t bytes = static_cast<int64_t>(entries.size() * sizeof(LogitAdjustment));
  // Alive until the stream synchronises (the sampler's token copy).
  TESSERA_ASSIGN_OR_RETURN(Tensor dev, ctx->UploadBytes(entries.data(), static_cast<size_t>(bytes),
                                                        {bytes}, DType::kU8));
  TESSERA_CUDA_LAUNCH_CHECK(LaunchAdjustLogits(logits.data<float>(), logits.dim(1),
                                               static_cast<const LogitAdjustment*>(dev.raw()),
                                               static_cast<int64_t>(entries.size()), ctx->stream()),
                            "AdjustLogitsKernel");
  TESSERA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(ctx->stream()));
  return Status::Ok();
}

Status MaskLogits(Tensor& logits, const std::vector<int64_t>& rows,
                  const std::vector<uint32_t>& words, int64_t words_per_row) {
  TESSERA_RETURN_IF_ERROR(CheckLogitMasks(logits, rows, words, words_per_row));
  if (logits.device() != Device::kCUDA)
    return InvalidArgument("masked logits " + logits.Describe() + " are not on a CUDA device");
  if (rows.empty()) return Status::Ok();
  TESSERA_ASSIGN_OR_RETURN(Context * ctx, Current());
  const int64_t row_bytes = static_cast<int64_t>(rows.size() * sizeof(int64_t));
  const int64_t word_bytes = static_cast<int64_t>(words.size() * sizeof(uint32_t));
  // Alive until the stream synchronises below.
  TESSERA_ASSIGN_OR_RETURN(
      Tensor dev_rows,
      ctx->UploadBytes(rows.data(), static_cast<size_t>(row_bytes), {row_bytes}, DType::kU8));
  TESSERA_ASSIGN_OR_RETURN(
      Tensor dev_words,
      ctx->UploadBytes(words.data(), static_cast<size_t>(word_bytes), {word_bytes}, DType::kU8));
  TESSERA_CUDA_LAUNCH_CHECK(
      LaunchMaskLogits(logits.data<float>(), logits.dim(1),
                       static_cast<const int64_t*>(dev_rows.raw()),
                       static_cast<const uint32_t*>(dev_words.raw()), words_per_row,
                       static_cast<int64_t>(rows.size()), ctx->stream()),
      "MaskLogitsKernel");
  TESSERA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(ctx->stream()));
  return Status::Ok();
}

}  // namespace tessera::kernels::cuda
