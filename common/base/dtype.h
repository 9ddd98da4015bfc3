// Element types of checkpoint and runtime tensors, and conversions to fp32.
//
// Sources: safetensors dtype strings ("F32", "F16", "BF16", "F8_E4M3", ...)
// from the safetensors format spec; IEEE-754 binary16 and bfloat16 (the upper
// 16 bits of a binary32) bit layouts; float8 e4m3fn as OCP's "OFP8 Formats for
// Deep Learning" (v1.0) defines it and torch.float8_e4m3fn stores it: 1 sign,
// 4 exponent (bias 7), 3 mantissa bits, no infinities, S.1111.111 is NaN, the
// largest finite value 448.
//
// Thread-safety: all functions are pure and may be called from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "common/base/status.h"

namespace tessera {

// kF8E4M3: float8 e4m3fn, the element of FP8 checkpoints (common/format/
// quantization.h); held on the host only as quantized weight data, never as
// a compute dtype.
enum class DType : uint8_t { kF32, kF16, kBF16, kI32, kI64, kU8, kF8E4M3 };

// Size of one element in bytes.
size_t DTypeSize(DType dtype);
// "F32", "F16", "BF16", "I32", "I64", "U8", "F8_E4M3": the safetensors spelling.
const char* DTypeName(DType dtype);
// Parses a safetensors dtype string. Errors: kUnimplemented naming the string
// and listing the supported ones.
StatusOr<DType> ParseDType(std::string_view name);

inline float BF16ToF32(uint16_t bits) {
  uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Round-to-nearest-even, NaN preserved (as torch does).
inline uint16_t F32ToBF16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

float F16ToF32(uint16_t bits);
uint16_t F32ToF16(float f);

// float8 e4m3fn -> fp32, exact (every e4m3 value is an fp32 value).
float F8E4M3ToF32(uint8_t bits);
// fp32 -> float8 e4m3fn, round to nearest even, saturating: |f| beyond 448
// gives +-448 (the quantizers clamp first, as torch's does; torch's own cast
// gives NaN there), NaN gives NaN (0x7f with f's sign).
uint8_t F32ToF8E4M3(float f);
inline constexpr float kF8E4M3Max = 448.0f;

// Converts `count` elements of `src` (of type `dtype`) to fp32 in `dst`.
// Precondition: dtype is kF32, kF16, kBF16 or kF8E4M3.
void ConvertToF32(DType dtype, const void* src, float* dst, size_t count);
// Converts `count` fp32 values to `dtype` (round to nearest even) in `dst`.
// Precondition: dtype is kF32, kF16 or kBF16.
void ConvertFromF32(DType dtype, const float* src, void* dst, size_t count);

}  // namespace tessera
