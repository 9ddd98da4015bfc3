#include "common/model/parallel_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/model/parallel_rank.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;

// Llama-3-8B's shape: 32 query heads, 8 KV heads, 32 layers.
ModelConfig Llama3_8B() {
  ModelConfig m;
  m.architecture = Architecture::kLlama;
  m.hidden_size = 4096;
  m.intermediate_size = 14336;
  m.num_hidden_layers = 32;
  m.num_attention_heads = 32;
  m.num_key_value_heads = 8;
  m.head_dim = 128;
  m.vocab_size = 128256;
  return m;
}

ModelConfig Small(int64_t layers, int64_t heads, int64_t kv_heads) {
  ModelConfig m = Llama3_8B();
  m.num_hidden_layers = layers;
  m.num_attention_heads = heads;
  m.num_key_value_heads = kv_heads;
  m.hidden_size = heads * 16;
  m.head_dim = 16;
  m.intermediate_size = 96;
  return m;
}

// The error message of Make(model, tp, pp, layers), or "" when it succeeds.
std::string MakeError(const ModelConfig& m, int tp, int pp, std::vector<int> layers = {}) {
  auto pc = ParallelConfig::Make(m, tp, pp, std::move(layers));
  if (pc.ok()) return "";
  EXPECT_EQ(pc.status().code(), StatusCode::kInvalidArgument);
  return pc.status().message();
}

TEST(ParallelConfig, RankFormulaPpOutermostThenTp) {
  auto pc = ParallelConfig::Make(Llama3_8B(), /*tp=*/2, /*pp=*/3);
  ASSERT_TRUE(pc.ok()) << pc.status().ToString();
  EXPECT_EQ(pc->world_size(), 6);
  struct Row {
    int stage, tp_rank, rank;
  };
  const Row table[] = {{0, 0, 0}, {0, 1, 1}, {1, 0, 2}, {1, 1, 3}, {2, 0, 4}, {2, 1, 5}};
  for (const Row& row : table) {
    SCOPED_TRACE(::testing::Message() << "stage " << row.stage << " tp_rank " << row.tp_rank);
    EXPECT_EQ(pc->WorldRank(row.stage, row.tp_rank), row.rank);
    EXPECT_EQ(pc->StageOf(row.rank), row.stage);
    EXPECT_EQ(pc->TpRankOf(row.rank), row.tp_rank);
  }
}

TEST(ParallelConfig, RankFormulaRoundTripsForManyLayouts) {
  for (int tp : {1, 2, 4, 8}) {
    for (int pp : {1, 2, 3, 4}) {
      auto pc = ParallelConfig::Make(Llama3_8B(), tp, pp);
      ASSERT_TRUE(pc.ok()) << pc.status().ToString();
      std::vector<int> seen(pc->world_size(), 0);
      for (int s = 0; s < pp; ++s) {
        for (int t = 0; t < tp; ++t) {
          const int rank = pc->WorldRank(s, t);
          ASSERT_GE(rank, 0);
          ASSERT_LT(rank, pc->world_size());
          ++seen[rank];
          EXPECT_EQ(pc->StageOf(rank), s);
          EXPECT_EQ(pc->TpRankOf(rank), t);
        }
      }
      for (int count : seen) EXPECT_EQ(count, 1);
    }
  }
}

TEST(ParallelConfig, EvenSplitGivesRemainderToEarlierStages) {
  auto pc = ParallelConfig::Make(Llama3_8B(), 1, 3);
  ASSERT_TRUE(pc.ok()) << pc.status().ToString();
  EXPECT_EQ(pc->layers_per_stage, (std::vector<int>{11, 11, 10}));

  auto pc4 = ParallelConfig::Make(Small(10, 4, 4), 1, 4);
  ASSERT_TRUE(pc4.ok()) << pc4.status().ToString();
  EXPECT_EQ(pc4->layers_per_stage, (std::vector<int>{3, 3, 2, 2}));
  EXPECT_EQ(pc4->FirstLayer(0), 0);
  EXPECT_EQ(pc4->EndLayer(0), 3);
  EXPECT_EQ(pc4->FirstLayer(2), 6);
  EXPECT_EQ(pc4->EndLayer(3), 10);
  EXPECT_EQ(pc4->num_layers(), 10);

  auto pc1 = ParallelConfig::Make(Small(5, 4, 4), 2, 1);
  ASSERT_TRUE(pc1.ok()) << pc1.status().ToString();
  EXPECT_EQ(pc1->layers_per_stage, (std::vector<int>{5}));
}

TEST(ParallelConfig, UnevenSplitAndLayerToStage) {
  auto pc = ParallelConfig::Make(Small(8, 4, 2), 2, 3, {2, 5, 1});
  ASSERT_TRUE(pc.ok()) << pc.status().ToString();
  EXPECT_EQ(pc->FirstLayer(0), 0);
  EXPECT_EQ(pc->EndLayer(0), 2);
  EXPECT_EQ(pc->FirstLayer(1), 2);
  EXPECT_EQ(pc->EndLayer(1), 7);
  EXPECT_EQ(pc->FirstLayer(2), 7);
  EXPECT_EQ(pc->EndLayer(2), 8);
  const int expected_stage[] = {0, 0, 1, 1, 1, 1, 1, 2};
  for (int layer = 0; layer < 8; ++layer) {
    EXPECT_EQ(pc->StageOfLayer(layer), expected_stage[layer]) << "layer " << layer;
  }
  // Every layer is on exactly one stage, and the stage's range contains it.
  for (int layer = 0; layer < 8; ++layer) {
    int stages = 0;
    for (int s = 0; s < pc->pp; ++s)
      stages += pc->FirstLayer(s) <= layer && layer < pc->EndLayer(s);
    EXPECT_EQ(stages, 1) << "layer " << layer;
  }
}

TEST(ParallelConfig, AcceptsKvHeadsFewerThanTp) {
  // 12 query heads, 2 KV heads (Qwen2.5-1.5B): tp=4 replicates each KV head
  // on 2 ranks; tp=6 on 3.
  EXPECT_EQ(MakeError(Small(4, 12, 2), 4, 1), "");
  EXPECT_EQ(MakeError(Small(4, 12, 2), 6, 1), "");
  EXPECT_EQ(MakeError(Small(4, 12, 2), 2, 2), "");
}

TEST(ParallelConfig, RejectsNonPositiveTpAndPp) {
  EXPECT_EQ(MakeError(Llama3_8B(), 0, 1), "tp must be >= 1, got tp=0");
  EXPECT_EQ(MakeError(Llama3_8B(), -2, 1), "tp must be >= 1, got tp=-2");
  EXPECT_EQ(MakeError(Llama3_8B(), 1, 0), "pp must be >= 1, got pp=0");
}

TEST(ParallelConfig, RejectsTpNotDividingHeads) {
  EXPECT_EQ(MakeError(Llama3_8B(), 3, 1),
            "tp=3 does not divide num_attention_heads=32: each tp rank must hold whole query "
            "heads");
}

TEST(ParallelConfig, RejectsTpIncompatibleWithKvHeads) {
  // 12 heads, 6 KV heads, tp=4: 4 divides 12 but neither 4 | 6 nor 6 | 4.
  EXPECT_EQ(MakeError(Small(4, 12, 6), 4, 1),
            "tp=4 neither divides num_key_value_heads=6 nor is a multiple of it: each tp rank "
            "must hold whole KV heads (replicated when num_key_value_heads < tp)");
}

TEST(ParallelConfig, RejectsTpNotDividingIntermediate) {
  ModelConfig m = Small(4, 4, 4);
  m.intermediate_size = 90;
  EXPECT_THAT(MakeError(m, 4, 1), HasSubstr("tp=4 does not divide intermediate_size=90"));
}

TEST(ParallelConfig, RejectsMalformedModelHeads) {
  EXPECT_THAT(MakeError(Small(4, 12, 5), 1, 1),
              HasSubstr("num_attention_heads=12 is not a multiple of num_key_value_heads=5"));
  EXPECT_THAT(MakeError(Small(0, 4, 4), 1, 1), HasSubstr("num_hidden_layers=0"));
  EXPECT_THAT(MakeError(Small(4, 4, 0), 1, 1), HasSubstr("num_key_value_heads=0"));
}

TEST(ParallelConfig, RejectsMorePpThanLayers) {
  EXPECT_EQ(MakeError(Small(4, 4, 4), 1, 5),
            "pp=5 exceeds num_hidden_layers=4: every stage needs at least one layer");
}

TEST(ParallelConfig, RejectsBadLayersPerStage) {
  const ModelConfig m = Small(8, 4, 4);
  EXPECT_EQ(MakeError(m, 1, 3, {4, 4}), "layers_per_stage=[4, 4] has 2 entries but pp=3");
  EXPECT_EQ(MakeError(m, 1, 3, {4, 0, 4}),
            "layers_per_stage=[4, 0, 4] gives stage 1 0 layers: every stage needs at least one "
            "layer");
  EXPECT_EQ(MakeError(m, 1, 2, {10, -2}),
            "layers_per_stage=[10, -2] gives stage 1 -2 layers: every stage needs at least one "
            "layer");
  EXPECT_EQ(MakeError(m, 1, 2, {4, 3}),
            "layers_per_stage=[4, 3] sums to 7 but num_hidden_layers=8");
  EXPECT_EQ(MakeError(m, 1, 2, {5, 4}),
            "layers_per_stage=[5, 4] sums to 9 but num_hidden_layers=8");
}

TEST(ParallelConfig, ValidateCatchesHandBuiltConfigs) {
  ParallelConfig pc;
  pc.tp = 2;
  pc.pp = 2;
  pc.layers_per_stage = {3};
  Status st = pc.Validate(Small(8, 4, 4));
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(), "layers_per_stage=[3] has 1 entries but pp=2");
  pc.layers_per_stage = {3, 5};
  EXPECT_TRUE(pc.Validate(Small(8, 4, 4)).ok());
}

// The error message of MakePerStage(model, tps, layers), or "" when it succeeds.
std::string MakePerStageError(const ModelConfig& m, std::vector<int> tps,
                              std::vector<int> layers = {}) {
  auto pc = ParallelConfig::MakePerStage(m, std::move(tps), std::move(layers));
  if (pc.ok()) return "";
  EXPECT_EQ(pc.status().code(), StatusCode::kInvalidArgument);
  return pc.status().message();
}

TEST(ParallelRank, PerStageFormulaIsPrefixSums) {
  // tp = [4, 2, 1]: stage 0 on ranks 0..3, stage 1 on 4..5, stage 2 on 6.
  const std::vector<int> tps = {4, 2, 1};
  struct Row {
    int stage, tp_rank, rank;
  };
  const Row table[] = {{0, 0, 0}, {0, 3, 3}, {1, 0, 4}, {1, 1, 5}, {2, 0, 6}};
  for (const Row& row : table) {
    SCOPED_TRACE(::testing::Message() << "stage " << row.stage << " tp_rank " << row.tp_rank);
    EXPECT_EQ(WorldRank(row.stage, row.tp_rank, tps), row.rank);
    EXPECT_EQ(StageOf(row.rank, tps), row.stage);
    EXPECT_EQ(TpRankOf(row.rank, tps), row.tp_rank);
  }
  EXPECT_EQ(StageFirstRank(0, tps), 0);
  EXPECT_EQ(StageFirstRank(1, tps), 4);
  EXPECT_EQ(StageFirstRank(2, tps), 6);
  EXPECT_EQ(StageOf(7, tps), -1);  // past the last stage
}

TEST(ParallelRank, UniformFormulaIsThePerStageFormulaWithEqualTps) {
  for (int tp : {1, 2, 3, 8}) {
    for (int pp : {1, 2, 5}) {
      const std::vector<int> tps(static_cast<size_t>(pp), tp);
      for (int s = 0; s < pp; ++s)
        for (int t = 0; t < tp; ++t) EXPECT_EQ(WorldRank(s, t, tp), WorldRank(s, t, tps));
      for (int w = 0; w < tp * pp; ++w) {
        EXPECT_EQ(StageOf(w, tp), StageOf(w, tps)) << "tp " << tp << " rank " << w;
        EXPECT_EQ(TpRankOf(w, tp), TpRankOf(w, tps)) << "tp " << tp << " rank " << w;
      }
    }
  }
}

TEST(ParallelConfig, PerStageTpRanksAndAccessors) {
  auto pc = ParallelConfig::MakePerStage(Llama3_8B(), {8, 4});
  ASSERT_TRUE(pc.ok()) << pc.status().ToString();
  EXPECT_FALSE(pc->uniform_tp());
  EXPECT_EQ(pc->tp, 0);
  EXPECT_EQ(pc->pp, 2);
  EXPECT_EQ(pc->world_size(), 12);
  EXPECT_EQ(pc->TpOfStage(0), 8);
  EXPECT_EQ(pc->TpOfStage(1), 4);
  EXPECT_EQ(pc->max_tp(), 8);
  EXPECT_EQ(pc->TpPerStage(), (std::vector<int>{8, 4}));
  EXPECT_EQ(pc->layers_per_stage, (std::vector<int>{16, 16}));
  EXPECT_EQ(pc->WorldRank(0, 7), 7);
  EXPECT_EQ(pc->WorldRank(1, 0), 8);
  EXPECT_EQ(pc->WorldRank(1, 3), 11);
  std::vector<int> seen(static_cast<size_t>(pc->world_size()), 0);
  for (int s = 0; s < pc->pp; ++s) {
    for (int t = 0; t < pc->TpOfStage(s); ++t) {
      const int rank = pc->WorldRank(s, t);
      ASSERT_GE(rank, 0);
      ASSERT_LT(rank, pc->world_size());
      ++seen[static_cast<size_t>(rank)];
      EXPECT_EQ(pc->StageOf(rank), s);
      EXPECT_EQ(pc->TpRankOf(rank), t);
    }
  }
  for (int count : seen) EXPECT_EQ(count, 1);
  EXPECT_EQ(pc->ToString(),
            "ParallelConfig{tp=[8, 4], pp=2, world_size=12, "
            "layers_per_stage=[16, 16]}");
  EXPECT_EQ(pc->TpString(), "[8, 4]");
}

TEST(ParallelConfig, PerStageWithEqualTpsIsTheUniformLayout) {
  auto pc = ParallelConfig::MakePerStage(Llama3_8B(), {2, 2, 2}, {10, 12, 10});
  ASSERT_TRUE(pc.ok()) << pc.status().ToString();
  EXPECT_TRUE(pc->uniform_tp());
  EXPECT_EQ(pc->tp, 2);
  EXPECT_EQ(pc->pp, 3);
  EXPECT_TRUE(pc->tp_per_stage.empty());
  EXPECT_EQ(pc->TpPerStage(), (std::vector<int>{2, 2, 2}));
  EXPECT_EQ(pc->world_size(), 6);
  EXPECT_EQ(pc->TpString(), "2");
}

TEST(ParallelConfig, PerStageErrorsNameTheStage) {
  // 12 heads, 6 KV heads: stage 1's tp=4 divides the heads, not the KV heads.
  EXPECT_EQ(MakePerStageError(Small(4, 12, 6), {2, 4}),
            "stage 1: tp=4 neither divides num_key_value_heads=6 nor is a multiple of it: each "
            "tp rank must hold whole KV heads (replicated when num_key_value_heads < tp)");
  EXPECT_EQ(MakePerStageError(Llama3_8B(), {8, 3}),
            "stage 1: tp=3 does not divide num_attention_heads=32: each tp rank must hold whole "
            "query heads");
  EXPECT_EQ(MakePerStageError(Llama3_8B(), {0, 4}), "stage 0: tp must be >= 1, got tp=0");
  ModelConfig m = Small(4, 4, 4);
  m.intermediate_size = 90;
  EXPECT_THAT(MakePerStageError(m, {1, 4}),
              HasSubstr("stage 1: tp=4 does not divide intermediate_size=90"));
  EXPECT_EQ(MakePerStageError(Llama3_8B(), {}), "tp_per_stage=[] has no stages");
  EXPECT_EQ(MakePerStageError(Small(2, 4, 4), {1, 2, 4}),
            "pp=3 exceeds num_hidden_layers=2: every stage needs at least one layer");
  EXPECT_EQ(MakePerStageError(Small(8, 4, 4), {1, 2}, {4, 3}),
            "layers_per_stage=[4, 3] sums to 7 but num_hidden_layers=8");
  // KV heads fewer than a stage's tp: replicated on that stage only.
  EXPECT_EQ(MakePerStageError(Small(4, 12, 2), {6, 2}), "");
}

TEST(ParallelConfig, ValidateCatchesHandBuiltPerStageConfigs) {
  ParallelConfig pc;
  pc.pp = 2;
  pc.layers_per_stage = {4, 4};
  pc.tp_per_stage = {2, 1, 1};
  pc.tp = 0;
  EXPECT_EQ(pc.Validate(Small(8, 4, 4)).message(), "tp_per_stage=[2, 1, 1] has 3 entries but pp=2");
  pc.tp_per_stage = {2, 1};
  pc.tp = 2;
  EXPECT_EQ(pc.Validate(Small(8, 4, 4)).message(),
            "tp_per_stage=[2, 1] is set together with tp=2: tp must be 0 for a per-stage layout");
  pc.tp = 0;
  pc.tp_per_stage = {2, 2};
  EXPECT_EQ(pc.Validate(Small(8, 4, 4)).message(),
            "tp_per_stage=[2, 2] gives every stage the same tp: use tp=2");
  pc.tp_per_stage = {2, 1};
  EXPECT_TRUE(pc.Validate(Small(8, 4, 4)).ok());
}

TEST(ParallelConfig, ToString) {
  auto pc = ParallelConfig::Make(Llama3_8B(), 2, 3);
  ASSERT_TRUE(pc.ok()) << pc.status().ToString();
  EXPECT_EQ(pc->ToString(),
            "ParallelConfig{tp=2, pp=3, world_size=6, layers_per_stage=[11, 11, 10]}");
}

// Every layout error names the parameter at fault, so the coordinator can
// name the config key: pp over the layers is parallel.pp, not parallel.tp.
TEST(ParallelConfig, LayoutParamOfErrorNamesTheParameterAtFault) {
  auto param = [](const StatusOr<ParallelConfig>& r) {
    EXPECT_FALSE(r.ok());
    return LayoutParamOfError(r.status());
  };
  EXPECT_EQ(param(ParallelConfig::Make(Small(2, 4, 4), 1, 3)), LayoutParam::kPp);
  EXPECT_EQ(param(ParallelConfig::Make(Small(2, 4, 4), 1, 0)), LayoutParam::kPp);
  EXPECT_EQ(param(ParallelConfig::Make(Small(2, 4, 4), 3, 1)), LayoutParam::kTp);
  EXPECT_EQ(param(ParallelConfig::Make(Small(2, 4, 4), 0, 1)), LayoutParam::kTp);
  EXPECT_EQ(param(ParallelConfig::Make(Small(8, 4, 4), 1, 2, {4, 3})),
            LayoutParam::kLayersPerStage);
  EXPECT_EQ(param(ParallelConfig::Make(Small(8, 4, 4), 1, 2, {8})), LayoutParam::kLayersPerStage);
  EXPECT_EQ(param(ParallelConfig::MakePerStage(Llama3_8B(), {8, 3})), LayoutParam::kTp);
  EXPECT_EQ(param(ParallelConfig::MakePerStage(Small(2, 4, 4), {1, 2, 4})), LayoutParam::kPp);
  EXPECT_EQ(param(ParallelConfig::Make(Small(2, 6, 4), 1, 1)), LayoutParam::kModel);
}

}  // namespace
}  // namespace tessera
