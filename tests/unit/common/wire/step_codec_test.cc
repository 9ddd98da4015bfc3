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
  a.sampling = SamplingParams{0.7f, 5, 0.9f, 42, 3};
  SeqStep c;
  c.seq_id = 12;
  c.start_pos = 20;
  c.num_tokens = 1;
  c.prompt_len = 18;
  c.block_table = {1, 2};
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
