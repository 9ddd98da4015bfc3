#include "worker/model/quantized_weight.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/base/parallel_for.h"

namespace tessera {

namespace {

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Elements per thread below which converting a slice stays on one thread.
constexpr int64_t kRowsPerThreadElements = int64_t{1} << 20;

// The scale tensor's expected shape for W of `full` shape; a second accepted
// spelling in `alt` (kChannel [out] beside [out, 1], kTensor [] beside [1]).
std::vector<int64_t> ExpectedScaleShape(const QuantizationConfig& q,
                                        const std::vector<int64_t>& full,
                                        std::vector<int64_t>* alt) {
  switch (q.weight_scale) {
    case WeightScaleKind::kBlock:
      return {CeilDiv(full[0], q.block_rows), CeilDiv(full[1], q.block_cols)};
    case WeightScaleKind::kChannel:
      *alt = {full[0]};
      return {full[0], 1};
    case WeightScaleKind::kTensor:
      *alt = {};
      return {1};
  }
  return {};
}

// The slice [begin, end) of `t` along its split dim, as (row range, column
// range) of W; the whole W for a replicated shard.
void SliceRanges(const TensorShard& t, int64_t* r0, int64_t* r1, int64_t* c0, int64_t* c1) {
  *r0 = 0;
  *r1 = t.full_shape[0];
  *c0 = 0;
  *c1 = t.full_shape[1];
  if (t.split_dim == 0) {
    *r0 = t.begin;
    *r1 = t.end;
  } else if (t.split_dim == 1) {
    *c0 = t.begin;
    *c1 = t.end;
  }
}

// Reads the weight slice [r0, r1) x [c0, c1) of `name` in `dtype` into `dst`.
Status ReadRange(const Checkpoint& ckpt, const TensorShard& t, DType dtype, void* dst) {
  if (t.split_dim < 0) return ckpt.ReadAll(t.name, dtype, dst);
  if (t.end == t.begin) return Status::Ok();
  return ckpt.ReadSlice(t.name, t.split_dim, t.begin, t.end, dtype, dst);
}

Status ReadScales(const Checkpoint& ckpt, const TensorShard& t, const QuantizationConfig& q,
                  QuantizedWeight& w) {
  const std::string scale_name = q.ScaleName(t.name);
  TESSERA_ASSIGN_OR_RETURN(TensorInfo info, ckpt.Find(scale_name));
  std::vector<int64_t> alt = {-1};
  const std::vector<int64_t> want = ExpectedScaleShape(q, t.full_shape, &alt);
  if (info.shape != want && info.shape != alt)
    return InvalidArgument("scale tensor '" + scale_name + "' in " + info.file + " has shape " +
                           info.ShapeString() + " but " + WeightScaleKindName(q.weight_scale) +
                           " scales of '" + t.name + "' " + ShapeToString(t.full_shape) + " need " +
                           ShapeToString(want) +
                           (q.weight_scale == WeightScaleKind::kBlock
                                ? " (weight_block_size " + std::to_string(q.block_rows) + "x" +
                                      std::to_string(q.block_cols) + ")"
                                : std::string()));
  int64_t r0, r1, c0, c1;
  SliceRanges(t, &r0, &r1, &c0, &c1);
  switch (q.weight_scale) {
    case WeightScaleKind::kTensor:
      w.scales = Tensor::Empty({1});
      return ckpt.ReadAll(scale_name, DType::kF32, w.scales.raw());
    case WeightScaleKind::kChannel:
      w.scales = Tensor::Empty({r1 - r0, 1});
      if (r1 == r0) return Status::Ok();
      return ckpt.ReadSlice(scale_name, 0, r0, r1, DType::kF32, w.scales.raw());
    case WeightScaleKind::kBlock: {
      const int64_t sr0 = r0 / q.block_rows, sr1 = r1 > r0 ? CeilDiv(r1, q.block_rows) : sr0;
      const int64_t sc0 = c0 / q.block_cols, sc1 = c1 > c0 ? CeilDiv(c1, q.block_cols) : sc0;
      w.scales = Tensor::Empty({sr1 - sr0, sc1 - sc0});
      if (sr1 == sr0 || sc1 == sc0) return Status::Ok();
      // Only the scale rows (column split: scale columns) over this slice.
      if (t.split_dim == 1)
        return ckpt.ReadSlice(scale_name, 1, sc0, sc1, DType::kF32, w.scales.raw());
      return ckpt.ReadSlice(scale_name, 0, sr0, sr1, DType::kF32, w.scales.raw());
    }
  }
  return Status::Ok();
}

QuantizedWeight EmptyRecord(const TensorShard& t, const QuantizationConfig& q) {
  QuantizedWeight w;
  int64_t r0, r1, c0, c1;
  SliceRanges(t, &r0, &r1, &c0, &c1);
  w.values = Tensor::Empty({r1 - r0, c1 - c0}, DType::kF8E4M3);
  w.scale_kind = q.weight_scale;
  w.block_rows = q.weight_scale == WeightScaleKind::kBlock ? q.block_rows : 0;
  w.block_cols = q.weight_scale == WeightScaleKind::kBlock ? q.block_cols : 0;
  w.row_origin = r0;
  w.col_origin = c0;
  return w;
}

// max_c |W[r, c]| of every row r of the slice, over whole rows of W. A
// row-parallel slice holds only some columns: whole rows are read in chunks
// of at most the slice's element count.
Status RowAbsMax(const Checkpoint& ckpt, const TensorShard& t, const Tensor& slice,
                 std::vector<float>* out) {
  const int64_t rows = slice.dim(0), cols = slice.dim(1);
  out->assign(static_cast<size_t>(rows), 0.0f);
  auto scan = [&](const float* p, int64_t n_rows, int64_t n_cols, int64_t first) {
    for (int64_t i = 0; i < n_rows; ++i) {
      float m = (*out)[static_cast<size_t>(first + i)];
      for (int64_t j = 0; j < n_cols; ++j) m = std::max(m, std::fabs(p[i * n_cols + j]));
      (*out)[static_cast<size_t>(first + i)] = m;
    }
  };
  if (t.split_dim != 1) {
    scan(slice.data<float>(), rows, cols, 0);
    return Status::Ok();
  }
  const int64_t width = t.full_shape[1];
  const int64_t chunk_rows = std::max<int64_t>(1, rows * cols / std::max<int64_t>(1, width));
  Tensor chunk = Tensor::Empty({std::min(chunk_rows, rows), width});
  for (int64_t r = 0; r < rows; r += chunk_rows) {
    const int64_t n = std::min(chunk_rows, rows - r);
    TESSERA_RETURN_IF_ERROR(ckpt.ReadSlice(t.name, 0, r, r + n, DType::kF32, chunk.raw()));
    scan(chunk.data<float>(), n, width, r);
  }
  return Status::Ok();
}

}  // namespace

int64_t QuantizedWeight::nbytes() const {
  return static_cast<int64_t>(values.nbytes() + scales.nbytes());
}

bool QuantizedWeight::BlockAligned(int64_t full_rows, int64_t full_cols) const {
  if (scale_kind != WeightScaleKind::kBlock) return true;
  auto on_edge = [](int64_t x, int64_t block, int64_t full) { return x % block == 0 || x == full; };
  return on_edge(row_origin, block_rows, full_rows) &&
         on_edge(row_origin + rows(), block_rows, full_rows) &&
         on_edge(col_origin, block_cols, full_cols) &&
         on_edge(col_origin + cols(), block_cols, full_cols);
}

StatusOr<QuantizedWeight> ReadQuantizedShard(const Checkpoint& checkpoint, const TensorShard& t,
                                             const QuantizationConfig& q) {
  TESSERA_ASSIGN_OR_RETURN(TensorInfo info, checkpoint.Find(t.name));
  if (info.dtype != DType::kF8E4M3 || info.shape.size() != 2 || t.full_shape.size() != 2)
    return InvalidArgument("tensor '" + t.name + "' in " + info.file + " is " +
                           DTypeName(info.dtype) + " " + info.ShapeString() +
                           ", not a 2-D F8_E4M3 weight");
  QuantizedWeight w = EmptyRecord(t, q);
  TESSERA_RETURN_IF_ERROR(ReadRange(checkpoint, t, DType::kF8E4M3, w.values.raw()));
  TESSERA_RETURN_IF_ERROR(ReadScales(checkpoint, t, q, w));
  if (q.static_input_scale) {
    const std::string name = q.InputScaleName(t.name);
    TESSERA_ASSIGN_OR_RETURN(TensorInfo in, checkpoint.Find(name));
    if (in.NumElements() != 1)
      return InvalidArgument("input scale '" + name + "' in " + in.file + " has shape " +
                             in.ShapeString() + ", not one value (static per-tensor)");
    TESSERA_RETURN_IF_ERROR(checkpoint.ReadAll(name, DType::kF32, &w.input_scale));
  }
  return w;
}

StatusOr<QuantizedWeight> QuantizeShardOnline(const Checkpoint& checkpoint, const TensorShard& t) {
  const QuantizationConfig q = OnlineFp8Quantization();
  QuantizedWeight w = EmptyRecord(t, q);
  const int64_t rows = w.rows(), cols = w.cols();
  Tensor dense = Tensor::Empty({rows, cols});
  TESSERA_RETURN_IF_ERROR(ReadRange(checkpoint, t, DType::kF32, dense.raw()));
  std::vector<float> absmax;
  TESSERA_RETURN_IF_ERROR(RowAbsMax(checkpoint, t, dense, &absmax));
  w.scales = Tensor::Empty({rows, 1});
  float* scale = w.scales.data<float>();
  const float* src = dense.data<float>();
  uint8_t* dst = w.values.data<uint8_t>();
  // Rows in parallel: a 7B model is 6.7 billion conversions.
  ParallelFor(rows, std::max<int64_t>(1, kRowsPerThreadElements / std::max<int64_t>(1, cols)),
              [&](int64_t r0, int64_t r1) {
                for (int64_t i = r0; i < r1; ++i) {
                  const float a = absmax[static_cast<size_t>(i)];
                  const float s = a > 0.0f ? a / kF8E4M3Max : 1.0f;
                  scale[i] = s;
                  for (int64_t j = 0; j < cols; ++j)
                    dst[i * cols + j] = F32ToF8E4M3(src[i * cols + j] / s);
                }
              });
  return w;
}

void DequantizeToF32(const QuantizedWeight& w, float* dst) {
  const int64_t rows = w.rows(), cols = w.cols();
  const uint8_t* v = w.values.data<uint8_t>();
  const float* s = w.scales.data<float>();
  ParallelFor(
      rows, std::max<int64_t>(1, kRowsPerThreadElements / std::max<int64_t>(1, cols)),
      [&](int64_t r0, int64_t r1) {
        for (int64_t i = r0; i < r1; ++i) {
          for (int64_t j = 0; j < cols; ++j) {
            float scale = s[0];
            if (w.scale_kind == WeightScaleKind::kChannel) {
              scale = s[i];
            } else if (w.scale_kind == WeightScaleKind::kBlock) {
              const int64_t br = (w.row_origin + i) / w.block_rows - w.row_origin / w.block_rows;
              const int64_t bc = (w.col_origin + j) / w.block_cols - w.col_origin / w.block_cols;
              scale = s[br * w.scales.dim(1) + bc];
            }
            dst[i * cols + j] = F8E4M3ToF32(v[i * cols + j]) * scale;
          }
        }
      });
}

}  // namespace tessera

namespace tessera {

int64_t ScaleColumnsPerRow(const QuantizedWeight& w) {
  if (w.scale_kind != WeightScaleKind::kBlock) return 1;
  return w.scales.dim(1);
}

int64_t ScaleColumnPhase(const QuantizedWeight& w) {
  return w.scale_kind == WeightScaleKind::kBlock ? w.col_origin % w.block_cols : 0;
}

void ScalesPerRow(const QuantizedWeight& w, float* dst) {
  const int64_t rows = w.rows(), cols = ScaleColumnsPerRow(w);
  const float* s = w.scales.data<float>();
  for (int64_t i = 0; i < rows; ++i) {
    if (w.scale_kind == WeightScaleKind::kTensor) {
      dst[i] = s[0];
    } else if (w.scale_kind == WeightScaleKind::kChannel) {
      dst[i] = s[i];
    } else {
      const int64_t br = (w.row_origin + i) / w.block_rows - w.row_origin / w.block_rows;
      std::copy(s + br * cols, s + (br + 1) * cols, dst + i * cols);
    }
  }
}

}  // namespace tessera
