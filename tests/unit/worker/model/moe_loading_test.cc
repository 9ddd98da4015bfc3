// Loading the MoE fixtures (Mixtral, Qwen2-MoE, Qwen3-MoE) shard by shard:
// every rank reads exactly its share from disk (Checkpoint::BytesRead equals
// the bytes it holds), with expert parallelism a rank holds whole experts,
// 1/tp of them as evenly as the count allows, and each expert is read by one
// rank only; without it every rank holds a 1/tp slice of every expert. Both
// checkpoint forms load: the published per-expert tensors and transformers
// 5's stacked 3-D ones. MoE architectures Tessera does not serve are refused
// at config load; a GPU backend loads MoE models (the CUDA MoE layer), and the
// GPU block without its expert table names the layer.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "common/format/checkpoint.h"
#include "common/format/model_config.h"
#include "common/model/parallel_config.h"
#include "common/model/shard_spec.h"
#include "support/test_util.h"
#include "worker/model/model_loader.h"
#include "worker/model/moe_layer.h"
#include "worker/model/weight_loader.h"

namespace tessera {
namespace {

const char* const kMoeFixtures[] = {"mixtral_moe_top3", "qwen2_moe_shared_mixed",
                                    "qwen3_moe_top1_fused"};

std::string Dir(const std::string& name) {
  return ::tessera::testing::FixturePath("models/" + name);
}

// Bytes of every routed-expert shard a rank holds.
int64_t ExpertBytes(const ShardSpec& spec) {
  int64_t n = 0;
  for (const TensorShard& t : spec.tensors())
    if (t.expert >= 0) n += t.local_numel() * 4;
  return n;
}

TEST(MoeLoading, EveryRankReadsExactlyItsShareOfTheExperts) {
  for (const char* name : kMoeFixtures) {
    const auto config = LoadModelConfig(Dir(name));
    ASSERT_TRUE(config.ok()) << config.status().ToString();
    ASSERT_TRUE(config->is_moe()) << name;
    const int64_t all_expert_bytes = [&] {
      int64_t sparse = 0;
      for (int l = 0; l < config->num_hidden_layers; ++l) sparse += config->LayerIsSparse(l);
      return sparse * LayerExpertParameterCount(*config) * 4;
    }();
    for (int tp : {1, 2, 4}) {
      for (bool ep : {false, true}) {
        const auto parallel = ParallelConfig::Make(*config, tp, 1, {}, ep);
        ASSERT_TRUE(parallel.ok()) << parallel.status().ToString();
        int64_t expert_bytes = 0;
        std::map<int, int> holders;  // expert -> ranks holding (some of) it, per layer 1
        for (int rank = 0; rank < tp; ++rank) {
          const std::string what = std::string(name) + " tp=" + std::to_string(tp) +
                                   (ep ? " ep" : "") + " rank " + std::to_string(rank);
          auto ckpt = Checkpoint::Open(Dir(name));
          ASSERT_TRUE(ckpt.ok()) << ckpt.status().ToString();
          auto spec = ShardSpec::Make(*config, *parallel, rank);
          ASSERT_TRUE(spec.ok()) << spec.status().ToString();
          auto weights = LoadStageWeights(**ckpt, *config, *parallel, *spec);
          ASSERT_TRUE(weights.ok()) << what << ": " << weights.status().ToString();
          // fp32 checkpoints, fp32 compute: the bytes read are the bytes held.
          EXPECT_EQ((*ckpt)->BytesRead(), weights->weight_bytes) << what;
          EXPECT_EQ(weights->weight_bytes, spec->WeightBytes(DType::kF32)) << what;
          expert_bytes += ExpertBytes(*spec);
          const ExpertRange want = ep ? ExpertsOfRank(config->num_experts, tp, rank)
                                      : ExpertRange{0, config->num_experts};
          EXPECT_EQ(spec->expert_begin(), want.begin) << what;
          EXPECT_EQ(spec->expert_end(), want.end) << what;
          const LayerWeights& sparse = weights->layers[1];  // layer 1 is sparse in every fixture
          ASSERT_TRUE(sparse.sparse()) << what;
          ASSERT_EQ(static_cast<int64_t>(sparse.experts.size()), want.end - want.begin) << what;
          for (const ExpertWeights& e : sparse.experts) {
            ++holders[e.expert];
            const int64_t cols =
                ep ? config->moe_intermediate_size : config->moe_intermediate_size / tp;
            EXPECT_EQ(e.gate_proj.shape(), (std::vector<int64_t>{cols, config->hidden_size}))
                << what;
            EXPECT_EQ(e.down_proj.shape(), (std::vector<int64_t>{config->hidden_size, cols}))
                << what;
          }
        }
        // Every expert is held; by one rank under ep, by all of them without.
        ASSERT_EQ(static_cast<int64_t>(holders.size()), config->num_experts) << name;
        for (const auto& [expert, n] : holders) EXPECT_EQ(n, ep ? 1 : tp) << name << " " << expert;
        EXPECT_EQ(expert_bytes, all_expert_bytes) << name << " tp=" << tp << (ep ? " ep" : "");
      }
    }
  }
}

TEST(MoeLoading, UnevenExpertCountsSpreadAsEvenlyAsPossible) {
  EXPECT_EQ(ExpertsOfRank(5, 2, 0).begin, 0);
  EXPECT_EQ(ExpertsOfRank(5, 2, 0).end, 3);
  EXPECT_EQ(ExpertsOfRank(5, 2, 1).begin, 3);
  EXPECT_EQ(ExpertsOfRank(5, 2, 1).end, 5);
  const int64_t want[][2] = {{0, 3}, {3, 6}, {6, 8}, {8, 10}};
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(ExpertsOfRank(10, 4, r).begin, want[r][0]);
    EXPECT_EQ(ExpertsOfRank(10, 4, r).end, want[r][1]);
  }
  // More ranks than experts: the last rank holds none.
  EXPECT_EQ(ExpertsOfRank(3, 4, 3).end - ExpertsOfRank(3, 4, 3).begin, 0);
}

TEST(MoeLoading, ExpertParallelLiftsTheIntermediateDivisibility) {
  auto config = LoadModelConfig(Dir("mixtral_moe_top3"));
  ASSERT_TRUE(config.ok());
  config->moe_intermediate_size = 30;  // not a multiple of 4
  config->intermediate_size = 32;
  const auto sliced = ParallelConfig::Make(*config, 4, 1, {}, false);
  ASSERT_FALSE(sliced.ok());
  EXPECT_NE(sliced.status().message().find("moe_intermediate_size=30"), std::string::npos)
      << sliced.status().ToString();
  EXPECT_TRUE(ParallelConfig::Make(*config, 4, 1, {}, true).ok());
}

TEST(MoeLoading, UnservedMoeArchitecturesAreRefusedNamingTheServedOnes) {
  for (const char* arch : {"DeepseekV3ForCausalLM", "GptOssForCausalLM"}) {
    const std::string json = std::string(R"({"architectures": [")") + arch +
                             R"("], "hidden_size": 64, "intermediate_size": 64,
        "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 128})";
    const auto c = ParseModelConfig(json, "/m/config.json");
    ASSERT_FALSE(c.ok()) << arch;
    EXPECT_EQ(c.status().code(), StatusCode::kUnimplemented);
    const std::string m = c.status().message();
    EXPECT_NE(m.find("/m/config.json: key 'architectures'"), std::string::npos) << m;
    EXPECT_NE(m.find(arch), std::string::npos) << m;
    EXPECT_NE(m.find("mixture-of-experts"), std::string::npos) << m;
    EXPECT_NE(m.find("MixtralForCausalLM, Qwen2MoeForCausalLM, Qwen3MoeForCausalLM"),
              std::string::npos)
        << m;
  }
  // An unknown architecture with routed-expert keys is taken for an MoE too.
  const auto c = ParseModelConfig(
      R"({"architectures": ["FooMoeForCausalLM"], "n_routed_experts": 64, "hidden_size": 64,
          "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
          "vocab_size": 128})",
      "/m/config.json");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("mixture-of-experts"), std::string::npos)
      << c.status().ToString();
}

TEST(MoeLoading, ConfigKeysAreRead) {
  const auto mixtral = LoadModelConfig(Dir("mixtral_moe_top3"));
  ASSERT_TRUE(mixtral.ok());
  EXPECT_EQ(mixtral->architecture, Architecture::kMixtral);
  EXPECT_EQ(mixtral->num_experts, 5);
  EXPECT_EQ(mixtral->num_experts_per_tok, 3);
  EXPECT_EQ(mixtral->moe_intermediate_size, 32);
  EXPECT_TRUE(mixtral->norm_topk_prob);
  EXPECT_TRUE(mixtral->LayerIsSparse(0) && mixtral->LayerIsSparse(1));
  const auto qwen2 = LoadModelConfig(Dir("qwen2_moe_shared_mixed"));
  ASSERT_TRUE(qwen2.ok());
  EXPECT_EQ(qwen2->shared_expert_intermediate_size, 64);
  EXPECT_TRUE(qwen2->attention_bias);
  EXPECT_FALSE(qwen2->LayerIsSparse(0));  // decoder_sparse_step 2
  EXPECT_TRUE(qwen2->LayerIsSparse(1));
  EXPECT_FALSE(qwen2->LayerIsSparse(2));
  const auto qwen3 = LoadModelConfig(Dir("qwen3_moe_top1_fused"));
  ASSERT_TRUE(qwen3.ok());
  EXPECT_FALSE(qwen3->norm_topk_prob);
  EXPECT_FALSE(qwen3->LayerIsSparse(0));  // mlp_only_layers [0]
  EXPECT_TRUE(qwen3->LayerIsSparse(1));
  // The parameter count is the checkpoint's: experts, the router, dense layers.
  for (const char* name : kMoeFixtures) {
    const auto c = LoadModelConfig(Dir(name));
    auto ckpt = Checkpoint::Open(Dir(name));
    ASSERT_TRUE(c.ok() && ckpt.ok());
    int64_t elements = 0;
    for (const std::string& t : (*ckpt)->TensorNames()) {
      auto info = (*ckpt)->Find(t);
      ASSERT_TRUE(info.ok());
      int64_t n = 1;
      for (int64_t d : info->shape) n *= d;
      elements += n;
    }
    EXPECT_EQ(ModelParameterCount(*c), elements) << name;
  }
}

// transformers 5 saves a Qwen MoE config with num_local_experts (its
// attribute map of num_experts), not num_experts; both names are read, and a
// config that gives both must give one count.
TEST(MoeLoading, QwenExpertCountIsReadUnderEitherName) {
  const std::string base = R"({"architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 64,
      "intermediate_size": 64, "moe_intermediate_size": 32, "num_hidden_layers": 2,
      "num_attention_heads": 4, "head_dim": 16, "vocab_size": 128, "num_experts_per_tok": 2)";
  const auto local = ParseModelConfig(base + R"(, "num_local_experts": 16})", "/m/config.json");
  ASSERT_TRUE(local.ok()) << local.status().ToString();
  EXPECT_EQ(local->num_experts, 16);
  const auto both =
      ParseModelConfig(base + R"(, "num_experts": 16, "num_local_experts": 16})", "/m/config.json");
  ASSERT_TRUE(both.ok()) << both.status().ToString();
  EXPECT_EQ(both->num_experts, 16);
  const auto bad =
      ParseModelConfig(base + R"(, "num_experts": 16, "num_local_experts": 8})", "/m/config.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("num_local_experts"), std::string::npos)
      << bad.status().ToString();
  EXPECT_NE(bad.status().message().find("disagrees with num_experts (16)"), std::string::npos)
      << bad.status().ToString();
}

// A backend that says it is a GPU and fails every call, naming itself.
class FakeGpuBackend : public kernels::Backend {
 public:
  Device device() const override { return Device::kCUDA; }
  DType compute_dtype() const override { return DType::kBF16; }
  std::string name() const override { return "fake-cuda"; }
  StatusOr<Tensor> Allocate(const std::vector<int64_t>&, DType) override { return Fail(); }
  StatusOr<Tensor> Zeros(const std::vector<int64_t>&, DType) override { return Fail(); }
  Status Copy(Tensor&, const Tensor&) override { return Fail(); }
  Status Synchronize() override { return Fail(); }
  kernels::MemoryStats memory_stats() const override { return {}; }

 private:
  static Status Fail() { return Internal("fake-cuda: the loader touched the backend"); }
};

// The CUDA backend runs MoE models (kernels/moe_experts.h): the loader no
// longer refuses them on a GPU but loads their weights onto it (here the fake
// backend's first call fails, which shows the loader got that far).
TEST(MoeLoading, AGpuBackendLoadsAnMoeModel) {
  FakeGpuBackend gpu;
  const auto config = LoadModelConfig(Dir("mixtral_moe_top3"));
  ASSERT_TRUE(config.ok());
  const auto parallel = ParallelConfig::Make(*config, 1, 1);
  ASSERT_TRUE(parallel.ok());
  auto loaded = LoadModel(Dir("mixtral_moe_top3"), *parallel, 0, nullptr, {}, &gpu);
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.status().code(), StatusCode::kInternal) << loaded.status().ToString();
  EXPECT_NE(loaded.status().message().find("the loader touched the backend"), std::string::npos)
      << loaded.status().ToString();
}

// On a GPU the MoE block needs the layer's expert table (LlamaModel makes it
// on its first step); without it the block says so, naming the layer.
TEST(MoeLoading, TheGpuMoeBlockNamesAMissingExpertTable) {
  FakeGpuBackend gpu;
  const auto config = LoadModelConfig(Dir("mixtral_moe_top3"));
  ASSERT_TRUE(config.ok());
  LayerWeights w;
  Tensor x = Tensor::Empty({1, config->hidden_size}), out = Tensor::Empty({1, config->hidden_size});
  const Status s = MoeForward(*config, w, 1, gpu, x, out, nullptr, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  EXPECT_NE(s.message().find("MoE block of layer 1"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("expert table"), std::string::npos) << s.ToString();
}

}  // namespace
}  // namespace tessera
