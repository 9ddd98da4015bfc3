// Bit-level float8 e4m3fn conversion shared by the CUDA kernels and their CPU test
// (kernels/fp8_gemm_cuda.cu, tests/unit/kernels/fp8_bits_test.cc).
//
// Fp8QuadScaled: four e4m3fn weights, the bytes of `w` from the low byte up, as fp32 values
// times 2^-120 (kFp8QuadUnscale is what they are short of), by integer operations alone. The
// sign goes to bit 31 and the seven exponent and mantissa bits to bits 26..20, so e4m3's 4-bit
// exponent (bias 7, OCP "OFP8 Formats for Deep Learning" v1.0) lands in fp32's 8-bit exponent
// field (bias 127): 2^(e - 127) (1 + m / 8) = 2^-120 * 2^(e - 7) (1 + m / 8). Subnormal e4m3
// (e = 0) maps to subnormal fp32 by the same factor, so every finite code is exact as long as
// the consumer keeps fp32 subnormals (no -ftz). e4m3fn's NaN codes (0x7f, 0xff) read as
// +-480 * 2^-120; a checkpoint holds no NaN weight.
//
// Why: on sm_90 a float conversion (F2F, F2FP) issues at 16 lanes per clock per SM, a quarter
// of the integer ALU's 64 (CUDA C++ Programming Guide, "Arithmetic Instructions", throughput
// table). The hardware path (e4m3x2 -> f16x2, then f16 -> f32: 1.5 conversions per weight)
// caps a weight stream near 16 bytes per clock per SM; these ~3 ALU operations per weight do
// not. Thread-safe (pure).
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define TESSERA_FP8_HD __host__ __device__ __forceinline__
#else
#define TESSERA_FP8_HD inline
#endif

namespace tessera::kernels {

inline constexpr float kFp8QuadUnscale = 0x1p120f;

TESSERA_FP8_HD float Fp8BitsAsFloat(uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
#endif
}

TESSERA_FP8_HD void Fp8QuadScaled(uint32_t w, float out[4]) {
  // Bytes 1 and 3 already sit where a bf16 pair keeps its signs (bits 15, 31): shift their
  // magnitudes down 4. Bytes 0 and 2 first move up 8 bits.
  const uint32_t odd = (w & 0x80008000u) | ((w >> 4) & 0x07f007f0u);
  const uint32_t even = ((w << 8) & 0x80008000u) | ((w << 4) & 0x07f007f0u);
  out[0] = Fp8BitsAsFloat(even << 16);
  out[1] = Fp8BitsAsFloat(odd << 16);
  out[2] = Fp8BitsAsFloat(even & 0xffff0000u);
  out[3] = Fp8BitsAsFloat(odd & 0xffff0000u);
}

}  // namespace tessera::kernels
