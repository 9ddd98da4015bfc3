// The placement planner on mixture-of-experts models: its per-rank weight
// bytes against what a rank of the MoE fixtures really loads (with expert
// parallelism the busiest rank's, whole experts of an uneven count), the
// decode bytes it costs (the experts a step's tokens route to: k of N at
// batch 1, nearly all at large batches), its expert_parallel choice and the
// note explaining it, and `tessera plan`'s inputs Mixtral-8x22B and
// Qwen3-235B-A22B on two DGX H100 hosts (configs/), placed or refused with
// the bytes named.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "common/format/checkpoint.h"
#include "common/format/model_config.h"
#include "common/model/parallel_config.h"
#include "common/model/shard_spec.h"
#include "common/topology/topology_file.h"
#include "coordinator/placement/cluster_model.h"
#include "coordinator/placement/cost_model.h"
#include "coordinator/placement/placement_planner.h"
#include "support/test_util.h"
#include "worker/model/weight_loader.h"

namespace tessera {
namespace {

std::string SourcePath(const std::string& rel) {
  return std::string(TESSERA_SOURCE_DIR) + "/" + rel;
}

// A config.json of configs/models (shapes only).
StatusOr<ModelConfig> ConfigFile(const std::string& name) {
  const std::string path = SourcePath("configs/models/" + name);
  return ParseModelConfig(testing::ReadFileOrDie(path), path);
}

TEST(MoePlanner, PredictedWeightBytesAreTheBusiestRanksLoadedBytes) {
  const std::string dir = testing::FixturePath("models/mixtral_moe_top3");
  auto config = LoadModelConfig(dir);
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  for (bool ep : {false, true}) {
    ModelSizes sizes = ModelSizes::From(*config, DType::kF32, DType::kF32);
    sizes.expert_parallel = ep;
    auto par = ParallelConfig::Make(*config, 2, 1, {}, ep);
    ASSERT_TRUE(par.ok()) << par.status().ToString();
    StageShape shape;
    shape.tp = 2;
    shape.layers = 2;
    shape.first = shape.last = shape.single_stage = true;
    const double predicted = WeightBytesPerGpu(sizes, shape);
    double most = 0;
    for (int rank = 0; rank < 2; ++rank) {
      auto ckpt = Checkpoint::Open(dir);
      auto spec = ShardSpec::Make(*config, *par, rank);
      ASSERT_TRUE(ckpt.ok() && spec.ok());
      auto w = LoadStageWeights(**ckpt, *config, *par, *spec);
      ASSERT_TRUE(w.ok()) << w.status().ToString();
      most = std::max(most, static_cast<double>(w->weight_bytes));
      // Without expert parallelism every rank holds the same bytes.
      if (!ep) {
        EXPECT_DOUBLE_EQ(predicted, static_cast<double>(w->weight_bytes)) << rank;
      }
    }
    // 5 experts over tp 2: rank 0 holds 3, the prediction's ceil(5/2).
    EXPECT_DOUBLE_EQ(predicted, most) << (ep ? "ep" : "sliced");
  }
}

TEST(MoePlanner, DecodeReadsTheActiveExpertsAtBatchOneAndNearlyAllAtLargeBatches) {
  auto config = ConfigFile("qwen3-235b-a22b.json");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  ModelSizes m = ModelSizes::From(*config, DType::kBF16, DType::kBF16);
  EXPECT_EQ(m.experts, 128);
  EXPECT_EQ(m.top_k, 8);
  // 128 experts x 3 x 4096 x 1536 bf16 per layer.
  EXPECT_DOUBLE_EQ(m.expert_layer_bytes, 128.0 * 3 * 4096 * 1536 * 2);
  const double held = m.ExpertBytesPerRank(8);
  EXPECT_DOUBLE_EQ(held, m.expert_layer_bytes / 8);
  EXPECT_NEAR(m.ExpertBytesReadPerRank(8, 1) / held, 8.0 / 128, 1e-12);
  EXPECT_GT(m.ExpertBytesReadPerRank(8, 64) / held, 0.98);
  // Whole experts: the busiest rank of tp 8 holds 16 and runs up to 8 of
  // them for one token.
  m.expert_parallel = true;
  EXPECT_DOUBLE_EQ(m.ExpertBytesPerRank(8), m.expert_layer_bytes / 8);
  EXPECT_DOUBLE_EQ(m.ExpertBytesReadPerRank(8, 1), m.expert_layer_bytes / 128 * 8);
  EXPECT_DOUBLE_EQ(m.ExpertBytesReadPerRank(8, 64), m.expert_layer_bytes / 8);
  // Uneven: 5 experts over tp 4, the busiest rank holds 2.
  m.experts = 5;
  m.expert_layer_bytes = 500;
  EXPECT_DOUBLE_EQ(m.ExpertBytesPerRank(4), 200);
  // A decode step at batch 1 costs less than one at batch 64.
  StageShape s;
  s.spec = GpuSpec{};
  s.spec.hbm_gb_per_s = 3350;
  s.spec.bf16_tflops = 989;
  s.tp = 8;
  s.layers = 94;
  s.link_bytes_per_s = 450e9;  // NVLink 4
  s.link_step_s = 1e-6;
  ModelSizes q = ModelSizes::From(*config, DType::kBF16, DType::kBF16);
  const double t1 = StageSeconds(q, s, CostConstants{}, 1, 1, 0);
  const double t64 = StageSeconds(q, s, CostConstants{}, 64, 64, 0);
  EXPECT_LT(t1 * 3, t64);
  // Read as if dense (every expert every step), batch 1 would cost more
  // than 3x: the routed experts are 95% of the weights.
  ModelSizes all = q;
  all.experts = 0;
  all.expert_layer_bytes = 0;  // the experts stay in layer_bytes, all read
  EXPECT_LT(t1 * 3, StageSeconds(all, s, CostConstants{}, 1, 1, 0));
}

StatusOr<PlanResult> PlanOn(const std::string& model, const std::string& topology,
                            std::optional<DType> dtype = std::nullopt) {
  auto config = ConfigFile(model);
  if (!config.ok()) return config.status();
  auto topo = LoadTopologyFile(SourcePath("configs/topologies/" + topology));
  if (!topo.ok()) return topo.status();
  auto cluster = BuildClusterModel(*topo);
  if (!cluster.ok()) return cluster.status();
  PlanOptions o;
  o.max_context = 8192;
  o.weight_dtype = dtype;
  PlacementPlanner planner;
  return planner.Plan(*config, *cluster, o);
}

bool HasNote(const PlanResult& r, const std::string& part) {
  for (const std::string& n : r.explanation.notes)
    if (n.find(part) != std::string::npos) return true;
  return false;
}

// The split the planner chose at the chosen layout's tp, and the note saying so.
void ExpectSplitExplained(const PlanResult& r, int64_t moe_intermediate) {
  ASSERT_FALSE(r.plan.replicas.empty());
  const int tp = r.plan.replicas[0].stages[0].tp;
  EXPECT_EQ(r.expert_parallel, AutoExpertParallel(moe_intermediate, tp)) << r.ToText();
  const std::string want = std::string("expert_parallel ") + (r.expert_parallel ? "on" : "off") +
                           " at tp " + std::to_string(tp) + ": a 1/" + std::to_string(tp) +
                           " slice of an expert is " + std::to_string(moe_intermediate / tp) +
                           " columns";
  EXPECT_TRUE(HasNote(r, want)) << want << "\n" << r.ToText();
}

TEST(MoePlanner, Mixtral8x22bOnTwoDgxH100KeepsExpertSlices) {
  auto r = PlanOn("mixtral-8x22b.json", "dgx_h100_x2.toml");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(HasNote(*r, "MoE: 8 experts, top-2")) << r->ToText();
  // 16384 columns: a slice stays over 256 at any tp of a host.
  EXPECT_FALSE(r->expert_parallel);
  ExpectSplitExplained(*r, 16384);
}

TEST(MoePlanner, Qwen3_235bOnTwoDgxH100ChoosesTheSplitAtItsTp) {
  auto r = PlanOn("qwen3-235b-a22b.json", "dgx_h100_x2.toml");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(HasNote(*r, "MoE: 128 experts, top-8")) << r->ToText();
  ExpectSplitExplained(*r, 1536);
  // The rule: 1536 / 8 = 192 columns is too thin, 1536 / 4 = 384 is not.
  EXPECT_TRUE(AutoExpertParallel(1536, 8));
  EXPECT_FALSE(AutoExpertParallel(1536, 4));
  EXPECT_TRUE(AutoExpertParallel(1000, 3));  // 3 does not divide 1000
  EXPECT_FALSE(AutoExpertParallel(1536, 1));
}

TEST(MoePlanner, AConfiguredSplitIsKept) {
  auto config = ConfigFile("qwen3-235b-a22b.json");
  auto topo = LoadTopologyFile(SourcePath("configs/topologies/dgx_h100_x2.toml"));
  ASSERT_TRUE(config.ok() && topo.ok());
  auto cluster = BuildClusterModel(*topo);
  ASSERT_TRUE(cluster.ok());
  for (bool ep : {false, true}) {
    PlanOptions o;
    o.max_context = 8192;
    o.expert_parallel = ep;
    o.fixed_tp = 8;
    o.fixed_pp = 1;
    auto r = PlacementPlanner().Plan(*config, *cluster, o);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->expert_parallel, ep);
    EXPECT_TRUE(HasNote(*r, "as configured (parallel.expert_parallel)")) << r->ToText();
  }
}

TEST(MoePlanner, Qwen3_235bInFp32OnOneDgxH100IsRefusedNamingTheBytes) {
  auto r = PlanOn("qwen3-235b-a22b.json", "dgx_h100_x1.toml", DType::kF32);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted) << r.status().ToString();
  // 235B parameters x 4 bytes, and what each layout could hold.
  EXPECT_NE(r.status().message().find("of weights at F32, 8 GPUs"), std::string::npos)
      << r.status().ToString();
  EXPECT_NE(r.status().message().find("usable per GPU"), std::string::npos)
      << r.status().ToString();
}

}  // namespace
}  // namespace tessera
