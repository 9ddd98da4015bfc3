// PlanChange: the layouts of admin plan requests, the fault rule (FitLayout),
// placement with weight reuse and the typed change a dry run describes, on
// the fixture models' configs.
#include "coordinator/placement/plan_change.h"

#include <gtest/gtest.h>

#include "support/test_util.h"

namespace tessera {
namespace {

ModelConfig Model(const std::string& name) {
  auto m = LoadModelConfig(::tessera::testing::FixturePath("models/" + name));
  TESSERA_CHECK(m.ok());
  return *m;
}

TEST(PlanChange, FitLayoutKeepsTheWantedLayoutOrShrinksByTheRule) {
  const ModelConfig m = Model("llama_gqa_f32");  // 2 layers, 4 heads, 2 KV heads
  const ParallelConfig wanted = *ParallelConfig::Make(m, 2, 2);
  // Enough workers (a spare too): the wanted layout.
  for (int n : {4, 5}) {
    auto p = FitLayout(m, wanted, n);
    ASSERT_TRUE(p.ok());
    EXPECT_EQ(p->tp, 2);
    EXPECT_EQ(p->pp, 2);
  }
  // 3 workers: 3 ranks cannot take tp 2 (no divisor) and tp 1 x pp 3 has more
  // stages than layers, so 2 ranks with the wanted tp.
  auto three = FitLayout(m, wanted, 3);
  ASSERT_TRUE(three.ok());
  EXPECT_EQ(three->tp, 2);
  EXPECT_EQ(three->pp, 1);
  auto one = FitLayout(m, wanted, 1);
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->world_size(), 1);
  // No worker: degraded.
  auto none = FitLayout(m, wanted, 0);
  EXPECT_EQ(none.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(none.status().message().rfind("no layout of the model fits 0 usable worker(s)", 0), 0)
      << none.status().message();
  // tp 1 x pp 2 wanted, one worker left: tp stays 1.
  auto pp_only = FitLayout(m, *ParallelConfig::Make(m, 1, 2, {1, 1}), 1);
  ASSERT_TRUE(pp_only.ok());
  EXPECT_EQ(pp_only->tp, 1);
  EXPECT_EQ(pp_only->pp, 1);
  // A memory bound: a worker that cannot hold half the model forces more
  // ranks; one that cannot hold a quarter leaves nothing that fits.
  const int64_t full = 609640;  // about the fixture's weight bytes
  auto roomy = FitLayout(m, wanted, 4, full);
  ASSERT_TRUE(roomy.ok());
  auto tiny = FitLayout(m, wanted, 4, 1000);
  EXPECT_EQ(tiny.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(tiny.status().message().find("weight bytes"), std::string::npos)
      << tiny.status().message();
}

TEST(PlanChange, PlaceRanksPrefersWorkersThatHoldTheSlice) {
  const ModelConfig m = Model("llama3_headdim_sharded");  // 3 layers
  const ParallelConfig from = *ParallelConfig::Make(m, 1, 3);
  std::map<std::string, HeldSlice> held;
  // w-a held layer 0 (+ embedding), w-b layer 1, w-c layer 2 (+ lm_head), tp 1.
  held["w-a"] = {1, 0, 0, 1, true, false};
  held["w-b"] = {1, 0, 1, 2, false, false};
  held["w-c"] = {1, 0, 2, 3, false, true};
  // tp 1 x pp 2 with [1, 2]: stage 0 = layer 0, stage 1 = layers 1-2.
  const ParallelConfig to = *ParallelConfig::Make(m, 1, 2, {1, 2});
  auto ranks = PlaceRanks(to, {"w-spare", "w-c", "w-b", "w-a"}, held);
  ASSERT_TRUE(ranks.ok());
  ASSERT_EQ(ranks->size(), 2u);
  EXPECT_EQ((*ranks)[0].worker_id, "w-a");
  EXPECT_EQ((*ranks)[0].reused_first, 0);
  EXPECT_EQ((*ranks)[0].reused_end, 1);
  EXPECT_TRUE((*ranks)[0].reuses_embedding);
  EXPECT_EQ((*ranks)[0].loaded_layers(), 0);
  // w-b and w-c each hold one of stage 1's layers; w-c also holds lm_head.
  EXPECT_EQ((*ranks)[1].worker_id, "w-c");
  EXPECT_EQ((*ranks)[1].loaded_layers(), 1);
  EXPECT_TRUE((*ranks)[1].reuses_lm_head);
  // A different tp slices every layer differently: nothing is reused, ranks
  // go to the candidates in order.
  const ParallelConfig tp2 = *ParallelConfig::Make(m, 2, 1);
  auto moved = PlaceRanks(tp2, {"w-spare", "w-c", "w-b"}, held);
  ASSERT_TRUE(moved.ok());
  EXPECT_EQ((*moved)[0].worker_id, "w-spare");
  EXPECT_EQ((*moved)[1].worker_id, "w-c");
  EXPECT_EQ((*moved)[0].loaded_layers(), 3);
  const PlanChange change = DescribePlanChange(&from, tp2, *moved, {"w-a", "w-b", "w-c"}, 7);
  EXPECT_EQ(change.plan_version, 7u);
  ASSERT_TRUE(change.from.has_value());
  EXPECT_EQ(change.from->pp, from.pp);
  EXPECT_EQ(change.to.tp, 2);
  EXPECT_EQ(change.layers_loaded, 6);
  EXPECT_EQ(change.layers_reused, 0);
  EXPECT_EQ(change.workers_released, (std::vector<std::string>{"w-a", "w-b"}));
  // A lost worker's rank goes to the spare, not to a worker another rank
  // could reuse (tp=2 x pp=2 of llama_gqa_f32, rank 1's worker lost).
  const ModelConfig gqa = Model("llama_gqa_f32");
  const ParallelConfig p22 = *ParallelConfig::Make(gqa, 2, 2);
  std::map<std::string, HeldSlice> before;
  before["A"] = {2, 0, 0, 1, true, false};
  before["C"] = {2, 0, 1, 2, false, true};
  before["D"] = {2, 1, 1, 2, false, true};
  auto refill = PlaceRanks(p22, {"A", "C", "D", "E"}, before);
  ASSERT_TRUE(refill.ok());
  std::vector<std::string> got;
  for (const RankPlacement& p : *refill) got.push_back(p.worker_id);
  EXPECT_EQ(got, (std::vector<std::string>{"A", "E", "C", "D"}));
  // Too few workers.
  auto short_of = PlaceRanks(to, {"w-a"}, held);
  EXPECT_EQ(short_of.status().code(), StatusCode::kFailedPrecondition);
}

// Mixed tp: a rank reuses a slice only under its own stage's tp; the fault
// rule shrinks to one tp, capped by the largest stage tp.
TEST(PlanChange, MixedTpReusesByTheStageTpAndFitsByTheLargestTp) {
  const ModelConfig m = Model("llama_gqa_f32");  // 2 layers, 4 heads, 2 KV heads
  const ParallelConfig mixed = *ParallelConfig::MakePerStage(m, {2, 1});
  // RankSlice carries each rank's stage tp.
  EXPECT_EQ(RankSlice(mixed, 1).tp, 2);
  EXPECT_EQ(RankSlice(mixed, 1).tp_rank, 1);
  EXPECT_EQ(RankSlice(mixed, 2).tp, 1);
  EXPECT_EQ(RankSlice(mixed, 2).stage, 1);
  // What tp=[2,1] left: A, B = stage 0 (tp 2, layer 0, embedding), C = stage 1
  // (tp 1, layer 1, lm_head).
  std::map<std::string, HeldSlice> held;
  held["A"] = {2, 0, 0, 1, true, false};
  held["B"] = {2, 1, 0, 1, true, false};
  held["C"] = {1, 0, 1, 2, false, true};
  // The same layout after losing B: the spare takes rank 1, A and C reuse all.
  auto refill = PlaceRanks(mixed, {"S", "C", "A"}, held);
  ASSERT_TRUE(refill.ok()) << refill.status().ToString();
  EXPECT_EQ((*refill)[0].worker_id, "A");
  EXPECT_EQ((*refill)[0].loaded_layers(), 0);
  EXPECT_TRUE((*refill)[0].reuses_embedding);
  EXPECT_EQ((*refill)[1].worker_id, "S");
  EXPECT_EQ((*refill)[1].loaded_layers(), 1);
  EXPECT_EQ((*refill)[2].worker_id, "C");
  EXPECT_EQ((*refill)[2].loaded_layers(), 0);
  EXPECT_TRUE((*refill)[2].reuses_lm_head);
  // tp=2 x pp=1: A and B keep their tp-2 slices of layer 0 and the
  // embedding; C's tp-1 layer 1 is a different slice, reused by no rank.
  const ParallelConfig tp2 = *ParallelConfig::Make(m, 2, 1);
  auto shrunk = PlaceRanks(tp2, {"C", "B", "A"}, held);
  ASSERT_TRUE(shrunk.ok());
  EXPECT_EQ((*shrunk)[0].worker_id, "A");
  EXPECT_EQ((*shrunk)[1].worker_id, "B");
  for (const RankPlacement& p : *shrunk) {
    EXPECT_EQ(p.reused_first, 0);
    EXPECT_EQ(p.reused_end, 1);
    EXPECT_TRUE(p.reuses_embedding);
    EXPECT_FALSE(p.reuses_lm_head);
  }
  // tp=[1,2]: every stage's tp differs from what its layers were held under.
  const ParallelConfig flipped = *ParallelConfig::MakePerStage(m, {1, 2});
  auto none = PlaceRanks(flipped, {"A", "B", "C"}, held);
  ASSERT_TRUE(none.ok());
  for (const RankPlacement& p : *none) EXPECT_EQ(p.reused_end - p.reused_first, 0);
  const PlanChange change = DescribePlanChange(&mixed, flipped, *none, {"A", "B", "C"}, 3);
  EXPECT_EQ(change.from->TpPerStage(), (std::vector<int>{2, 1}));
  EXPECT_EQ(change.to.TpPerStage(), (std::vector<int>{1, 2}));
  EXPECT_EQ(change.ranks[0].tp, 1);
  EXPECT_EQ(change.ranks[1].tp, 2);
  EXPECT_EQ(change.layers_loaded, 3);
  EXPECT_TRUE(change.workers_released.empty());
  // Before the first placement nothing runs: no "from".
  EXPECT_FALSE(DescribePlanChange(nullptr, flipped, *none, {}, 1).from.has_value());
  // The fault rule: 3 workers keep tp=[2,1]; 2 give tp=2 x pp=1 (the largest
  // stage tp, not 0); 1 gives tp=1 x pp=1.
  auto keep = FitLayout(m, mixed, 3);
  ASSERT_TRUE(keep.ok());
  EXPECT_EQ(keep->TpPerStage(), (std::vector<int>{2, 1}));
  auto two = FitLayout(m, mixed, 2);
  ASSERT_TRUE(two.ok()) << two.status().ToString();
  EXPECT_EQ(two->tp, 2);
  EXPECT_EQ(two->pp, 1);
  auto one = FitLayout(m, mixed, 1);
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->world_size(), 1);
}

}  // namespace
}  // namespace tessera
