// Linear on CUDA through cuBLASLt: y[m, n] = x[m, k] W[n, k]^T (+ bias), fp32
// accumulation (CUBLAS_COMPUTE_32F, no TF32), the bias as a cuBLASLt
// epilogue. Row-major y = x W^T is column-major y^T = W x^T, i.e. the "TN"
// GEMM with A = W (op T) and B = x (op N), so weights keep their nn.Linear
// layout. The algorithm is cuBLASLt's first heuristic choice. Decode shapes (m <= 8 rows of
// bf16/fp16) run the skinny GEMM of kernels/skinny_gemm_cuda.cu instead, which streams the
// weight closer to the HBM bandwidth; TESSERA_CUDA_SKINNY_GEMM=0 turns it off (the A/B in
// bench/results). (Timing all
// heuristic candidates per shape was tried and made some cublasLtMatmul calls
// fail on the H200 with CUBLAS_STATUS_EXECUTION_FAILED; not pursued.)
#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "common/base/env_switch.h"
#include "kernels/cuda_context.h"
#include "kernels/cuda_launch.h"
#include "kernels/dispatch.h"
#include "kernels/linear.h"
#include "kernels/linear_swiglu.h"
#include "kernels/tensor_ops.h"

namespace tessera::kernels::cuda {

namespace {

cudaDataType_t CudaType(DType d) {
  switch (d) {
    case DType::kBF16:
      return CUDA_R_16BF;
    case DType::kF16:
      return CUDA_R_16F;
    default:
      return CUDA_R_32F;
  }
}

int Alignment(const void* p) {
  const auto v = reinterpret_cast<uintptr_t>(p);
  for (int a : {16, 8, 4})
    if (v % static_cast<uintptr_t>(a) == 0) return a;
  return 2;
}

StatusOr<GemmPlan*> Plan(Context& ctx, int64_t m, int64_t n, int64_t k, DType in, DType out,
                         const Tensor& bias, int align) {
  const Context::GemmKey key{
      m, n, k, static_cast<int>(in), static_cast<int>(out), bias.defined() ? 1 : 0, align};
  auto it = ctx.gemm_plans().find(key);
  if (it != ctx.gemm_plans().end()) return it->second.get();
  auto plan = std::make_unique<GemmPlan>();
  const std::string what = "linear [" + std::to_string(m) + ", " + std::to_string(k) + "] x [" +
                           std::to_string(n) + ", " + std::to_string(k) + "]^T " + DTypeName(in) +
                           " -> " + DTypeName(out);
  for (int attempt = 0; attempt < 2; ++attempt) {
    const bool epilogue = bias.defined() && attempt == 0;
    if (attempt == 1 && !bias.defined()) break;
    if (plan->desc) cublasLtMatmulDescDestroy(plan->desc);
    plan->desc = nullptr;
    TESSERA_CUBLAS_RETURN_IF_ERROR(
        cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    TESSERA_CUBLAS_RETURN_IF_ERROR(
        cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    TESSERA_CUBLAS_RETURN_IF_ERROR(
        cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    if (epilogue) {
      const cublasLtEpilogue_t ep = CUBLASLT_EPILOGUE_BIAS;
      const cudaDataType_t bt = CudaType(bias.dtype());
      TESSERA_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
          plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof ep));
      TESSERA_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
          plan->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt));
    }
    if (!plan->a) {
      TESSERA_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(
          &plan->a, CudaType(in), static_cast<uint64_t>(k), static_cast<uint64_t>(n), k));
      TESSERA_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(
          &plan->b, CudaType(in), static_cast<uint64_t>(k), static_cast<uint64_t>(m), k));
      TESSERA_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(
          &plan->c, CudaType(out), static_cast<uint64_t>(n), static_cast<uint64_t>(m), n));
    }
    cublasLtMatmulPreference_t pref = nullptr;
    TESSERA_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceCreate(&pref));
    const size_t ws = ctx.workspace_bytes();
    const uint32_t al = static_cast<uint32_t>(align);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                         sizeof ws);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al,
                                         sizeof al);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al,
                                         sizeof al);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al,
                                         sizeof al);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al,
                                         sizeof al);
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
    if (st != CUBLAS_STATUS_SUCCESS && st != CUBLAS_STATUS_NOT_SUPPORTED)
      return CublasError(st, "cublasLtMatmulAlgoGetHeuristic", __FILE__, __LINE__)
          .WithContext(what);
  }
  return Unimplemented("cuBLASLt has no algorithm for " + what);
}

// TESSERA_CUDA_SKINNY_GEMM=0 sends every shape to cuBLASLt; read once.
bool SkinnyGemmEnabled() {
  static const bool on = EnvSwitchOn("TESSERA_CUDA_SKINNY_GEMM");
  return on;
}

}  // namespace

Status Linear(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& y) {
  TESSERA_RETURN_IF_ERROR(ExpectFloatTensor(x, 2, Device::kCUDA, "linear input"));
  TESSERA_RETURN_IF_ERROR(ExpectFloatTensor(w, 2, Device::kCUDA, "linear weight"));
  TESSERA_RETURN_IF_ERROR(ExpectFloatTensor(y, 2, Device::kCUDA, "linear output"));
  TESSERA_RETURN_IF_ERROR(ExpectDType(w, x.dtype(), "linear weight", "the input"));
  if (y.dtype() != x.dtype() && y.dtype() != DType::kF32)
    return InvalidArgument("linear: output " + y.Describe() +
                           " must have the input's dtype or F32");
  const int64_t m = x.dim(0), k = x.dim(1), n = w.dim(0);
  if (w.dim(1) != k || y.dim(0) != m || y.dim(1) != n)
    return InvalidArgument("linear: x " + x.Describe() + " @ w^T " + w.Describe() + " -> y " +
                           y.Describe() + " do not agree");
  if (bias.defined()) {
    TESSERA_RETURN_IF_ERROR(ExpectFloatTensor(bias, 1, Device::kCUDA, "linear bias"));
    TESSERA_RETURN_IF_ERROR(ExpectDType(bias, w.dtype(), "linear bias", "the weight"));
    if (bias.dim(0) != n)
      return InvalidArgument("linear: bias " + bias.Describe() + " does not match w " +
                             w.Describe());
  }
  if (m == 0) return Status::Ok();
  TESSERA_ASSIGN_OR_RETURN(Context * ctx, Current());
  if (SkinnyGemmEnabled() && SkinnyGemmApplies(x.dtype(), m, k, x.raw(), w.raw())) {
    TESSERA_CUDA_LAUNCH_CHECK(
        LaunchSkinnyGemm(x.dtype(), y.dtype(), x.raw(), w.raw(),
                         bias.defined() ? bias.raw() : nullptr, y.raw(), m, n, k, ctx->stream()),
        "SkinnyGemmKernel");
    return Status::Ok();
  }
  int align = std::min({Alignment(x.raw()), Alignment(w.raw()), Alignment(y.raw())});
  if (bias.defined()) align = std::min(align, Alignment(bias.raw()));
  TESSERA_ASSIGN_OR_RETURN(GemmPlan * plan, Plan(*ctx, m, n, k, x.dtype(), y.dtype(), bias, align));
  if (plan->bias_epilogue) {
    const void* bp = bias.raw();
    TESSERA_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
        plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bp, sizeof bp));
  }
  const float alpha = 1.0f, beta = 0.0f;
  TESSERA_CUBLAS_RETURN_IF_ERROR(cublasLtMatmul(
      ctx->lt(), plan->desc, &alpha, w.raw(), plan->a, x.raw(), plan->b, &beta, y.raw(), plan->c,
      y.raw(), plan->c, &plan->algo, ctx->workspace(), ctx->workspace_bytes(), ctx->stream()));
  if (bias.defined() && !plan->bias_epilogue) {
    if (y.dtype() != bias.dtype())
      return Unimplemented("linear: a " + std::string(DTypeName(bias.dtype())) + " bias on a " +
                           DTypeName(y.dtype()) + " output without the cuBLASLt bias epilogue");
    TESSERA_RETURN_IF_ERROR(AddInPlace(y, Tensor(), bias));
  }
  return Status::Ok();
}

namespace {

bool SkinnySwiGluApplies(const Tensor& x, const Tensor& w) {
  return x.device() == Device::kCUDA && x.rank() == 2 && w.rank() == 2 && w.dtype() == x.dtype() &&
         SkinnyGemmApplies(x.dtype(), x.dim(0), x.dim(1), x.raw(), w.raw());
}

}  // namespace

// On by default (an H100 ran the Llama-2-7B shape 0.7% faster at batch 1 and 2% at batch 64 with
// it, bench/results/NOTES.md 2026-12-07j); TESSERA_CUDA_FUSED_SWIGLU=0 turns it off (A/B runs).
bool LinearSiluMulFuses(const Tensor& x, const Tensor& w) {
  static const bool on = EnvSwitchOn("TESSERA_CUDA_FUSED_SWIGLU");
  return on && SkinnyGemmEnabled() && SkinnySwiGluApplies(x, w);
}

// kernels/linear_swiglu.h (the dispatcher has checked shapes, dtypes and devices).
Status LinearSiluMul(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& act) {
  if (!SkinnySwiGluApplies(x, w))
    return FailedPrecondition("linear+swiglu: x " + x.Describe() + " with weight " + w.Describe() +
                              " is not a skinny GEMM (at most 8 rows of BF16/F16, k % 8 == 0, "
                              "16-byte aligned): use Linear and SiluMulFused");
  TESSERA_ASSIGN_OR_RETURN(Context * ctx, Current());
  TESSERA_CUDA_LAUNCH_CHECK(
      LaunchSkinnyGemmSwiGlu(x.dtype(), x.raw(), w.raw(), bias.defined() ? bias.raw() : nullptr,
                             act.raw(), x.dim(0), act.dim(1), x.dim(1), ctx->stream()),
      "SkinnyGemmKernel (SwiGLU)");
  return Status::Ok();
}

}  // namespace tessera::kernels::cuda
