#include "common/base/dtype.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

namespace tessera {

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return 4;
    case DType::kF16:
      return 2;
    case DType::kBF16:
      return 2;
    case DType::kI32:
      return 4;
    case DType::kI64:
      return 8;
    case DType::kU8:
      return 1;
    case DType::kF8E4M3:
      return 1;
  }
  return 0;
}

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "F32";
    case DType::kF16:
      return "F16";
    case DType::kBF16:
      return "BF16";
    case DType::kI32:
      return "I32";
    case DType::kI64:
      return "I64";
    case DType::kU8:
      return "U8";
    case DType::kF8E4M3:
      return "F8_E4M3";
  }
  return "?";
}

StatusOr<DType> ParseDType(std::string_view name) {
  if (name == "F32") return DType::kF32;
  if (name == "F16") return DType::kF16;
  if (name == "BF16") return DType::kBF16;
  if (name == "I32") return DType::kI32;
  if (name == "I64") return DType::kI64;
  if (name == "U8") return DType::kU8;
  if (name == "F8_E4M3") return DType::kF8E4M3;
  return Unimplemented("unknown dtype '" + std::string(name) +
                       "' (supported: F32, F16, BF16, I32, I64, U8, F8_E4M3)");
}

float F16ToF32(uint16_t h) {
  const uint32_t sign = (h >> 15) & 1u;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  float value;
  if (exp == 0) {
    value = std::ldexp(static_cast<float>(mant), -24);  // subnormal or zero
  } else if (exp == 31) {
    value = mant ? std::nanf("") : INFINITY;
  } else {
    value = std::ldexp(static_cast<float>(mant | 0x400u), static_cast<int>(exp) - 25);
  }
  return sign ? -value : value;
}

uint16_t F32ToF16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);   // NaN
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> inf
  if (abs < 0x38800000u) {  // subnormal half (or zero): round to nearest even on 2^-24 grid
    float a;
    std::memcpy(&a, &abs, sizeof a);
    const float scaled = a * 16777216.0f;  // 2^24
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(std::nearbyint(scaled)));
  }
  uint32_t rounded = abs + 0xfffu + ((abs >> 13) & 1u);
  return static_cast<uint16_t>(sign | ((rounded - 0x38000000u) >> 13));
}

namespace {

// e4m3fn by its definition: (-1)^s x 1.mmm x 2^(e-7), subnormals mmm x 2^-9,
// S.1111.111 NaN. The table below is built from it once.
float F8E4M3Value(uint8_t b) {
  const bool negative = (b & 0x80u) != 0;
  const int exp = (b >> 3) & 0xf;
  const int mant = b & 0x7;
  float value;
  if (exp == 0xf && mant == 0x7) {
    value = std::nanf("");
  } else if (exp == 0) {
    value = std::ldexp(static_cast<float>(mant), -9);  // subnormal: mant x 2^-6 / 8
  } else {
    value = std::ldexp(static_cast<float>(8 + mant), exp - 10);  // 1.mmm x 2^(exp-7)
  }
  return negative ? -value : value;
}

const std::array<float, 256>& F8E4M3Table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int b = 0; b < 256; ++b) t[static_cast<size_t>(b)] = F8E4M3Value(static_cast<uint8_t>(b));
    return t;
  }();
  return table;
}

}  // namespace

float F8E4M3ToF32(uint8_t b) { return F8E4M3Table()[b]; }

uint8_t F32ToF8E4M3(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  const auto sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  u &= 0x7fffffffu;
  if (u > 0x7f800000u) return static_cast<uint8_t>(sign | 0x7fu);   // NaN
  if (u >= 0x43e00000u) return static_cast<uint8_t>(sign | 0x7eu);  // >= 448 (and inf): saturate
  if (u < 0x3c800000u) {
    // Below the smallest normal (2^-6) the grid is 2^-9; nearbyint rounds half
    // to even in the default rounding mode. 8 x 2^-9 carries into exp 1, mant 0,
    // which is bits 0x08: the same integer.
    float a;
    std::memcpy(&a, &u, sizeof a);
    return static_cast<uint8_t>(sign | static_cast<uint8_t>(std::nearbyint(a * 512.0f)));
  }
  // Normal: keep 3 of the 23 mantissa bits, rounding to nearest even (a carry
  // out of the mantissa moves into the exponent), and rebias the exponent from
  // 127 to 7: bits = ((E - 120) << 3) | mmm.
  const uint32_t rounded = u + 0x7ffffu + ((u >> 20) & 1u);
  const uint32_t bits = ((rounded >> 20) - (120u << 3)) & 0xffu;
  return static_cast<uint8_t>(sign | std::min<uint32_t>(bits, 0x7eu));
}

void ConvertToF32(DType dtype, const void* src, float* dst, size_t count) {
  switch (dtype) {
    case DType::kF32:
      std::memcpy(dst, src, count * sizeof(float));
      return;
    case DType::kBF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < count; ++i) dst[i] = BF16ToF32(s[i]);
      return;
    }
    case DType::kF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < count; ++i) dst[i] = F16ToF32(s[i]);
      return;
    }
    case DType::kF8E4M3: {
      const auto* s = static_cast<const uint8_t*>(src);
      for (size_t i = 0; i < count; ++i) dst[i] = F8E4M3ToF32(s[i]);
      return;
    }
    default:
      TESSERA_CHECK(false && "ConvertToF32: not a floating dtype");
  }
}

void ConvertFromF32(DType dtype, const float* src, void* dst, size_t count) {
  switch (dtype) {
    case DType::kF32:
      std::memcpy(dst, src, count * sizeof(float));
      return;
    case DType::kBF16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (size_t i = 0; i < count; ++i) d[i] = F32ToBF16(src[i]);
      return;
    }
    case DType::kF16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (size_t i = 0; i < count; ++i) d[i] = F32ToF16(src[i]);
      return;
    }
    default:
      TESSERA_CHECK(false && "ConvertFromF32: not a floating dtype");
  }
}

}  // namespace tessera
