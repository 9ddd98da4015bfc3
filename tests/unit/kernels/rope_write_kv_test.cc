// NormRopeWriteKv on the CPU (kernels/rope_write_kv.h): the separate calls' result, and the
// argument checks, which name the bad tensor and come before anything is written.
#include "kernels/rope_write_kv.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>

#include "kernels/head_rms_norm.h"
#include "kernels/rope.h"
#include "support/random_tensor.h"

namespace tessera::kernels {
namespace {

using ::tessera::testing::RandomNormal;

Tensor Copy(const Tensor& t) {
  Tensor out = Tensor::Empty(t.shape(), t.dtype());
  std::copy(t.data<float>(), t.data<float>() + t.numel(), out.data<float>());
  return out;
}

std::vector<float> Values(const Tensor& t) {
  return std::vector<float>(t.data<float>(), t.data<float>() + t.numel());
}

// Two sequences (2 cached positions + 3 new, 5 cached + 1 new), 4 q heads over 2 kv heads of
// dim 8, blocks of 4.
struct Fixture {
  std::vector<int32_t> table_a{3, 0}, table_b{1, 2};
  Tensor q = RandomNormal({4, 4, 8}, 1), k = RandomNormal({4, 2, 8}, 2),
         v = RandomNormal({4, 2, 8}, 3);
  Tensor qw = RandomNormal({8}, 4), kw = RandomNormal({8}, 5);
  Tensor positions = Tensor::Empty({4}, DType::kI32);
  Tensor inv_freq = Tensor::Empty({4});
  KvCacheLayer cache{Tensor::Zeros({4, 4, 2, 8}), Tensor::Zeros({4, 4, 2, 8})};
  AttentionBatch batch;

  Fixture() {
    const int32_t pos[] = {2, 3, 4, 5};
    std::copy(pos, pos + 4, positions.data<int32_t>());
    for (int i = 0; i < 4; ++i) inv_freq.data<float>()[i] = std::pow(100.0f, -i / 4.0f);
    auto b = MakeAttentionBatch({{0, 3, 2, table_a}, {3, 1, 5, table_b}}, 4, 4, 4, CpuBackend());
    EXPECT_TRUE(b.ok()) << b.status().ToString();
    batch = *b;
  }
};

TEST(NormRopeWriteKv, EqualsTheSeparateCalls) {
  Fixture f;
  Tensor q_want = Copy(f.q), k_want = Copy(f.k);
  KvCacheLayer want{Tensor::Zeros({4, 4, 2, 8}), Tensor::Zeros({4, 4, 2, 8})};
  ASSERT_TRUE(HeadRmsNorm(q_want, f.qw, 1e-6f, 1.0f).ok());
  ASSERT_TRUE(HeadRmsNorm(k_want, f.kw, 1e-6f, 1.0f).ok());
  ASSERT_TRUE(ApplyRopeQk(q_want, k_want, f.positions, f.inv_freq).ok());
  ASSERT_TRUE(WriteKv(want, k_want, f.v, f.batch).ok());

  Status s = NormRopeWriteKv(f.q, f.k, f.v, {f.qw, f.kw, 1e-6f, 1.0f}, f.positions, f.inv_freq,
                             f.cache, f.batch);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(Values(f.q), Values(q_want));
  EXPECT_EQ(Values(f.k), Values(k_want));
  EXPECT_EQ(Values(f.cache.k), Values(want.k));
  EXPECT_EQ(Values(f.cache.v), Values(want.v));
  // Position 3 of the first sequence (its second new token): table entry 0, block 3, slot 3.
  EXPECT_EQ(f.cache.k.data<float>()[(3 * 4 + 3) * 16], k_want.data<float>()[1 * 16]);
}

// Each bad argument is named, and q, k and the cache are left as they were.
TEST(NormRopeWriteKv, BadArgumentsAreNamedAndNothingIsWritten) {
  struct Bad {
    const char* name;
    std::function<void(Fixture&, QkNorms&)> spoil;
    const char* expect;
  };
  const std::vector<Bad> cases = {
      {"k heads",
       [](Fixture& f, QkNorms&) {
         f.k = RandomNormal({4, 2, 6}, 9);
       },
       "k "},
      {"v shape",
       [](Fixture& f, QkNorms&) {
         f.v = RandomNormal({4, 1, 8}, 9);
       },
       "v "},
      {"q norm", [](Fixture&, QkNorms& n) { n.q_weight = RandomNormal({6}, 9); }, "q norm weight"},
      {"k norm",
       [](Fixture&, QkNorms& n) {
         n.k_weight = RandomNormal({8, 1}, 9);
       },
       "k norm weight"},
      {"positions", [](Fixture& f, QkNorms&) { f.positions = Tensor::Empty({3}, DType::kI32); },
       "positions"},
      {"inv_freq", [](Fixture& f, QkNorms&) { f.inv_freq = Tensor::Empty({8}); }, "inv_freq"},
      {"cache",
       [](Fixture& f, QkNorms&) {
         f.cache.v = Tensor::Zeros({4, 4, 3, 8});
       },
       "kv cache"},
  };
  for (const Bad& c : cases) {
    Fixture f;
    QkNorms norms{f.qw, f.kw, 1e-6f, 0.0f};
    c.spoil(f, norms);
    const std::vector<float> q0 = Values(f.q), k0 = Values(f.k);
    Status s = NormRopeWriteKv(f.q, f.k, f.v, norms, f.positions, f.inv_freq, f.cache, f.batch);
    ASSERT_FALSE(s.ok()) << c.name;
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << c.name;
    EXPECT_NE(s.message().find(c.expect), std::string::npos) << c.name << ": " << s.ToString();
    EXPECT_EQ(Values(f.q), q0) << c.name;
    EXPECT_EQ(Values(f.k), k0) << c.name;
    for (float x : Values(f.cache.k)) ASSERT_EQ(x, 0.0f) << c.name;
  }
}

}  // namespace
}  // namespace tessera::kernels
