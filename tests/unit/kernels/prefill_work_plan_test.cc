// The work plan of FlashInfer's Hopper prefill (kernels/prefill_work_plan.h): every (sequence,
// query tile, head) exactly once, the kernel's arrays consistent with the sequences, and the
// longest-processing-time bound on the busiest CTA.
#include "kernels/prefill_work_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <tuple>

namespace tessera::kernels {
namespace {

// Every item's fields, keyed by (batch, tile, head), with the CTA that runs it.
struct Seen {
  int64_t cta;
  int32_t qo_indptr, kv_indptr, qo_len, kv_len;
};
std::map<std::tuple<int32_t, int32_t, int32_t>, Seen> ItemsOf(const PrefillWorkPlan& p) {
  std::map<std::tuple<int32_t, int32_t, int32_t>, Seen> out;
  const auto at = [&](PrefillWorkPlan::Field f, int64_t w) { return p.values[p.Offset(f) + w]; };
  for (int64_t c = 0; c < p.ctas; ++c) {
    for (int64_t w = p.values[c]; w < p.values[c + 1]; ++w) {
      const auto key =
          std::make_tuple(at(PrefillWorkPlan::kBatch, w), at(PrefillWorkPlan::kQoTile, w),
                          at(PrefillWorkPlan::kHead, w));
      EXPECT_EQ(out.count(key), 0u) << "item planned twice";
      out[key] = {c, at(PrefillWorkPlan::kQoIndptr, w), at(PrefillWorkPlan::kKvIndptr, w),
                  at(PrefillWorkPlan::kQoLen, w), at(PrefillWorkPlan::kKvLen, w)};
    }
  }
  return out;
}

TEST(PrefillWorkPlan, EveryTileOfEveryHeadOnceWithItsSequence) {
  // A fresh prompt, a chunk after a cached prefix, a decode token, an empty sequence.
  const std::vector<PrefillWorkSeq> seqs = {
      {0, 300, 0, 300, 0}, {300, 129, 19, 1129, 1}, {429, 1, 90, 40, 2}, {430, 0, 93, 7, 3}};
  const PrefillWorkPlan p = PlanPrefillWork(seqs, /*heads=*/4, /*ctas=*/5, /*tile_q=*/128);
  EXPECT_EQ(p.ctas, 5);
  EXPECT_EQ(p.works, (3 + 2 + 1) * 4);
  ASSERT_EQ(p.values.size(), static_cast<size_t>(6 + 7 * p.works));
  EXPECT_EQ(p.values[0], 0);
  EXPECT_EQ(p.values[5], p.works);
  const auto items = ItemsOf(p);
  ASSERT_EQ(static_cast<int64_t>(items.size()), p.works);
  for (const auto& [key, seen] : items) {
    const auto [batch, tile, head] = key;
    ASSERT_GE(batch, 0);
    ASSERT_LT(batch, 3) << "the empty sequence has no work";
    const PrefillWorkSeq& s = seqs[static_cast<size_t>(batch)];
    EXPECT_LT(tile * 128, s.q_len);
    EXPECT_GE(head, 0);
    EXPECT_LT(head, 4);
    EXPECT_EQ(seen.qo_indptr, s.q_begin);
    EXPECT_EQ(seen.kv_indptr, s.kv_begin);
    EXPECT_EQ(seen.qo_len, s.q_len);
    EXPECT_EQ(seen.kv_len, s.kv_len);
  }
}

TEST(PrefillWorkPlan, CostIsTheCausalReadsPlusTheTile) {
  // One sequence, one head, one CTA: 300 rows over 300 positions in tiles of 128 read 128, 256
  // and 300 positions; each item adds its 128 rows.
  const std::vector<PrefillWorkSeq> seqs = {{0, 300, 0, 300, 0}};
  const PrefillWorkPlan p = PlanPrefillWork(seqs, 1, 1, 128);
  EXPECT_EQ(p.total_cost, (128 + 128) + (256 + 128) + (300 + 128));
  EXPECT_EQ(p.max_cta_cost, p.total_cost);
  // After a cached prefix of 1000, a chunk of 129 rows: tiles read 1128 and 1129 positions.
  const std::vector<PrefillWorkSeq> chunk = {{0, 129, 0, 1129, 0}};
  EXPECT_EQ(PlanPrefillWork(chunk, 1, 1, 128).total_cost, (1128 + 128) + (1129 + 128));
}

TEST(PrefillWorkPlan, BusiestCtaWithinTheLptBound) {
  // A 32k prompt beside short ones over 132 SMs, 32 heads: items are many and uneven.
  const std::vector<PrefillWorkSeq> seqs = {
      {0, 32768, 0, 32768, 0}, {32768, 1024, 2048, 1024, 1}, {33792, 77, 2112, 5077, 2}};
  const PrefillWorkPlan p = PlanPrefillWork(seqs, 32, 132, 128);
  EXPECT_EQ(p.works, (256 + 8 + 1) * 32);
  // LPT: the busiest CTA is within 4/3 of the optimum, and the optimum is at least the mean
  // and at least the largest item (32768 + 128).
  int64_t largest = 0;
  for (int64_t w = 0; w < p.works; ++w)
    largest = std::max<int64_t>(
        largest,
        std::min<int64_t>(32768, (p.values[p.Offset(PrefillWorkPlan::kQoTile) + w] + 1) * 128) +
            128);
  const int64_t lower = std::max((p.total_cost + p.ctas - 1) / p.ctas, largest);
  EXPECT_LE(p.max_cta_cost * 3, lower * 4);
  // With this many items LPT is close to the mean: within 2%.
  EXPECT_LE(p.max_cta_cost * 100, lower * 102);
  // Every CTA has work.
  for (int64_t c = 0; c < p.ctas; ++c) EXPECT_LT(p.values[c], p.values[c + 1]) << "cta " << c;
}

TEST(PrefillWorkPlan, SameInputSamePlan) {
  const std::vector<PrefillWorkSeq> seqs = {{0, 500, 0, 500, 0}, {500, 500, 32, 500, 1}};
  EXPECT_EQ(PlanPrefillWork(seqs, 8, 16, 128).values, PlanPrefillWork(seqs, 8, 16, 128).values);
}

TEST(PrefillWorkPlan, NoSequencesNoWork) {
  const PrefillWorkPlan p = PlanPrefillWork({}, 8, 4, 128);
  EXPECT_EQ(p.works, 0);
  EXPECT_EQ(p.values, std::vector<int32_t>(5, 0));
}

}  // namespace
}  // namespace tessera::kernels
