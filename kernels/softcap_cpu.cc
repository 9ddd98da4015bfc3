#include <cmath>
#include <string>

#include "kernels/dispatch.h"
#include "kernels/softcap.h"

namespace tessera::kernels {

Status CheckSoftCap(const Tensor& x, float cap) {
  if (!x.defined()) return InvalidArgument("soft-cap: undefined tensor");
  if (!(cap > 0.0f) || !std::isfinite(cap))
    return InvalidArgument("soft-cap: cap " + std::to_string(cap) + " is not positive and finite");
  return Status::Ok();
}

Status SoftCap(Tensor& x, float cap) {
  TESSERA_RETURN_IF_ERROR(CheckSoftCap(x, cap));
  return TESSERA_DISPATCH(x.device(), SoftCap, x, cap);
}

namespace cpu {

Status SoftCap(Tensor& x, float cap) {
  TESSERA_RETURN_IF_ERROR(CheckSoftCap(x, cap));
  if (x.dtype() != DType::kF32)
    return InvalidArgument("soft-cap: " + x.Describe() + " (the CPU takes F32)");
  float* v = x.data<float>();
  for (int64_t i = 0; i < x.numel(); ++i) v[i] = std::tanh(v[i] / cap) * cap;
  return Status::Ok();
}

}  // namespace cpu
}  // namespace tessera::kernels
