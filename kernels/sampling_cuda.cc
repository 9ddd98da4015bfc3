// Tensor-level CUDA sampling: argmax for every row, then sort-and-draw for
// the non-greedy rows (kernels/sampling_cuda.cu); the tokens come back to the
// host, the step's one synchronisation.
#include <algorithm>
#include <cstdint>

#include "kernels/cuda_context.h"
#include "kernels/cuda_launch.h"
#include "kernels/dispatch.h"
#include "kernels/sampling.h"

namespace tessera::kernels::cuda {

static_assert(kNonFiniteRowToken == kNonFiniteLogitsToken);

Status SampleTokens(const Tensor& logits, const std::vector<SampleRow>& rows,
                    std::vector<int32_t>& tokens) {
  TESSERA_RETURN_IF_ERROR(ExpectTensor(logits, 2, DType::kF32, "sampling logits"));
  const int64_t n = static_cast<int64_t>(rows.size()), vocab = logits.dim(1);
  if (logits.dim(0) != n || logits.device() != Device::kCUDA)
    return InvalidArgument("sampling: logits " + logits.Describe() + " for " + std::to_string(n) +
                           " rows");
  tokens.assign(rows.size(), 0);
  if (n == 0) return Status::Ok();
  TESSERA_ASSIGN_OR_RETURN(Context * ctx, Current());
  TESSERA_ASSIGN_OR_RETURN(Tensor out, ctx->Allocate({n}, DType::kI32));
  TESSERA_CUDA_LAUNCH_CHECK(
      LaunchArgmax(logits.data<float>(), n, vocab, out.data<int32_t>(), ctx->stream()),
      "ArgmaxKernel");
  const bool any_sampled =
      std::any_of(rows.begin(), rows.end(), [](const SampleRow& r) { return !r.greedy(); });
  Tensor params, scratch;  // alive until the synchronisation below
  // The segmented sort indexes rows x vocab elements with int32 (cub's
  // segment offsets): 8191 rows of Gemma's 262144-entry vocab at most.
  if (any_sampled && n * vocab > INT32_MAX)
    return Unimplemented("sampling: " + std::to_string(n) + " rows x vocab " +
                         std::to_string(vocab) +
                         " exceed the 2^31 elements the CUDA sampler sorts in one call");
  if (any_sampled) {
    std::vector<SampleRowDev> host(rows.size());
    for (size_t i = 0; i < rows.size(); ++i)
      host[i] = {rows[i].uniform, rows[i].temperature,      rows[i].top_p,
                 rows[i].top_k,   rows[i].greedy() ? 1 : 0, rows[i].min_p};
    TESSERA_ASSIGN_OR_RETURN(
        params,
        ctx->UploadBytes(host.data(), host.size() * sizeof(SampleRowDev),
                         {static_cast<int64_t>(host.size() * sizeof(SampleRowDev))}, DType::kU8));
    const size_t bytes = SampleScratchBytes(n, vocab);
    TESSERA_ASSIGN_OR_RETURN(scratch, ctx->Allocate({static_cast<int64_t>(bytes)}, DType::kU8));
    TESSERA_CUDA_LAUNCH_CHECK(
        LaunchSampleRows(logits.data<float>(), n, vocab,
                         static_cast<const SampleRowDev*>(params.raw()), out.data<int32_t>(),
                         scratch.raw(), bytes, ctx->stream()),
        "SampleKernel");
  }
  TESSERA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(tokens.data(), out.raw(),
                                               sizeof(int32_t) * tokens.size(),
                                               cudaMemcpyDeviceToHost, ctx->stream()));
  TESSERA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(ctx->stream()));
  return Status::Ok();
}

StatusOr<Tensor> RowsToHost(const Tensor& logits, const std::vector<int64_t>& rows) {
  TESSERA_RETURN_IF_ERROR(CheckHostRows(logits, rows));
  if (logits.device() != Device::kCUDA)
    return InvalidArgument("logits rows: " + logits.Describe() + " are not on a CUDA device");
  const int64_t vocab = logits.dim(1);
  Tensor out = Tensor::Empty({static_cast<int64_t>(rows.size()), vocab});
  if (rows.empty()) return out;
  TESSERA_ASSIGN_OR_RETURN(Context * ctx, Current());
  for (size_t i = 0; i < rows.size(); ++i)
    TESSERA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
        out.data<float>() + static_cast<int64_t>(i) * vocab, logits.data<float>() + rows[i] * vocab,
        sizeof(float) * static_cast<size_t>(vocab), cudaMemcpyDeviceToHost, ctx->stream()));
  TESSERA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(ctx->stream()));
  return out;
}

// The rows that ask for log-probabilities come to the host (one vocab-sized
// copy each) and are computed there by LogprobsRowCpu, so both backends
// return the same values for the same logits.
Status TokenLogprobs(const Tensor& logits, const std::vector<LogprobRow>& rows,
                     std::vector<SampledToken>& out) {
  TESSERA_RETURN_IF_ERROR(CheckLogprobRows(logits, rows));
  if (logits.device() != Device::kCUDA)
    return InvalidArgument("logprobs: logits " + logits.Describe() + " are not on a CUDA device");
  out.clear();
  if (rows.empty()) return Status::Ok();
  const int64_t vocab = logits.dim(1);
  TESSERA_ASSIGN_OR_RETURN(Context * ctx, Current());
  std::vector<float> host(rows.size() * static_cast<size_t>(vocab));
  for (size_t i = 0; i < rows.size(); ++i)
    TESSERA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
        host.data() + i * static_cast<size_t>(vocab), logits.data<float>() + rows[i].row * vocab,
        sizeof(float) * static_cast<size_t>(vocab), cudaMemcpyDeviceToHost, ctx->stream()));
  TESSERA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(ctx->stream()));
  out.reserve(rows.size());
  for (size_t i = 0; i < rows.size(); ++i)
    out.push_back(LogprobsRowCpu(host.data() + i * static_cast<size_t>(vocab), vocab, rows[i].token,
                                 rows[i].top));
  return Status::Ok();
}

}  // namespace tessera::kernels::cuda
