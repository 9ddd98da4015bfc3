#include <cmath>

#include "kernels/dispatch.h"
#include "kernels/geglu.h"
#include "kernels/swiglu.h"

namespace tessera::kernels {

Status GeluTanhMul(const Tensor& gate, const Tensor& up, Tensor& out) {
  return TESSERA_DISPATCH(gate.device(), GeluTanhMul, gate, up, out);
}

Status GeluTanhMulFused(const Tensor& gate_up, Tensor& out) {
  return TESSERA_DISPATCH(gate_up.device(), GeluTanhMulFused, gate_up, out);
}

namespace cpu {

namespace {

// PyTorch's constants: kBeta = sqrt(2) * (2 / sqrt(pi)) * 0.5 = sqrt(2 / pi).
constexpr float kBeta = 0.7978845608028654f;
constexpr float kKappa = 0.044715f;

float GeluTanh(float x) { return 0.5f * x * (1.0f + std::tanh(kBeta * (x + kKappa * x * x * x))); }

}  // namespace

Status GeluTanhMul(const Tensor& gate, const Tensor& up, Tensor& out) {
  TESSERA_RETURN_IF_ERROR(ExpectTensor(gate, 2, DType::kF32, "geglu gate"));
  if (up.shape() != gate.shape() || out.shape() != gate.shape() || up.dtype() != DType::kF32 ||
      out.dtype() != DType::kF32)
    return InvalidArgument("geglu: gate " + gate.Describe() + ", up " + up.Describe() + ", out " +
                           out.Describe() + " do not agree");
  const float* g = gate.data<float>();
  const float* u = up.data<float>();
  float* o = out.data<float>();
  for (int64_t i = 0; i < gate.numel(); ++i) o[i] = GeluTanh(g[i]) * u[i];
  return Status::Ok();
}

Status GeluTanhMulFused(const Tensor& gate_up, Tensor& out) {
  TESSERA_RETURN_IF_ERROR(CheckGluFused(gate_up, out, "geglu (fused gate|up)"));
  TESSERA_RETURN_IF_ERROR(ExpectTensor(gate_up, 2, DType::kF32, "geglu gate_up"));
  const int64_t rows = out.dim(0), n = out.dim(1);
  for (int64_t r = 0; r < rows; ++r) {
    const float* g = gate_up.data<float>() + r * 2 * n;
    const float* u = g + n;
    float* o = out.data<float>() + r * n;
    for (int64_t i = 0; i < n; ++i) o[i] = GeluTanh(g[i]) * u[i];
  }
  return Status::Ok();
}

}  // namespace cpu
}  // namespace tessera::kernels
