#include "common/format/model_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/model/tensor_roles.h"
#include "support/test_util.h"

namespace tessera {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using json = nlohmann::json;

// config.json of Llama-3.1-8B, as published.
const char* kLlama31 = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "hidden_act": "silu",
  "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
  "max_position_embeddings": 131072, "mlp_bias": false, "model_type": "llama",
  "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
  "pretraining_tp": 1, "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.43.0.dev0", "use_cache": true, "vocab_size": 128256
})";

// Mistral-7B-v0.3.
const char* kMistral = R"({
  "architectures": ["MistralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1,
  "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
  "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mistral",
  "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
  "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "sliding_window": null,
  "tie_word_embeddings": false, "torch_dtype": "bfloat16", "use_cache": true, "vocab_size": 32768
})";

// Qwen2.5-0.5B.
const char* kQwen2 = R"({
  "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
  "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 896, "initializer_range": 0.02,
  "intermediate_size": 4864, "max_position_embeddings": 32768, "max_window_layers": 24,
  "model_type": "qwen2", "num_attention_heads": 14, "num_hidden_layers": 24,
  "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
  "sliding_window": 32768, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "use_cache": true, "use_sliding_window": false, "vocab_size": 151936
})";

StatusOr<ModelConfig> Parse(const json& j) { return ParseModelConfig(j.dump(2), "m/config.json"); }

// Qwen3-8B, as published (head_dim 128 is not hidden / heads = 128 by
// coincidence only: Qwen3-0.6B has hidden 1024, 16 heads, head_dim 128).
const char* kQwen3 = R"({
  "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
  "hidden_size": 1024, "initializer_range": 0.02, "intermediate_size": 3072,
  "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
  "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
  "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000, "sliding_window": null,
  "tie_word_embeddings": true, "torch_dtype": "bfloat16", "use_cache": true,
  "use_sliding_window": false, "vocab_size": 151936
})";

// Phi-3-mini-128k-instruct's shape (its factor lists shortened to values
// filled in by Phi3Longrope below).
const char* kPhi3 = R"({
  "architectures": ["Phi3ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1,
  "embd_pdrop": 0.0, "eos_token_id": 32000, "hidden_act": "silu", "hidden_size": 3072,
  "initializer_range": 0.02, "intermediate_size": 8192, "max_position_embeddings": 131072,
  "model_type": "phi3", "num_attention_heads": 32, "num_hidden_layers": 32,
  "num_key_value_heads": 32, "original_max_position_embeddings": 4096, "pad_token_id": 32000,
  "resid_pdrop": 0.0, "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 262144,
  "tie_word_embeddings": false, "torch_dtype": "bfloat16", "use_cache": true, "vocab_size": 32064
})";

json Phi3Longrope(const char* type, size_t n) {
  std::vector<double> short_f(n), long_f(n);
  for (size_t i = 0; i < n; ++i) {
    short_f[i] = 1.0 + 0.01 * static_cast<double>(i);
    long_f[i] = 2.0 + 0.5 * static_cast<double>(i);
  }
  return {{"type", type}, {"short_factor", short_f}, {"long_factor", long_f}};
}

// `base` with `patch` merged in (a null value in the patch deletes the key).
json Patched(const char* base, const json& patch) {
  json j = json::parse(base);
  j.merge_patch(patch);
  return j;
}

// Sizes whose products would overflow the byte counts derived from them are
// refused when the config is read (a fuzzer found vocab_size ~5e18 reaching
// ShardSpec::WeightBytes).
TEST(ModelConfig, SizesThatOverflowAreRefusedNamingTheKey) {
  auto huge = Parse(Patched(kQwen2, {{"vocab_size", 5100000000101111112LL}}));
  ASSERT_FALSE(huge.ok());
  EXPECT_NE(huge.status().message().find("vocab_size"), std::string::npos)
      << huge.status().ToString();
  EXPECT_NE(huge.status().message().find("at most 2147483647"), std::string::npos)
      << huge.status().ToString();
  auto big = Parse(Patched(kQwen2, {{"hidden_size", 1 << 30},
                                    {"intermediate_size", 1 << 30},
                                    {"num_attention_heads", 1},
                                    {"num_key_value_heads", 1}}));
  ASSERT_FALSE(big.ok());
  EXPECT_NE(big.status().message().find("more than 2^48"), std::string::npos)
      << big.status().ToString();
  EXPECT_TRUE(Parse(json::parse(kQwen2)).ok());
}

TEST(ModelConfig, Llama31) {
  auto c = ParseModelConfig(kLlama31, "llama/config.json");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->architecture, Architecture::kLlama);
  EXPECT_STREQ(ArchitectureName(c->architecture), "LlamaForCausalLM");
  EXPECT_EQ(c->model_type, "llama");
  EXPECT_EQ(c->hidden_size, 4096);
  EXPECT_EQ(c->intermediate_size, 14336);
  EXPECT_EQ(c->num_hidden_layers, 32);
  EXPECT_EQ(c->num_attention_heads, 32);
  EXPECT_EQ(c->num_key_value_heads, 8);
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_DOUBLE_EQ(c->rms_norm_eps, 1e-5);
  EXPECT_DOUBLE_EQ(c->rope_theta, 500000.0);
  EXPECT_EQ(c->max_position_embeddings, 131072);
  EXPECT_EQ(c->rope_scaling.type, RopeType::kLlama3);
  EXPECT_STREQ(RopeTypeName(c->rope_scaling.type), "llama3");
  EXPECT_DOUBLE_EQ(c->rope_scaling.factor, 8.0);
  EXPECT_DOUBLE_EQ(c->rope_scaling.low_freq_factor, 1.0);
  EXPECT_DOUBLE_EQ(c->rope_scaling.high_freq_factor, 4.0);
  EXPECT_EQ(c->rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_FALSE(c->tie_word_embeddings);
  EXPECT_FALSE(c->attention_bias);
  EXPECT_FALSE(c->mlp_bias);
  EXPECT_EQ(c->vocab_size, 128256);
  EXPECT_THAT(c->bos_token_ids, ElementsAre(128000));
  EXPECT_THAT(c->eos_token_ids, ElementsAre(128001, 128008, 128009));
  EXPECT_EQ(c->torch_dtype, DType::kBF16);
  // 32 layers of these plus 2 x 128256 x 4096 embeddings and a norm = 8.03e9.
  EXPECT_EQ(LayerParameterCount(*c), 218112000);
  EXPECT_EQ(c->KvBytesPerTokenPerLayer(DType::kBF16), 2 * 8 * 128 * 2);
}

TEST(ModelConfig, LlamaBiasesCountInLayerParameters) {
  auto c = Parse(Patched(kLlama31, {{"attention_bias", true}, {"mlp_bias", true}}));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE(c->attention_bias);
  EXPECT_TRUE(c->mlp_bias);
  // q (4096) + k, v (1024 each) + o (4096) biases; gate, up (14336 each) + down (4096).
  EXPECT_EQ(LayerParameterCount(*c), 218112000 + 4096 + 2048 + 4096 + 2 * 14336 + 4096);
}

TEST(ModelConfig, Mistral) {
  auto c = ParseModelConfig(kMistral, "mistral/config.json");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->architecture, Architecture::kMistral);
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_DOUBLE_EQ(c->rope_theta, 1e6);
  EXPECT_EQ(c->rope_scaling.type, RopeType::kDefault);
  EXPECT_FALSE(c->attention_bias);
  EXPECT_THAT(c->eos_token_ids, ElementsAre(2));
  // A window as wide as the context never masks anything.
  EXPECT_TRUE(Parse(Patched(kMistral, {{"sliding_window", 32768}})).ok());
}

TEST(ModelConfig, Qwen2HasQkvBiasAndTiedEmbeddings) {
  auto c = ParseModelConfig(kQwen2, "qwen/config.json");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->architecture, Architecture::kQwen2);
  EXPECT_TRUE(c->attention_bias);  // no "attention_bias" key: Qwen2 always has q/k/v bias
  EXPECT_FALSE(c->mlp_bias);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_EQ(c->head_dim, 64);
  EXPECT_EQ(c->num_key_value_heads, 2);
  EXPECT_THAT(c->bos_token_ids, ElementsAre(151643));
  // 24 layers of these plus 151936 x 896 tied embeddings and a norm = 494.0e6.
  EXPECT_EQ(LayerParameterCount(*c), 14912384);
  // Explicit false does not remove Qwen2's bias.
  EXPECT_TRUE(Parse(Patched(kQwen2, {{"attention_bias", false}}))->attention_bias);
  // use_sliding_window only on layers >= max_window_layers; 24 of 24 -> none.
  EXPECT_TRUE(
      Parse(Patched(kQwen2, {{"use_sliding_window", true}, {"sliding_window", 4096}})).ok());
}

TEST(ModelConfig, HeadDimDifferentFromHiddenOverHeads) {
  // Mistral-Nemo: 5120 / 32 = 160, but head_dim is 128.
  auto c = Parse(Patched(kMistral, {{"hidden_size", 5120}, {"head_dim", 128}}));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_EQ(c->KvBytesPerTokenPerLayer(DType::kF32), 2 * 8 * 128 * 4);
  // head_dim: null means derive it.
  json null_head_dim = Patched(kMistral, {{"hidden_size", 5120}});
  null_head_dim["head_dim"] = nullptr;
  auto d = Parse(null_head_dim);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->head_dim, 160);
  // Heads need not divide hidden_size when head_dim is given.
  EXPECT_TRUE(Parse(Patched(kMistral, {{"hidden_size", 5000}, {"head_dim", 128}})).ok());
}

TEST(ModelConfig, DefaultsForOptionalKeys) {
  json j = {{"architectures", json::array({"LlamaForCausalLM"})},
            {"hidden_size", 64},
            {"intermediate_size", 128},
            {"num_hidden_layers", 2},
            {"num_attention_heads", 4},
            {"vocab_size", 100}};
  auto c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->num_key_value_heads, 4);
  EXPECT_EQ(c->head_dim, 16);
  EXPECT_DOUBLE_EQ(c->rms_norm_eps, 1e-6);
  EXPECT_DOUBLE_EQ(c->rope_theta, 10000.0);
  EXPECT_EQ(c->max_position_embeddings, 2048);
  EXPECT_EQ(c->rope_scaling.type, RopeType::kDefault);
  EXPECT_FALSE(c->tie_word_embeddings);
  EXPECT_TRUE(c->bos_token_ids.empty());
  EXPECT_TRUE(c->eos_token_ids.empty());
  EXPECT_EQ(c->torch_dtype, DType::kF32);

  j["eos_token_id"] = nullptr;
  j["dtype"] = "float16";  // newer transformers spelling
  j["architectures"] = nullptr;
  j["model_type"] = "qwen2";  // fallback when architectures is absent
  c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->torch_dtype, DType::kF16);
  EXPECT_EQ(c->architecture, Architecture::kQwen2);
  EXPECT_TRUE(c->eos_token_ids.empty());
}

TEST(ModelConfig, EachRopeType) {
  auto with = [](const json& rope) { return Parse(Patched(kMistral, {{"rope_scaling", rope}})); };
  auto def = with({{"rope_type", "default"}});
  ASSERT_TRUE(def.ok()) << def.status().ToString();
  EXPECT_EQ(def->rope_scaling.type, RopeType::kDefault);
  EXPECT_DOUBLE_EQ(def->rope_scaling.factor, 1.0);

  auto lin = with({{"type", "linear"}, {"factor", 2.0}});  // legacy "type" key
  ASSERT_TRUE(lin.ok()) << lin.status().ToString();
  EXPECT_EQ(lin->rope_scaling.type, RopeType::kLinear);
  EXPECT_DOUBLE_EQ(lin->rope_scaling.factor, 2.0);

  auto dyn = with({{"rope_type", "dynamic"}, {"factor", 4}});
  ASSERT_TRUE(dyn.ok()) << dyn.status().ToString();
  EXPECT_EQ(dyn->rope_scaling.type, RopeType::kDynamic);
  EXPECT_DOUBLE_EQ(dyn->rope_scaling.factor, 4.0);

  auto l3 = ParseModelConfig(kLlama31, "c.json");
  ASSERT_TRUE(l3.ok());
  EXPECT_EQ(l3->rope_scaling.type, RopeType::kLlama3);

  // Newer transformers: theta and scaling together in "rope_parameters".
  json j = json::parse(kLlama31);
  j["rope_parameters"] = j["rope_scaling"];
  j["rope_parameters"]["rope_theta"] = 500000.0;
  j.erase("rope_scaling");
  j.erase("rope_theta");
  auto rp = Parse(j);
  ASSERT_TRUE(rp.ok()) << rp.status().ToString();
  EXPECT_DOUBLE_EQ(rp->rope_theta, 500000.0);
  EXPECT_EQ(rp->rope_scaling.type, RopeType::kLlama3);
  EXPECT_EQ(rp->rope_scaling.original_max_position_embeddings, 8192);
  auto rp_default = Parse(Patched(
      kMistral, {{"rope_theta", nullptr},
                 {"rope_parameters", {{"rope_theta", 75000.0}, {"rope_type", "default"}}}}));
  ASSERT_TRUE(rp_default.ok()) << rp_default.status().ToString();
  EXPECT_DOUBLE_EQ(rp_default->rope_theta, 75000.0);
  EXPECT_EQ(rp_default->rope_scaling.type, RopeType::kDefault);
}

void ExpectError(const StatusOr<ModelConfig>& c, StatusCode code,
                 const std::vector<std::string>& parts) {
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), code) << c.status().ToString();
  for (const std::string& p : parts) EXPECT_THAT(c.status().message(), HasSubstr(p));
}

TEST(ModelConfig, UnsupportedArchitecture) {
  ExpectError(Parse(Patched(kLlama31, {{"architectures", json::array({"GPT2LMHeadModel"})}})),
              StatusCode::kUnimplemented,
              {"m/config.json", "'architectures'", "GPT2LMHeadModel",
               "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, "
               "Phi3ForCausalLM"});
}

TEST(ModelConfig, UnsupportedRopeType) {
  ExpectError(
      Parse(Patched(kLlama31, {{"rope_scaling", {{"rope_type", "yarn"}, {"factor", 4.0}}}})),
      StatusCode::kUnimplemented,
      {"m/config.json", "'rope_scaling.rope_type'", "yarn", "default, linear, dynamic, llama3"});
  ExpectError(
      Parse(Patched(kLlama31, {{"rope_scaling", {{"rope_type", "linear"}, {"factor", nullptr}}}})),
      StatusCode::kInvalidArgument, {"missing required key 'rope_scaling.factor'"});
  ExpectError(Parse(Patched(kLlama31, {{"rope_scaling", {{"low_freq_factor", nullptr}}}})),
              StatusCode::kInvalidArgument, {"'rope_scaling.low_freq_factor'"});
  ExpectError(Parse(Patched(kLlama31, {{"rope_scaling", {{"high_freq_factor", 1.0}}}})),
              StatusCode::kInvalidArgument, {"'rope_scaling.high_freq_factor'", "must exceed"});
}

TEST(ModelConfig, MissingRequiredKey) {
  for (const char* key : {"hidden_size", "intermediate_size", "num_hidden_layers",
                          "num_attention_heads", "vocab_size"}) {
    ExpectError(Parse(Patched(kQwen2, {{key, nullptr}})), StatusCode::kInvalidArgument,
                {"m/config.json", std::string("missing required key '") + key + "'"});
  }
}

TEST(ModelConfig, InvalidValues) {
  ExpectError(Parse(Patched(kQwen2, {{"hidden_size", "896"}})), StatusCode::kInvalidArgument,
              {"'hidden_size'", "expected an integer"});
  ExpectError(Parse(Patched(kQwen2, {{"vocab_size", 0}})), StatusCode::kInvalidArgument,
              {"'vocab_size'", "must be positive"});
  ExpectError(Parse(Patched(kQwen2, {{"num_key_value_heads", 3}})), StatusCode::kInvalidArgument,
              {"'num_key_value_heads'", "does not divide"});
  ExpectError(Parse(Patched(kQwen2, {{"hidden_size", 900}})), StatusCode::kInvalidArgument,
              {"'num_attention_heads'", "hidden_size (900)"});
  ExpectError(Parse(Patched(kQwen2, {{"eos_token_id", "x"}})), StatusCode::kInvalidArgument,
              {"'eos_token_id'"});
  ExpectError(Parse(Patched(kQwen2, {{"tie_word_embeddings", 1}})), StatusCode::kInvalidArgument,
              {"'tie_word_embeddings'"});
  ExpectError(Parse(Patched(kQwen2, {{"torch_dtype", "float64"}})), StatusCode::kUnimplemented,
              {"'torch_dtype'", "float64", "float32, float16, bfloat16"});
  ExpectError(ParseModelConfig("[1, 2]", "a.json"), StatusCode::kInvalidArgument,
              {"a.json", "not a JSON object"});
}

TEST(ModelConfig, Qwen3ReadsAttentionBiasAndHasNoMlpBias) {
  auto c = ParseModelConfig(kQwen3, "qwen3/config.json");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->architecture, Architecture::kQwen3);
  EXPECT_STREQ(ArchitectureName(c->architecture), "Qwen3ForCausalLM");
  EXPECT_FALSE(c->attention_bias);
  EXPECT_FALSE(c->mlp_bias);
  EXPECT_EQ(c->head_dim, 128);
  // q/k/v/o, the two norms and the per-head q_norm/k_norm [head_dim].
  EXPECT_EQ(LayerParameterCount(*c),
            1024 * 2048 + 2 * 1024 * 1024 + 2048 * 1024 + 3 * 1024 * 3072 + 2 * 1024 + 2 * 128);
  // Qwen3 reads attention_bias (q, k, v and o), unlike Qwen2.
  EXPECT_TRUE(Parse(Patched(kQwen3, {{"attention_bias", true}}))->attention_bias);
  EXPECT_FALSE(Parse(Patched(kQwen3, {{"mlp_bias", true}}))->mlp_bias);
  // A model_type fallback, and per-layer windows that mask are refused.
  EXPECT_EQ(Parse(Patched(kQwen3, {{"architectures", nullptr}}))->architecture,
            Architecture::kQwen3);
  ExpectError(Parse(Patched(kQwen3, {{"use_sliding_window", true},
                                     {"sliding_window", 4096},
                                     {"max_window_layers", 14}})),
              StatusCode::kUnimplemented, {"'use_sliding_window'", "4096", "Qwen3ForCausalLM"});
}

TEST(ModelConfig, Phi3LongropeAndItsAttentionFactor) {
  for (const char* type : {"su", "longrope"}) {
    SCOPED_TRACE(type);
    auto c = Parse(Patched(kPhi3, {{"rope_scaling", Phi3Longrope(type, 48)}}));
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    EXPECT_EQ(c->architecture, Architecture::kPhi3);
    EXPECT_FALSE(c->attention_bias);
    EXPECT_FALSE(c->mlp_bias);
    EXPECT_EQ(c->rope_scaling.type, RopeType::kLongRope);
    EXPECT_EQ(c->rope_scaling.original_max_position_embeddings, 4096);
    ASSERT_EQ(c->rope_scaling.short_factor.size(), 48u);
    EXPECT_DOUBLE_EQ(c->rope_scaling.long_factor[3], 3.5);
    // transformers: factor = 131072 / 4096 = 32, sqrt(1 + ln 32 / ln 4096).
    EXPECT_DOUBLE_EQ(c->rope_scaling.attention_factor,
                     std::sqrt(1.0 + std::log(32.0) / std::log(4096.0)));
    EXPECT_EQ(c->sliding_window, 262144);
  }
  json given = Phi3Longrope("longrope", 48);
  given["attention_factor"] = 1.25;
  EXPECT_DOUBLE_EQ(Parse(Patched(kPhi3, {{"rope_scaling", given}}))->rope_scaling.attention_factor,
                   1.25);
  // Phi-3-mini-4k: no scaling, attention factor 1.
  auto plain = Parse(json::parse(kPhi3));
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  EXPECT_EQ(plain->rope_scaling.type, RopeType::kDefault);
  EXPECT_DOUBLE_EQ(plain->rope_scaling.attention_factor, 1.0);
  // Fused q|k|v and gate|up count as their parts: the same parameters as
  // the unfused layout.
  EXPECT_EQ(LayerParameterCount(*plain), 3072 * 3072 * 4 + 3 * 3072 * 8192 + 2 * 3072);
  ExpectError(Parse(Patched(kPhi3, {{"rope_scaling", Phi3Longrope("longrope", 47)}})),
              StatusCode::kInvalidArgument,
              {"'rope_scaling'", "head_dim / 2 = 48", "got 47 and 47"});
  json missing = Phi3Longrope("su", 48);
  missing.erase("long_factor");
  ExpectError(Parse(Patched(kPhi3, {{"rope_scaling", missing}})), StatusCode::kInvalidArgument,
              {"'rope_scaling.long_factor'"});
  ExpectError(Parse(Patched(kPhi3, {{"rope_scaling", Phi3Longrope("su", 48)},
                                    {"original_max_position_embeddings", 1}})),
              StatusCode::kInvalidArgument, {"'original_max_position_embeddings'", "at least 2"});
  ExpectError(Parse(Patched(kPhi3, {{"partial_rotary_factor", 0.75}})), StatusCode::kUnimplemented,
              {"'partial_rotary_factor'", "0.75"});
  EXPECT_TRUE(Parse(Patched(kPhi3, {{"partial_rotary_factor", 1.0}})).ok());
  ExpectError(Parse(Patched(kPhi3, {{"rope_scaling", {{"type", "yarn"}, {"factor", 4.0}}}})),
              StatusCode::kUnimplemented, {"'rope_scaling.type'", "yarn", "longrope (su)"});
}

TEST(ModelConfig, SlidingWindowOnEveryLayerIsReadPerLayerWindowsAreRefused) {
  // Mistral-7B-v0.1 uses a 4096 window over a 32768 context: every layer.
  auto mistral = Parse(Patched(kMistral, {{"sliding_window", 4096}}));
  ASSERT_TRUE(mistral.ok()) << mistral.status().ToString();
  EXPECT_EQ(mistral->sliding_window, 4096);
  EXPECT_EQ(Parse(json::parse(kMistral))->sliding_window, 0);  // null: no window
  // Phi-3-mini-4k: 2047 over 4096.
  EXPECT_EQ(Parse(Patched(kPhi3, {{"sliding_window", 2047}}))->sliding_window, 2047);
  // Qwen2's window applies to layers >= max_window_layers only: refused.
  ExpectError(Parse(Patched(kQwen2, {{"use_sliding_window", true},
                                     {"sliding_window", 4096},
                                     {"max_window_layers", 12}})),
              StatusCode::kUnimplemented, {"'use_sliding_window'", "4096"});
}

TEST(ModelConfig, MalformedJsonReportsLineAndColumn) {
  const std::string text = "{\n  \"hidden_size\": 4096,\n  \"vocab_size\": ,\n}\n";
  ExpectError(ParseModelConfig(text, "bad/config.json"), StatusCode::kInvalidArgument,
              {"bad/config.json:3:17", "malformed JSON"});
  ExpectError(ParseModelConfig("{\"a\": 1", "t.json"), StatusCode::kInvalidArgument,
              {"t.json:1:8"});
}

TEST(ModelConfig, LoadFromDirectory) {
  const std::string dir = testing::MakeTempDir("cfg");
  EXPECT_EQ(LoadModelConfig(dir).status().code(), StatusCode::kNotFound);
  EXPECT_THAT(LoadModelConfig(dir).status().message(), HasSubstr(dir + "/config.json"));
  std::ofstream(dir + "/config.json") << kQwen2;
  auto c = LoadModelConfig(dir);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->vocab_size, 151936);
  std::ofstream(dir + "/config.json") << "{\"hidden_size\": 1,";
  EXPECT_THAT(LoadModelConfig(dir).status().message(), HasSubstr(dir + "/config.json:1:"));
}

}  // namespace
}  // namespace tessera
