#include <cmath>
#include <string>

#include "kernels/dispatch.h"
#include "kernels/swiglu.h"

namespace tessera::kernels {

Status SiluMul(const Tensor& gate, const Tensor& up, Tensor& out) {
  return TESSERA_DISPATCH(gate.device(), SiluMul, gate, up, out);
}

Status SiluMulFused(const Tensor& gate_up, Tensor& out) {
  return TESSERA_DISPATCH(gate_up.device(), SiluMulFused, gate_up, out);
}

Status CheckGluFused(const Tensor& gate_up, const Tensor& out, const char* what) {
  TESSERA_RETURN_IF_ERROR(ExpectFloatTensor(gate_up, 2, gate_up.device(), what));
  if (out.rank() != 2 || out.dim(0) != gate_up.dim(0) || 2 * out.dim(1) != gate_up.dim(1) ||
      out.dtype() != gate_up.dtype() || out.device() != gate_up.device())
    return InvalidArgument(std::string(what) + ": gate_up " + gate_up.Describe() +
                           " (gate|up) vs out " + out.Describe() +
                           ": want out [tokens, gate_up columns / 2] of its dtype");
  const auto* g = static_cast<const char*>(gate_up.raw());
  const auto* o = static_cast<const char*>(out.raw());
  if (out.nbytes() > 0 && o < g + gate_up.nbytes() && g < o + out.nbytes())
    return InvalidArgument(std::string(what) + ": out " + out.Describe() + " overlaps gate_up " +
                           gate_up.Describe());
  return Status::Ok();
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

Status SiluMulFused(const Tensor& gate_up, Tensor& out) {
  TESSERA_RETURN_IF_ERROR(CheckGluFused(gate_up, out, "swiglu (fused gate|up)"));
  TESSERA_RETURN_IF_ERROR(ExpectTensor(gate_up, 2, DType::kF32, "swiglu gate_up"));
  const int64_t rows = out.dim(0), n = out.dim(1);
  for (int64_t r = 0; r < rows; ++r) {
    const float* g = gate_up.data<float>() + r * 2 * n;
    const float* u = g + n;
    float* o = out.data<float>() + r * n;
    for (int64_t i = 0; i < n; ++i) o[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
  }
  return Status::Ok();
}

}  // namespace cpu
}  // namespace tessera::kernels
