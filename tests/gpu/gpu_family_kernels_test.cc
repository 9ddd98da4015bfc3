// GPU tests (tessera_gpu_test, tests/gpu/gpu_test_util.h): the kernels the
// newer model families added (issue 22) against the CPU kernels, per dtype:
// the per-head q/k RMSNorm of Qwen3 and Gemma 3, and Gemma's (1 + weight)
// RMSNorm, GeGLU (tanh GELU), tanh soft-capping of the logits and the
// embedding multiplier (the sliding-window attention of Mistral, Phi-3 and
// Gemma is Kernels.PagedAttentionSlidingWindowMatchesCpu, Gemma 2's
// soft-capped scores Kernels.PagedAttentionSoftCapMatchesCpu, both in
// gpu_kernels_test.cc).
#include <array>

#include "gpu/gpu_test_util.h"
#include "kernels/geglu.h"
#include "kernels/head_rms_norm.h"
#include "kernels/rms_norm.h"
#include "kernels/softcap.h"
#include "kernels/tensor_ops.h"

namespace tessera {
namespace {

class FamilyKernels : public ::testing::TestWithParam<DType> {};

TEST_P(FamilyKernels, HeadRmsNormMatchesCpu) {
  const DType dt = GetParam();
  kernels::Backend& g = Gpu(dt);
  // Qwen3's head dim (128), the fixture's (32), a head dim that is not a
  // multiple of the warp (80), and a row count that leaves a partial block.
  const std::vector<std::array<int64_t, 3>> shapes = {
      {1, 1, 128}, {7, 16, 128}, {13, 3, 32}, {5, 9, 80}, {300, 8, 64}};
  uint64_t seed = 500;
  for (const auto& [tokens, heads, head_dim] : shapes) {
    // Qwen3's plain weight, and Gemma 3's (1 + weight) with weights near 0.
    for (float offset : {0.0f, 1.0f}) {
      HostPair x = Random({tokens, heads, head_dim}, ++seed, dt),
               w = Random({head_dim}, ++seed, dt, offset > 0 ? 0.2f : 1.0f);
      Tensor ref = Tensor::Empty({tokens, heads, head_dim});
      std::copy(x.f32.data<float>(), x.f32.data<float>() + x.f32.numel(), ref.data<float>());
      ASSERT_TRUE(kernels::cpu::HeadRmsNorm(ref, w.f32, 1e-6f, offset).ok());
      Tensor y = Up(g, x.raw);
      Status s = kernels::HeadRmsNorm(y, Up(g, w.raw), 1e-6f, offset);
      ASSERT_TRUE(s.ok()) << s.ToString();
      ExpectClose(Down(g, y), Vec(ref), dt,
                  "head_rms_norm " + std::to_string(tokens) + "x" + std::to_string(heads) + "x" +
                      std::to_string(head_dim) + " offset " + std::to_string(offset));
    }
  }
}

// Gemma's RMSNorm: x / rms(x) * (1 + w), plain and with the fused residual
// add, at Gemma 2's and Gemma 3's hidden sizes.
TEST_P(FamilyKernels, UnitOffsetRmsNormMatchesCpu) {
  const DType dt = GetParam();
  kernels::Backend& g = Gpu(dt);
  uint64_t seed = 600;
  for (int64_t hidden : {64, 1152, 2304, 3584}) {
    const int64_t rows = 7;
    HostPair x = Random({rows, hidden}, ++seed, dt), w = Random({hidden}, ++seed, dt, 0.2f),
             r = Random({rows, hidden}, ++seed, dt);
    Tensor ref = Tensor::Empty({rows, hidden});
    ASSERT_TRUE(kernels::cpu::RmsNorm(x.f32, w.f32, 1e-6f, ref, 1.0f).ok());
    Tensor y = Dev(g, {rows, hidden}, dt);
    ASSERT_TRUE(kernels::RmsNorm(Up(g, x.raw), Up(g, w.raw), 1e-6f, y, 1.0f).ok());
    ExpectClose(Down(g, y), Vec(ref), dt, "rms_norm (1 + w) hidden " + std::to_string(hidden));
    // In place, as the model normalises the attention and MLP outputs.
    Tensor inplace = Up(g, x.raw);
    ASSERT_TRUE(kernels::RmsNorm(inplace, Up(g, w.raw), 1e-6f, inplace, 1.0f).ok());
    EXPECT_EQ(Down(g, inplace), Down(g, y)) << "in place";
    // Fused add: the residual rounded to the dtype first.
    std::vector<float> sum(static_cast<size_t>(rows * hidden));
    for (size_t i = 0; i < sum.size(); ++i)
      sum[i] = r.f32.data<float>()[i] + x.f32.data<float>()[i];
    Tensor rounded = Tensor::Empty({rows, hidden}, dt), res_ref = Tensor::Empty({rows, hidden});
    ConvertFromF32(dt, sum.data(), rounded.raw(), sum.size());
    ConvertToF32(dt, rounded.raw(), res_ref.data<float>(), sum.size());
    Tensor ref2 = Tensor::Empty({rows, hidden});
    ASSERT_TRUE(kernels::cpu::RmsNorm(res_ref, w.f32, 1e-6f, ref2, 1.0f).ok());
    Tensor res = Up(g, r.raw), y2 = Dev(g, {rows, hidden}, dt);
    ASSERT_TRUE(kernels::AddRmsNorm(res, Up(g, x.raw), Up(g, w.raw), 1e-6f, y2, 1.0f).ok());
    ExpectClose(Down(g, y2), Vec(ref2), dt,
                "add_rms_norm (1 + w) hidden " + std::to_string(hidden));
  }
}

// GeGLU: gelu_tanh(gate) * up, out aliasing gate, at an intermediate size
// that is not a multiple of the block.
TEST_P(FamilyKernels, GeluTanhMulMatchesCpu) {
  const DType dt = GetParam();
  kernels::Backend& g = Gpu(dt);
  for (int64_t cols : {96, 9216, 777}) {
    HostPair gate = Random({5, cols}, 700 + cols, dt, 3.0f), up = Random({5, cols}, 701 + cols, dt);
    Tensor ref = Tensor::Empty({5, cols});
    ASSERT_TRUE(kernels::cpu::GeluTanhMul(gate.f32, up.f32, ref).ok());
    Tensor gd = Up(g, gate.raw);
    Status s = kernels::GeluTanhMul(gd, Up(g, up.raw), gd);
    ASSERT_TRUE(s.ok()) << s.ToString();
    ExpectClose(Down(g, gd), Vec(ref), dt, "geglu " + std::to_string(cols));
  }
}

// GeGLU reading the fused gate|up output [rows, 2 * cols]: matches the CPU
// and gives the same bits as GeluTanhMul on the two halves.
TEST_P(FamilyKernels, GeluTanhMulFusedMatchesCpu) {
  const DType dt = GetParam();
  kernels::Backend& g = Gpu(dt);
  for (int64_t rows : {1, 5}) {
    for (int64_t cols : {96, 9216, 777}) {
      HostPair gu = Random({rows, 2 * cols}, 720 + cols + rows, dt, 3.0f);
      Tensor ref = Tensor::Empty({rows, cols});
      ASSERT_TRUE(kernels::cpu::GeluTanhMulFused(gu.f32, ref).ok());
      const Tensor gud = Up(g, gu.raw);
      Tensor out = Dev(g, {rows, cols}, dt);
      Status s = kernels::GeluTanhMulFused(gud, out);
      ASSERT_TRUE(s.ok()) << s.ToString();
      const std::string what = "geglu fused " + std::to_string(rows) + " x " + std::to_string(cols);
      ExpectClose(Down(g, out), Vec(ref), dt, what);
      Tensor gate = Dev(g, {rows, cols}, dt), up = Dev(g, {rows, cols}, dt);
      ASSERT_TRUE(kernels::CopyColumns(gud, 0, gate, 0, cols).ok());
      ASSERT_TRUE(kernels::CopyColumns(gud, cols, up, 0, cols).ok());
      ASSERT_TRUE(kernels::GeluTanhMul(gate, up, gate).ok());
      EXPECT_EQ(Down(g, out), Down(g, gate)) << what << " vs the two halves";
    }
  }
}

// Final-logit soft-capping on F32 logits of a Gemma-sized vocab (the model's
// logits are F32 on every backend), and on the dtype itself; then the
// embedding multiplier, whose scale is rounded to the dtype first
// (sqrt(2304) = 48 exactly; sqrt(3072) = 55.43 becomes 55.5 in bf16, as in
// transformers' Gemma3TextScaledWordEmbedding).
TEST_P(FamilyKernels, SoftCapAndScaleMatchCpu) {
  const DType dt = GetParam();
  kernels::Backend& g = Gpu(dt);
  HostPair logits = Random({3, 262144}, 800, DType::kF32, 20.0f);
  Tensor ref = Tensor::Empty({3, 262144});
  std::copy(logits.f32.data<float>(), logits.f32.data<float>() + ref.numel(), ref.data<float>());
  ASSERT_TRUE(kernels::cpu::SoftCap(ref, 30.0f).ok());
  Tensor ld = Up(g, logits.raw);
  ASSERT_TRUE(kernels::SoftCap(ld, 30.0f).ok());
  ExpectClose(Down(g, ld), Vec(ref), DType::kF32, "softcap 30 on F32 logits");
  HostPair x = Random({4, 100}, 801, dt, 40.0f);
  Tensor xref = Tensor::Empty({4, 100});
  std::copy(x.f32.data<float>(), x.f32.data<float>() + xref.numel(), xref.data<float>());
  ASSERT_TRUE(kernels::cpu::SoftCap(xref, 50.0f).ok());
  Tensor xd = Up(g, x.raw);
  ASSERT_TRUE(kernels::SoftCap(xd, 50.0f).ok());
  ExpectClose(Down(g, xd), Vec(xref), dt, "softcap 50");

  for (float scale : {std::sqrt(2304.0f), std::sqrt(3072.0f)}) {
    HostPair e = Random({6, 64}, 802, dt);
    // The scale in the dtype, as the kernel (and transformers) applies it.
    float rounded_scale = 0;
    Tensor one = Tensor::Empty({1}, dt);
    ConvertFromF32(dt, &scale, one.raw(), 1);
    ConvertToF32(dt, one.raw(), &rounded_scale, 1);
    Tensor eref = Tensor::Empty({6, 64});
    std::copy(e.f32.data<float>(), e.f32.data<float>() + eref.numel(), eref.data<float>());
    ASSERT_TRUE(kernels::cpu::ScaleInPlace(eref, rounded_scale).ok());
    Tensor ed = Up(g, e.raw);
    ASSERT_TRUE(kernels::ScaleInPlace(ed, scale).ok());
    ExpectClose(Down(g, ed), Vec(eref), dt, "embedding scale " + std::to_string(scale));
    // A unit input shows the scale itself.
    Tensor unit = Tensor::Empty({1}, DType::kF32);
    unit.data<float>()[0] = 1.0f;
    Tensor unit_raw = Tensor::Empty({1}, dt);
    ConvertFromF32(dt, unit.data<float>(), unit_raw.raw(), 1);
    Tensor ud = Up(g, unit_raw);
    ASSERT_TRUE(kernels::ScaleInPlace(ud, scale).ok());
    EXPECT_EQ(Down(g, ud)[0], rounded_scale) << DTypeName(dt);
    if (dt == DType::kBF16 && scale > 55.0f) {
      EXPECT_EQ(rounded_scale, 55.5f);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, FamilyKernels,
                         ::testing::Values(DType::kF32, DType::kBF16, DType::kF16),
                         [](const auto& info) { return std::string(DTypeName(info.param)); });

}  // namespace
}  // namespace tessera
