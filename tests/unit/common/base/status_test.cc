#include "common/base/status.h"

#include <gtest/gtest.h>

#include <cmath>

#include "common/base/dtype.h"
#include "common/base/tensor.h"

namespace tessera {
namespace {

StatusOr<int> Half(int x) {
  if (x % 2) return InvalidArgument("odd: " + std::to_string(x));
  return x / 2;
}

Status UseHalf(int x, int* out) {
  TESSERA_ASSIGN_OR_RETURN(int h, Half(x));
  *out = h;
  return Status::Ok();
}

TEST(Status, PropagatesWithContext) {
  int out = 0;
  EXPECT_TRUE(UseHalf(4, &out).ok());
  EXPECT_EQ(out, 2);
  Status s = UseHalf(3, &out).WithContext("layer 7");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.ToString(), "INVALID_ARGUMENT: layer 7: odd: 3");
}

TEST(DType, Bf16AndF16RoundTrip) {
  for (float f : {0.0f, 1.0f, -2.5f, 3.140625f, 65504.0f, 1e-5f}) {
    EXPECT_EQ(BF16ToF32(F32ToBF16(f)), BF16ToF32(F32ToBF16(BF16ToF32(F32ToBF16(f)))));
    EXPECT_NEAR(F16ToF32(F32ToF16(f)), f, std::abs(f) * 1e-3 + 1e-7);
  }
  EXPECT_EQ(F32ToF16(1.0f), 0x3c00);
  EXPECT_EQ(F16ToF32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(F32ToBF16(1.0f), 0x3f80);
  EXPECT_FALSE(ParseDType("F8_E5M2").ok());
  EXPECT_EQ(*ParseDType("F8_E4M3"), DType::kF8E4M3);  // FP8 checkpoints (fp8_weights_test)
  EXPECT_EQ(DTypeSize(DType::kF8E4M3), 1u);
  EXPECT_NE(ParseDType("Q4").status().message().find("supported"), std::string::npos);
}

TEST(Tensor, SliceAndReshapeShareStorage) {
  Tensor t = Tensor::Zeros({4, 3});
  t.data<float>()[3 * 2 + 1] = 7.0f;
  Tensor row = t.Slice0(2, 3);
  EXPECT_EQ(row.shape(), (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(row.data<float>()[1], 7.0f);
  Tensor flat = t.Reshape({-1});
  EXPECT_EQ(flat.dim(0), 12);
  EXPECT_EQ(flat.data<float>()[7], 7.0f);
  EXPECT_EQ(t.Describe(), "[4, 3] F32 cpu");
}

}  // namespace
}  // namespace tessera
