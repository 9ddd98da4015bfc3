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

// SamplingParams with the warper fields set (the rest default).
SamplingParams Params(float temperature, int32_t top_k, float top_p, uint64_t seed,
                      int32_t logprobs = -1) {
  SamplingParams p;
  p.temperature = temperature;
  p.top_k = top_k;
  p.top_p = top_p;
  p.seed = seed;
  p.logprobs = logprobs;
  return p;
}

TEST(Sampler, GreedyTakesFirstMaximum) {
  Sampler s(SamplingParams{});
  std::vector<float> l = {0.1f, 3.0f, -1.0f, 3.0f};
  EXPECT_EQ(s.Sample(l.data(), 4), 1);
}

TEST(Sampler, SeededRunsRepeatAndSeedsDiffer) {
  std::vector<float> l = {1.0f, 1.2f, 0.8f, 1.1f, 0.9f, 1.0f};
  SamplingParams p = Params(1.0f, 0, 1.0f, 42);
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
  SamplingParams k2 = Params(1.0f, 2, 1.0f, 1);
  Sampler sk(k2);
  for (int i = 0; i < 200; ++i) {
    int32_t t = sk.Sample(l.data(), 5);
    EXPECT_TRUE(t == 0 || t == 4) << t;
  }
  // probs ~ {0.506, 0.186, 0.003, 0.001, 0.307}: top_p 0.7 keeps {0, 4}.
  SamplingParams p7 = Params(1.0f, 0, 0.7f, 2);
  Sampler sp(p7);
  std::map<int32_t, int> seen;
  for (int i = 0; i < 400; ++i) seen[sp.Sample(l.data(), 5)]++;
  EXPECT_EQ(seen.size(), 2u);
  EXPECT_GT(seen[0], seen[4]);
}

TEST(Sampler, TemperatureFlattensTheDistribution) {
  std::vector<float> l = {2.0f, 0.0f};
  auto frac = [&](float temp) {
    Sampler s(Params(temp, 0, 1.0f, 7));
    int ones = 0;
    for (int i = 0; i < 2000; ++i) ones += s.Sample(l.data(), 2);
    return ones / 2000.0;
  };
  EXPECT_NEAR(frac(1.0f), 1.0 / (1.0 + std::exp(2.0)), 0.03);
  EXPECT_NEAR(frac(4.0f), 1.0 / (1.0 + std::exp(0.5)), 0.03);
}

TEST(Sampler, ValidateNamesTheField) {
  EXPECT_NE(Params(-1.0f, 0, 1.0f, 0).Validate().message().find("temperature"), std::string::npos);
  EXPECT_NE(Params(1.0f, -3, 1.0f, 0).Validate().message().find("top_k"), std::string::npos);
  EXPECT_NE(Params(1.0f, 0, 0.0f, 0).Validate().message().find("top_p"), std::string::npos);
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
      Params(0.0f, 0, 1.0f, 1, -1),  // greedy, no logprobs
      Params(0.0f, 0, 1.0f, 2, 2),   // greedy, 2 top
      Params(5.0f, 2, 0.5f, 3, 0),   // sampled at a high temperature, own logprob only
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

namespace tessera {
namespace {

// min_p after top-p (HF MinPLogitsWarper): relative probabilities 1, 0.5,
// 0.2, 0.05; min_p 0.3 keeps ids 0 and 1 (renormalised 2/3, 1/3).
TEST(Sampler, MinPDropsTokensBelowItsShareOfTheBest) {
  const std::vector<float> l = {0.0f, std::log(0.5f), std::log(0.2f), std::log(0.05f)};
  kernels::SampleRow row;
  row.temperature = 1.0f;
  row.uniform = 0.99;
  // Without min_p: cumulative 0.571, 0.857, 0.971, 1 -> id 3.
  EXPECT_EQ(kernels::SampleRowCpu(l.data(), 4, row), 3);
  row.min_p = 0.3f;
  EXPECT_EQ(kernels::SampleRowCpu(l.data(), 4, row), 1);
  row.uniform = 0.6;  // below 2/3
  EXPECT_EQ(kernels::SampleRowCpu(l.data(), 4, row), 0);
  row.min_p = 1.0f;  // only the best
  row.uniform = 0.999;
  EXPECT_EQ(kernels::SampleRowCpu(l.data(), 4, row), 0);
}

TEST(Sampler, BannedLogitIsNeverDrawn) {
  const std::vector<float> l = {0.0f, kernels::kBannedLogit, 0.0f};
  kernels::SampleRow row;
  row.temperature = 100.0f;  // even at a high temperature its probability is 0
  for (double u : {0.0, 0.3, 0.5, 0.7, 0.999999999}) {
    row.uniform = u;
    EXPECT_NE(kernels::SampleRowCpu(l.data(), 3, row), 1) << u;
  }
}

TEST(LogitAdjustmentsFor, CountsOutputTokensAndMarksPromptTokens) {
  SamplingParams p;
  p.presence_penalty = 0.5f;
  p.frequency_penalty = 0.25f;
  p.repetition_penalty = 1.5f;
  p.logit_bias = {{10, 2.0f}, {8, -1.0f}};
  p.min_tokens = 5;
  p.min_tokens_blocked = {2};
  // Prompt 7 8 7, output 8 8 9 (3 generated < min_tokens 5: token 2 banned).
  const std::vector<int32_t> tokens = {7, 8, 7, 8, 8, 9};
  auto e = LogitAdjustmentsFor(p, tokens, 3, 4, 100);
  std::map<int32_t, kernels::LogitAdjustment> by;
  for (const auto& a : e) {
    EXPECT_EQ(a.row, 4);
    EXPECT_TRUE(by.emplace(a.token, a).second) << "token " << a.token << " twice";
  }
  ASSERT_EQ(by.size(), 5u);
  EXPECT_EQ(by[7].flags, kernels::kLogitInPrompt);
  EXPECT_EQ(by[7].output_count, 0);
  EXPECT_EQ(by[8].flags, kernels::kLogitInPrompt);
  EXPECT_EQ(by[8].output_count, 2);
  EXPECT_FLOAT_EQ(by[8].bias, -1.0f);
  EXPECT_EQ(by[9].output_count, 1);
  EXPECT_FLOAT_EQ(by[10].bias, 2.0f);
  EXPECT_EQ(by[2].flags, kernels::kLogitBanned);
  EXPECT_FLOAT_EQ(by[9].presence, 0.5f);
  EXPECT_FLOAT_EQ(by[9].frequency, 0.25f);
  EXPECT_FLOAT_EQ(by[9].repetition, 1.5f);
  // Five tokens generated: min_tokens is met, nothing banned; no
  // repetition penalty: prompt tokens need no entry.
  p.repetition_penalty = 1.0f;
  e = LogitAdjustmentsFor(p, {7, 8, 7, 8, 8, 9, 9, 9}, 3, 0, 100);
  for (const auto& a : e) {
    EXPECT_NE(a.token, 2);
    EXPECT_NE(a.token, 7);
  }
}

SeqStep Step(int64_t id, int32_t start, int32_t n, bool want, const SamplingParams& p) {
  SeqStep s;
  s.seq_id = id;
  s.start_pos = start;
  s.num_tokens = n;
  s.want_logits = want;
  s.sampling = p;
  s.output_start = 4;
  return s;
}

// The history is built from prefill chunks the sampling rank sees (and a
// step's `history` where a prefix-cache hit skipped tokens); the presence
// penalty then moves a greedy pick off an already generated token.
TEST(SequenceSamplers, PenaltiesUseTheHistoryOfTheBatchesSeen) {
  SamplingParams p;  // greedy
  p.presence_penalty = 1.0f;
  SequenceSamplers samplers;
  Tensor none = Tensor::Empty({0, 12});
  StepBatch chunk;
  chunk.token_ids = {5, 6, 7};
  chunk.seqs = {Step(1, 0, 3, false, p)};
  ASSERT_TRUE(samplers.Sample(chunk, none).ok());
  EXPECT_EQ(samplers.histories(), 1u);
  // Positions 3 (prompt) and 4 (generated: 9).
  StepBatch next;
  next.token_ids = {5, 9};
  next.seqs = {Step(1, 3, 2, true, p)};
  Tensor l = Tensor::Zeros({1, 12});
  l.data<float>()[9] = 1.0f;  // best by 1.0 ...
  l.data<float>()[3] = 0.5f;  // ... but 9 was generated: 1 - 1 < 0.5
  l.data<float>()[5] = 0.9f;  // 5 is only in the prompt: presence does not count it
  auto out = samplers.Sample(next, l);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_EQ((*out)[0].token_id, 5);
  // A sequence that starts past what is known without history is refused.
  StepBatch gap;
  gap.token_ids = {1};
  gap.seqs = {Step(2, 3, 1, true, p)};
  Tensor g = Tensor::Zeros({1, 12});
  auto bad = samplers.Sample(gap, g);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("seq_id 2 starts at position 3"), std::string::npos)
      << bad.status().ToString();
  // With the skipped tokens as history it samples: generated = [3, 9]
  // (positions 4 and 5 of history 8 8 8 8 3 + token 9).
  gap.seqs[0].history = {8, 8, 8, 8};
  gap.seqs[0].start_pos = 4;
  gap.seqs[0].output_start = 4;
  gap.token_ids = {3};
  g = Tensor::Zeros({1, 12});
  g.data<float>()[3] = 0.8f;  // generated once: 0.8 - 1 < 0
  g.data<float>()[8] = 0.1f;  // only in the prompt
  auto good = samplers.Sample(gap, g);
  ASSERT_TRUE(good.ok()) << good.status().ToString();
  EXPECT_EQ((*good)[0].token_id, 8);
  // Finished sequences drop their history.
  StepBatch end;
  end.finished_seq_ids = {1, 2};
  ASSERT_TRUE(samplers.Sample(end, none).ok());
  EXPECT_EQ(samplers.histories(), 0u);
}

// logit_bias changes the pick, not the reported log-probabilities: they
// stay those of the raw logits.
TEST(SequenceSamplers, LogitBiasPicksButLogprobsStayRaw) {
  SamplingParams p;
  p.logit_bias = {{0, 100.0f}};
  p.logprobs = 1;
  StepBatch b;
  b.token_ids = {1};
  b.seqs = {Step(1, 0, 1, true, p)};
  Tensor l = Tensor::Empty({1, 5});
  std::copy(kLogits.begin(), kLogits.end(), l.data<float>());
  SequenceSamplers samplers;
  auto out = samplers.Sample(b, l);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_EQ((*out)[0].token_id, 0);
  ASSERT_TRUE((*out)[0].has_logprobs);
  EXPECT_NEAR((*out)[0].logprob, kLogSoftmax[0], 1e-6);
  ASSERT_EQ((*out)[0].top.size(), 1u);
  EXPECT_EQ((*out)[0].top[0].token_id, 1);  // the raw best
}

// min_tokens bans its ids until enough tokens were generated.
TEST(SequenceSamplers, MinTokensBansEosUntilReached) {
  SamplingParams p;
  p.min_tokens = 2;
  p.min_tokens_blocked = {4};
  SequenceSamplers samplers;
  std::vector<int32_t> tokens = {1, 2, 3, 4};  // prompt of 4 (output_start 4)
  StepBatch prefill;
  prefill.token_ids = tokens;
  prefill.seqs = {Step(1, 0, 4, true, p)};
  Tensor l = Tensor::Zeros({1, 6});
  l.data<float>()[4] = 5.0f;
  auto a = samplers.Sample(prefill, l);
  ASSERT_TRUE(a.ok());
  EXPECT_NE((*a)[0].token_id, 4);  // 0 generated
  StepBatch d1;
  d1.token_ids = {0};
  d1.seqs = {Step(1, 4, 1, true, p)};
  l = Tensor::Zeros({1, 6});
  l.data<float>()[4] = 5.0f;
  auto b = samplers.Sample(d1, l);
  ASSERT_TRUE(b.ok());
  EXPECT_NE((*b)[0].token_id, 4);  // 1 generated
  StepBatch d2;
  d2.token_ids = {0};
  d2.seqs = {Step(1, 5, 1, true, p)};
  l = Tensor::Zeros({1, 6});
  l.data<float>()[4] = 5.0f;
  auto c = samplers.Sample(d2, l);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ((*c)[0].token_id, 4);  // 2 generated: allowed
}

}  // namespace
}  // namespace tessera
