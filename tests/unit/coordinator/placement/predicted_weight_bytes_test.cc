// The placement cost model's weight bytes (WeightBytesPerGpu, from the
// family's tensor table through LayerParameterCount) against the bytes a
// rank really loads (LoadStageWeights), for the model families of issue 22:
// Qwen3 (per-head q/k norms, tied head), Phi-3 (fused qkv_proj and
// gate_up_proj, counted as their parts), Mistral with a sliding window and
// Gemma 2 / Gemma 3 (four hidden norms per layer, Gemma 3's per-head q/k
// norms, tied heads), at tp=2 on one stage and on two. The fixtures' vocabularies are multiples
// of 2 and their KV heads are not replicated at tp=2, so the prediction is
// exact.
#include <gtest/gtest.h>

#include <string>

#include "common/format/checkpoint.h"
#include "common/format/model_config.h"
#include "common/model/parallel_config.h"
#include "common/model/shard_spec.h"
#include "coordinator/placement/cost_model.h"
#include "support/test_util.h"
#include "worker/model/weight_loader.h"

namespace tessera {
namespace {

class PredictedWeightBytes : public ::testing::TestWithParam<std::string> {};

TEST_P(PredictedWeightBytes, EqualLoadedBytesAtTp2) {
  const std::string dir = testing::FixturePath("models/" + GetParam());
  auto config = LoadModelConfig(dir);
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  auto ckpt = Checkpoint::Open(dir);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().ToString();
  // The CPU backend holds F32 whatever the checkpoint dtype.
  const ModelSizes sizes = ModelSizes::From(*config, DType::kF32, DType::kF32);
  for (int pp : {1, 2}) {
    auto par = ParallelConfig::Make(*config, 2, pp);
    ASSERT_TRUE(par.ok()) << par.status().ToString();
    for (int rank = 0; rank < par->world_size(); ++rank) {
      SCOPED_TRACE("pp " + std::to_string(pp) + " rank " + std::to_string(rank));
      auto spec = ShardSpec::Make(*config, *par, rank);
      ASSERT_TRUE(spec.ok()) << spec.status().ToString();
      auto w = LoadStageWeights(**ckpt, *config, *par, *spec);
      ASSERT_TRUE(w.ok()) << w.status().ToString();
      StageShape shape;
      shape.tp = 2;
      shape.layers = spec->end_layer() - spec->first_layer();
      shape.first = spec->is_first_stage();
      shape.last = spec->is_last_stage();
      shape.single_stage = pp == 1;
      EXPECT_DOUBLE_EQ(WeightBytesPerGpu(sizes, shape), static_cast<double>(w->weight_bytes));
      EXPECT_EQ(w->weight_bytes, spec->WeightBytes(DType::kF32));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Families, PredictedWeightBytes,
                         ::testing::Values("qwen3_qknorm_tied", "phi3_fused_longrope_bf16",
                                           "mistral_sliding_window", "gemma2_softcap_window",
                                           "gemma3_text_local_rope_bf16"));

}  // namespace
}  // namespace tessera
