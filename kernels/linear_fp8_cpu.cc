#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>

#include "common/base/env_switch.h"
#include "kernels/dispatch.h"
#include "kernels/linear.h"
#include "kernels/linear_fp8.h"

namespace tessera::kernels {

Status LinearFp8(const Tensor& x, const Tensor& w, const Fp8Scales& scales, const Tensor& bias,
                 Tensor& y, Tensor& scratch) {
  return TESSERA_DISPATCH(x.device(), LinearFp8, x, w, scales, bias, y, scratch);
}

bool Fp8QuantizesActivations(int64_t m, int64_t n, int64_t k, const Fp8Scales& scales) {
  static const bool enabled = EnvSwitchOn("TESSERA_CUDA_FP8_GEMM");
  return enabled && m > kFp8SkinnyMaxTokens && scales.scales.defined() &&
         scales.scales.dim(1) == 1 && n % 16 == 0 && k % 16 == 0;
}

namespace {
std::atomic<int64_t> g_tensor_core_fallbacks{0};
}  // namespace

int64_t Fp8TensorCoreFallbacks() { return g_tensor_core_fallbacks.load(); }
void CountFp8TensorCoreFallback() { g_tensor_core_fallbacks.fetch_add(1); }

int64_t Fp8ScratchElements(Device device, DType dtype, int64_t m, int64_t n, int64_t k,
                           const Fp8Scales& scales) {
  if (device == Device::kCPU) return n * k;
  if (m <= kFp8SkinnyMaxTokens) return 0;
  if (!Fp8QuantizesActivations(m, n, k, scales)) return n * k;
  const int64_t bytes = (m * k + 15) / 16 * 16 + m * static_cast<int64_t>(sizeof(float));
  const auto elem = static_cast<int64_t>(DTypeSize(dtype));
  return (bytes + elem - 1) / elem;
}

Status CheckFp8Operands(const Tensor& w, const Fp8Scales& s, const Tensor& scratch,
                        DType scratch_dtype, int64_t scratch_elements) {
  TESSERA_RETURN_IF_ERROR(ExpectTensor(w, 2, DType::kF8E4M3, "fp8 linear weight"));
  TESSERA_RETURN_IF_ERROR(ExpectTensor(s.scales, 2, DType::kF32, "fp8 linear scales"));
  const int64_t n = w.dim(0), k = w.dim(1);
  if (s.scales.dim(0) != n || s.cols_per_scale < 1 || s.col_phase < 0 ||
      s.scales.dim(1) * s.cols_per_scale < k + s.col_phase)
    return InvalidArgument("fp8 linear: scales " + s.scales.Describe() + " (" +
                           std::to_string(s.cols_per_scale) + " columns each, phase " +
                           std::to_string(s.col_phase) + ") do not cover the weight " +
                           w.Describe());
  if (s.scales.device() != w.device())
    return InvalidArgument("fp8 linear: scales " + s.scales.Describe() +
                           " must be on the weight's device");
  if (!scratch.defined()) return Status::Ok();
  if (scratch.device() != w.device() || scratch.dtype() != scratch_dtype ||
      scratch.numel() < scratch_elements)
    return InvalidArgument("fp8 linear: scratch " + scratch.Describe() + " must hold " +
                           std::to_string(scratch_elements) + " " + DTypeName(scratch_dtype) +
                           " elements");
  return Status::Ok();
}

namespace cpu {

Status LinearFp8(const Tensor& x, const Tensor& w, const Fp8Scales& scales, const Tensor& bias,
                 Tensor& y, Tensor& scratch) {
  TESSERA_RETURN_IF_ERROR(CheckFp8Operands(w, scales, scratch, DType::kF32, w.numel()));
  if (!scratch.defined()) return InvalidArgument("fp8 linear: the CPU needs a scratch buffer");
  const int64_t n = w.dim(0), k = w.dim(1), sc = scales.scales.dim(1);
  const auto* wv = static_cast<const uint8_t*>(w.raw());
  const float* s = scales.scales.data<float>();
  float* out = scratch.data<float>();
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < k; ++c)
      out[r * k + c] = F8E4M3ToF32(wv[r * k + c]) *
                       s[r * sc + (sc == 1 ? 0 : (c + scales.col_phase) / scales.cols_per_scale)];
  return Linear(x, scratch.Reshape({scratch.numel()}).Slice0(0, n * k).Reshape({n, k}), bias, y);
}

}  // namespace cpu
}  // namespace tessera::kernels
