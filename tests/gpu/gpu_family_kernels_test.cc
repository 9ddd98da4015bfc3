// GPU tests (tessera_gpu_test, tests/gpu/gpu_test_util.h): the kernels the
// newer model families added (issue 22) against the CPU kernels, per dtype:
// the per-head q/k RMSNorm of Qwen3 (the sliding-window attention of Mistral
// and Phi-3 is Kernels.PagedAttentionSlidingWindowMatchesCpu in
// gpu_kernels_test.cc).
#include <array>

#include "gpu/gpu_test_util.h"
#include "kernels/head_rms_norm.h"

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
    HostPair x = Random({tokens, heads, head_dim}, ++seed, dt), w = Random({head_dim}, ++seed, dt);
    Tensor ref = Tensor::Empty({tokens, heads, head_dim});
    std::copy(x.f32.data<float>(), x.f32.data<float>() + x.f32.numel(), ref.data<float>());
    ASSERT_TRUE(kernels::cpu::HeadRmsNorm(ref, w.f32, 1e-6f).ok());
    Tensor y = Up(g, x.raw);
    Status s = kernels::HeadRmsNorm(y, Up(g, w.raw), 1e-6f);
    ASSERT_TRUE(s.ok()) << s.ToString();
    ExpectClose(Down(g, y), Vec(ref), dt,
                "head_rms_norm " + std::to_string(tokens) + "x" + std::to_string(heads) + "x" +
                    std::to_string(head_dim));
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, FamilyKernels,
                         ::testing::Values(DType::kF32, DType::kBF16, DType::kF16),
                         [](const auto& info) { return std::string(DTypeName(info.param)); });

}  // namespace
}  // namespace tessera
