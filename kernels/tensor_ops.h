// Small data-movement operations of the forward pass that are not layers:
// residual/bias adds, scaling (Gemma's embedding multiplier), picking the
// rows that need logits, placing one rank's vocab slice of the logits, and
// splitting the fused q|k|v projection's output.
//
// Every tensor is row-major and contiguous; all operands of one call are on
// one device. Thread-safety: stateless.
#pragma once

#include <cstdint>
#include <vector>

#include "common/base/status.h"
#include "common/base/tensor.h"

namespace tessera::kernels {

// acc[t, i] += x[t, i] + bias[i], either term skipped when undefined.
// Shapes: acc, x [rows, cols]; bias [cols]; one dtype (F32 on the CPU; F32,
// BF16 or F16 on CUDA, added in fp32 and rounded once).
// Errors: kInvalidArgument naming the shapes.
Status AddInPlace(Tensor& acc, const Tensor& x, const Tensor& bias);

// x[i] *= scale, with scale first rounded to x's dtype (as transformers
// multiplies Gemma's embeddings by embed_scale.to(weight.dtype)), computed
// in fp32 and rounded once. Shapes: any; dtypes F32 (CPU) or F32, BF16, F16
// (CUDA). Errors: kInvalidArgument for an undefined tensor or a scale that
// is not finite.
Status ScaleInPlace(Tensor& x, float scale);

// out[i, :] = src[rows[i], :]. Shapes: src [n, cols], out [rows.size(), cols],
// same dtype (any). Errors: kInvalidArgument on shapes, kOutOfRange for a
// row outside [0, n).
Status GatherRows(const Tensor& src, const std::vector<int64_t>& rows, Tensor& out);

// dst[r, dst_col0 + j] = src[r, src_col0 + j] for j < cols and every row r.
// Shapes: src [rows, src_cols], dst [rows, dst_cols], same dtype (any).
// Errors: kOutOfRange when a column range leaves its tensor.
Status CopyColumns(const Tensor& src, int64_t src_col0, Tensor& dst, int64_t dst_col0,
                   int64_t cols);

// The columns of src split, in order, into three tensors: a[r, j] = src[r,
// j], b[r, j] = src[r, a_cols + j], c[r, j] = src[r, a_cols + b_cols + j]
// (the fused q|k|v GEMM's output [tokens, q + k + v] into q, k and v).
// Shapes: src [rows, a_cols + b_cols + c_cols], a [rows, a_cols], b [rows,
// b_cols], c [rows, c_cols] (any rank-2 views), one dtype (any), one device;
// the outputs must not overlap src. Errors: kInvalidArgument naming the
// shapes.
Status SplitColumns(const Tensor& src, Tensor& a, Tensor& b, Tensor& c);

namespace cpu {
Status AddInPlace(Tensor& acc, const Tensor& x, const Tensor& bias);
Status ScaleInPlace(Tensor& x, float scale);
Status GatherRows(const Tensor& src, const std::vector<int64_t>& rows, Tensor& out);
Status CopyColumns(const Tensor& src, int64_t src_col0, Tensor& dst, int64_t dst_col0,
                   int64_t cols);
Status SplitColumns(const Tensor& src, Tensor& a, Tensor& b, Tensor& c);
}  // namespace cpu
namespace cuda {
Status AddInPlace(Tensor& acc, const Tensor& x, const Tensor& bias);
Status ScaleInPlace(Tensor& x, float scale);
Status GatherRows(const Tensor& src, const std::vector<int64_t>& rows, Tensor& out);
Status CopyColumns(const Tensor& src, int64_t src_col0, Tensor& dst, int64_t dst_col0,
                   int64_t cols);
Status SplitColumns(const Tensor& src, Tensor& a, Tensor& b, Tensor& c);
}  // namespace cuda

// Shared argument checks (every device). Errors as above.
Status CheckAddInPlace(const Tensor& acc, const Tensor& x, const Tensor& bias);
Status CheckScaleInPlace(const Tensor& x, float scale);
Status CheckGatherRows(const Tensor& src, const std::vector<int64_t>& rows, const Tensor& out);
Status CheckCopyColumns(const Tensor& src, int64_t src_col0, const Tensor& dst, int64_t dst_col0,
                        int64_t cols);
Status CheckSplitColumns(const Tensor& src, const Tensor& a, const Tensor& b, const Tensor& c);

}  // namespace tessera::kernels
