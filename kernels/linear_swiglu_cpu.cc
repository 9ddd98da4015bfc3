// LinearSiluMul (kernels/linear_swiglu.h): the shared checks, the dispatch, and the CPU's form,
// the two calls with a temporary gate_up.
#include <string>

#include "kernels/dispatch.h"
#include "kernels/linear.h"
#include "kernels/linear_swiglu.h"
#include "kernels/swiglu.h"

namespace tessera::kernels {

namespace {

Status CheckLinearSiluMul(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& act) {
  const bool same = w.device() == x.device() && act.device() == x.device() &&
                    w.dtype() == x.dtype() && act.dtype() == x.dtype();
  if (x.rank() != 2 || w.rank() != 2 || act.rank() != 2 || !same || w.dim(1) != x.dim(1) ||
      w.dim(0) % 2 != 0 || act.dim(0) != x.dim(0) || 2 * act.dim(1) != w.dim(0))
    return InvalidArgument("linear+swiglu: x " + x.Describe() + ", fused gate|up weight " +
                           w.Describe() + " and act " + act.Describe() +
                           " must be [tokens, k], [2 * inter, k] and [tokens, inter] of one "
                           "dtype on one device");
  if (bias.defined() && (bias.rank() != 1 || bias.dim(0) != w.dim(0) || bias.dtype() != w.dtype() ||
                         bias.device() != w.device()))
    return InvalidArgument("linear+swiglu: bias " + bias.Describe() + " for weight " +
                           w.Describe() + ": it must be [2 * inter] of the weight's dtype");
  return Status::Ok();
}

}  // namespace

bool LinearSiluMulFuses(const Tensor& x, const Tensor& w) {
#ifdef TESSERA_WITH_CUDA
  return x.device() == Device::kCUDA && cuda::LinearSiluMulFuses(x, w);
#else
  (void)x;
  (void)w;
  return false;
#endif
}

Status LinearSiluMul(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& act) {
  TESSERA_RETURN_IF_ERROR(CheckLinearSiluMul(x, w, bias, act));
  return TESSERA_DISPATCH(x.device(), LinearSiluMul, x, w, bias, act);
}

namespace cpu {

Status LinearSiluMul(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& act) {
  Tensor gate_up = Tensor::Empty({x.dim(0), w.dim(0)}, x.dtype());
  TESSERA_RETURN_IF_ERROR(Linear(x, w, bias, gate_up));
  return SiluMulFused(gate_up, act);
}

}  // namespace cpu

}  // namespace tessera::kernels
