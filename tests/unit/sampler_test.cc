#include "worker/sampler.h"

#include <gtest/gtest.h>

#include <map>
#include <vector>

#include "worker/kv_cache.h"

namespace tessera {
namespace {

TEST(Sampler, GreedyTakesFirstMaximum) {
  Sampler s(SamplingParams{});
  std::vector<float> l = {0.1f, 3.0f, -1.0f, 3.0f};
  EXPECT_EQ(s.Sample(l.data(), 4), 1);
}

TEST(Sampler, SeededRunsRepeatAndSeedsDiffer) {
  std::vector<float> l = {1.0f, 1.2f, 0.8f, 1.1f, 0.9f, 1.0f};
  SamplingParams p{1.0f, 0, 1.0f, 42};
  auto draw = [&](uint64_t seed) {
    p.seed = seed;
    Sampler s(p);
    std::vector<int32_t> out;
    for (int i = 0; i < 64; ++i) out.push_back(s.Sample(l.data(), 6));
    return out;
  };
  EXPECT_EQ(draw(42), draw(42));
  EXPECT_NE(draw(42), draw(43));
}

TEST(Sampler, TopKAndTopPRestrictTheSupport) {
  std::vector<float> l = {5.0f, 4.0f, 0.0f, -1.0f, 4.5f};
  SamplingParams k2{1.0f, 2, 1.0f, 1};
  Sampler sk(k2);
  for (int i = 0; i < 200; ++i) {
    int32_t t = sk.Sample(l.data(), 5);
    EXPECT_TRUE(t == 0 || t == 4) << t;
  }
  // probs ~ {0.506, 0.186, 0.003, 0.001, 0.307}: top_p 0.7 keeps {0, 4}.
  SamplingParams p7{1.0f, 0, 0.7f, 2};
  Sampler sp(p7);
  std::map<int32_t, int> seen;
  for (int i = 0; i < 400; ++i) seen[sp.Sample(l.data(), 5)]++;
  EXPECT_EQ(seen.size(), 2u);
  EXPECT_GT(seen[0], seen[4]);
}

TEST(Sampler, TemperatureFlattensTheDistribution) {
  std::vector<float> l = {2.0f, 0.0f};
  auto frac = [&](float temp) {
    Sampler s(SamplingParams{temp, 0, 1.0f, 7});
    int ones = 0;
    for (int i = 0; i < 2000; ++i) ones += s.Sample(l.data(), 2);
    return ones / 2000.0;
  };
  EXPECT_NEAR(frac(1.0f), 1.0 / (1.0 + std::exp(2.0)), 0.03);
  EXPECT_NEAR(frac(4.0f), 1.0 / (1.0 + std::exp(0.5)), 0.03);
}

TEST(Sampler, ValidateNamesTheField) {
  EXPECT_NE((SamplingParams{-1.0f, 0, 1.0f, 0}).Validate().message().find("temperature"),
            std::string::npos);
  EXPECT_NE((SamplingParams{1.0f, -3, 1.0f, 0}).Validate().message().find("top_k"),
            std::string::npos);
  EXPECT_NE((SamplingParams{1.0f, 0, 0.0f, 0}).Validate().message().find("top_p"),
            std::string::npos);
}

TEST(BlockAllocator, AllocatesLowestFirstAndRefusesOverflow) {
  BlockAllocator a(4);
  std::vector<int32_t> t1, t2;
  ASSERT_TRUE(a.Allocate(2, t1).ok());
  EXPECT_EQ(t1, (std::vector<int32_t>{0, 1}));
  ASSERT_TRUE(a.Allocate(1, t2).ok());
  Status s = a.Allocate(2, t2);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(t2.size(), 1u);  // nothing allocated on failure
  a.Free(t1);
  EXPECT_TRUE(t1.empty());
  EXPECT_EQ(a.num_free(), 3);
  ASSERT_TRUE(a.Allocate(1, t2).ok());
  EXPECT_EQ(t2.back(), 0);
  EXPECT_EQ(BlockAllocator::BlocksFor(17, 16), 2);
}

}  // namespace
}  // namespace tessera
