#include "common/wire/step_codec.h"

#include <gtest/gtest.h>

namespace tessera {
namespace {

StepBatch Sample() {
  StepBatch b;
  b.token_ids = {1, 2, 3, 4};
  b.finished_seq_ids = {7};
  SeqStep a;
  a.seq_id = 11;
  a.start_pos = 0;
  a.num_tokens = 3;
  a.prompt_len = 3;
  a.block_table = {4, 9};
  a.want_logits = true;
  a.sampling.temperature = 0.7f;
  a.sampling.top_k = 5;
  a.sampling.top_p = 0.9f;
  a.sampling.seed = 42;
  a.sampling.logprobs = 3;
  SeqStep c;
  c.seq_id = 12;
  c.start_pos = 20;
  c.num_tokens = 1;
  c.prompt_len = 18;
  c.block_table = {1, 2};
  c.sampling.presence_penalty = 0.5f;
  c.sampling.frequency_penalty = -1.25f;
  c.sampling.repetition_penalty = 1.3f;
  c.sampling.min_p = 0.05f;
  c.sampling.min_tokens = 4;
  c.sampling.logit_bias = {{3, -100.0f}, {9, 2.5f}};
  c.sampling.min_tokens_blocked = {2, 7};
  c.output_start = 18;
  c.history.assign(20, 6);
  b.seqs = {a, c};
  return b;
}

TEST(StepCodec, RoundTrips) {
  auto d = DecodeStep(EncodeStep(Sample()));
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->kind, StepMessageKind::kStep);
  const StepBatch& b = d->batch;
  EXPECT_EQ(b.token_ids, Sample().token_ids);
  EXPECT_EQ(b.finished_seq_ids, std::vector<int64_t>{7});
  ASSERT_EQ(b.seqs.size(), 2u);
  EXPECT_EQ(b.seqs[0].block_table, (std::vector<int32_t>{4, 9}));
  EXPECT_EQ(b.seqs[0].sampling.seed, 42u);
  EXPECT_EQ(b.seqs[0].sampling.logprobs, 3);
  EXPECT_EQ(b.seqs[1].sampling.logprobs, -1);
  EXPECT_FLOAT_EQ(b.seqs[0].sampling.top_p, 0.9f);
  EXPECT_TRUE(b.seqs[0].want_logits);
  EXPECT_EQ(b.seqs[1].start_pos, 20);
  EXPECT_EQ(b.seqs[1].prompt_len, 18);
  EXPECT_EQ(b.Positions(), (std::vector<int32_t>{0, 1, 2, 20}));
  const SamplingParams& q = b.seqs[1].sampling;
  EXPECT_EQ(q.presence_penalty, 0.5f);
  EXPECT_EQ(q.frequency_penalty, -1.25f);
  EXPECT_EQ(q.repetition_penalty, 1.3f);
  EXPECT_EQ(q.min_p, 0.05f);
  EXPECT_EQ(q.min_tokens, 4);
  EXPECT_EQ(q.logit_bias, (std::vector<std::pair<int32_t, float>>{{3, -100.0f}, {9, 2.5f}}));
  EXPECT_EQ(q.min_tokens_blocked, (std::vector<int32_t>{2, 7}));
  EXPECT_EQ(b.seqs[1].output_start, 18);
  EXPECT_EQ(b.seqs[1].history, std::vector<int32_t>(20, 6));
  EXPECT_TRUE(b.seqs[0].history.empty());
  EXPECT_EQ(b.seqs[0].sampling.repetition_penalty, 1.0f);
  // A history that is not start_pos long, and sampling out of range, are refused.
  StepBatch short_history = Sample();
  short_history.seqs[1].history.resize(5);
  auto bad = DecodeStep(EncodeStep(short_history));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("history of 5 tokens"), std::string::npos)
      << bad.status().ToString();
  StepBatch bad_bias = Sample();
  bad_bias.seqs[1].sampling.logit_bias = {{3, 200.0f}};
  bad = DecodeStep(EncodeStep(bad_bias));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("logit_bias"), std::string::npos)
      << bad.status().ToString();
  EXPECT_EQ(DecodeStep(EncodeShutdown())->kind, StepMessageKind::kShutdown);
  EXPECT_EQ(DecodeStep(EncodeKeepalive())->kind, StepMessageKind::kKeepalive);
}

TEST(StepCodec, RejectsMalformedMessagesNamingTheProblem) {
  auto bytes = EncodeStep(Sample());
  auto bad_magic = bytes;
  bad_magic[0] = 'X';
  EXPECT_NE(DecodeStep(bad_magic).status().message().find("magic"), std::string::npos);
  auto bad_version = bytes;
  bad_version[3] = 99;
  EXPECT_NE(DecodeStep(bad_version).status().message().find("version 99"), std::string::npos);
  for (size_t cut : {size_t{2}, size_t{6}, bytes.size() / 2, bytes.size() - 1}) {
    std::vector<uint8_t> t(bytes.begin(), bytes.begin() + static_cast<long>(cut));
    EXPECT_EQ(DecodeStep(t).status().code(), StatusCode::kInvalidArgument) << cut;
  }
  // A count larger than the message.
  auto huge = bytes;
  huge[5] = 0xff;
  huge[6] = 0xff;
  EXPECT_NE(DecodeStep(huge).status().message().find("exceeds the message"), std::string::npos);
  // Sequences that do not cover the tokens.
  StepBatch b = Sample();
  b.token_ids.push_back(5);
  EXPECT_NE(DecodeStep(EncodeStep(b)).status().message().find("cover"), std::string::npos);
}

}  // namespace
}  // namespace tessera
