#include "kernels/kv_quant.h"

#include <cmath>
#include <string>

#include "common/base/dtype.h"

namespace tessera::kernels {

void QuantizeKvRow(const float* src, float scale, int64_t n, uint8_t* dst) {
  for (int64_t i = 0; i < n; ++i) dst[i] = F32ToF8E4M3(src[i] / scale);
}

void DequantizeKvRow(const uint8_t* src, float scale, int64_t n, float* dst) {
  for (int64_t i = 0; i < n; ++i) dst[i] = F8E4M3ToF32(src[i]) * scale;
}

Status CheckKvScale(float scale, std::string_view what) {
  if (std::isfinite(scale) && scale > 0.0f) return Status::Ok();
  return InvalidArgument(std::string(what) + ": fp8 KV cache scale " + std::to_string(scale) +
                         " is not a finite number > 0");
}

}  // namespace tessera::kernels
