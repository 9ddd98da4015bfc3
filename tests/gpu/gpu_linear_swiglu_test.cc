// GPU tests (tessera_gpu_test, tests/gpu/gpu_test_util.h): the gate|up projection with the
// SwiGLU in the skinny GEMM's epilogue (kernels/linear_swiglu.h) against the separate Linear and
// SiluMulFused on the GPU, bit for bit, and against the CPU within the dtype's tolerance: every
// row count 1..8, the k split 1, 2 and 4 ways, a bias, an intermediate width past one wave.
#include "gpu/gpu_test_util.h"
#include "kernels/cuda_launch.h"
#include "kernels/linear_swiglu.h"

namespace tessera {
namespace {

TEST(LinearSiluMul, FusedMatchesLinearThenSiluMulAndTheCpu) {
  for (DType dt : {DType::kBF16, DType::kF16}) {
    kernels::Backend& g = Gpu(dt);
    for (int64_t m = 1; m <= kernels::cuda::kSkinnyGemmMaxRows; ++m) {
      // (inter, k, bias): the k split 4 ways (64 x 4104), 2 ways (100 x 2056), whole (1376 x 512;
      // 8000 x 1024: more warps than the device holds at once).
      struct Shape {
        int64_t inter, k;
        bool bias;
      };
      for (const Shape sh : {Shape{64, 4104, false}, Shape{100, 2056, true}, Shape{1376, 512, true},
                             Shape{8000, 1024, false}}) {
        const std::string what = "swiglu m=" + std::to_string(m) +
                                 " inter=" + std::to_string(sh.inter) +
                                 " k=" + std::to_string(sh.k) + (sh.bias ? " +bias" : "");
        HostPair x = Random({m, sh.k}, 70 + m, dt), w = Random({2 * sh.inter, sh.k}, 71, dt, 0.1f),
                 b = Random({2 * sh.inter}, 72, dt);
        const Tensor xd = Up(g, x.raw), wd = Up(g, w.raw);
        const Tensor bd = sh.bias ? Up(g, b.raw) : Tensor();
        Tensor fused = Dev(g, {m, sh.inter}, dt);
        Status s = kernels::LinearSiluMul(xd, wd, bd, fused);
        ASSERT_TRUE(s.ok()) << what << ": " << s.ToString();

        Tensor gate_up = Dev(g, {m, 2 * sh.inter}, dt), act = Dev(g, {m, sh.inter}, dt);
        ASSERT_TRUE(kernels::Linear(xd, wd, bd, gate_up).ok()) << what;
        ASSERT_TRUE(kernels::SiluMulFused(gate_up, act).ok()) << what;
        const std::vector<float> got = Down(g, fused);
        EXPECT_EQ(got, Down(g, act)) << what << ": fused vs Linear + SiluMulFused";

        Tensor ref = Tensor::Empty({m, sh.inter});
        s = kernels::LinearSiluMul(x.f32, w.f32, sh.bias ? b.f32 : Tensor(), ref);
        ASSERT_TRUE(s.ok()) << s.ToString();
        ExpectClose(got, Vec(ref), dt, what);
      }
    }
  }
}

// A CUDA call the fused form does not take (9 rows: above the skinny GEMM's) is refused with a
// clear error, and the predicate says no.
TEST(LinearSiluMul, RowsAboveTheSkinnyGemmAreRefused) {
  kernels::Backend& g = Gpu(DType::kBF16);
  const int64_t m = kernels::cuda::kSkinnyGemmMaxRows + 1;
  const Tensor xd = Dev(g, {m, 64}, DType::kBF16), wd = Dev(g, {32, 64}, DType::kBF16);
  Tensor act = Dev(g, {m, 16}, DType::kBF16);
  EXPECT_FALSE(kernels::LinearSiluMulFuses(xd, wd));
  Status s = kernels::LinearSiluMul(xd, wd, Tensor(), act);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
}

}  // namespace
}  // namespace tessera
