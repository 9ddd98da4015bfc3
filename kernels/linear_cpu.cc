#include <cblas.h>

#include "kernels/dispatch.h"
#include "kernels/linear.h"

namespace tessera::kernels {

Status Linear(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& y) {
  return TESSERA_DISPATCH(x.device(), Linear, x, w, bias, y);
}

namespace cpu {

Status Linear(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& y) {
  TESSERA_RETURN_IF_ERROR(ExpectTensor(x, 2, DType::kF32, "linear input"));
  TESSERA_RETURN_IF_ERROR(ExpectTensor(w, 2, DType::kF32, "linear weight"));
  TESSERA_RETURN_IF_ERROR(ExpectTensor(y, 2, DType::kF32, "linear output"));
  const int64_t m = x.dim(0), k = x.dim(1), n = w.dim(0);
  if (w.dim(1) != k || y.dim(0) != m || y.dim(1) != n)
    return InvalidArgument("linear: x " + x.Describe() + " @ w^T " + w.Describe() + " -> y " +
                           y.Describe() + " do not agree");
  if (bias.defined() && (bias.rank() != 1 || bias.dim(0) != n))
    return InvalidArgument("linear: bias " + bias.Describe() + " does not match w " + w.Describe());
  if (m == 0) return Status::Ok();
  float* out = y.data<float>();
  float beta = 0.0f;
  if (bias.defined()) {
    const float* b = bias.data<float>();
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) out[i * n + j] = b[j];
    beta = 1.0f;
  }
  if (m == 1) {
    // Decode at batch 1 is a matrix-vector product: y = W x (+ b).
    cblas_sgemv(CblasRowMajor, CblasNoTrans, static_cast<int>(n), static_cast<int>(k), 1.0f,
                w.data<float>(), static_cast<int>(k), x.data<float>(), 1, beta, out, 1);
    return Status::Ok();
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m), static_cast<int>(n),
              static_cast<int>(k), 1.0f, x.data<float>(), static_cast<int>(k), w.data<float>(),
              static_cast<int>(k), beta, out, static_cast<int>(n));
  return Status::Ok();
}

}  // namespace cpu
}  // namespace tessera::kernels
