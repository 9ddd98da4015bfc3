// Tensor-level CUDA tensor ops: checks, then kernels/tensor_ops_cuda.cu (or
// cudaMemcpy2DAsync for column blocks).
#include "kernels/cuda_context.h"
#include "kernels/cuda_launch.h"
#include "kernels/dispatch.h"
#include "kernels/tensor_ops.h"

namespace tessera::kernels::cuda {

Status AddInPlace(Tensor& acc, const Tensor& x, const Tensor& bias) {
  TESSERA_RETURN_IF_ERROR(CheckAddInPlace(acc, x, bias));
  TESSERA_ASSIGN_OR_RETURN(Context * ctx, Current());
  TESSERA_CUDA_LAUNCH_CHECK(
      LaunchAddInPlace(acc.dtype(), acc.raw(), x.defined() ? x.raw() : nullptr,
                       bias.defined() ? bias.raw() : nullptr, acc.dim(0), acc.dim(1),
                       ctx->stream()),
      "AddKernel");
  return Status::Ok();
}

Status ScaleInPlace(Tensor& x, float scale) {
  TESSERA_RETURN_IF_ERROR(CheckScaleInPlace(x, scale));
  TESSERA_RETURN_IF_ERROR(ExpectFloatTensor(x, x.rank(), Device::kCUDA, "scale input"));
  TESSERA_ASSIGN_OR_RETURN(Context * ctx, Current());
  TESSERA_CUDA_LAUNCH_CHECK(LaunchScale(x.dtype(), x.raw(), x.numel(), scale, ctx->stream()),
                            "ScaleKernel");
  return Status::Ok();
}

Status GatherRows(const Tensor& src, const std::vector<int64_t>& rows, Tensor& out) {
  TESSERA_RETURN_IF_ERROR(CheckGatherRows(src, rows, out));
  if (rows.empty()) return Status::Ok();
  TESSERA_ASSIGN_OR_RETURN(Context * ctx, Current());
  std::vector<int32_t> r32(rows.begin(), rows.end());
  TESSERA_ASSIGN_OR_RETURN(Tensor dev_rows, ctx->UploadI32(r32));
  TESSERA_CUDA_LAUNCH_CHECK(
      LaunchGatherRows(src.raw(), dev_rows.data<int32_t>(), static_cast<int64_t>(rows.size()),
                       static_cast<size_t>(src.dim(1)) * DTypeSize(src.dtype()), out.raw(),
                       ctx->stream()),
      "GatherKernel");
  return Status::Ok();
}

Status CopyColumns(const Tensor& src, int64_t src_col0, Tensor& dst, int64_t dst_col0,
                   int64_t cols) {
  TESSERA_RETURN_IF_ERROR(CheckCopyColumns(src, src_col0, dst, dst_col0, cols));
  if (cols == 0 || src.dim(0) == 0) return Status::Ok();
  TESSERA_ASSIGN_OR_RETURN(Context * ctx, Current());
  const size_t e = DTypeSize(src.dtype());
  TESSERA_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(
      static_cast<char*>(dst.raw()) + dst_col0 * e, static_cast<size_t>(dst.dim(1)) * e,
      static_cast<const char*>(src.raw()) + src_col0 * e, static_cast<size_t>(src.dim(1)) * e,
      static_cast<size_t>(cols) * e, static_cast<size_t>(src.dim(0)), cudaMemcpyDeviceToDevice,
      ctx->stream()));
  return Status::Ok();
}

Status SplitColumns(const Tensor& src, Tensor& a, Tensor& b, Tensor& c) {
  TESSERA_RETURN_IF_ERROR(CheckSplitColumns(src, a, b, c));
  if (src.numel() == 0) return Status::Ok();
  TESSERA_ASSIGN_OR_RETURN(Context * ctx, Current());
  const size_t e = DTypeSize(src.dtype());
  const size_t bytes[3] = {static_cast<size_t>(a.dim(1)) * e, static_cast<size_t>(b.dim(1)) * e,
                           static_cast<size_t>(c.dim(1)) * e};
  void* const dst[3] = {a.raw(), b.raw(), c.raw()};
  TESSERA_CUDA_LAUNCH_CHECK(LaunchSplitColumns(src.raw(), src.dim(0), bytes, dst, ctx->stream()),
                            "SplitColumnsKernel");
  return Status::Ok();
}

}  // namespace tessera::kernels::cuda
