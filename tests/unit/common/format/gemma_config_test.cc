// Gemma 2 and Gemma 3 (text) config.json files read as transformers'
// Gemma2Config / Gemma3TextConfig read them (common/format/gemma_config.h):
// defaults for absent keys, null versus absent soft-capping, the per-layer
// attention types, Gemma 3's two RoPE tables in both config formats, and the
// refusals (a vision tower, other activations, bidirectional attention,
// other RoPE types), each naming its key. The parameter counts from the
// tensor tables equal those of the transformers models built from the same
// configs (sum of parameters of AutoModelForCausalLM.from_config on the meta
// device, transformers 5.24.0: 2,614,341,888 and 999,885,952).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "common/format/model_config.h"
#include "common/model/tensor_roles.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;
using json = nlohmann::json;

// gemma-2-2b's config.json.
const char* kGemma2 = R"({
  "architectures": ["Gemma2ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "attn_logit_softcapping": 50.0, "bos_token_id": 2, "cache_implementation": "hybrid",
  "eos_token_id": 1, "final_logit_softcapping": 30.0, "head_dim": 256,
  "hidden_act": "gelu_pytorch_tanh", "hidden_activation": "gelu_pytorch_tanh",
  "hidden_size": 2304, "initializer_range": 0.02, "intermediate_size": 9216,
  "max_position_embeddings": 8192, "model_type": "gemma2", "num_attention_heads": 8,
  "num_hidden_layers": 26, "num_key_value_heads": 4, "pad_token_id": 0,
  "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06, "rope_theta": 10000.0,
  "sliding_window": 4096, "torch_dtype": "float32", "use_cache": true, "vocab_size": 256000
})";

// gemma-3-1b-it's config.json (the text-only Gemma 3).
const char* kGemma3 = R"({
  "architectures": ["Gemma3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "attn_logit_softcapping": null, "bos_token_id": 2, "cache_implementation": "hybrid",
  "eos_token_id": [1, 106], "final_logit_softcapping": null, "head_dim": 256,
  "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 1152, "initializer_range": 0.02,
  "intermediate_size": 6912, "max_position_embeddings": 32768, "model_type": "gemma3_text",
  "num_attention_heads": 4, "num_hidden_layers": 26, "num_key_value_heads": 1,
  "pad_token_id": 0, "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06,
  "rope_local_base_freq": 10000, "rope_scaling": null, "rope_theta": 1000000,
  "sliding_window": 512, "sliding_window_pattern": 6, "torch_dtype": "bfloat16",
  "use_cache": true, "vocab_size": 262144
})";

StatusOr<ModelConfig> Parse(const json& j) { return ParseModelConfig(j.dump(2), "g/config.json"); }

// `base` with `patch` merged in (a null value in the patch deletes the key).
json Patched(const char* base, const json& patch) {
  json j = json::parse(base);
  j.merge_patch(patch);
  return j;
}

// `base` with `key` set to null (merge_patch would delete it).
json WithNull(const char* base, const char* key) {
  json j = json::parse(base);
  j[key] = nullptr;
  return j;
}

void ExpectError(const StatusOr<ModelConfig>& c, StatusCode code,
                 const std::vector<std::string>& parts) {
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), code) << c.status().ToString();
  for (const std::string& p : parts) EXPECT_THAT(c.status().message(), HasSubstr(p));
}

std::vector<bool> Sliding(const ModelConfig& c) {
  std::vector<bool> out;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) out.push_back(c.LayerSlidingWindow(l) > 0);
  return out;
}

TEST(GemmaConfig, Gemma2) {
  auto c = Parse(json::parse(kGemma2));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->architecture, Architecture::kGemma2);
  EXPECT_STREQ(ArchitectureName(c->architecture), "Gemma2ForCausalLM");
  EXPECT_EQ(c->head_dim, 256);
  EXPECT_TRUE(c->tie_word_embeddings);  // Gemma2Config's default
  EXPECT_TRUE(c->rms_norm_unit_offset);
  EXPECT_EQ(c->hidden_activation, Activation::kGeluTanh);
  EXPECT_STREQ(ActivationName(c->hidden_activation), "gelu_pytorch_tanh");
  EXPECT_DOUBLE_EQ(c->embedding_multiplier, std::sqrt(2304.0));
  EXPECT_DOUBLE_EQ(c->query_pre_attn_scalar, 256.0);
  EXPECT_DOUBLE_EQ(c->AttentionScale(), 1.0 / 16.0);
  EXPECT_DOUBLE_EQ(c->attn_logit_softcapping, 50.0);
  EXPECT_DOUBLE_EQ(c->final_logit_softcapping, 30.0);
  EXPECT_EQ(c->sliding_window, 4096);
  EXPECT_EQ(c->local_rope_theta, 0.0);
  // transformers' default layer_types: the even layers slide.
  ASSERT_EQ(c->sliding_layers.size(), 26u);
  for (int64_t l = 0; l < 26; ++l) {
    EXPECT_EQ(c->LayerSlidingWindow(l), l % 2 == 0 ? 4096 : 0) << l;
    EXPECT_FALSE(c->LayerUsesLocalRope(l));
  }
  EXPECT_EQ(c->rope_scaling.type, RopeType::kDefault);
  EXPECT_FALSE(c->mlp_bias);
  EXPECT_EQ(ModelParameterCount(*c), 2614341888);

  // Absent soft-capping keys take Gemma2Config's defaults; null turns them off.
  auto absent = Parse(Patched(kGemma2, {{"attn_logit_softcapping", nullptr},
                                        {"final_logit_softcapping", nullptr},
                                        {"query_pre_attn_scalar", nullptr},
                                        {"sliding_window", nullptr},
                                        {"head_dim", nullptr},
                                        {"max_position_embeddings", nullptr}}));
  ASSERT_TRUE(absent.ok()) << absent.status().ToString();
  EXPECT_DOUBLE_EQ(absent->attn_logit_softcapping, 50.0);
  EXPECT_DOUBLE_EQ(absent->final_logit_softcapping, 30.0);
  EXPECT_DOUBLE_EQ(absent->query_pre_attn_scalar, 256.0);
  EXPECT_EQ(absent->sliding_window, 4096);
  EXPECT_EQ(absent->head_dim, 256);  // not hidden / heads = 288
  EXPECT_EQ(absent->max_position_embeddings, 8192);
  auto off = Parse(WithNull(kGemma2, "attn_logit_softcapping"));
  ASSERT_TRUE(off.ok());
  EXPECT_EQ(off->attn_logit_softcapping, 0.0);
  EXPECT_DOUBLE_EQ(off->final_logit_softcapping, 30.0);
  off = Parse(WithNull(kGemma2, "final_logit_softcapping"));
  ASSERT_TRUE(off.ok());
  EXPECT_EQ(off->final_logit_softcapping, 0.0);
  // A null window: no layer slides.
  off = Parse(WithNull(kGemma2, "sliding_window"));
  ASSERT_TRUE(off.ok());
  EXPECT_EQ(off->sliding_window, 0);
  for (int64_t l = 0; l < 26; ++l) EXPECT_EQ(off->LayerSlidingWindow(l), 0);
  // Gemma 2 reads attention_bias (q, k, v and o), never an MLP bias.
  auto biased = Parse(Patched(kGemma2, {{"attention_bias", true}, {"mlp_bias", true}}));
  ASSERT_TRUE(biased.ok());
  EXPECT_TRUE(biased->attention_bias);
  EXPECT_FALSE(biased->mlp_bias);
  // model_type alone names the family.
  EXPECT_EQ(Parse(Patched(kGemma2, {{"architectures", nullptr}}))->architecture,
            Architecture::kGemma2);
}

TEST(GemmaConfig, Gemma3Text) {
  auto c = Parse(json::parse(kGemma3));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->architecture, Architecture::kGemma3Text);
  EXPECT_STREQ(ArchitectureName(c->architecture), "Gemma3ForCausalLM");
  EXPECT_EQ(c->attn_logit_softcapping, 0.0);
  EXPECT_EQ(c->final_logit_softcapping, 0.0);
  EXPECT_DOUBLE_EQ(c->rope_theta, 1000000.0);
  EXPECT_DOUBLE_EQ(c->local_rope_theta, 10000.0);
  EXPECT_EQ(c->rope_scaling.type, RopeType::kDefault);
  EXPECT_EQ(c->eos_token_ids, (std::vector<int64_t>{1, 106}));
  // sliding_window_pattern 6: every sixth layer is global.
  for (int64_t l = 0; l < 26; ++l) {
    const bool sliding = (l + 1) % 6 != 0;
    EXPECT_EQ(c->LayerSlidingWindow(l), sliding ? 512 : 0) << l;
    EXPECT_EQ(c->LayerUsesLocalRope(l), sliding) << l;
  }
  EXPECT_EQ(ModelParameterCount(*c), 999885952);

  // Gemma3Attention never passes attn_logit_softcapping to attention.
  auto capped = Parse(
      Patched(kGemma3, {{"attn_logit_softcapping", 50.0}, {"final_logit_softcapping", 30.0}}));
  ASSERT_TRUE(capped.ok());
  EXPECT_EQ(capped->attn_logit_softcapping, 0.0);
  EXPECT_DOUBLE_EQ(capped->final_logit_softcapping, 30.0);

  // Absent keys: Gemma3TextConfig's defaults (pattern 6, global theta 1e6,
  // local 1e4, max_position_embeddings 131072).
  auto absent = Parse(Patched(kGemma3, {{"sliding_window_pattern", nullptr},
                                        {"rope_theta", nullptr},
                                        {"rope_local_base_freq", nullptr},
                                        {"max_position_embeddings", nullptr}}));
  ASSERT_TRUE(absent.ok()) << absent.status().ToString();
  EXPECT_EQ(Sliding(*absent), Sliding(*c));
  EXPECT_DOUBLE_EQ(absent->rope_theta, 1000000.0);
  EXPECT_DOUBLE_EQ(absent->local_rope_theta, 10000.0);
  EXPECT_EQ(absent->max_position_embeddings, 131072);

  // Explicit layer_types win over the pattern.
  json types = json::array();
  for (int l = 0; l < 26; ++l) types.push_back(l < 2 ? "full_attention" : "sliding_attention");
  auto listed = Parse(Patched(kGemma3, {{"layer_types", types}}));
  ASSERT_TRUE(listed.ok()) << listed.status().ToString();
  EXPECT_EQ(listed->LayerSlidingWindow(0), 0);
  EXPECT_EQ(listed->LayerSlidingWindow(5), 512);
  EXPECT_FALSE(listed->LayerUsesLocalRope(1));
  EXPECT_TRUE(listed->LayerUsesLocalRope(5));

  // Linear scaling of the global layers (gemma-3-4b and larger).
  auto linear =
      Parse(Patched(kGemma3, {{"rope_scaling", {{"rope_type", "linear"}, {"factor", 8}}}}));
  ASSERT_TRUE(linear.ok()) << linear.status().ToString();
  EXPECT_EQ(linear->rope_scaling.type, RopeType::kLinear);
  EXPECT_DOUBLE_EQ(linear->rope_scaling.factor, 8.0);
  EXPECT_DOUBLE_EQ(linear->local_rope_theta, 10000.0);
}

// transformers 5's format: one rope_parameters object per layer type.
TEST(GemmaConfig, Gemma3RopeParametersPerLayerType) {
  auto c = Parse(Patched(
      kGemma3,
      {{"rope_theta", nullptr},
       {"rope_local_base_freq", nullptr},
       {"rope_scaling", nullptr},
       {"rope_parameters",
        {{"full_attention", {{"rope_type", "linear"}, {"factor", 8.0}, {"rope_theta", 5e5}}},
         {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 2e4}}}}}}));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->rope_scaling.type, RopeType::kLinear);
  EXPECT_DOUBLE_EQ(c->rope_scaling.factor, 8.0);
  EXPECT_DOUBLE_EQ(c->rope_theta, 5e5);
  EXPECT_DOUBLE_EQ(c->local_rope_theta, 2e4);

  ExpectError(
      Parse(Patched(kGemma3,
                    {{"rope_parameters",
                      {{"sliding_attention", {{"rope_type", "linear"}, {"factor", 2.0}}}}}})),
      StatusCode::kUnimplemented,
      {"g/config.json", "'rope_parameters.sliding_attention.rope_type'", "linear"});
  ExpectError(Parse(Patched(kGemma3, {{"rope_parameters", {{"rope_type", "default"}}}})),
              StatusCode::kInvalidArgument, {"'rope_parameters'", "full_attention"});
}

// A config.json as transformers 5.24's save_pretrained writes it (layer_types
// listed, per-layer-type rope_parameters, "dtype", the private
// "_sliding_window_pattern"): what tests/gpu/hf_reference.py makes.
TEST(GemmaConfig, Gemma3AsSavedByTransformers5) {
  auto c = Parse(json::parse(R"({
    "_sliding_window_pattern": 6, "architectures": ["Gemma3ForCausalLM"],
    "attention_bias": false, "attn_logit_softcapping": null, "bos_token_id": 1,
    "dtype": "bfloat16", "eos_token_id": 2, "final_logit_softcapping": null, "head_dim": 16,
    "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 64, "intermediate_size": 96,
    "layer_types": ["sliding_attention", "sliding_attention", "sliding_attention",
                    "sliding_attention", "sliding_attention", "full_attention",
                    "sliding_attention", "sliding_attention"],
    "max_position_embeddings": 4096, "model_type": "gemma3_text", "num_attention_heads": 4,
    "num_hidden_layers": 8, "num_key_value_heads": 2, "pad_token_id": 0,
    "query_pre_attn_scalar": 16, "rms_norm_eps": 1e-05,
    "rope_parameters": {
      "full_attention": {"factor": 8.0, "rope_theta": 1000000.0, "rope_type": "linear"},
      "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"}},
    "sliding_window": 8, "sliding_window_pattern": 6, "tie_word_embeddings": false,
    "use_bidirectional_attention": false, "use_cache": true, "vocab_size": 300
  })"));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->torch_dtype, DType::kBF16);
  EXPECT_FALSE(c->tie_word_embeddings);
  EXPECT_EQ(c->rope_scaling.type, RopeType::kLinear);
  EXPECT_DOUBLE_EQ(c->rope_theta, 1000000.0);
  EXPECT_DOUBLE_EQ(c->local_rope_theta, 10000.0);
  EXPECT_EQ(Sliding(*c), (std::vector<bool>{true, true, true, true, true, false, true, true}));
  EXPECT_DOUBLE_EQ(c->AttentionScale(), 0.25);
}

TEST(GemmaConfig, RefusalsNameTheKey) {
  // A vision tower: Gemma3ForConditionalGeneration's config nests the text
  // model under text_config beside vision_config.
  json multimodal = {{"architectures", {"Gemma3ForConditionalGeneration"}},
                     {"model_type", "gemma3"},
                     {"text_config", json::parse(kGemma3)},
                     {"vision_config", {{"model_type", "siglip_vision_model"}}}};
  ExpectError(Parse(multimodal), StatusCode::kUnimplemented,
              {"g/config.json", "'vision_config'", "vision tower", "Gemma3ForCausalLM"});
  multimodal.erase("vision_config");
  ExpectError(Parse(multimodal), StatusCode::kUnimplemented,
              {"'architectures'", "Gemma3ForConditionalGeneration", "gemma3_text"});
  ExpectError(Parse(Patched(kGemma2, {{"hidden_activation", "gelu"}})), StatusCode::kUnimplemented,
              {"'hidden_activation'", "'gelu'", "gelu_pytorch_tanh"});
  ExpectError(Parse(Patched(kGemma3, {{"use_bidirectional_attention", true}})),
              StatusCode::kUnimplemented, {"'use_bidirectional_attention'"});
  ExpectError(
      Parse(Patched(kGemma2, {{"rope_scaling", {{"rope_type", "dynamic"}, {"factor", 2.0}}}})),
      StatusCode::kUnimplemented, {"'rope_scaling'", "dynamic", "default, linear"});
  ExpectError(Parse(Patched(kGemma3, {{"rope_scaling",
                                       {{"rope_type", "llama3"},
                                        {"factor", 8.0},
                                        {"low_freq_factor", 1.0},
                                        {"high_freq_factor", 4.0},
                                        {"original_max_position_embeddings", 8192}}}})),
              StatusCode::kUnimplemented, {"'rope_scaling'", "llama3"});
  ExpectError(Parse(Patched(kGemma3, {{"layer_types", {"sliding_attention"}}})),
              StatusCode::kInvalidArgument, {"'layer_types'", "26"});
  json chunked = json::array();
  for (int l = 0; l < 26; ++l) chunked.push_back("chunked_attention");
  ExpectError(Parse(Patched(kGemma3, {{"layer_types", chunked}})), StatusCode::kUnimplemented,
              {"'layer_types'", "chunked_attention"});
  ExpectError(Parse(Patched(kGemma2, {{"attn_logit_softcapping", -1.0}})),
              StatusCode::kInvalidArgument, {"'attn_logit_softcapping'", "positive"});
  ExpectError(Parse(Patched(kGemma3, {{"sliding_window_pattern", 0}})),
              StatusCode::kInvalidArgument, {"'sliding_window_pattern'"});
  ExpectError(Parse(Patched(kGemma2, {{"query_pre_attn_scalar", "x"}})),
              StatusCode::kInvalidArgument, {"'query_pre_attn_scalar'"});
}

}  // namespace
}  // namespace tessera
