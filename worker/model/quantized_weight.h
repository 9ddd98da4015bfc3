// QuantizedWeight: one rank's slice of an FP8 linear projection, values and
// scales, as read from an FP8 checkpoint or made by online quantization
// (common/format/quantization.h has the formats).
//
// This record is the seam between the FP8 formats and the backends
// (docs/architecture.md, "FP8 weights"): the weight loader builds one for
// every quantized projection slice a rank owns, then hands it to the
// backend's policy. The CPU backend (and, until the FP8 GEMMs land, every
// backend) dequantizes it into the dense fp32 slot of StageWeights at load
// (DequantizeToF32); a backend with FP8 GEMMs keeps `values` and `scales`
// beside the dense record instead.
//
// Slices and scales: the slice is rows [row_origin, row_origin + rows) and
// columns [col_origin, col_origin + cols) of the whole checkpoint tensor
// W[out, in]. A rank reads only its own weight rows (or its column range)
// and only the scale rows (or columns) that cover them:
//  - kBlock (block_rows x block_cols): `scales` is [sr, sc], the scale
//    blocks [row_origin / block_rows, ceil((row_origin + rows) / block_rows))
//    x [col_origin / block_cols, ceil((col_origin + cols) / block_cols)).
//    A tp split that cuts through a block is handled exactly: local element
//    (i, j) uses scales[(row_origin + i) / block_rows - row_origin / block_rows]
//    [(col_origin + j) / block_cols - col_origin / block_cols], the block the
//    element has in the unsharded tensor, so every rank dequantizes its rows
//    to the same values as tp 1. BlockAligned() tells whether the slice's
//    edges fall on block boundaries (what a block-scaled FP8 GEMM needs).
//  - kChannel: `scales` is [rows, 1], the scales of the slice's rows.
//  - kTensor: `scales` is [1].
// W[r, c] = e4m3(values[r, c]) x scale (the scale multiplies, for HF fp8's
// "weight_scale_inv" as for compressed-tensors' "weight_scale").
//
// Thread-safety: a plain value of host tensors.
#pragma once

#include <cstdint>

#include "common/base/status.h"
#include "common/base/tensor.h"
#include "common/format/checkpoint.h"
#include "common/format/quantization.h"
#include "common/model/shard_spec.h"

namespace tessera {

struct QuantizedWeight {
  Tensor values;  // [rows, cols] F8E4M3, host
  Tensor scales;  // F32, host: see the file comment for the shape per kind
  WeightScaleKind scale_kind = WeightScaleKind::kChannel;
  int64_t block_rows = 0, block_cols = 0;  // kBlock only
  int64_t row_origin = 0, col_origin = 0;  // the slice's first row and column in W
  // Static per-tensor activation scale (x is quantized as e4m3(x / it));
  // 0 = dynamic per-token activation scales.
  float input_scale = 0.0f;

  int64_t rows() const { return values.dim(0); }
  int64_t cols() const { return values.dim(1); }
  // Bytes of values and scales: what a backend keeping FP8 holds for it.
  int64_t nbytes() const;
  // kBlock: whether row_origin, col_origin and the slice's ends (unless they
  // are W's ends, `full_rows`/`full_cols`) are multiples of the block.
  bool BlockAligned(int64_t full_rows, int64_t full_cols) const;
};

// Reads shard `t` of an FP8 checkpoint: its rows (or columns) of the
// F8_E4M3 weight `t.name` and the scale rows (or columns) covering them,
// plus the static input scale when `q` has one. Never reads another rank's
// weight bytes. Errors: kNotFound naming the missing scale tensor and the
// checkpoint directory; kInvalidArgument naming the scale tensor, its shape
// and the expected one; kInvalidArgument when `t.name` is not F8_E4M3 or not
// 2-D; I/O errors from the checkpoint.
StatusOr<QuantizedWeight> ReadQuantizedShard(const Checkpoint& checkpoint, const TensorShard& t,
                                             const QuantizationConfig& q);

// Online FP8 (model.quantization = "fp8"): reads shard `t` of a dense
// (F32/F16/BF16) weight and quantizes it per output channel, s_r = max_c
// |W[r, c]| / 448 over the WHOLE row r of W (1 for a zero row), values =
// e4m3(W / s_r), so every tp gives the same values. A row-parallel shard
// (columns of W) finds its rows' maxima by reading whole rows in chunks of
// at most the shard's own element count: the rank never holds more than its
// shard's worth of W, even transiently. Errors: those of Checkpoint::ReadSlice.
StatusOr<QuantizedWeight> QuantizeShardOnline(const Checkpoint& checkpoint, const TensorShard& t);

// W's slice in fp32: dst[i * cols + j] = F8E4M3ToF32(values[i, j]) x its
// scale (fp32 multiply, as transformers dequantizes in fp32).
// Precondition: dst holds rows() * cols() floats.
void DequantizeToF32(const QuantizedWeight& w, float* dst);

// The scales of `w` as a backend keeping FP8 holds them (kernels/linear_fp8.h
// Fp8Scales): one row of ScaleColumnsPerRow(w) fp32 scales per weight row,
// column j covering the slice's columns [j * block_cols - phase, (j + 1) *
// block_cols - phase) with phase = ScaleColumnPhase(w) (col_origin mod
// block_cols); one column for per-channel and per-tensor scales. A block
// scale is repeated for each row of its block (4 bytes per row and block of
// columns: 1/32 of the FP8 bytes at 128 x 128 blocks), so that fused q|k|v
// and gate|up rows and tp slices that cut a block need no row alignment.
// Precondition: dst holds rows() * ScaleColumnsPerRow(w) floats.
int64_t ScaleColumnsPerRow(const QuantizedWeight& w);
int64_t ScaleColumnPhase(const QuantizedWeight& w);
void ScalesPerRow(const QuantizedWeight& w, float* dst);

}  // namespace tessera
