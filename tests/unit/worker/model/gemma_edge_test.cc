// Gemma's edge cases on the fixture models (tests/fixtures/models/gemma*,
// references from transformers 5.24.0, eager attention):
//  - a prompt longer than the sliding window with soft-capping on (Gemma 2:
//    window 4 on the even layers, attention scores capped at 3, logits at
//    10): the last logits match transformers when the prompt is prefilled
//    in one step and in chunks of 5, 3 and 1 tokens (each chunk's rows see
//    the previous chunks' keys through the paged cache, some of them outside
//    the window), on 4-token KV blocks;
//  - the features the fixtures exercise are load-bearing: the same weights
//    with one feature left out (no attention cap, no final cap, the window on
//    every layer or on none; Gemma 3 without its local RoPE table, with
//    plain-weight norms or without the embedding multiplier) are far from
//    the reference, so a forward pass that dropped one would fail here;
//  - the tied head under pp: the last stage of a pp = 2 split holds no
//    embedding but lm_head, read from model.embed_tokens.weight, equal to
//    the embedding the first stage holds.
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "support/model_harness.h"
#include "support/test_util.h"
#include "worker/model/kv_cache.h"
#include "worker/model/llama_model.h"
#include "worker/model/model_loader.h"

namespace tessera {
namespace {

using nlohmann::json;
using ::tessera::testing::RelMaxDiff;

constexpr int64_t kBlockSize = 4;
constexpr int64_t kBlocks = 64;

// One stage holding the whole fixture, with `patch` applied to its config
// after the weights are read (the weights are the checkpoint's either way).
struct Rig {
  std::unique_ptr<LlamaModel> model;
  std::unique_ptr<KvCache> cache;
};

Rig Load(const std::string& dir, const std::function<void(ModelConfig&)>& patch = {}) {
  Rig rig;
  auto config = LoadModelConfig(dir);
  EXPECT_TRUE(config.ok()) << config.status().ToString();
  if (!config.ok()) return rig;
  auto par = ParallelConfig::Make(*config, 1, 1);
  EXPECT_TRUE(par.ok()) << par.status().ToString();
  if (!par.ok()) return rig;
  auto loaded = LoadModel(dir, *par, 0, nullptr);
  EXPECT_TRUE(loaded.ok()) << loaded.status().ToString();
  if (!loaded.ok()) return rig;
  ModelConfig patched = loaded->config;
  if (patch) patch(patched);
  rig.model = std::make_unique<LlamaModel>(patched, loaded->model->weights(), nullptr);
  auto cache = KvCache::Create(kernels::CpuBackend(), patched.num_hidden_layers, kBlocks,
                               kBlockSize, rig.model->layout().kv_heads_local, patched.head_dim);
  EXPECT_TRUE(cache.ok()) << cache.status().ToString();
  if (cache.ok()) rig.cache = std::move(*cache);
  return rig;
}

// The last position's logits of `prompt` prefilled in chunks of `chunk`
// tokens (one sequence, blocks 0, 1, ...).
std::vector<float> LastLogits(Rig& rig, const std::vector<int32_t>& prompt, int32_t chunk) {
  const int32_t n = static_cast<int32_t>(prompt.size());
  std::vector<int32_t> table;
  for (int32_t b = 0; b * kBlockSize < n; ++b) table.push_back(b);
  const int64_t vocab = rig.model->config().vocab_size;
  Tensor logits = Tensor::Empty({1, vocab});
  for (int32_t start = 0; start < n; start += chunk) {
    StepBatch batch;
    SeqStep s;
    s.start_pos = start;
    s.num_tokens = std::min(chunk, n - start);
    s.prompt_len = n;
    s.block_table = table;
    s.want_logits = start + s.num_tokens == n;
    batch.token_ids.assign(prompt.begin() + start, prompt.begin() + start + s.num_tokens);
    batch.seqs.push_back(s);
    auto hidden = rig.model->NewHidden(batch.total_tokens());
    EXPECT_TRUE(hidden.ok());
    if (!hidden.ok()) return {};
    Status st = rig.model->Forward(batch, Tensor(), *rig.cache, *hidden);
    EXPECT_TRUE(st.ok()) << st.ToString();
    if (!st.ok()) return {};
    if (s.want_logits) {
      st = rig.model->Logits(batch, *hidden, logits);
      EXPECT_TRUE(st.ok()) << st.ToString();
      if (!st.ok()) return {};
    }
  }
  return std::vector<float>(logits.data<float>(), logits.data<float>() + vocab);
}

// The reference prompt with the most tokens.
const json& LongestPrompt(const json& ref) {
  const json* best = &ref["prompts"][0];
  for (const json& p : ref["prompts"])
    if (p["ids"].size() > (*best)["ids"].size()) best = &p;
  return *best;
}

TEST(GemmaEdges, PromptLongerThanTheWindowWithSoftCapping) {
  const std::string dir = testing::FixturePath("models/gemma2_softcap_window");
  const json ref = json::parse(testing::ReadFileOrDie(dir + "/reference.json"));
  const json& p = LongestPrompt(ref);
  const auto ids = p["ids"].get<std::vector<int32_t>>();
  Rig rig = Load(dir);
  ASSERT_NE(rig.model, nullptr);
  const ModelConfig& c = rig.model->config();
  // The case this test is about, as the fixture states it.
  ASSERT_EQ(c.sliding_window, 4);
  ASSERT_GT(static_cast<int64_t>(ids.size()), 3 * c.sliding_window);
  ASSERT_EQ(c.attn_logit_softcapping, 3.0);
  ASSERT_EQ(c.final_logit_softcapping, 10.0);
  ASSERT_EQ(c.sliding_layers, (std::vector<bool>{true, false, true, false}));
  for (int32_t chunk : {static_cast<int32_t>(ids.size()), 5, 3, 1}) {
    const auto logits = LastLogits(rig, ids, chunk);
    ASSERT_EQ(logits.size(), p["last_logits"].size());
    EXPECT_LE(RelMaxDiff(logits, p["last_logits"]), 1e-4) << "chunks of " << chunk;
  }

  const std::vector<std::pair<std::string, std::function<void(ModelConfig&)>>> without = {
      {"attention soft-cap", [](ModelConfig& m) { m.attn_logit_softcapping = 0; }},
      {"final soft-cap", [](ModelConfig& m) { m.final_logit_softcapping = 0; }},
      {"the window", [](ModelConfig& m) { m.sliding_window = 0; }},
      {"full layers (the window on all)", [](ModelConfig& m) { m.sliding_layers.clear(); }},
      {"GeGLU (SwiGLU instead)", [](ModelConfig& m) { m.hidden_activation = Activation::kSilu; }},
      {"query_pre_attn_scalar (head_dim)", [](ModelConfig& m) { m.query_pre_attn_scalar = 0; }},
  };
  for (const auto& [what, patch] : without) {
    Rig off = Load(dir, patch);
    ASSERT_NE(off.model, nullptr);
    const double diff = RelMaxDiff(LastLogits(off, ids, 5), p["last_logits"]);
    EXPECT_GT(diff, 1e-2) << "without " << what << " the logits should be far from transformers'";
    std::printf("gemma2 without %-34s rel max diff %.3g\n", what.c_str(), diff);
  }
}

TEST(GemmaEdges, Gemma3LocalRopeAndUnitOffsetNormsAreLoadBearing) {
  const std::string dir = testing::FixturePath("models/gemma3_text_local_rope_bf16");
  const json ref = json::parse(testing::ReadFileOrDie(dir + "/reference.json"));
  const json& p = LongestPrompt(ref);
  const auto ids = p["ids"].get<std::vector<int32_t>>();
  Rig rig = Load(dir);
  ASSERT_NE(rig.model, nullptr);
  const ModelConfig& c = rig.model->config();
  ASSERT_EQ(c.local_rope_theta, 100.0);
  ASSERT_GT(static_cast<int64_t>(ids.size()), c.sliding_window);
  for (int32_t chunk : {static_cast<int32_t>(ids.size()), 4, 1}) {
    EXPECT_LE(RelMaxDiff(LastLogits(rig, ids, chunk), p["last_logits"]), 1e-4)
        << "chunks of " << chunk;
  }
  const std::vector<std::pair<std::string, std::function<void(ModelConfig&)>>> without = {
      {"the local RoPE table", [](ModelConfig& m) { m.local_rope_theta = 0; }},
      {"(1 + w) norms", [](ModelConfig& m) { m.rms_norm_unit_offset = false; }},
      {"the embedding multiplier", [](ModelConfig& m) { m.embedding_multiplier = 1.0; }},
      {"the windows", [](ModelConfig& m) { m.sliding_window = 0; }},
  };
  for (const auto& [what, patch] : without) {
    Rig off = Load(dir, patch);
    ASSERT_NE(off.model, nullptr);
    const double diff = RelMaxDiff(LastLogits(off, ids, 4), p["last_logits"]);
    EXPECT_GT(diff, 1e-2) << "without " << what << " the logits should be far from transformers'";
    std::printf("gemma3 without %-34s rel max diff %.3g\n", what.c_str(), diff);
  }
}

TEST(GemmaEdges, TiedHeadUnderPipelineParallelism) {
  for (const char* name : {"gemma2_softcap_window", "gemma3_text_local_rope_bf16"}) {
    SCOPED_TRACE(name);
    const std::string dir = testing::FixturePath(std::string("models/") + name);
    auto config = LoadModelConfig(dir);
    ASSERT_TRUE(config.ok()) << config.status().ToString();
    ASSERT_TRUE(config->tie_word_embeddings);
    auto par = ParallelConfig::Make(*config, 1, 2);
    ASSERT_TRUE(par.ok()) << par.status().ToString();
    auto first = LoadModel(dir, *par, 0, nullptr);
    ASSERT_TRUE(first.ok()) << first.status().ToString();
    auto last = LoadModel(dir, *par, 1, nullptr);
    ASSERT_TRUE(last.ok()) << last.status().ToString();
    const StageWeights& a = first->model->weights();
    const StageWeights& b = last->model->weights();
    EXPECT_FALSE(a.lm_head.defined());
    EXPECT_FALSE(b.embed_tokens.defined());
    ASSERT_TRUE(a.embed_tokens.defined());
    ASSERT_TRUE(b.lm_head.defined());
    ASSERT_EQ(a.embed_tokens.shape(), b.lm_head.shape());
    int64_t differ = 0;
    for (int64_t i = 0; i < a.embed_tokens.numel(); ++i)
      differ += a.embed_tokens.data<float>()[i] != b.lm_head.data<float>()[i];
    EXPECT_EQ(differ, 0) << "the last stage's lm_head is the embedding";
  }
}

}  // namespace
}  // namespace tessera
