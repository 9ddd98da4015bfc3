// Structured outputs end to end (issue 37 section 1): response_format
// json_schema and json_object sent to real daemons (coordinator and workers
// as processes, CURVE on the control plane) at tp 1 and at tp 2 x pp 2 on
// CPU, where the grammar mask is applied on the last stage's sampling rank.
//  - Greedy completions equal a reference decoded here: the fixture model's
//    logits (LocalModel) masked by LLGuidance's own matcher (the engine of
//    common/grammar/, over the same tokenizer) and the argmax taken.
//  - Chat json_schema outputs, greedy and sampled (n = 3, seeded), parse with
//    nlohmann/json and validate against the schema (required keys, types,
//    enum and range); json_object outputs parse as objects.
//  - max_tokens cuts a document with finish_reason "length".
//  - Streamed deltas join into the whole response's document.
//  - Properties come in the schema's order as the request wrote it, not
//    sorted by name.
//  - Bad input: each malformed response_format (a missing or invalid
//    json_schema.name too), and a schema LLGuidance cannot compile or cannot
//    start an output under (its reason in the message), is a 400 naming the
//    field; the deployment keeps serving. A coordinator without the library refuses
//    these requests alone, naming it.
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/grammar/grammar_engine.h"
#include "common/grammar/grammar_library_paths.h"
#include "common/net/http_client.h"
#include "support/daemons_fixture.h"
#include "support/model_harness.h"
#include "support/test_util.h"

namespace tessera {
namespace {

using json = nlohmann::json;

const std::vector<int32_t> kPrompt = {5, 17, 42, 7, 5, 17};

// Bounded: every property required, in order, none extra; a finite number of
// tokens closes it.
json Schema() {
  return {{"type", "object"},
          {"properties",
           {{"ok", {{"type", "boolean"}}},
            {"color", {{"enum", {"red", "green", "blue"}}}},
            {"n", {{"type", "integer"}, {"minimum", 0}, {"maximum", 9}}}}},
          {"required", {"ok", "color", "n"}},
          {"additionalProperties", false}};
}

json SchemaFormat() {
  return {{"type", "json_schema"},
          {"json_schema", {{"name", "answer"}, {"schema", Schema()}, {"strict", true}}}};
}

// The schema's checks, written out: an object with exactly its three keys, of
// their types, in range.
void ExpectValid(const std::string& text) {
  const json doc = json::parse(text, nullptr, false);
  ASSERT_FALSE(doc.is_discarded()) << "not JSON: " << text;
  ASSERT_TRUE(doc.is_object()) << text;
  EXPECT_EQ(doc.size(), 3u) << text;
  ASSERT_TRUE(doc.contains("ok") && doc.contains("color") && doc.contains("n")) << text;
  EXPECT_TRUE(doc["ok"].is_boolean()) << text;
  const std::set<std::string> colors = {"red", "green", "blue"};
  ASSERT_TRUE(doc["color"].is_string()) << text;
  EXPECT_TRUE(colors.count(doc["color"].get<std::string>())) << text;
  ASSERT_TRUE(doc["n"].is_number_integer()) << text;
  EXPECT_GE(doc["n"].get<int>(), 0) << text;
  EXPECT_LE(doc["n"].get<int>(), 9) << text;
}

// Greedy decoding of kPrompt under `spec`: at each step the fixture model's
// logits with every token outside LLGuidance's mask removed, then the argmax,
// until EOS (not in the text) or max_tokens.
struct Reference {
  std::string text;
  std::string finish_reason;
};
Reference MaskedGreedy(const GrammarSpec& spec, int max_tokens) {
  Reference r;
  auto model = testing::LocalModel::Load(testing::FixturePath("models/llama_gqa_f32"));
  auto tok = Tokenizer::Load(testing::FixturePath("models/llama_gqa_f32"));
  const GrammarLibraryPaths paths = DefaultGrammarLibraryPaths();
  auto lib = LlguidanceLibrary::Load(paths.llguidance_library, paths.python_library);
  EXPECT_TRUE(model.ok() && tok.ok() && lib.ok()) << lib.status().ToString();
  if (!model.ok() || !tok.ok() || !lib.ok()) return r;
  std::shared_ptr<const Tokenizer> tokenizer(std::move(*tok));
  const int32_t vocab = static_cast<int32_t>((*model)->config().vocab_size);
  auto engine = GrammarEngine::Create(*lib, tokenizer, vocab, *tokenizer->eos_id());
  EXPECT_TRUE(engine.ok()) << engine.status().ToString();
  if (!engine.ok()) return r;
  auto matcher = (*engine)->NewMatcher(spec);
  EXPECT_TRUE(matcher.ok());
  if (!matcher.ok()) return r;
  std::vector<int32_t> seq = kPrompt, out;
  std::vector<uint32_t> mask;
  r.finish_reason = "length";
  for (int step = 0; step < max_tokens; ++step) {
    auto logits = (*model)->LastLogits(seq);
    EXPECT_TRUE(logits.ok());
    EXPECT_TRUE((*matcher)->ComputeMask(mask).ok());
    if (!logits.ok()) return r;
    int32_t best = -1;
    for (int32_t t = 0; t < vocab; ++t)
      if (((mask[t / 32] >> (t % 32)) & 1u) && (best < 0 || (*logits)[t] > (*logits)[best]))
        best = t;
    EXPECT_GE(best, 0);
    if (best == *tokenizer->eos_id()) {
      r.finish_reason = "stop";
      break;
    }
    EXPECT_TRUE((*matcher)->Accept(best).ok());
    seq.push_back(best);
    out.push_back(best);
  }
  r.text = tokenizer->Decode(out, true);
  return r;
}

json Chat(const json& format, json extra = json::object()) {
  json body = {{"model", "llama_gqa_f32"},
               {"messages", {{{"role", "user"}, {"content", "give me an answer"}}}},
               {"max_tokens", 60},
               {"response_format", format}};
  for (auto& [k, v] : extra.items()) body[k] = v;
  return body;
}

void ExpectBadField(int port, const json& body, const std::string& param,
                    const std::string& words = "") {
  const HttpReply r = HttpCall(port, "POST", "/v1/chat/completions", body.dump());
  ASSERT_EQ(r.status, 400) << r.body;
  const json e = json::parse(r.body)["error"];
  EXPECT_EQ(e["param"], param) << r.body;
  if (!words.empty()) {
    EXPECT_NE(e["message"].get<std::string>().find(words), std::string::npos) << r.body;
  }
}

void CheckStructuredOutputs(int port) {
  // Completions: greedy output equals the masked reference, token for token.
  const Reference ref = MaskedGreedy({GrammarKind::kJsonSchema, Schema().dump()}, 60);
  ASSERT_EQ(ref.finish_reason, "stop") << ref.text;
  ExpectValid(ref.text);
  {
    const json body = {{"model", "llama_gqa_f32"},
                       {"prompt", kPrompt},
                       {"max_tokens", 60},
                       {"temperature", 0},
                       {"response_format", SchemaFormat()}};
    const HttpReply r = HttpCall(port, "POST", "/v1/completions", body.dump());
    ASSERT_EQ(r.status, 200) << r.body;
    const json c = json::parse(r.body)["choices"][0];
    EXPECT_EQ(c["text"], ref.text);
    EXPECT_EQ(c["finish_reason"], "stop");
    ExpectValid(c["text"].get<std::string>());
  }
  // Chat json_schema, greedy and sampled (three seeded choices at temperature 1.2).
  for (const json& extra :
       {json{{"temperature", 0}}, json{{"temperature", 1.2}, {"seed", 11}, {"n", 3}}}) {
    SCOPED_TRACE(extra.dump());
    const HttpReply r =
        HttpCall(port, "POST", "/v1/chat/completions", Chat(SchemaFormat(), extra).dump());
    ASSERT_EQ(r.status, 200) << r.body;
    const json choices = json::parse(r.body)["choices"];
    ASSERT_EQ(choices.size(), extra.value("n", 1));
    for (const json& c : choices) {
      EXPECT_EQ(c["finish_reason"], "stop") << c.dump();
      ExpectValid(c["message"]["content"].get<std::string>());
    }
  }
  // Streamed: the deltas join into the same greedy document.
  {
    const HttpReply whole = HttpCall(port, "POST", "/v1/chat/completions",
                                     Chat(SchemaFormat(), {{"temperature", 0}}).dump());
    ASSERT_EQ(whole.status, 200) << whole.body;
    const HttpReply r =
        HttpCall(port, "POST", "/v1/chat/completions",
                 Chat(SchemaFormat(), {{"temperature", 0}, {"stream", true}}).dump());
    ASSERT_EQ(r.status, 200) << r.body;
    std::string text;
    for (const std::string& e : r.events) {
      if (e == "[DONE]") break;
      const json c = json::parse(e);
      if (c["choices"].empty()) continue;
      const json& d = c["choices"][0]["delta"];
      if (d.contains("content") && d["content"].is_string())
        text += d["content"].get<std::string>();
    }
    EXPECT_EQ(text, json::parse(whole.body)["choices"][0]["message"]["content"]);
    ExpectValid(text);
  }
  // json_object on chat: greedy and sampled, each answer a JSON object. A bias
  // toward "}" lets the random fixture model close its object within max_tokens.
  const std::string close = std::to_string(
      Tokenizer::Load(testing::FixturePath("models/llama_gqa_f32")).value()->Encode("}", false)[0]);
  for (const json& extra : {json{{"temperature", 0}}, json{{"temperature", 1.0}, {"seed", 5}}}) {
    json x = extra;
    x["logit_bias"] = {{close, 30}};
    const HttpReply r =
        HttpCall(port, "POST", "/v1/chat/completions", Chat({{"type", "json_object"}}, x).dump());
    ASSERT_EQ(r.status, 200) << r.body;
    const json c = json::parse(r.body)["choices"][0];
    EXPECT_EQ(c["finish_reason"], "stop") << c.dump();
    const json doc = json::parse(c["message"]["content"].get<std::string>(), nullptr, false);
    EXPECT_TRUE(doc.is_object()) << c.dump();
  }
  // Cut by max_tokens: finish_reason length.
  {
    const HttpReply r =
        HttpCall(port, "POST", "/v1/chat/completions",
                 Chat(SchemaFormat(), {{"max_tokens", 3}, {"temperature", 0}}).dump());
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(json::parse(r.body)["choices"][0]["finish_reason"], "length") << r.body;
  }
}

// A schema whose properties are not in alphabetical order ("zeta", "alpha",
// "mid", all required), sent as text in that order: the greedy document lists
// its keys in that order, on both endpoints, and equals the masked reference
// over the same schema text.
void CheckPropertyOrder(int port) {
  const std::string schema =
      R"({"type":"object","properties":{"zeta":{"type":"boolean"},"alpha":{"enum":["x","y"]},)"
      R"("mid":{"type":"integer","minimum":0,"maximum":9}},"required":["zeta","alpha","mid"],)"
      R"("additionalProperties":false})";
  const Reference ref = MaskedGreedy({GrammarKind::kJsonSchema, schema}, 60);
  ASSERT_EQ(ref.finish_reason, "stop") << ref.text;
  const std::string format =
      R"({"type":"json_schema","json_schema":{"name":"ordered","schema":)" + schema + "}}";
  const std::string prompt = json(kPrompt).dump();
  const std::vector<std::pair<std::string, std::string>> requests = {
      {"/v1/completions", R"({"model":"llama_gqa_f32","prompt":)" + prompt +
                              R"(,"max_tokens":60,"temperature":0,"response_format":)" + format +
                              "}"},
      {"/v1/chat/completions",
       R"({"model":"llama_gqa_f32","messages":[{"role":"user","content":"give me an answer"}],)"
       R"("max_tokens":60,"temperature":0,"response_format":)" +
           format + "}"}};
  for (const auto& [path, body] : requests) {
    SCOPED_TRACE(path);
    const HttpReply r = HttpCall(port, "POST", path, body);
    ASSERT_EQ(r.status, 200) << r.body;
    const json c = json::parse(r.body)["choices"][0];
    EXPECT_EQ(c["finish_reason"], "stop") << c.dump();
    const std::string text = c.contains("text") ? c["text"].get<std::string>()
                                                : c["message"]["content"].get<std::string>();
    if (path == "/v1/completions") {
      EXPECT_EQ(text, ref.text);
    }
    const nlohmann::ordered_json doc = nlohmann::ordered_json::parse(text, nullptr, false);
    ASSERT_TRUE(doc.is_object()) << text;
    std::vector<std::string> keys;
    for (const auto& [key, value] : doc.items()) keys.push_back(key);
    EXPECT_EQ(keys, (std::vector<std::string>{"zeta", "alpha", "mid"})) << text;
  }
}

void CheckBadInput(int port) {
  ExpectBadField(port, Chat("json"), "response_format");
  ExpectBadField(port, Chat({{"type", "xml"}}), "response_format.type", "xml");
  ExpectBadField(port, Chat({{"type", "json_schema"}}), "response_format.json_schema");
  ExpectBadField(port, Chat({{"type", "json_schema"}, {"json_schema", {{"name", "x"}}}}),
                 "response_format.json_schema.schema");
  ExpectBadField(port,
                 Chat({{"type", "json_schema"},
                       {"json_schema", {{"name", 3}, {"schema", {{"type", "object"}}}}}}),
                 "response_format.json_schema.name");
  ExpectBadField(
      port,
      Chat({{"type", "json_schema"},
            {"json_schema", {{"name", "x"}, {"schema", {{"type", "object"}}}, {"strict", "yes"}}}}),
      "response_format.json_schema.strict");
  // The name is required and follows OpenAI's rule.
  ExpectBadField(
      port, Chat({{"type", "json_schema"}, {"json_schema", {{"schema", {{"type", "object"}}}}}}),
      "response_format.json_schema.name", "is required");
  ExpectBadField(port,
                 Chat({{"type", "json_schema"},
                       {"json_schema", {{"name", "my answer"}, {"schema", {{"type", "object"}}}}}}),
                 "response_format.json_schema.name", "letters, digits, _ or -");
  // Schemas LLGuidance cannot use: its reason is in the message. One it does
  // not compile (a bad type, a $ref to nothing), and ones it compiles but
  // cannot start an output under (they only recurse), which the worker's
  // first mask would fail on.
  const auto schema_format = [](const json& schema) {
    return json{{"type", "json_schema"}, {"json_schema", {{"name", "x"}, {"schema", schema}}}};
  };
  ExpectBadField(port, Chat(schema_format({{"type", "bogus"}})),
                 "response_format.json_schema.schema", "bogus");
  ExpectBadField(
      port,
      Chat(schema_format({{"type", "object"}, {"properties", {{"a", {{"$ref", "#/nope"}}}}}})),
      "response_format.json_schema.schema", "/nope");
  ExpectBadField(port, Chat(schema_format({{"$ref", "#"}})), "response_format.json_schema.schema",
                 "cannot start an output");
  ExpectBadField(port,
                 Chat(schema_format(
                     {{"$defs", {{"a", {{"$ref", "#/$defs/b"}}}, {"b", {{"$ref", "#/$defs/a"}}}}},
                      {"$ref", "#/$defs/a"}})),
                 "response_format.json_schema.schema", "cannot start an output");
  // Requires itself: LLGuidance fails it once the object opens (it was a
  // 503 worker_failed from the sampling worker before the check followed
  // the grammar past its first mask).
  ExpectBadField(
      port,
      Chat(schema_format(
               {{"type", "object"}, {"properties", {{"a", {{"$ref", "#"}}}}}, {"required", {"a"}}}),
           {{"stream", true}}),
      "response_format.json_schema.schema", "fails at token");
  {
    const json body = {{"model", "llama_gqa_f32"},
                       {"prompt", kPrompt},
                       {"response_format", schema_format({{"$ref", "#"}})}};
    const HttpReply r = HttpCall(port, "POST", "/v1/completions", body.dump());
    ASSERT_EQ(r.status, 400) << r.body;
    const json e = json::parse(r.body)["error"];
    EXPECT_EQ(e["param"], "response_format.json_schema.schema") << r.body;
    EXPECT_EQ(e["code"], "invalid_json_schema") << r.body;
  }
  ExpectBadField(port, Chat({{"type", "json_object"}}, {{"ignore_eos", true}}), "ignore_eos");
  ExpectBadField(port, Chat({{"type", "json_object"}}, {{"min_tokens", 2}}), "min_tokens");
  // The same field on completions.
  const json cmp = {
      {"model", "llama_gqa_f32"}, {"prompt", kPrompt}, {"response_format", {{"type", "yaml"}}}};
  const HttpReply r = HttpCall(port, "POST", "/v1/completions", cmp.dump());
  ASSERT_EQ(r.status, 400) << r.body;
  EXPECT_EQ(json::parse(r.body)["error"]["param"], "response_format.type");
  // Still serving.
  const HttpReply ok = HttpCall(port, "POST", "/v1/chat/completions",
                                Chat({{"type", "json_object"}}, {{"max_tokens", 2}}).dump());
  EXPECT_EQ(ok.status, 200) << ok.body;
}

// A coordinator whose grammar library is missing refuses response_format
// requests alone, naming the file and the key, and keeps serving the rest.
class StructuredMissingLibrary : public Daemons {
 protected:
  testing::DaemonClusterOptions Options() const override {
    auto o = Daemons::Options();
    o.parallel_toml = "tp = 1\npp = 1\n";
    o.workers = 1;
    o.extra_toml = "[structured_output]\nllguidance_library = \"/nonexistent/llguidance.so\"\n";
    return o;
  }
};

TEST_F(StructuredMissingLibrary, ResponseFormatIsRefusedNamingTheLibrary) {
  for (int i = 0; i < 2; ++i) {  // the failed load is remembered, not retried into a crash
    const HttpReply r =
        HttpCall(port_, "POST", "/v1/chat/completions", Chat({{"type", "json_object"}}).dump());
    ASSERT_EQ(r.status, 400) << r.body;
    const json e = json::parse(r.body)["error"];
    EXPECT_EQ(e["param"], "response_format") << r.body;
    EXPECT_EQ(e["code"], "structured_output_unavailable") << r.body;
    const std::string message = e["message"];
    EXPECT_NE(message.find("/nonexistent/llguidance.so"), std::string::npos) << message;
    EXPECT_NE(message.find("structured_output.llguidance_library"), std::string::npos) << message;
  }
  json plain = Chat({{"type", "text"}}, {{"max_tokens", 4}});
  const HttpReply ok = HttpCall(port_, "POST", "/v1/chat/completions", plain.dump());
  EXPECT_EQ(ok.status, 200) << ok.body;
}

class StructuredTp1 : public Daemons {
 protected:
  testing::DaemonClusterOptions Options() const override {
    auto o = Daemons::Options();
    o.parallel_toml = "tp = 1\npp = 1\n";
    o.workers = 1;
    return o;
  }
};

TEST_F(StructuredTp1, OutputsFollowTheSchemaAndBadFormatsAre400) {
  CheckStructuredOutputs(port_);
  CheckPropertyOrder(port_);
  CheckBadInput(port_);
}

// tp 2 x pp 2: the mask is applied on the last stage's tp rank 0.
TEST_F(Daemons, StructuredOutputsFollowTheSchemaAtTp2Pp2) { CheckStructuredOutputs(port_); }

}  // namespace
}  // namespace tessera
