// The LLGuidance glue (common/grammar/) against the real library of the
// llguidance wheel, where scripts/setup unpacks it (the default of
// structured_output.llguidance_library), over a byte-level BPE tokenizer
// (llama_gqa_f32) and a SentencePiece-style one that puts a word-start space
// before every text it encodes (mistral_sliding_window): the bytes LLGuidance
// sees, masks that only allow JSON the
// schema accepts, a walk through the masks that always ends in a valid
// document, the engine's reason for a bad schema, and a missing library
// named in the error.
#include "common/grammar/grammar_engine.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/grammar/grammar_library_paths.h"
#include "support/test_util.h"

namespace tessera {
namespace {

using json = nlohmann::json;

bool Allowed(const std::vector<uint32_t>& mask, int32_t t) {
  return (mask[t / 32] >> (t % 32)) & 1u;
}

class GrammarEngineTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const std::string dir = testing::FixturePath("models/" + GetParam());
    kVocab = json::parse(testing::ReadFileOrDie(dir + "/config.json"))["vocab_size"].get<int32_t>();
    const GrammarLibraryPaths paths = DefaultGrammarLibraryPaths();
    auto lib = LlguidanceLibrary::Load(paths.llguidance_library, paths.python_library);
    ASSERT_TRUE(lib.ok()) << lib.status().ToString() << " (scripts/setup fetches it)";
    auto tok = Tokenizer::Load(dir);
    ASSERT_TRUE(tok.ok()) << tok.status().ToString();
    tokenizer_ = std::shared_ptr<const Tokenizer>(std::move(*tok));
    ASSERT_TRUE(tokenizer_->eos_id().has_value());
    auto engine = GrammarEngine::Create(*lib, tokenizer_, kVocab, *tokenizer_->eos_id());
    ASSERT_TRUE(engine.ok()) << engine.status().ToString();
    engine_ = *engine;
  }

  // Follows the masks from the start, taking at each step the allowed token
  // that `pick` prefers, until only EOS is allowed (or `limit` steps).
  std::string Walk(const GrammarSpec& spec, bool prefer_high, int limit = 200) {
    auto m = engine_->NewMatcher(spec);
    EXPECT_TRUE(m.ok()) << m.status().ToString();
    if (!m.ok()) return "";
    std::vector<int32_t> ids;
    std::vector<uint32_t> mask;
    for (int step = 0; step < limit; ++step) {
      EXPECT_TRUE((*m)->ComputeMask(mask).ok());
      std::vector<int32_t> allowed;
      for (int32_t t = 0; t < kVocab; ++t)
        if (Allowed(mask, t) && t != engine_->eos_id()) allowed.push_back(t);
      if (allowed.empty()) {
        EXPECT_TRUE(Allowed(mask, engine_->eos_id())) << "nothing allowed after " << ids.size();
        const Status eos = (*m)->Accept(engine_->eos_id());
        EXPECT_TRUE(eos.ok()) << eos.ToString();
        EXPECT_TRUE((*m)->ended());
        break;
      }
      const int32_t t = prefer_high ? allowed.back() : allowed.front();
      EXPECT_TRUE((*m)->Accept(t).ok());
      ids.push_back(t);
    }
    return tokenizer_->Decode(ids, false);
  }

  int32_t kVocab = 0;  // the fixture's config.json vocab_size
  std::shared_ptr<const Tokenizer> tokenizer_;
  std::shared_ptr<const GrammarEngine> engine_;
};

INSTANTIATE_TEST_SUITE_P(Tokenizers, GrammarEngineTest,
                         ::testing::Values("llama_gqa_f32", "mistral_sliding_window"));

// The bytes LLGuidance is given for each token: byte-level BPE's map undone,
// SentencePiece's word-start space as a space. That tokenizer also spells
// any text with a leading space, which is why the engine does not hand
// LLGuidance its Encode for the bytes a grammar forces (grammar_engine.cc).
TEST(GrammarTokenBytes, ByteLevelAndSentencePieceTokensSpellTheirBytes) {
  auto bpe = Tokenizer::Load(testing::FixturePath("models/llama_gqa_f32"));
  ASSERT_TRUE(bpe.ok()) << bpe.status().ToString();
  const auto space_a = (*bpe)->Encode(" a", false);
  ASSERT_EQ(space_a.size(), 1u);
  EXPECT_EQ((*bpe)->TokenBytes(space_a[0]), " a");
  EXPECT_EQ((*bpe)->TokenBytes((*bpe)->Encode("{", false)[0]), "{");
  auto sp = Tokenizer::Load(testing::FixturePath("models/mistral_sliding_window"));
  ASSERT_TRUE(sp.ok()) << sp.status().ToString();
  std::string spelled;
  for (int32_t id : (*sp)->Encode("{", false)) spelled += (*sp)->TokenBytes(id);
  EXPECT_EQ(spelled, " {");
}

TEST_P(GrammarEngineTest, FirstMaskAllowsOnlyTokensThatOpenAnObject) {
  auto m = engine_->NewMatcher({GrammarKind::kJsonObject, ""});
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  std::vector<uint32_t> mask;
  ASSERT_TRUE((*m)->ComputeMask(mask).ok());
  ASSERT_EQ(mask.size(), static_cast<size_t>((kVocab + 31) / 32));
  int allowed = 0;
  for (int32_t t = 0; t < kVocab; ++t) {
    if (!Allowed(mask, t)) continue;
    ++allowed;
    EXPECT_EQ(tokenizer_->TokenBytes(t).substr(0, 1), "{") << "token " << t;
  }
  EXPECT_GT(allowed, 0);
  EXPECT_FALSE(Allowed(mask, engine_->eos_id()));
  const int32_t letter = tokenizer_->Encode("a", false)[0];
  EXPECT_FALSE((*m)->Accept(letter).ok()) << "a token outside the mask is refused";
}

TEST_P(GrammarEngineTest, WalksThroughTheMasksEndInValidDocuments) {
  const json schema = {{"type", "object"},
                       {"properties",
                        {{"ok", {{"type", "boolean"}}},
                         {"color", {{"enum", {"red", "green"}}}},
                         {"n", {{"type", "integer"}, {"minimum", 0}, {"maximum", 9}}}}},
                       {"required", {"ok", "color", "n"}},
                       {"additionalProperties", false}};
  for (bool high : {false, true}) {
    SCOPED_TRACE(high);
    const std::string text = Walk({GrammarKind::kJsonSchema, schema.dump()}, high);
    const json doc = json::parse(text, nullptr, false);
    ASSERT_FALSE(doc.is_discarded()) << text;
    ASSERT_TRUE(doc.is_object()) << text;
    EXPECT_EQ(doc.size(), 3u) << text;
    EXPECT_TRUE(doc["ok"].is_boolean()) << text;
    EXPECT_TRUE(doc["color"] == "red" || doc["color"] == "green") << text;
    ASSERT_TRUE(doc["n"].is_number_integer()) << text;
    EXPECT_GE(doc["n"].get<int>(), 0);
    EXPECT_LE(doc["n"].get<int>(), 9);
  }
}

TEST_P(GrammarEngineTest, ABadSchemaGetsTheEnginesReason) {
  const Status st = engine_->Check({GrammarKind::kJsonSchema, R"({"type": "bogus"})"});
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("bogus"), std::string::npos) << st.message();
  EXPECT_FALSE(engine_->Check({GrammarKind::kJsonSchema, "{not json"}).ok());
  EXPECT_TRUE(engine_->Check({GrammarKind::kJsonSchema, R"({"type": "string"})"}).ok());
  EXPECT_FALSE(engine_->NewMatcher({GrammarKind::kJsonSchema, R"({"type": "bogus"})"}).ok());
}

// LLGuidance generates properties in the order the schema text lists them;
// the engine hands it that text without reordering (nlohmann::json would
// sort "zeta", "alpha", "mid" by name).
TEST_P(GrammarEngineTest, PropertiesComeInTheSchemasOrder) {
  const std::string schema =
      R"({"type":"object","properties":{"zeta":{"type":"boolean"},"alpha":{"type":"null"},)"
      R"("mid":{"enum":[1,2]}},"required":["zeta","alpha","mid"],"additionalProperties":false})";
  for (bool high : {false, true}) {
    SCOPED_TRACE(high);
    const std::string text = Walk({GrammarKind::kJsonSchema, schema}, high);
    const nlohmann::ordered_json doc = nlohmann::ordered_json::parse(text, nullptr, false);
    ASSERT_TRUE(doc.is_object()) << text;
    std::vector<std::string> keys;
    for (const auto& [key, value] : doc.items()) keys.push_back(key);
    EXPECT_EQ(keys, (std::vector<std::string>{"zeta", "alpha", "mid"})) << text;
    EXPECT_LT(text.find("\"zeta\""), text.find("\"alpha\"")) << text;
  }
}

// Schemas that LLGuidance compiles but cannot start an output under (every
// path recurses without producing a byte), or fails a few tokens in, fail
// the check, as they would fail the sampling worker's masks; the reason
// carries no parser-state dump.
TEST_P(GrammarEngineTest, ASchemaWithNoFirstTokenFailsTheCheck) {
  for (const std::string schema :
       {R"({"$ref":"#"})",
        R"({"$defs":{"a":{"$ref":"#/$defs/b"},"b":{"$ref":"#/$defs/a"}},"$ref":"#/$defs/a"})"}) {
    SCOPED_TRACE(schema);
    const Status st = engine_->Check({GrammarKind::kJsonSchema, schema});
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find("cannot start an output"), std::string::npos) << st.message();
    EXPECT_EQ(st.message().find("<state>"), std::string::npos) << st.message();
  }
  // One that requires itself: over the byte-level tokenizer LLGuidance
  // starts it ("{") and fails the next mask (its forced tokens never end),
  // so the check refuses it. Over the SentencePiece one (LLGuidance's greedy
  // tokenizer) it forces {"a":{"a":... token by token without failing, which
  // the worker would serve until max_tokens: the check lets it pass.
  const GrammarSpec endless = {
      GrammarKind::kJsonSchema,
      R"({"type":"object","properties":{"a":{"$ref":"#"}},"required":["a"]})"};
  const Status st = engine_->Check(endless);
  if (GetParam() == "llama_gqa_f32") {
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find("fails at token 1 of the output"), std::string::npos)
        << st.message();
  } else {
    EXPECT_TRUE(st.ok()) << st.ToString();
    EXPECT_EQ(Walk(endless, false, 12).rfind(R"({"a":{"a":)", 0), 0u);
  }
  const Status missing =
      engine_->Check({GrammarKind::kJsonSchema, R"({"properties":{"a":{"$ref":"#/nope"}}})"});
  EXPECT_EQ(missing.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(missing.message().find("/nope"), std::string::npos) << missing.message();
  // Recursion with a way out is fine.
  EXPECT_TRUE(engine_
                  ->Check({GrammarKind::kJsonSchema,
                           R"({"type":"object","properties":{"next":{"$ref":"#"}}})"})
                  .ok());
}

TEST(LlguidanceLibrary, AMissingLibraryIsNamed) {
  auto lib =
      LlguidanceLibrary::Load("/nonexistent/llguidance/_lib.abi3.so", "libpython3.11.so.1.0");
  ASSERT_FALSE(lib.ok());
  EXPECT_EQ(lib.status().code(), StatusCode::kNotFound);
  EXPECT_NE(lib.status().message().find("/nonexistent/llguidance/_lib.abi3.so"), std::string::npos);
  EXPECT_NE(lib.status().message().find("scripts/setup"), std::string::npos);
}

}  // namespace
}  // namespace tessera
