#include <cmath>

#include "kernels/dispatch.h"
#include "kernels/geglu.h"

namespace tessera::kernels {

Status GeluTanhMul(const Tensor& gate, const Tensor& up, Tensor& out) {
  return TESSERA_DISPATCH(gate.device(), GeluTanhMul, gate, up, out);
}

namespace cpu {

Status GeluTanhMul(const Tensor& gate, const Tensor& up, Tensor& out) {
  TESSERA_RETURN_IF_ERROR(ExpectTensor(gate, 2, DType::kF32, "geglu gate"));
  if (up.shape() != gate.shape() || out.shape() != gate.shape() || up.dtype() != DType::kF32 ||
      out.dtype() != DType::kF32)
    return InvalidArgument("geglu: gate " + gate.Describe() + ", up " + up.Describe() + ", out " +
                           out.Describe() + " do not agree");
  // PyTorch's constants: kBeta = sqrt(2) * (2 / sqrt(pi)) * 0.5 = sqrt(2 / pi).
  constexpr float kBeta = 0.7978845608028654f;
  constexpr float kKappa = 0.044715f;
  const float* g = gate.data<float>();
  const float* u = up.data<float>();
  float* o = out.data<float>();
  for (int64_t i = 0; i < gate.numel(); ++i) {
    const float x = g[i];
    const float inner = kBeta * (x + kKappa * x * x * x);
    o[i] = 0.5f * x * (1.0f + std::tanh(inner)) * u[i];
  }
  return Status::Ok();
}

}  // namespace cpu
}  // namespace tessera::kernels
