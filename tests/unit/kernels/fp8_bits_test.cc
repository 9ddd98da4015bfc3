// The integer e4m3 conversion of the CUDA FP8 skinny GEMM (kernels/fp8_bits.h): every finite
// code, in every byte position of a word, is the exact e4m3 value times 2^-120, against the
// dtype table (common/base/dtype.h F8E4M3ToF32).
#include "kernels/fp8_bits.h"

#include <gtest/gtest.h>

#include <cmath>

#include "common/base/dtype.h"

namespace tessera::kernels {
namespace {

bool IsNanCode(uint32_t b) { return (b & 0x7fu) == 0x7fu; }

TEST(Fp8Bits, EveryFiniteCodeInEveryByteIsItsValueTimesTwoToTheMinus120) {
  for (uint32_t b = 0; b < 256; ++b) {
    if (IsNanCode(b)) continue;
    const float want = F8E4M3ToF32(static_cast<uint8_t>(b));
    for (int pos = 0; pos < 4; ++pos) {
      // The other bytes hold a different code, so a mask that leaks a neighbour shows.
      const uint32_t other = (b * 37u + 11u) & 0xffu;
      uint32_t w = other * 0x01010101u;
      w = (w & ~(0xffu << (8 * pos))) | (b << (8 * pos));
      float out[4];
      Fp8QuadScaled(w, out);
      EXPECT_EQ(out[pos] * kFp8QuadUnscale, want) << "code 0x" << std::hex << b << " byte " << pos;
      EXPECT_EQ(std::signbit(out[pos]), std::signbit(want)) << "code 0x" << std::hex << b;
      for (int q = 0; q < 4; ++q) {
        if (q == pos || IsNanCode(other)) continue;
        EXPECT_EQ(out[q] * kFp8QuadUnscale, F8E4M3ToF32(static_cast<uint8_t>(other)))
            << "neighbour 0x" << std::hex << other << " byte " << q;
      }
    }
  }
}

TEST(Fp8Bits, SubnormalCodesStayExactAsFp32Subnormals) {
  // e4m3's smallest subnormal, 2^-9, is 2^-129 here: below fp32's smallest normal.
  float out[4];
  Fp8QuadScaled(0x81000001u, out);  // bytes 0x01, 0x00, 0x00, 0x81
  EXPECT_EQ(out[0], std::ldexp(1.0f, -129));
  EXPECT_LT(out[0], std::ldexp(1.0f, -126));
  EXPECT_EQ(out[1], 0.0f);
  EXPECT_EQ(out[3], -std::ldexp(1.0f, -129));
  EXPECT_EQ(out[0] * kFp8QuadUnscale, std::ldexp(1.0f, -9));
}

}  // namespace
}  // namespace tessera::kernels
