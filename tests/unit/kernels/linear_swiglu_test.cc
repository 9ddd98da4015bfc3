// LinearSiluMul on the CPU (kernels/linear_swiglu.h): Linear then SiluMulFused, the argument
// checks naming what is wrong, and LinearSiluMulFuses saying no for CPU tensors.
#include "kernels/linear_swiglu.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "kernels/linear.h"
#include "kernels/swiglu.h"
#include "support/random_tensor.h"

namespace tessera::kernels {
namespace {

using ::tessera::testing::RandomNormal;

std::vector<float> Values(const Tensor& t) {
  return std::vector<float>(t.data<float>(), t.data<float>() + t.numel());
}

TEST(LinearSiluMul, EqualsLinearThenSiluMulFused) {
  const Tensor x = RandomNormal({3, 16}, 1), w = RandomNormal({2 * 5, 16}, 2),
               b = RandomNormal({10}, 3);
  Tensor gate_up = Tensor::Empty({3, 10}), want = Tensor::Empty({3, 5}),
         act = Tensor::Empty({3, 5});
  ASSERT_TRUE(Linear(x, w, b, gate_up).ok());
  ASSERT_TRUE(SiluMulFused(gate_up, want).ok());
  Status s = LinearSiluMul(x, w, b, act);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(Values(act), Values(want));
  // act[0][0] by hand: silu(g) * u with g = x0 . w0 + b0, u = x0 . w5 + b5.
  float g = b.data<float>()[0], u = b.data<float>()[5];
  for (int i = 0; i < 16; ++i) {
    g += x.data<float>()[i] * w.data<float>()[i];
    u += x.data<float>()[i] * w.data<float>()[5 * 16 + i];
  }
  EXPECT_NEAR(act.data<float>()[0], g / (1.0f + std::exp(-g)) * u, 1e-4f * (1.0f + std::abs(u)));
  EXPECT_FALSE(LinearSiluMulFuses(x, w));
}

TEST(LinearSiluMul, BadShapesAreNamed) {
  const Tensor x = RandomNormal({3, 16}, 1), w = RandomNormal({10, 16}, 2);
  Tensor act = Tensor::Empty({3, 5});
  Status s = LinearSiluMul(x, RandomNormal({9, 16}, 4), Tensor(), act);  // an odd gate|up height
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("fused gate|up weight"), std::string::npos) << s.ToString();
  Tensor wrong = Tensor::Empty({3, 4});
  s = LinearSiluMul(x, w, Tensor(), wrong);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  s = LinearSiluMul(x, w, RandomNormal({5}, 5), act);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("bias"), std::string::npos) << s.ToString();
}

}  // namespace
}  // namespace tessera::kernels
