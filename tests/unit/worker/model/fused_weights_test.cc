// The fused weight layout (worker/model/stage_weights.h, "Fused
// projections"): on every fixture family, at tp 1 and 2, every rank holds
// each layer's q, k and v rows as one tensor qkv_proj (and gate, up as one
// gate_up_proj; the biases likewise when present), the part fields are row
// views of it in order (no byte held twice), and the bytes held are the
// ShardSpec's prediction. The values of each part are checked against the
// checkpoint by shard_loading_test and fused_shard_test (through the views).
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "common/format/checkpoint.h"
#include "common/format/model_config.h"
#include "common/model/parallel_config.h"
#include "common/model/shard_spec.h"
#include "support/test_util.h"
#include "worker/model/weight_loader.h"

namespace tessera {
namespace {

const char* const kFixtures[] = {
    "gemma2_softcap_window",  "gemma3_text_local_rope_bf16", "llama3_headdim_sharded",
    "llama_gqa_f32",          "llama_mha_tied_bf16",         "mistral_dynamic",
    "mistral_sliding_window", "phi3_fused_longrope_bf16",    "qwen2_bias_f16",
    "qwen3_qknorm_tied",
};

// `parts` are consecutive row views of `fused`, which has exactly their rows.
void ExpectViews(const Tensor& fused, const std::vector<const Tensor*>& parts,
                 const std::string& what) {
  ASSERT_TRUE(fused.defined()) << what;
  const char* at = static_cast<const char*>(fused.raw());
  int64_t rows = 0;
  for (const Tensor* p : parts) {
    ASSERT_TRUE(p->defined()) << what;
    ASSERT_EQ(p->rank(), fused.rank()) << what;
    EXPECT_EQ(static_cast<const char*>(p->raw()), at) << what << ": a part is not in place";
    for (int d = 1; d < fused.rank(); ++d) EXPECT_EQ(p->dim(d), fused.dim(d)) << what;
    at += p->nbytes();
    rows += p->dim(0);
  }
  EXPECT_EQ(rows, fused.dim(0)) << what;
}

TEST(FusedWeights, EveryFamilyHoldsQkvAndGateUpAsOneTensorWithViews) {
  for (const char* name : kFixtures) {
    const std::string dir = testing::FixturePath(std::string("models/") + name);
    auto config = LoadModelConfig(dir);
    ASSERT_TRUE(config.ok()) << name << ": " << config.status().ToString();
    auto ckpt = Checkpoint::Open(dir);
    ASSERT_TRUE(ckpt.ok()) << name << ": " << ckpt.status().ToString();
    for (int tp : {1, 2}) {
      auto par = ParallelConfig::Make(*config, tp, 1);
      ASSERT_TRUE(par.ok()) << name << " tp " << tp << ": " << par.status().ToString();
      for (int rank = 0; rank < tp; ++rank) {
        const std::string ctx =
            std::string(name) + " tp " + std::to_string(tp) + " rank " + std::to_string(rank);
        auto spec = ShardSpec::Make(*config, *par, rank);
        ASSERT_TRUE(spec.ok()) << ctx << ": " << spec.status().ToString();
        auto w = LoadStageWeights(**ckpt, *config, *par, *spec);
        ASSERT_TRUE(w.ok()) << ctx << ": " << w.status().ToString();
        EXPECT_EQ(w->weight_bytes, spec->WeightBytes(DType::kF32)) << ctx;
        const StageLayout& lay = w->layout;
        const int64_t qkv_rows = (lay.heads_local + 2 * lay.kv_heads_local) * config->head_dim;
        for (size_t l = 0; l < w->layers.size(); ++l) {
          const LayerWeights& lw = w->layers[l];
          const std::string at = ctx + " layer " + std::to_string(l);
          EXPECT_EQ(lw.qkv_proj.shape(), (std::vector<int64_t>{qkv_rows, config->hidden_size}))
              << at;
          ExpectViews(lw.qkv_proj, {&lw.q_proj, &lw.k_proj, &lw.v_proj}, at + " qkv_proj");
          EXPECT_EQ(lw.gate_up_proj.shape(),
                    (std::vector<int64_t>{2 * lay.inter_local, config->hidden_size}))
              << at;
          ExpectViews(lw.gate_up_proj, {&lw.gate_proj, &lw.up_proj}, at + " gate_up_proj");
          EXPECT_EQ(lw.qkv_bias.defined(), config->attention_bias) << at;
          if (lw.qkv_bias.defined()) {
            EXPECT_EQ(lw.qkv_bias.shape(), (std::vector<int64_t>{qkv_rows})) << at;
            ExpectViews(lw.qkv_bias, {&lw.q_bias, &lw.k_bias, &lw.v_bias}, at + " qkv_bias");
          }
          EXPECT_EQ(lw.gate_up_bias.defined(), config->mlp_bias) << at;
        }
      }
    }
  }
}

// Qwen2's q/k/v biases are fused with the weights' row order: the fused
// bias holds this rank's q, k and v bias slices, in that order.
TEST(FusedWeights, Qwen2BiasesAreFused) {
  const std::string dir = testing::FixturePath("models/qwen2_bias_f16");
  auto config = LoadModelConfig(dir);
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  ASSERT_TRUE(config->attention_bias);
  auto ckpt = Checkpoint::Open(dir);
  ASSERT_TRUE(ckpt.ok());
  auto par = ParallelConfig::Make(*config, 2, 1);
  ASSERT_TRUE(par.ok());
  auto spec = ShardSpec::Make(*config, *par, 1);
  ASSERT_TRUE(spec.ok());
  auto w = LoadStageWeights(**ckpt, *config, *par, *spec);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  const LayerWeights& lw = w->layers[0];
  ASSERT_TRUE(lw.qkv_bias.defined());
  // Rank 1's k bias: rows [kv_begin * d, ...) of k_proj.bias, from the file.
  auto k = spec->Find(TensorRole::kKBias, 0);
  ASSERT_TRUE(k.ok()) << k.status().ToString();
  std::vector<float> want(static_cast<size_t>((*k)->end - (*k)->begin));
  ASSERT_TRUE(
      (*ckpt)->ReadSlice((*k)->name, 0, (*k)->begin, (*k)->end, DType::kF32, want.data()).ok());
  const float* got = lw.qkv_bias.data<float>() + lw.q_bias.numel();
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i], want[i]) << i;
}

}  // namespace
}  // namespace tessera
