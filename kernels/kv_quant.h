// Element conversion of the fp8 KV cache (common/format/kv_cache_dtype.h,
// kernels/paged_attention.h KvCacheLayer): float8 e4m3fn with one fp32 scale
// per layer for K and one for V, as vLLM's fp8 KV cache (per-tensor
// k_scale / v_scale).
//
//   quantize:   q = F32ToF8E4M3(x / scale)  (round to nearest even, |x / scale|
//               beyond 448 saturates to +-448, NaN stays NaN; common/base/dtype.h)
//   dequantize: x' = F8E4M3ToF32(q) * scale  (fp32)
//
// The CPU attention and the CUDA kernels use these formulas; the CUDA side's
// conversion (cuda_fp8.h, __NV_SATFINITE) rounds the same way.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string_view>

#include "common/base/status.h"

namespace tessera::kernels {

// dst[i] = F32ToF8E4M3(src[i] / scale), i < n.
void QuantizeKvRow(const float* src, float scale, int64_t n, uint8_t* dst);
// dst[i] = F8E4M3ToF32(src[i]) * scale, i < n.
void DequantizeKvRow(const uint8_t* src, float scale, int64_t n, float* dst);
// Errors: kInvalidArgument naming `what` when `scale` is not finite and > 0.
Status CheckKvScale(float scale, std::string_view what);

}  // namespace tessera::kernels
