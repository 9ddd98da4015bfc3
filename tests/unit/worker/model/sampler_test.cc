#include "worker/model/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "common/engine/block_allocator.h"
#include "worker/model/kv_cache.h"

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

// log_softmax of {1, 3, 2, 3, -1}: log Z = log(e + 2e^3 + e^2 + e^-1)
// = 3.9248660042217245 (by hand), logprob_i = l_i - log Z.
const std::vector<float> kLogits = {1.0f, 3.0f, 2.0f, 3.0f, -1.0f};
const std::vector<double> kLogSoftmax = {-2.9248660042217245, -0.9248660042217245,
                                         -1.9248660042217245, -0.9248660042217245,
                                         -4.924866004221725};

TEST(TokenLogprobs, MatchTheHandComputedLogSoftmaxWithTopKBestFirstAndTiesByLowerId) {
  for (int32_t token = 0; token < 5; ++token) {
    SampledToken t = kernels::LogprobsRowCpu(kLogits.data(), 5, token, 3);
    EXPECT_TRUE(t.has_logprobs);
    EXPECT_EQ(t.token_id, token);
    EXPECT_NEAR(t.logprob, kLogSoftmax[static_cast<size_t>(token)], 1e-6) << token;
    // 1 and 3 tie: the lower id first; then 2.
    ASSERT_EQ(t.top.size(), 3u);
    EXPECT_EQ(t.top[0].token_id, 1);
    EXPECT_EQ(t.top[1].token_id, 3);
    EXPECT_EQ(t.top[2].token_id, 2);
    for (size_t i = 0; i < 3; ++i)
      EXPECT_NEAR(t.top[i].logprob, kLogSoftmax[static_cast<size_t>(t.top[i].token_id)], 1e-6);
  }
  // top 0: the token's own logprob only; top > vocab: the whole vocab, sorted.
  EXPECT_TRUE(kernels::LogprobsRowCpu(kLogits.data(), 5, 4, 0).top.empty());
  SampledToken all = kernels::LogprobsRowCpu(kLogits.data(), 5, 4, 20);
  ASSERT_EQ(all.top.size(), 5u);
  EXPECT_EQ(all.top.back().token_id, 4);
  double mass = 0.0;
  for (size_t i = 0; i < all.top.size(); ++i) {
    if (i > 0) {
      EXPECT_GE(all.top[i - 1].logprob, all.top[i].logprob);
    }
    mass += std::exp(static_cast<double>(all.top[i].logprob));
  }
  EXPECT_NEAR(mass, 1.0, 1e-6);
  // Large logits do not overflow, and the dominant token's value is 0, not above.
  const std::vector<float> big = {1000.0f, 0.0f, -1000.0f};
  SampledToken b = kernels::LogprobsRowCpu(big.data(), 3, 0, 2);
  EXPECT_EQ(b.logprob, 0.0f);
  EXPECT_NEAR(b.top[1].logprob, -1000.0f, 1e-3);
}

TEST(TokenLogprobs, TensorRowsAreCheckedAndNameTheRow) {
  Tensor logits = Tensor::Empty({2, 5});
  for (int i = 0; i < 10; ++i) logits.data<float>()[i] = kLogits[static_cast<size_t>(i % 5)];
  std::vector<SampledToken> out;
  ASSERT_TRUE(kernels::TokenLogprobs(logits, {{1, 2, 1}, {0, 4, 0}}, out).ok());
  ASSERT_EQ(out.size(), 2u);
  EXPECT_NEAR(out[0].logprob, kLogSoftmax[2], 1e-6);
  ASSERT_EQ(out[0].top.size(), 1u);
  EXPECT_EQ(out[0].top[0].token_id, 1);
  EXPECT_NEAR(out[1].logprob, kLogSoftmax[4], 1e-6);
  Status s = kernels::TokenLogprobs(logits, {{0, 1, 1}, {2, 0, 1}}, out);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("row 1 (logits row 2"), std::string::npos) << s.ToString();
  s = kernels::TokenLogprobs(logits, {{0, 5, 1}}, out);
  EXPECT_NE(s.message().find("token 5"), std::string::npos) << s.ToString();
  s = kernels::TokenLogprobs(logits, {{0, 1, -1}}, out);
  EXPECT_NE(s.message().find("top -1"), std::string::npos) << s.ToString();
}

// The sampler returns logprobs exactly for the sequences that ask, from the
// raw distribution whatever the temperature; under greedy the sampled token
// is the top-1 entry.
TEST(SequenceSamplers, LogprobsOnlyWhereAskedAndFromTheRawDistribution) {
  StepBatch batch;
  batch.token_ids = {1, 2, 3, 4};
  std::vector<SamplingParams> params = {
      {0.0f, 0, 1.0f, 1, -1},  // greedy, no logprobs
      {0.0f, 0, 1.0f, 2, 2},   // greedy, 2 top
      {5.0f, 2, 0.5f, 3, 0},   // sampled at a high temperature, own logprob only
  };
  for (size_t i = 0; i < params.size(); ++i) {
    SeqStep s;
    s.seq_id = static_cast<int64_t>(i);
    s.num_tokens = i == 0 ? 2 : 1;
    s.want_logits = true;
    s.sampling = params[i];
    batch.seqs.push_back(s);
  }
  Tensor logits = Tensor::Empty({3, 5});
  for (int i = 0; i < 15; ++i) logits.data<float>()[i] = kLogits[static_cast<size_t>(i % 5)];
  SequenceSamplers samplers;
  auto out = samplers.Sample(batch, logits);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  ASSERT_EQ(out->size(), 3u);
  EXPECT_EQ((*out)[0].token_id, 1);
  EXPECT_FALSE((*out)[0].has_logprobs);
  EXPECT_TRUE((*out)[0].top.empty());
  const SampledToken& g = (*out)[1];
  ASSERT_TRUE(g.has_logprobs);
  EXPECT_EQ(g.token_id, 1);
  ASSERT_EQ(g.top.size(), 2u);
  EXPECT_EQ(g.top[0].token_id, g.token_id);
  EXPECT_EQ(g.top[0].logprob, g.logprob);
  EXPECT_NEAR(g.logprob, kLogSoftmax[1], 1e-6);
  const SampledToken& t = (*out)[2];
  ASSERT_TRUE(t.has_logprobs);
  EXPECT_TRUE(t.token_id == 1 || t.token_id == 3) << t.token_id;  // top_k 2 keeps {1, 3}
  EXPECT_NEAR(t.logprob, kLogSoftmax[static_cast<size_t>(t.token_id)], 1e-6);
  EXPECT_TRUE(t.top.empty());
}

// A row holding a NaN, +inf or -inf yields kNonFiniteLogitsToken (never
// token 0) and no log-probabilities, greedy or sampled; the finite rows of
// the same batch are sampled as usual.
TEST(SequenceSamplers, NonFiniteRowsYieldTheSentinelAndNoLogprobs) {
  const float bad[3] = {std::nanf(""), INFINITY, -INFINITY};
  StepBatch batch;
  std::vector<SamplingParams> params;
  for (int i = 0; i < 7; ++i) {
    SamplingParams p;
    p.logprobs = 2;
    if (i % 2 == 1) {
      p.temperature = 0.7f;
      p.top_k = 3;
      p.seed = static_cast<uint64_t>(i);
    }
    SeqStep s;
    s.seq_id = i;
    s.num_tokens = 1;
    s.want_logits = true;
    s.sampling = p;
    batch.seqs.push_back(s);
    batch.token_ids.push_back(1);
  }
  Tensor logits = Tensor::Empty({7, 5});
  for (int r = 0; r < 7; ++r)
    for (int i = 0; i < 5; ++i) logits.data<float>()[r * 5 + i] = kLogits[static_cast<size_t>(i)];
  // Rows 0..5: one bad value each (greedy and sampled for each kind); row 6
  // stays finite.
  for (int r = 0; r < 6; ++r) logits.data<float>()[r * 5 + (r % 5)] = bad[r / 2];
  SequenceSamplers samplers;
  auto out = samplers.Sample(batch, logits);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  ASSERT_EQ(out->size(), 7u);
  for (int r = 0; r < 6; ++r) {
    SCOPED_TRACE(r);
    EXPECT_EQ((*out)[static_cast<size_t>(r)].token_id, kNonFiniteLogitsToken);
    EXPECT_FALSE((*out)[static_cast<size_t>(r)].has_logprobs);
  }
  EXPECT_EQ((*out)[6].token_id, 1);
  EXPECT_TRUE((*out)[6].has_logprobs);
  EXPECT_EQ(kernels::SampleRowCpu(logits.data<float>(), 5, kernels::SampleRow{}),
            kNonFiniteLogitsToken);
}

TEST(Sampler, ValidateBoundsLogprobs) {
  SamplingParams p;
  for (int32_t ok : {-1, 0, 20}) {
    p.logprobs = ok;
    EXPECT_TRUE(p.Validate().ok()) << ok;
  }
  for (int32_t bad : {-2, 21}) {
    p.logprobs = bad;
    EXPECT_NE(p.Validate().message().find("logprobs must be in -1..20, got " + std::to_string(bad)),
              std::string::npos);
  }
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
