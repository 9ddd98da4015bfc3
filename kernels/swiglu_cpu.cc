#include <cmath>

#include "kernels/dispatch.h"
#include "kernels/swiglu.h"

namespace tessera::kernels {

Status SiluMul(const Tensor& gate, const Tensor& up, Tensor& out) {
  return TESSERA_DISPATCH(gate.device(), SiluMul, gate, up, out);
}

namespace cpu {

Status SiluMul(const Tensor& gate, const Tensor& up, Tensor& out) {
  TESSERA_RETURN_IF_ERROR(ExpectTensor(gate, 2, DType::kF32, "swiglu gate"));
  if (up.shape() != gate.shape() || out.shape() != gate.shape())
    return InvalidArgument("swiglu: gate " + gate.Describe() + ", up " + up.Describe() + ", out " +
                           out.Describe() + " do not agree");
  const float* g = gate.data<float>();
  const float* u = up.data<float>();
  float* o = out.data<float>();
  for (int64_t i = 0; i < gate.numel(); ++i) o[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
  return Status::Ok();
}

}  // namespace cpu
}  // namespace tessera::kernels
