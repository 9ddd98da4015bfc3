// WriteSafetensors: writes tensors to one `.safetensors` file (the format read
// by SafetensorsFile; see common/format/safetensors.h for the layout).
//
// Tensors are laid out back to back in the order given; the JSON header is
// padded with spaces to a multiple of 8 bytes so that the byte buffer starts
// 8-byte aligned, as the reference implementation does. The file is written
// to `<path>.tmp` and renamed, so readers never see a half-written file.
//
// Thread-safety: a free function; concurrent calls must use distinct paths.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/base/dtype.h"
#include "common/base/status.h"

namespace tessera {

struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;  // row-major; empty for a scalar
  std::vector<uint8_t> bytes;  // product(shape) * DTypeSize(dtype) bytes, little-endian
};

// Encodes `values` as little-endian `dtype` elements (F32, F16 or BF16;
// F16/BF16 round to nearest even). Precondition: dtype is a float dtype.
std::vector<uint8_t> EncodeFloats(DType dtype, const std::vector<float>& values);

// Writes `tensors` (and "__metadata__" when `metadata` is not empty) to `path`.
// Errors: kInvalidArgument naming the tensor when its byte count does not
// match its shape and dtype, when a dimension is negative, or when two entries
// share a name (or one is called "__metadata__"); kIoError naming `path` when
// the file cannot be written.
Status WriteSafetensors(const std::string& path, const std::vector<SafetensorsEntry>& tensors,
                        const std::map<std::string, std::string>& metadata = {});

}  // namespace tessera
