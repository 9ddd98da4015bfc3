// Linear with an FP8 weight on CUDA (kernels/linear_fp8.h): up to
// kSkinnyGemmMaxRows tokens run the FP8 skinny kernel (kernels/fp8_gemm_cuda.cu);
// more run W8A8 on FP8 tensor cores when the weight has one scale per row
// (x quantized per token, then cuBLASLt's e4m3 GEMM with outer-vector
// scales), else dequantize the weight into the scratch buffer and run the
// dense cuBLASLt GEMM on it.
#include <algorithm>
#include <mutex>
#include <string>

#include "common/base/logging.h"
#include "kernels/cuda_context.h"
#include "kernels/cuda_launch.h"
#include "kernels/dispatch.h"
#include "kernels/linear.h"
#include "kernels/linear_fp8.h"
#include "kernels/tensor_ops.h"

namespace tessera::kernels::cuda {

namespace {

cudaDataType_t OutType(DType d) {
  return d == DType::kBF16 ? CUDA_R_16BF : d == DType::kF16 ? CUDA_R_16F : CUDA_R_32F;
}

// The cuBLASLt plan of an e4m3 x e4m3 GEMM y^T [n, m] = w [n, k] xq^T with
// outer-vector scales (one per row of w, one per token), cached in the
// context's plans under the input dtype kF8E4M3. As Linear (kernels/
// linear_cuda.cc): the "TN" GEMM with A = w, B = xq; the bias epilogue when
// cuBLASLt has an algorithm with it, else the bias is added after.
StatusOr<GemmPlan*> Fp8Plan(Context& ctx, int64_t m, int64_t n, int64_t k, DType out, DType bias,
                            const void* w_scales, const void* token_scales) {
  const Context::GemmKey key{m,
                             n,
                             k,
                             static_cast<int>(DType::kF8E4M3),
                             static_cast<int>(out),
                             bias == DType::kU8 ? 0 : 1 + static_cast<int>(bias),
                             16};
  auto it = ctx.gemm_plans().find(key);
  if (it != ctx.gemm_plans().end()) return it->second.get();
  const std::string what = "fp8 linear [" + std::to_string(m) + ", " + std::to_string(k) + "] x [" +
                           std::to_string(n) + ", " + std::to_string(k) + "]^T e4m3 -> " +
                           DTypeName(out);
  auto plan = std::make_unique<GemmPlan>();
  TESSERA_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(
      &plan->a, CUDA_R_8F_E4M3, static_cast<uint64_t>(k), static_cast<uint64_t>(n), k));
  TESSERA_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(
      &plan->b, CUDA_R_8F_E4M3, static_cast<uint64_t>(k), static_cast<uint64_t>(m), k));
  TESSERA_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(
      &plan->c, OutType(out), static_cast<uint64_t>(n), static_cast<uint64_t>(m), n));
  const bool has_bias = bias != DType::kU8;
  for (int attempt = has_bias ? 0 : 1; attempt < 2; ++attempt) {
    const bool epilogue = attempt == 0;
    if (plan->desc) cublasLtMatmulDescDestroy(plan->desc);
    plan->desc = nullptr;
    TESSERA_CUBLAS_RETURN_IF_ERROR(
        cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    const cublasLtMatmulMatrixScale_t vec = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
    TESSERA_CUBLAS_RETURN_IF_ERROR(
        cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    TESSERA_CUBLAS_RETURN_IF_ERROR(
        cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    TESSERA_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
        plan->desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &vec, sizeof vec));
    TESSERA_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
        plan->desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &vec, sizeof vec));
    // Vector scales need their pointers before the heuristic runs (without
    // them cuBLASLt 13.0 on an H100 answered CUBLAS_STATUS_INVALID_VALUE);
    // each call sets its own again.
    TESSERA_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
        plan->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &w_scales, sizeof w_scales));
    TESSERA_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
        plan->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &token_scales, sizeof token_scales));
    if (epilogue) {
      const cublasLtEpilogue_t ep = CUBLASLT_EPILOGUE_BIAS;
      const cudaDataType_t bt = OutType(bias);
      TESSERA_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
          plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof ep));
      TESSERA_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
          plan->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt));
    }
    cublasLtMatmulPreference_t pref = nullptr;
    TESSERA_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceCreate(&pref));
    const size_t ws = ctx.workspace_bytes();
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                         sizeof ws);
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(
        ctx.lt(), plan->desc, plan->a, plan->b, plan->c, plan->c, pref, 1, &result, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (st == CUBLAS_STATUS_SUCCESS && found > 0) {
      plan->algo = result.algo;
      plan->bias_epilogue = epilogue;
      GemmPlan* raw = plan.get();
      ctx.gemm_plans().emplace(key, std::move(plan));
      return raw;
    }
    // The bias epilogue may be refused either way; the second attempt goes without it.
    const bool retry =
        epilogue && (st == CUBLAS_STATUS_NOT_SUPPORTED || st == CUBLAS_STATUS_INVALID_VALUE);
    if (st != CUBLAS_STATUS_SUCCESS && st != CUBLAS_STATUS_NOT_SUPPORTED && !retry)
      return CublasError(st, "cublasLtMatmulAlgoGetHeuristic", __FILE__, __LINE__)
          .WithContext(what);
  }
  plan->unsupported =
      Unimplemented("cuBLASLt has no FP8 algorithm with per-row and per-token scales for " + what +
                    " (needs cuBLAS >= 12.9 on sm_90)");
  GemmPlan* raw = plan.get();
  ctx.gemm_plans().emplace(key, std::move(plan));
  return raw;
}

// W8A8: x quantized per token into the scratch (e4m3 rows, then the fp32
// token scales), then the FP8 tensor-core GEMM. False: cuBLASLt has no
// algorithm for the shape (nothing ran).
StatusOr<bool> TensorCoreGemm(Context& ctx, const Tensor& x, const Tensor& w,
                              const Fp8Scales& scales, const Tensor& bias, Tensor& y,
                              Tensor& scratch) {
  const int64_t m = x.dim(0), k = x.dim(1), n = w.dim(0);
  auto* xq = static_cast<uint8_t*>(scratch.raw());
  auto* x_scales = reinterpret_cast<float*>(xq + (m * k + 15) / 16 * 16);
  if (reinterpret_cast<uintptr_t>(xq) % 16 != 0 || reinterpret_cast<uintptr_t>(x.raw()) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(w.raw()) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(y.raw()) % 16 != 0)
    return InvalidArgument("fp8 linear: the FP8 tensor-core GEMM needs 16-byte aligned x " +
                           x.Describe() + ", w, y and scratch");
  const void* w_scale = scales.scales.raw();
  const void* t_scale = x_scales;
  TESSERA_ASSIGN_OR_RETURN(
      GemmPlan * plan, Fp8Plan(ctx, m, n, k, y.dtype(), bias.defined() ? bias.dtype() : DType::kU8,
                               w_scale, t_scale));
  if (!plan->unsupported.ok()) {
    static std::once_flag warned;
    std::call_once(warned, [&] {
      TESSERA_LOG_WARN("kernels", "{}: such FP8 products dequantize the weight instead (W8A16)",
                       plan->unsupported.message());
    });
    return false;
  }
  TESSERA_CUDA_LAUNCH_CHECK(
      LaunchFp8QuantizeRows(x.dtype(), x.raw(), m, k, xq, x_scales, ctx.stream()),
      "Fp8QuantizeRowsKernel");
  TESSERA_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
      plan->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &w_scale, sizeof w_scale));
  TESSERA_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
      plan->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &t_scale, sizeof t_scale));
  if (plan->bias_epilogue) {
    const void* bp = bias.raw();
    TESSERA_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
        plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bp, sizeof bp));
  }
  const float alpha = 1.0f, beta = 0.0f;
  TESSERA_CUBLAS_RETURN_IF_ERROR(cublasLtMatmul(
      ctx.lt(), plan->desc, &alpha, w.raw(), plan->a, xq, plan->b, &beta, y.raw(), plan->c, y.raw(),
      plan->c, &plan->algo, ctx.workspace(), ctx.workspace_bytes(), ctx.stream()));
  if (bias.defined() && !plan->bias_epilogue) {
    if (y.dtype() != bias.dtype())
      return Unimplemented("fp8 linear: a " + std::string(DTypeName(bias.dtype())) + " bias on a " +
                           DTypeName(y.dtype()) + " output without the cuBLASLt bias epilogue");
    TESSERA_RETURN_IF_ERROR(AddInPlace(y, Tensor(), bias));
  }
  return true;
}

}  // namespace

Status LinearFp8(const Tensor& x, const Tensor& w, const Fp8Scales& scales, const Tensor& bias,
                 Tensor& y, Tensor& scratch) {
  TESSERA_RETURN_IF_ERROR(ExpectFloatTensor(x, 2, Device::kCUDA, "fp8 linear input"));
  TESSERA_RETURN_IF_ERROR(ExpectFloatTensor(y, 2, Device::kCUDA, "fp8 linear output"));
  const int64_t m = x.dim(0), k = x.dim(1), n = w.dim(0);
  TESSERA_RETURN_IF_ERROR(
      CheckFp8Operands(w, scales, scratch, x.dtype(),
                       Fp8ScratchElements(Device::kCUDA, x.dtype(), m, n, k, scales)));
  if (w.dim(1) != k || y.dim(0) != m || y.dim(1) != n)
    return InvalidArgument("fp8 linear: x " + x.Describe() + " @ w^T " + w.Describe() + " -> y " +
                           y.Describe() + " do not agree");
  if (y.dtype() != x.dtype() && y.dtype() != DType::kF32)
    return InvalidArgument("fp8 linear: output " + y.Describe() +
                           " must have the input's dtype or F32");
  if (bias.defined()) {
    TESSERA_RETURN_IF_ERROR(ExpectFloatTensor(bias, 1, Device::kCUDA, "fp8 linear bias"));
    TESSERA_RETURN_IF_ERROR(ExpectDType(bias, x.dtype(), "fp8 linear bias", "the input"));
    if (bias.dim(0) != n)
      return InvalidArgument("fp8 linear: bias " + bias.Describe() + " does not match w " +
                             w.Describe());
  }
  Fp8GemmArgs a;
  a.x = x.raw();
  a.w = w.raw();
  a.scales = scales.scales.data<float>();
  a.scale_cols = scales.scales.dim(1);
  a.cols_per_scale = scales.cols_per_scale;
  a.col_phase = scales.col_phase;
  a.bias = bias.defined() ? bias.raw() : nullptr;
  a.y = y.raw();
  a.m = m;
  a.n = n;
  a.k = k;
  if (!Fp8GemmApplies(x.dtype(), a))
    return InvalidArgument("fp8 linear: the FP8 kernels need a BF16 or F16 input (got " +
                           x.Describe() + "), in_features % 16 == 0 (w " + w.Describe() +
                           ") and block scales in multiples of 16 columns (" +
                           std::to_string(scales.cols_per_scale) + ", phase " +
                           std::to_string(scales.col_phase) + ")");
  if (m == 0) return Status::Ok();
  TESSERA_ASSIGN_OR_RETURN(Context * ctx, Current());
  if (m <= kSkinnyGemmMaxRows && reinterpret_cast<uintptr_t>(x.raw()) % 16 == 0) {
    TESSERA_CUDA_LAUNCH_CHECK(LaunchFp8SkinnyGemm(x.dtype(), y.dtype(), a, ctx->stream()),
                              "Fp8SkinnyGemmKernel");
    return Status::Ok();
  }
  if (!scratch.defined())
    return InvalidArgument("fp8 linear: " + std::to_string(m) +
                           " tokens need a scratch buffer (Fp8ScratchElements)");
  Tensor dense = scratch;
  if (Fp8QuantizesActivations(m, n, k, scales)) {
    TESSERA_ASSIGN_OR_RETURN(const bool ran, TensorCoreGemm(*ctx, x, w, scales, bias, y, scratch));
    if (ran) return Status::Ok();
    CountFp8TensorCoreFallback();
    TESSERA_ASSIGN_OR_RETURN(dense, ctx->Allocate({n * k}, x.dtype()));  // scratch holds m x k
  }
  dense = dense.Reshape({dense.numel()}).Slice0(0, n * k).Reshape({n, k});
  TESSERA_CUDA_LAUNCH_CHECK(LaunchFp8Dequantize(x.dtype(), a, dense.raw(), ctx->stream()),
                            "Fp8DequantizeKernel");
  return Linear(x, dense, bias, y);
}

}  // namespace tessera::kernels::cuda
