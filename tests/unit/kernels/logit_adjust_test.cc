// Logits processing (kernels/logit_adjust.h) on the CPU against values worked
// out by hand from the formulas of kernels/logit_adjust_entry.h.
#include "kernels/logit_adjust.h"

#include <gtest/gtest.h>

#include <vector>

namespace tessera::kernels {
namespace {

Tensor Logits(const std::vector<float>& values, int64_t rows) {
  Tensor t = Tensor::Empty({rows, static_cast<int64_t>(values.size()) / rows});
  std::copy(values.begin(), values.end(), t.data<float>());
  return t;
}

TEST(AdjustLogits, EachFormulaByHand) {
  Tensor l = Logits({2.0f, -1.0f, 0.5f, 3.0f, 2.0f, -1.0f, 0.5f, 3.0f}, 2);
  std::vector<LogitAdjustment> e(5);
  // Row 0, token 0: bias 1 -> 3; in the prompt, repetition 2, positive -> 3 / 2;
  // never generated: no presence or frequency.
  e[0] = {0, 0, 0, 1.0f, 0.25f, 0.5f, 2.0f, kLogitInPrompt};
  // Row 0, token 1: generated twice; -1 * 2 = -2, then -2 - (0.5 * 2 + 0.25).
  e[1] = {0, 1, 2, 0.0f, 0.25f, 0.5f, 2.0f, 0};
  // Row 0, token 2: banned (min_tokens), whatever its bias.
  e[2] = {0, 2, 0, 5.0f, 0.0f, 0.0f, 1.0f, kLogitBanned};
  // Row 1, token 3: generated once, no repetition penalty: 3 - 1 * 1 - 1.
  e[3] = {1, 3, 1, 0.0f, 1.0f, 1.0f, 1.0f, 0};
  // Row 1, token 1: only a negative bias.
  e[4] = {1, 1, 0, -100.0f, 0.0f, 0.0f, 1.0f, 0};
  ASSERT_TRUE(AdjustLogits(l, e).ok());
  const float* v = l.data<float>();
  EXPECT_FLOAT_EQ(v[0], 1.5f);
  EXPECT_FLOAT_EQ(v[1], -3.25f);
  EXPECT_EQ(v[2], kBannedLogit);
  EXPECT_FLOAT_EQ(v[3], 3.0f);  // no entry: unchanged
  EXPECT_FLOAT_EQ(v[4], 2.0f);
  EXPECT_FLOAT_EQ(v[5], -101.0f);
  EXPECT_FLOAT_EQ(v[6], 0.5f);
  EXPECT_FLOAT_EQ(v[7], 1.0f);
}

TEST(AdjustLogits, RepetitionPenaltyOnlyOnSeenTokens) {
  Tensor l = Logits({4.0f, -4.0f}, 1);
  // Neither in the prompt nor generated: repetition does not apply.
  std::vector<LogitAdjustment> e = {{0, 0, 0, 0.0f, 0.0f, 0.0f, 1.3f, 0},
                                    {0, 1, 0, 0.0f, 0.0f, 0.0f, 1.3f, kLogitInPrompt}};
  ASSERT_TRUE(AdjustLogits(l, e).ok());
  EXPECT_FLOAT_EQ(l.data<float>()[0], 4.0f);
  EXPECT_FLOAT_EQ(l.data<float>()[1], -4.0f * 1.3f);
}

TEST(AdjustLogits, RejectsEntriesThatDoNotFitNamingThem) {
  Tensor l = Logits({0.0f, 0.0f, 0.0f}, 1);
  LogitAdjustment ok{0, 1, 0, 1.0f, 0.0f, 0.0f, 1.0f, 0};
  LogitAdjustment bad_token = ok;
  bad_token.token = 3;
  Status s = AdjustLogits(l, {bad_token});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("token 3"), std::string::npos) << s.ToString();
  LogitAdjustment bad_row = ok;
  bad_row.row = 1;
  EXPECT_FALSE(AdjustLogits(l, {bad_row}).ok());
  LogitAdjustment bad_rep = ok;
  bad_rep.repetition = 0.0f;
  EXPECT_FALSE(AdjustLogits(l, {bad_rep}).ok());
  s = AdjustLogits(l, {ok, ok});
  EXPECT_NE(s.message().find("twice"), std::string::npos) << s.ToString();
  EXPECT_EQ(l.data<float>()[1], 0.0f);  // nothing applied on an error
}

// Structured-output masks: a clear bit bans its token (kBannedLogit), a set
// bit keeps the logit; rows without a mask are untouched; 40 tokens span two
// words.
TEST(MaskLogits, ClearBitsAreBannedAcrossWords) {
  std::vector<float> values(3 * 40);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i % 40) * 0.5f;
  Tensor l = Logits(values, 3);
  // Row 2: tokens 1 and 33 allowed. Row 0: every token but 39.
  const std::vector<int64_t> rows = {2, 0};
  const std::vector<uint32_t> words = {(1u << 1), (1u << 1), 0xffffffffu, 0x7fu};
  ASSERT_TRUE(MaskLogits(l, rows, words, 2).ok());
  const float* v = l.data<float>();
  for (int t = 0; t < 40; ++t) {
    SCOPED_TRACE(t);
    EXPECT_EQ(v[2 * 40 + t], t == 1 || t == 33 ? t * 0.5f : kBannedLogit);
    EXPECT_EQ(v[t], t == 39 ? kBannedLogit : t * 0.5f);
    EXPECT_EQ(v[40 + t], t * 0.5f);
  }
}

TEST(MaskLogits, BadShapesAreRefused) {
  Tensor l = Logits(std::vector<float>(2 * 40, 0.0f), 2);
  EXPECT_FALSE(MaskLogits(l, {0}, {0u}, 1).ok());         // 40 tokens need 2 words
  EXPECT_FALSE(MaskLogits(l, {2}, {0u, 0u}, 2).ok());     // row outside [0, 2)
  EXPECT_FALSE(MaskLogits(l, {0, 1}, {0u, 0u}, 2).ok());  // words for one row only
  EXPECT_TRUE(MaskLogits(l, {}, {}, 2).ok());
}

}  // namespace
}  // namespace tessera::kernels
