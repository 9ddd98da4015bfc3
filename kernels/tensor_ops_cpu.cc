#include <cmath>
#include <cstring>
#include <string>

#include "kernels/dispatch.h"
#include "kernels/tensor_ops.h"

namespace tessera::kernels {

Status CheckAddInPlace(const Tensor& acc, const Tensor& x, const Tensor& bias) {
  TESSERA_RETURN_IF_ERROR(ExpectFloatTensor(acc, 2, acc.device(), "add accumulator"));
  if (x.defined() &&
      (x.shape() != acc.shape() || x.dtype() != acc.dtype() || x.device() != acc.device()))
    return InvalidArgument("add: x " + x.Describe() + " vs accumulator " + acc.Describe());
  if (bias.defined() && (bias.rank() != 1 || bias.dim(0) != acc.dim(1) ||
                         bias.dtype() != acc.dtype() || bias.device() != acc.device()))
    return InvalidArgument("add: bias " + bias.Describe() + " vs accumulator " + acc.Describe());
  return Status::Ok();
}

Status CheckScaleInPlace(const Tensor& x, float scale) {
  if (!x.defined()) return InvalidArgument("scale: undefined tensor");
  if (!std::isfinite(scale)) return InvalidArgument("scale: " + std::to_string(scale));
  return Status::Ok();
}

Status CheckGatherRows(const Tensor& src, const std::vector<int64_t>& rows, const Tensor& out) {
  if (!src.defined() || !out.defined() || src.rank() != 2 || out.rank() != 2 ||
      src.dtype() != out.dtype() || src.device() != out.device() || src.dim(1) != out.dim(1) ||
      out.dim(0) != static_cast<int64_t>(rows.size()))
    return InvalidArgument("gather rows: src " + src.Describe() + ", " +
                           std::to_string(rows.size()) + " rows, out " + out.Describe());
  for (size_t i = 0; i < rows.size(); ++i)
    if (rows[i] < 0 || rows[i] >= src.dim(0))
      return OutOfRange("gather rows: row " + std::to_string(rows[i]) + " (index " +
                        std::to_string(i) + ") outside src " + src.Describe());
  return Status::Ok();
}

Status CheckCopyColumns(const Tensor& src, int64_t src_col0, const Tensor& dst, int64_t dst_col0,
                        int64_t cols) {
  if (!src.defined() || !dst.defined() || src.rank() != 2 || dst.rank() != 2 ||
      src.dtype() != dst.dtype() || src.device() != dst.device() || src.dim(0) != dst.dim(0))
    return InvalidArgument("copy columns: src " + src.Describe() + ", dst " + dst.Describe());
  if (cols < 0 || src_col0 < 0 || dst_col0 < 0 || src_col0 + cols > src.dim(1) ||
      dst_col0 + cols > dst.dim(1))
    return OutOfRange("copy columns: " + std::to_string(cols) + " columns from " +
                      std::to_string(src_col0) + " of " + src.Describe() + " to " +
                      std::to_string(dst_col0) + " of " + dst.Describe());
  return Status::Ok();
}

namespace {

// Whether the bytes of x and y overlap (both defined, on one device).
bool Overlap(const Tensor& x, const Tensor& y) {
  const auto* xb = static_cast<const char*>(x.raw());
  const auto* yb = static_cast<const char*>(y.raw());
  return x.nbytes() > 0 && y.nbytes() > 0 && xb < yb + y.nbytes() && yb < xb + x.nbytes();
}

}  // namespace

Status CheckSplitColumns(const Tensor& src, const Tensor& a, const Tensor& b, const Tensor& c) {
  const std::string what = "split columns: src " + src.Describe() + " into " + a.Describe() + ", " +
                           b.Describe() + ", " + c.Describe();
  if (!src.defined() || src.rank() != 2) return InvalidArgument(what);
  for (const Tensor* t : {&a, &b, &c}) {
    if (!t->defined() || t->rank() != 2 || t->dim(0) != src.dim(0) || t->dtype() != src.dtype() ||
        t->device() != src.device())
      return InvalidArgument(what);
  }
  if (a.dim(1) + b.dim(1) + c.dim(1) != src.dim(1))
    return InvalidArgument(what + ": the parts' columns do not add up to src's");
  if (Overlap(src, a) || Overlap(src, b) || Overlap(src, c) || Overlap(a, b) || Overlap(a, c) ||
      Overlap(b, c))
    return InvalidArgument(what + ": the tensors overlap");
  return Status::Ok();
}

Status AddInPlace(Tensor& acc, const Tensor& x, const Tensor& bias) {
  return TESSERA_DISPATCH(acc.device(), AddInPlace, acc, x, bias);
}

Status ScaleInPlace(Tensor& x, float scale) {
  TESSERA_RETURN_IF_ERROR(CheckScaleInPlace(x, scale));
  return TESSERA_DISPATCH(x.device(), ScaleInPlace, x, scale);
}

Status GatherRows(const Tensor& src, const std::vector<int64_t>& rows, Tensor& out) {
  return TESSERA_DISPATCH(src.device(), GatherRows, src, rows, out);
}

Status CopyColumns(const Tensor& src, int64_t src_col0, Tensor& dst, int64_t dst_col0,
                   int64_t cols) {
  return TESSERA_DISPATCH(src.device(), CopyColumns, src, src_col0, dst, dst_col0, cols);
}

Status SplitColumns(const Tensor& src, Tensor& a, Tensor& b, Tensor& c) {
  return TESSERA_DISPATCH(src.device(), SplitColumns, src, a, b, c);
}

namespace cpu {

Status AddInPlace(Tensor& acc, const Tensor& x, const Tensor& bias) {
  TESSERA_RETURN_IF_ERROR(CheckAddInPlace(acc, x, bias));
  TESSERA_RETURN_IF_ERROR(ExpectTensor(acc, 2, DType::kF32, "add accumulator"));
  const int64_t rows = acc.dim(0), cols = acc.dim(1);
  float* a = acc.data<float>();
  const float* xp = x.defined() ? x.data<float>() : nullptr;
  const float* b = bias.defined() ? bias.data<float>() : nullptr;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < cols; ++i)
      a[r * cols + i] += (xp ? xp[r * cols + i] : 0.0f) + (b ? b[i] : 0.0f);
  return Status::Ok();
}

Status ScaleInPlace(Tensor& x, float scale) {
  TESSERA_RETURN_IF_ERROR(CheckScaleInPlace(x, scale));
  TESSERA_RETURN_IF_ERROR(ExpectFloatTensor(x, x.rank(), Device::kCPU, "scale input"));
  if (x.dtype() != DType::kF32)
    return InvalidArgument("scale: " + x.Describe() + " (the CPU takes F32)");
  float* v = x.data<float>();
  for (int64_t i = 0; i < x.numel(); ++i) v[i] *= scale;
  return Status::Ok();
}

Status GatherRows(const Tensor& src, const std::vector<int64_t>& rows, Tensor& out) {
  TESSERA_RETURN_IF_ERROR(CheckGatherRows(src, rows, out));
  const size_t row_bytes = static_cast<size_t>(src.dim(1)) * DTypeSize(src.dtype());
  const auto* s = static_cast<const char*>(src.raw());
  auto* o = static_cast<char*>(out.raw());
  for (size_t i = 0; i < rows.size(); ++i)
    std::memmove(o + i * row_bytes, s + static_cast<size_t>(rows[i]) * row_bytes, row_bytes);
  return Status::Ok();
}

Status CopyColumns(const Tensor& src, int64_t src_col0, Tensor& dst, int64_t dst_col0,
                   int64_t cols) {
  TESSERA_RETURN_IF_ERROR(CheckCopyColumns(src, src_col0, dst, dst_col0, cols));
  const size_t e = DTypeSize(src.dtype());
  for (int64_t r = 0; r < src.dim(0); ++r)
    std::memcpy(static_cast<char*>(dst.raw()) + (r * dst.dim(1) + dst_col0) * e,
                static_cast<const char*>(src.raw()) + (r * src.dim(1) + src_col0) * e,
                static_cast<size_t>(cols) * e);
  return Status::Ok();
}

Status SplitColumns(const Tensor& src, Tensor& a, Tensor& b, Tensor& c) {
  TESSERA_RETURN_IF_ERROR(CheckSplitColumns(src, a, b, c));
  const size_t e = DTypeSize(src.dtype());
  const auto* s = static_cast<const char*>(src.raw());
  const size_t src_row = static_cast<size_t>(src.dim(1)) * e;
  for (int64_t r = 0; r < src.dim(0); ++r) {
    const char* row = s + static_cast<size_t>(r) * src_row;
    for (Tensor* t : {&a, &b, &c}) {
      const size_t n = static_cast<size_t>(t->dim(1)) * e;
      std::memcpy(static_cast<char*>(t->raw()) + static_cast<size_t>(r) * n, row, n);
      row += n;
    }
  }
  return Status::Ok();
}

}  // namespace cpu
}  // namespace tessera::kernels
