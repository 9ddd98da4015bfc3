// Tests for common/tokenizer/tokenizer.h against fixtures made by the Hugging Face
// `tokenizers` library (tools/make_tokenizer_fixtures.py): exact ids, exact
// decodes, streaming decode, tokenizer_config handling and load errors.
#include "common/tokenizer/tokenizer.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "support/test_util.h"

namespace tessera {
namespace {

using nlohmann::json;

const char* const kFixtures[] = {"bytelevel_llama3", "bytelevel_gpt2", "metaspace_llama2",
                                 "metaspace_pretok"};

std::string FixtureDir(const std::string& name) {
  return testing::FixturePath("tokenizers/" + name);
}

json ReadJson(const std::string& path) { return json::parse(testing::ReadFileOrDie(path)); }

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  ASSERT_TRUE(out.good()) << path;
}

std::vector<int32_t> Ids(const json& j) { return j.get<std::vector<int32_t>>(); }

// Strict UTF-8 check written independently of common/base/utf8.h (RFC 3629 table).
bool WellFormedUtf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto b = static_cast<unsigned char>(s[i]);
    size_t n = 0;
    unsigned char lo = 0x80, hi = 0xBF;
    if (b <= 0x7F) {
      ++i;
      continue;
    } else if (b >= 0xC2 && b <= 0xDF) {
      n = 1;
    } else if (b == 0xE0) {
      n = 2, lo = 0xA0;
    } else if ((b >= 0xE1 && b <= 0xEC) || b == 0xEE || b == 0xEF) {
      n = 2;
    } else if (b == 0xED) {
      n = 2, hi = 0x9F;
    } else if (b == 0xF0) {
      n = 3, lo = 0x90;
    } else if (b >= 0xF1 && b <= 0xF3) {
      n = 3;
    } else if (b == 0xF4) {
      n = 3, hi = 0x8F;
    } else {
      return false;
    }
    if (i + n >= s.size()) return false;
    for (size_t k = 1; k <= n; ++k) {
      const auto c = static_cast<unsigned char>(s[i + k]);
      const unsigned char l = (k == 1) ? lo : 0x80, h = (k == 1) ? hi : 0xBF;
      if (c < l || c > h) return false;
    }
    i += n + 1;
  }
  return true;
}

// Streams `ids` through an IncrementalDecoder; checks each piece is valid
// UTF-8 and that the pieces add up to Decode(ids). Returns how many pushes
// held text back (returned "" although the full decode had grown).
int CheckStreaming(const Tokenizer& tok, const std::vector<int32_t>& ids, bool skip_special,
                   const std::string& label) {
  IncrementalDecoder stream(tok, skip_special);
  std::string joined;
  int held = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    const std::string piece = stream.Push(ids[i]);
    EXPECT_TRUE(WellFormedUtf8(piece)) << label << " push " << i;
    const std::string so_far =
        tok.Decode(std::vector<int32_t>(ids.begin(), ids.begin() + i + 1), skip_special);
    if (piece.empty() && so_far.size() > joined.size()) ++held;
    joined += piece;
  }
  const std::string rest = stream.Flush();
  EXPECT_TRUE(WellFormedUtf8(rest)) << label << " flush";
  joined += rest;
  EXPECT_EQ(joined, tok.Decode(ids, skip_special)) << label;
  return held;
}

// Checks a tokenizer against an expected.json written by
// tools/make_tokenizer_fixtures.py (any model dir may hold one).
void CheckAgainstExpected(const Tokenizer& tok, const json& expected, const std::string& name) {
  EXPECT_EQ(tok.vocab_size(), expected["vocab_size"].get<int32_t>()) << name;
  for (const auto& c : expected["cases"]) {
    const std::string text = c["text"];
    const std::string label = name + " text=" + json(text).dump();
    EXPECT_EQ(tok.Encode(text, false), Ids(c["ids"])) << label;
    const std::vector<int32_t> with_special = Ids(c["ids_with_special"]);
    EXPECT_EQ(tok.Encode(text, true), with_special) << label;
    EXPECT_EQ(tok.Decode(with_special, false), c["decode"].get<std::string>()) << label;
    EXPECT_EQ(tok.Decode(with_special, true), c["decode_skip_special"].get<std::string>()) << label;
    CheckStreaming(tok, with_special, false, label);
    CheckStreaming(tok, with_special, true, label);
  }
  if (expected.contains("decode_cases")) {
    for (const auto& c : expected["decode_cases"]) {
      const std::vector<int32_t> ids = Ids(c["ids"]);
      const std::string label = name + " ids=" + c["ids"].dump();
      EXPECT_EQ(tok.Decode(ids, false), c["decode"].get<std::string>()) << label;
      EXPECT_EQ(tok.Decode(ids, true), c["decode_skip_special"].get<std::string>()) << label;
      CheckStreaming(tok, ids, false, label);
      CheckStreaming(tok, ids, true, label);
    }
  }
}

std::unique_ptr<Tokenizer> LoadOrDie(const std::string& dir) {
  auto tok = Tokenizer::Load(dir);
  EXPECT_TRUE(tok.ok()) << tok.status().ToString();
  return tok.ok() ? std::move(tok).value() : nullptr;
}

class FixtureTest : public ::testing::TestWithParam<const char*> {};

TEST_P(FixtureTest, MatchesHuggingFaceTokenizers) {
  const std::string dir = FixtureDir(GetParam());
  auto tok = LoadOrDie(dir);
  ASSERT_NE(tok, nullptr);
  const json expected = ReadJson(dir + "/expected.json");
  ASSERT_GE(expected["cases"].size(), 30u);
  CheckAgainstExpected(*tok, expected, GetParam());
}

TEST_P(FixtureTest, TokenLookupsRoundTrip) {
  const std::string dir = FixtureDir(GetParam());
  auto tok = LoadOrDie(dir);
  ASSERT_NE(tok, nullptr);
  const json tj = ReadJson(dir + "/tokenizer.json");
  for (const auto& [token, id] : tj["model"]["vocab"].items()) {
    ASSERT_EQ(tok->TokenToId(token), id.get<int32_t>()) << token;
    ASSERT_EQ(tok->IdToToken(id.get<int32_t>()), token);
  }
  for (const auto& added : tj["added_tokens"]) {
    const int32_t id = added["id"];
    EXPECT_EQ(tok->TokenToId(added["content"].get<std::string>()), id);
    EXPECT_EQ(tok->IsSpecial(id), added["special"].get<bool>()) << added.dump();
  }
  EXPECT_FALSE(tok->TokenToId("definitely not a token").has_value());
  EXPECT_EQ(tok->IdToToken(1 << 30), "");
  EXPECT_FALSE(tok->IsSpecial(-1));
}

INSTANTIATE_TEST_SUITE_P(Fixtures, FixtureTest, ::testing::ValuesIn(kFixtures));

TEST(TokenizerTest, ConfigBosEosAndChatTemplate) {
  auto llama3 = LoadOrDie(FixtureDir("bytelevel_llama3"));
  ASSERT_NE(llama3, nullptr);
  EXPECT_EQ(llama3->bos_id(), llama3->TokenToId("<|begin_of_text|>"));
  EXPECT_EQ(llama3->eos_id(), llama3->TokenToId("<|im_end|>"));  // given as {"content": ...}
  EXPECT_EQ(llama3->bos_token(), "<|begin_of_text|>");
  EXPECT_TRUE(llama3->IsSpecial(*llama3->bos_id()));
  EXPECT_NE(llama3->chat_template().find("<|im_start|>"), std::string::npos);

  auto llama2 = LoadOrDie(FixtureDir("metaspace_llama2"));
  ASSERT_NE(llama2, nullptr);
  EXPECT_EQ(llama2->bos_id(), 1);
  EXPECT_EQ(llama2->eos_id(), 2);
  EXPECT_NE(llama2->chat_template().find("[INST]"), std::string::npos);
  EXPECT_FALSE(llama2->IsSpecial(*llama2->TokenToId("<0x41>")));

  auto gpt2 = LoadOrDie(FixtureDir("bytelevel_gpt2"));
  ASSERT_NE(gpt2, nullptr);
  EXPECT_EQ(gpt2->bos_id(), gpt2->eos_id());
  EXPECT_EQ(gpt2->chat_template(), "");
}

// Copies a fixture into a scratch dir, with tokenizer_config.json replaced.
std::string CopyWithConfig(const std::string& fixture, const json& config) {
  const std::string dir = testing::MakeTempDir("tok-" + fixture);
  std::filesystem::copy_file(FixtureDir(fixture) + "/tokenizer.json", dir + "/tokenizer.json");
  WriteFile(dir + "/tokenizer_config.json", config.dump());
  return dir;
}

TEST(TokenizerTest, AddBosEosFlagsOverrideTemplate) {
  const json expected = ReadJson(FixtureDir("metaspace_llama2") + "/expected.json");
  const json& hello = expected["cases"][0];
  ASSERT_EQ(hello["text"], "Hello world");
  const std::vector<int32_t> plain = Ids(hello["ids"]);
  json config = ReadJson(FixtureDir("metaspace_llama2") + "/tokenizer_config.json");

  config["add_eos_token"] = true;
  auto both = LoadOrDie(CopyWithConfig("metaspace_llama2", config));
  ASSERT_NE(both, nullptr);
  std::vector<int32_t> want = {1};
  want.insert(want.end(), plain.begin(), plain.end());
  want.push_back(2);
  EXPECT_EQ(both->Encode("Hello world", true), want);
  EXPECT_EQ(both->Encode("Hello world", false), plain);

  config["add_bos_token"] = false;
  config["add_eos_token"] = false;
  auto none = LoadOrDie(CopyWithConfig("metaspace_llama2", config));
  ASSERT_NE(none, nullptr);
  EXPECT_EQ(none->Encode("Hello world", true), plain);

  // No config file at all: tokenizer.json's template alone decides.
  const std::string bare = testing::MakeTempDir("tok-bare");
  std::filesystem::copy_file(FixtureDir("metaspace_llama2") + "/tokenizer.json",
                             bare + "/tokenizer.json");
  WriteFile(bare + "/chat_template.jinja", "{{ messages }}");
  auto no_config = LoadOrDie(bare);
  ASSERT_NE(no_config, nullptr);
  EXPECT_EQ(no_config->Encode("Hello world", true), Ids(hello["ids_with_special"]));
  EXPECT_FALSE(no_config->bos_id().has_value());
  EXPECT_EQ(no_config->chat_template(), "{{ messages }}");
}

TEST(TokenizerTest, StreamingHoldsBackSplitCharacters) {
  // Emoji and CJK whose UTF-8 bytes are spread over several tokens.
  const std::string text = "emoji 😀🎉👍🏽 and 日本語 🇫🇷";
  for (const char* name : kFixtures) {
    auto tok = LoadOrDie(FixtureDir(name));
    ASSERT_NE(tok, nullptr);
    const std::vector<int32_t> ids = tok->Encode(text, true);
    const int held = CheckStreaming(*tok, ids, true, name);
    if (std::string(name) != "metaspace_pretok") {  // that one maps them to <unk>
      EXPECT_GT(held, 0) << name << ": no token ended inside a character";
      // ByteLevel(add_prefix_space) adds a leading space that decode keeps.
      const std::string prefix = std::string(name) == "bytelevel_gpt2" ? " " : "";
      EXPECT_EQ(tok->Decode(ids, true), prefix + text) << name;
    }
  }
}

TEST(TokenizerTest, StreamingRandomIdsMatchDecode) {
  // Random ids biased towards the tokens that stress the streaming window:
  // specials, <0xNN> byte tokens, low ids (single bytes / characters).
  for (const char* name : kFixtures) {
    auto tok = LoadOrDie(FixtureDir(name));
    ASSERT_NE(tok, nullptr);
    uint64_t state = 0x9E3779B97F4A7C15ull;
    auto next = [&state](uint64_t bound) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      return (state >> 33) % bound;
    };
    for (int round = 0; round < 300; ++round) {
      std::vector<int32_t> ids(next(30));
      for (auto& id : ids) {
        id = static_cast<int32_t>(next(4) == 0 ? next(300) : next(tok->vocab_size() + 2));
      }
      CheckStreaming(*tok, ids, round % 2 == 0,
                     std::string(name) + " round " + std::to_string(round));
    }
  }
}

TEST(TokenizerTest, StreamingFallsBackForCrossTokenDecoders) {
  // A Replace after Fuse rewrites text across token boundaries, so the
  // streaming decoder must decode whole sequences; results stay identical.
  json j = ReadJson(FixtureDir("metaspace_llama2") + "/tokenizer.json");
  j["decoder"] = json::parse(R"({"type": "Sequence", "decoders": [
      {"type": "ByteFallback"}, {"type": "Fuse"},
      {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
      {"type": "Strip", "content": " ", "start": 1, "stop": 0}]})");
  const std::string dir = testing::MakeTempDir("tok-fuse");
  WriteFile(dir + "/tokenizer.json", j.dump());
  auto tok = LoadOrDie(dir);
  ASSERT_NE(tok, nullptr);
  const std::string text = "Hello  world, café 日本語 😀";
  const std::vector<int32_t> ids = tok->Encode(text, true);
  EXPECT_EQ(tok->Decode(ids, true), text);
  CheckStreaming(*tok, ids, true, "replace-after-fuse");
  CheckStreaming(*tok, ids, false, "replace-after-fuse");
}

// A vocab whose ids have a hole (the fuzzer's find: 856 entries, the largest id 975): every id
// Encode returns is below vocab_size(), and the special-token table covers every id.
TEST(TokenizerTest, VocabWithHolesBoundsEveryEncodedId) {
  json j = ReadJson(FixtureDir("metaspace_llama2") + "/tokenizer.json");
  json& vocab = j["model"]["vocab"];
  std::string moved;
  int32_t largest = -1;
  for (auto& [token, id] : vocab.items()) {
    if (id.get<int32_t>() > largest) {
      largest = id.get<int32_t>();
      moved = token;
    }
  }
  const int32_t far = largest + 120;
  vocab[moved] = far;  // one id past a hole of 119
  const std::string dir = testing::MakeTempDir("tok-holes");
  WriteFile(dir + "/tokenizer.json", j.dump());
  auto tok = LoadOrDie(dir);
  ASSERT_NE(tok, nullptr);
  EXPECT_GT(tok->vocab_size(), far);
  EXPECT_FALSE(tok->Decode({far}, false).empty()) << "the moved token decodes";
  for (int32_t id : tok->Encode("Hello, world! " + moved, true)) EXPECT_LT(id, tok->vocab_size());
}

TEST(TokenizerTest, StreamingDecoderResetsAfterFlush) {
  auto tok = LoadOrDie(FixtureDir("metaspace_llama2"));
  ASSERT_NE(tok, nullptr);
  IncrementalDecoder stream(*tok);
  std::string first;
  for (int32_t id : tok->Encode("Hello world", true)) first += stream.Push(id);
  first += stream.Flush();
  EXPECT_EQ(first, "Hello world");
  std::string second;
  for (int32_t id : tok->Encode("café", true)) second += stream.Push(id);
  second += stream.Flush();
  EXPECT_EQ(second, "café");
}

TEST(TokenizerTest, InvalidUtf8InputIsReplaced) {
  auto tok = LoadOrDie(FixtureDir("bytelevel_llama3"));
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->Encode("a\xff b\xe2\x82", false),
            tok->Encode("a\xEF\xBF\xBD b\xEF\xBF\xBD", false));
}

TEST(TokenizerTest, ConcurrentEncodeIsConsistent) {
  auto tok = LoadOrDie(FixtureDir("bytelevel_llama3"));
  ASSERT_NE(tok, nullptr);
  const json expected = ReadJson(FixtureDir("bytelevel_llama3") + "/expected.json");
  std::vector<std::thread> threads;
  std::vector<int> mismatches(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 5; ++round) {
        for (const auto& c : expected["cases"]) {
          if (tok->Encode(c["text"].get<std::string>(), true) != Ids(c["ids_with_special"])) {
            ++mismatches[t];
          }
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches, std::vector<int>(4, 0));
}

TEST(TokenizerTest, LongInputs) {
  auto tok = LoadOrDie(FixtureDir("bytelevel_llama3"));
  ASSERT_NE(tok, nullptr);
  // 50k spaces then a word: exercises \s+(?!\S) on a long run.
  const std::string spaces(50000, ' ');
  const std::vector<int32_t> ids = tok->Encode(spaces + "x", false);
  EXPECT_EQ(tok->Decode(ids, false), spaces + "x");
  std::string big;
  for (int i = 0; i < 2000; ++i) big += "The quick brown fox 12345 jumps; café 日本語 😀\n";
  EXPECT_EQ(tok->Decode(tok->Encode(big, false), false), big);
}

// ---- Load errors -----------------------------------------------------------

// Writes `tokenizer_json` into a scratch model dir and returns Load's status.
Status LoadStatus(const std::string& tokenizer_json, const std::string& config = "") {
  const std::string dir = testing::MakeTempDir("tok-err");
  WriteFile(dir + "/tokenizer.json", tokenizer_json);
  if (!config.empty()) WriteFile(dir + "/tokenizer_config.json", config);
  auto tok = Tokenizer::Load(dir);
  return tok.ok() ? Status::Ok() : tok.status();
}

json FixtureTokenizerJson(const std::string& name) {
  return ReadJson(FixtureDir(name) + "/tokenizer.json");
}

void ExpectErrorMentions(const Status& st, StatusCode code, const std::vector<std::string>& parts) {
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), code) << st.ToString();
  for (const auto& p : parts) EXPECT_NE(st.message().find(p), std::string::npos) << st.ToString();
}

TEST(TokenizerErrorTest, MissingDirectoryOrFile) {
  auto tok = Tokenizer::Load("/nonexistent/model/dir");
  ASSERT_FALSE(tok.ok());
  EXPECT_EQ(tok.status().code(), StatusCode::kNotFound);
  EXPECT_NE(tok.status().message().find("/nonexistent/model/dir/tokenizer.json"),
            std::string::npos);
}

TEST(TokenizerErrorTest, MalformedJson) {
  ExpectErrorMentions(LoadStatus("{\"model\": {"), StatusCode::kInvalidArgument,
                      {"tokenizer.json", "malformed JSON"});
  ExpectErrorMentions(LoadStatus("{}"), StatusCode::kInvalidArgument,
                      {"tokenizer.json", "model", "required key is missing"});
}

TEST(TokenizerErrorTest, UnsupportedModelType) {
  json j = FixtureTokenizerJson("bytelevel_gpt2");
  j["model"]["type"] = "WordPiece";
  ExpectErrorMentions(LoadStatus(j.dump()), StatusCode::kUnimplemented,
                      {"tokenizer.json", "model.type", "'WordPiece'", "supported: BPE"});
}

TEST(TokenizerErrorTest, UnsupportedPreTokenizerNamesJsonPath) {
  json j = FixtureTokenizerJson("bytelevel_llama3");
  j["pre_tokenizer"]["pretokenizers"][1] = {{"type", "Whitespace"}};
  ExpectErrorMentions(LoadStatus(j.dump()), StatusCode::kUnimplemented,
                      {"tokenizer.json", "pre_tokenizer.pretokenizers[1].type", "'Whitespace'",
                       "Sequence, Split, ByteLevel, Digits, Metaspace"});
}

TEST(TokenizerErrorTest, UnsupportedSplitBehavior) {
  json j = FixtureTokenizerJson("bytelevel_llama3");
  j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Exploded";
  ExpectErrorMentions(LoadStatus(j.dump()), StatusCode::kUnimplemented,
                      {"pre_tokenizer.pretokenizers[0].behavior", "Isolated"});
}

TEST(TokenizerErrorTest, BadRegex) {
  json j = FixtureTokenizerJson("bytelevel_llama3");
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed";
  ExpectErrorMentions(LoadStatus(j.dump()), StatusCode::kInvalidArgument,
                      {"pre_tokenizer.pretokenizers[0].pattern.Regex", "(unclosed"});
}

TEST(TokenizerErrorTest, UnsupportedNormalizerDecoderPostProcessor) {
  json j = FixtureTokenizerJson("metaspace_llama2");
  j["normalizer"]["normalizers"][1] = {{"type", "Lowercase"}};
  ExpectErrorMentions(LoadStatus(j.dump()), StatusCode::kUnimplemented,
                      {"normalizer.normalizers[1].type", "'Lowercase'", "Prepend, Replace"});

  j = FixtureTokenizerJson("metaspace_llama2");
  j["decoder"]["decoders"][2] = {{"type", "WordPiece"}};
  ExpectErrorMentions(LoadStatus(j.dump()), StatusCode::kUnimplemented,
                      {"decoder.decoders[2].type", "'WordPiece'", "ByteFallback, Fuse, Strip"});

  j = FixtureTokenizerJson("metaspace_llama2");
  j["post_processor"] = {{"type", "BertProcessing"}};
  ExpectErrorMentions(LoadStatus(j.dump()), StatusCode::kUnimplemented,
                      {"post_processor.type", "'BertProcessing'", "TemplateProcessing"});
}

TEST(TokenizerErrorTest, BadMergesAndVocab) {
  json j = FixtureTokenizerJson("bytelevel_llama3");
  j["model"]["merges"][3] = json::array({"nope", "x"});
  ExpectErrorMentions(LoadStatus(j.dump()), StatusCode::kInvalidArgument,
                      {"model.merges[3]", "'nope'", "not in model.vocab"});

  j = FixtureTokenizerJson("bytelevel_gpt2");  // string form
  j["model"]["merges"][0] = "nospace";
  ExpectErrorMentions(LoadStatus(j.dump()), StatusCode::kInvalidArgument, {"model.merges[0]"});

  j = FixtureTokenizerJson("bytelevel_gpt2");
  j["model"]["vocab"]["a"] = "seven";
  ExpectErrorMentions(LoadStatus(j.dump()), StatusCode::kInvalidArgument, {"model.vocab.a"});

  j = FixtureTokenizerJson("bytelevel_gpt2");
  j["model"]["dropout"] = 0.1;
  ExpectErrorMentions(LoadStatus(j.dump()), StatusCode::kUnimplemented, {"model.dropout"});
}

TEST(TokenizerErrorTest, BadTokenizerConfig) {
  const std::string tj = FixtureTokenizerJson("metaspace_llama2").dump();
  ExpectErrorMentions(LoadStatus(tj, "{\"bos_token\": \"<nope>\"}"), StatusCode::kInvalidArgument,
                      {"tokenizer_config.json", "bos_token", "'<nope>'"});
  ExpectErrorMentions(LoadStatus(tj, "{\"eos_token\": 5}"), StatusCode::kInvalidArgument,
                      {"tokenizer_config.json", "eos_token"});
  ExpectErrorMentions(LoadStatus(tj, "{\"add_eos_token\": true}"), StatusCode::kInvalidArgument,
                      {"tokenizer_config.json", "add_eos_token", "eos_token is not set"});
  ExpectErrorMentions(LoadStatus(tj, "[1, 2"), StatusCode::kInvalidArgument,
                      {"tokenizer_config.json", "malformed JSON"});
}

// ---- A real model directory --------------------------------------------------

// The real SmolLM2 tokenizer (imported by scripts/setup into models/default,
// or TESSERA_SMOLLM2_DIR) against the HF tokenizers encodings of the corpus
// recorded by `tools/make_tokenizer_fixtures.py --expected-for DIR
// --expected-out tests/fixtures/tokenizers/smollm2_expected.json`.
TEST(TokenizerModelDirTest, SmolLM2) {
  const char* env = std::getenv("TESSERA_SMOLLM2_DIR");
  const std::string dir = env && *env ? std::string(env) : FixtureDir("../../../models/default");
  ASSERT_TRUE(std::filesystem::exists(dir + "/tokenizer.json"))
      << "no SmolLM2 model at " << dir << ": run scripts/setup or set TESSERA_SMOLLM2_DIR";
  auto tok = LoadOrDie(dir);
  ASSERT_NE(tok, nullptr);
  CheckAgainstExpected(*tok, ReadJson(FixtureDir("smollm2_expected.json")), "smollm2");
}

}  // namespace
}  // namespace tessera
