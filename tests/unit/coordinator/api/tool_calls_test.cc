// Tool-calling requests (coordinator/api/tool_calls.h, tool_call_grammar.h):
// the fields parsed and each malformed one a 400 naming it; the history's
// tool messages rendered by the fixture templates of Qwen2.5, Qwen3, Llama
// 3.1, Llama 3.2 and Mistral v0.3; a template without tools
// refused naming tools and the model; and each family's enforced grammar,
// compiled by the real LLGuidance, accepting a call of the named function
// with valid arguments and refusing anything else.
#include "coordinator/api/tool_calls.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "common/grammar/grammar_engine.h"
#include "common/grammar/grammar_library_paths.h"
#include "coordinator/api/openai_api.h"
#include "coordinator/api/tool_call_grammar.h"
#include "coordinator/api/tool_call_stream.h"
#include "support/test_util.h"

namespace tessera {
namespace {

using json = nlohmann::json;

json Weather() {
  return {{"type", "function"},
          {"function",
           {{"name", "get_weather"},
            {"description", "Weather of a city"},
            {"parameters",
             {{"type", "object"},
              {"properties",
               {{"city", {{"enum", {"Paris", "Oslo"}}}}, {"days", {{"type", "integer"}}}}},
              {"required", {"city", "days"}},
              {"additionalProperties", false}}}}}};
}

json Body(json extra = json::object()) {
  json body = {{"model", "m"},
               {"messages", {{{"role", "user"}, {"content", "weather?"}}}},
               {"tools", {Weather(), {{"type", "function"}, {"function", {{"name", "noop"}}}}}}};
  for (auto& [k, v] : extra.items()) body[k] = v;
  return body;
}

ChatCompletionRequest Parse(const json& body) {
  auto r = ParseChatCompletionRequest(body.dump());
  EXPECT_TRUE(r.ok()) << r.error().message;
  return r.ok() ? std::move(r).value() : ChatCompletionRequest{};
}

void ExpectBad(const json& body, const std::string& param, const std::string& words) {
  SCOPED_TRACE(body.dump());
  auto r = ParseChatCompletionRequest(body.dump());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().http_status, 400);
  EXPECT_EQ(r.error().param, param) << r.error().message;
  EXPECT_NE(r.error().message.find(words), std::string::npos) << r.error().message;
}

TEST(ToolCallRequests, FieldsAreParsed) {
  ChatCompletionRequest r = Parse(Body());
  ASSERT_EQ(r.tools->functions.size(), 2u);
  EXPECT_EQ(r.tools->functions[0].name, "get_weather");
  EXPECT_EQ(r.tools->functions[1].parameters,
            (json{{"type", "object"}, {"properties", json::object()}}));
  EXPECT_EQ(r.tools->choice, ToolChoice::kAuto);
  EXPECT_TRUE(r.tools->parallel);
  // The template gets the tools in the request's key order.
  auto ordered = ParseChatCompletionRequest(
      R"({"model":"m","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function",)"
      R"("function":{"name":"f","parameters":{"type":"object","properties":{"z":{},"a":{}}}}}]})");
  ASSERT_TRUE(ordered.ok()) << ordered.error().message;
  const nlohmann::ordered_json& t = ordered->tools->tools_json[0];
  EXPECT_EQ(t.begin().key(), "type");
  EXPECT_EQ(t["function"]["parameters"]["properties"].begin().key(), "z");
  r = Parse(Body({{"tool_choice", "required"}, {"parallel_tool_calls", false}}));
  EXPECT_EQ(r.tools->choice, ToolChoice::kRequired);
  EXPECT_FALSE(r.tools->parallel);
  r = Parse(Body({{"tool_choice", {{"type", "function"}, {"function", {{"name", "noop"}}}}}}));
  EXPECT_EQ(r.tools->choice, ToolChoice::kNamed);
  EXPECT_EQ(r.tools->named, "noop");
  EXPECT_FALSE(Parse(Body({{"tool_choice", "none"}})).tools->parse());
  EXPECT_EQ(Parse(json{{"model", "m"}, {"messages", {{{"role", "user"}, {"content", "x"}}}}})
                .tools->choice,
            ToolChoice::kNone);
  // Legacy functions and function_call.
  r = Parse({{"model", "m"},
             {"messages", {{{"role", "user"}, {"content", "x"}}}},
             {"functions", {Weather()["function"]}},
             {"function_call", {{"name", "get_weather"}}}});
  EXPECT_TRUE(r.tools->legacy);
  EXPECT_EQ(r.tools->choice, ToolChoice::kNamed);
  EXPECT_EQ(r.tools->tools_json[0]["type"], "function");
}

TEST(ToolCallRequests, BadFieldsAre400sNamingThem) {
  ExpectBad(Body({{"tools", "x"}}), "tools", "must be an array");
  ExpectBad(Body({{"tools", {{{"type", "retrieval"}}}}}), "tools[0].type", "\"function\"");
  ExpectBad(Body({{"tools", {{{"type", "function"}, {"function", {{"name", "a b"}}}}}}}),
            "tools[0].function.name", "letters, digits");
  ExpectBad(Body({{"tools", {Weather(), Weather()}}}), "tools[1].function.name", "given twice");
  json bad = Weather();
  bad["function"]["parameters"] = {{"type", "bogus"}};
  ExpectBad(Body({{"tools", {bad}}}), "tools[0].function.parameters", "bogus");
  bad["function"]["parameters"] = "object";
  ExpectBad(Body({{"tools", {bad}}}), "tools[0].function.parameters", "JSON Schema object");
  bad["function"]["parameters"] = {{"type", "object"}, {"properties", {{"a", 3}}}};
  ExpectBad(Body({{"tools", {bad}}}), "tools[0].function.parameters", "properties.a");
  bad["function"]["parameters"] = {{"type", "object"}, {"required", "a"}};
  ExpectBad(Body({{"tools", {bad}}}), "tools[0].function.parameters", "required");
  ExpectBad(Body({{"tool_choice", "always"}}), "tool_choice", "'always' is not one of");
  ExpectBad(Body({{"tool_choice", 3}}), "tool_choice", "a string or an object");
  ExpectBad(Body({{"tool_choice", {{"type", "function"}, {"function", {{"name", "nope"}}}}}}),
            "tool_choice.function.name", "'nope' is not a function in tools");
  ExpectBad(Body({{"tool_choice", {{"type", "function"}}}}), "tool_choice.function.name",
            "must be a string");
  ExpectBad(Body({{"parallel_tool_calls", "yes"}}), "parallel_tool_calls", "a boolean");
  ExpectBad({{"model", "m"},
             {"messages", {{{"role", "user"}, {"content", "x"}}}},
             {"tool_choice", "required"}},
            "tool_choice", "requires tools");
  ExpectBad(Body({{"functions", {Weather()["function"]}}}), "functions", "not both");
  ExpectBad(Body({{"tool_choice", "required"}, {"response_format", {{"type", "json_object"}}}}),
            "tool_choice", "response_format");
}

json History() {
  return {{{"role", "user"}, {"content", "weather in Paris?"}},
          {{"role", "assistant"},
           {"content", nullptr},
           {"tool_calls",
            {{{"id", "abcDEF123"},
              {"type", "function"},
              {"function",
               {{"name", "get_weather"}, {"arguments", "{\"city\": \"Paris\", \"days\": 1}"}}}}}}},
          {{"role", "tool"}, {"tool_call_id", "abcDEF123"}, {"content", "sunny"}}};
}

TEST(ToolCallRequests, HistoryMessagesAreChecked) {
  ChatCompletionRequest r = Parse(Body({{"messages", History()}}));
  ASSERT_EQ(r.messages.size(), 3u);
  EXPECT_TRUE(r.messages[1].content_null);
  EXPECT_EQ(r.messages[1].extra["tool_calls"][0]["function"]["arguments"]["days"], 1);
  EXPECT_EQ(r.messages[2].extra["tool_call_id"], "abcDEF123");
  json h = History();
  h[1]["tool_calls"][0]["function"]["arguments"] = "{oops";
  ExpectBad(Body({{"messages", h}}), "messages[1].tool_calls[0].function.arguments",
            "not valid JSON");
  h = History();
  h[2].erase("tool_call_id");
  ExpectBad(Body({{"messages", h}}), "messages[2].tool_call_id", "is required");
  h = History();
  h[0]["tool_calls"] = json::array();
  ExpectBad(Body({{"messages", h}}), "messages[0].tool_calls", "only allowed in assistant");
}

ChatTemplate Template(const std::string& name, const std::string& bos, const std::string& eos) {
  auto t = ChatTemplate::FromJinja(
      testing::ReadFileOrDie(testing::FixturePath("chat_templates/" + name + ".jinja")), bos, eos);
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return *t;
}

void ExpectRenders(const ChatTemplate& t, const std::vector<std::string>& parts) {
  ChatCompletionRequest r = Parse(Body({{"messages", History()}}));
  auto text = t.Render(r.messages, true, &r.tools->tools_json);
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  for (const std::string& p : parts)
    EXPECT_NE(text->find(p), std::string::npos) << "missing: " << p << "\nin:\n" << *text;
}

TEST(ToolCallRequests, TemplatesRenderToolsAndTheHistory) {
  const ChatTemplate qwen = Template("qwen2_5", "", "<|im_end|>");
  EXPECT_TRUE(qwen.references_tools());
  ExpectRenders(qwen, {"<tools>\n{\"function\": {\"description\": \"Weather of a city\", \"name\": "
                       "\"get_weather\"",
                       "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
                       "\"Paris\", \"days\": 1}}\n</tool_call>",
                       "<tool_response>\nsunny\n</tool_response>"});
  ExpectRenders(Template("llama3_1", "<|begin_of_text|>", "<|eot_id|>"),
                {"\"name\": \"get_weather\"",
                 "{\"name\": \"get_weather\", \"parameters\": "
                 "{\"city\": \"Paris\", \"days\": 1}}",
                 "<|start_header_id|>ipython<|end_header_id|>\n\n\"sunny\""});
  ExpectRenders(Template("qwen3", "", "<|im_end|>"),
                {"<tools>\n{\"function\": {\"description\": \"Weather of a city\"",
                 "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
                 "\"Paris\", \"days\": 1}}\n</tool_call>",
                 "<tool_response>\nsunny\n</tool_response>"});
  ExpectRenders(
      Template("llama3_2", "<|begin_of_text|>", "<|eot_id|>"),
      {"Environment: ipython", "<|start_header_id|>ipython<|end_header_id|>\n\n\"sunny\""});
  ExpectRenders(Template("mistral_v0_3", "<s>", "</s>"),
                {"[AVAILABLE_TOOLS]", "[TOOL_CALLS] [{\"name\": \"get_weather\"",
                 "\"id\": \"abcDEF123\"", "[TOOL_RESULTS] {\"content\": sunny"});
  EXPECT_FALSE(Template("smollm2", "", "<|im_end|>").references_tools());
}

class ToolCallGrammarTest : public ::testing::Test {
 protected:
  void SetUp() override { Load(testing::FixturePath("models/qwen2_bias_f16")); }

  void Load(const std::string& dir) {
    auto tok = Tokenizer::Load(dir);
    ASSERT_TRUE(tok.ok()) << tok.status().ToString();
    tokenizer_ = std::shared_ptr<const Tokenizer>(std::move(*tok));
    const GrammarLibraryPaths paths = DefaultGrammarLibraryPaths();
    auto lib = LlguidanceLibrary::Load(paths.llguidance_library, paths.python_library);
    ASSERT_TRUE(lib.ok()) << lib.status().ToString() << " (scripts/setup fetches it)";
    auto engine =
        GrammarEngine::Create(*lib, tokenizer_, tokenizer_->vocab_size(), *tokenizer_->eos_id());
    ASSERT_TRUE(engine.ok()) << engine.status().ToString();
    engine_ = *engine;
  }

  // Whether the grammar accepts `text` as a whole output (each token, then EOS).
  bool Accepts(const GrammarSpec& spec, const std::string& text) {
    auto m = engine_->NewMatcher(spec);
    EXPECT_TRUE(m.ok()) << m.status().ToString();
    if (!m.ok()) return false;
    std::vector<uint32_t> mask;
    for (int32_t t : tokenizer_->Encode(text, false)) {
      EXPECT_TRUE((*m)->ComputeMask(mask).ok());
      if (!((mask[t / 32] >> (t % 32)) & 1u)) return false;
      if (!(*m)->Accept(t).ok()) return false;
    }
    EXPECT_TRUE((*m)->ComputeMask(mask).ok());
    const int32_t eos = engine_->eos_id();
    return (mask[eos / 32] >> (eos % 32)) & 1u;
  }

  std::shared_ptr<const Tokenizer> tokenizer_;
  std::shared_ptr<const GrammarEngine> engine_;
};

TEST_F(ToolCallGrammarTest, EachFamilysGrammarAcceptsOnlyCallsOfTheAllowedFunctions) {
  ToolsRequest named =
      *Parse(Body({{"tool_choice", {{"type", "function"}, {"function", {{"name", "get_weather"}}}}},
                   {"parallel_tool_calls", false}}))
           .tools;
  ToolsRequest required = *Parse(Body({{"tool_choice", "required"}})).tools;
  const std::string call = R"({"name":"get_weather","arguments":{"city":"Oslo","days":3}})";
  const std::string noop = R"({"name":"noop","arguments":{}})";
  GrammarSpec g = ToolCallGrammar(ToolCallFormat::kHermes, named, *tokenizer_);
  EXPECT_EQ(g.kind, GrammarKind::kLark);
  EXPECT_TRUE(Accepts(g, "<tool_call>\n" + call + "\n</tool_call>"));
  EXPECT_FALSE(Accepts(g, "<tool_call>\n" + noop + "\n</tool_call>"));  // not the named one
  EXPECT_FALSE(Accepts(g,
                       "<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{\"city\":"
                       "\"Rome\",\"days\":3}}\n</tool_call>"));  // not in the enum
  EXPECT_FALSE(Accepts(g, "<tool_call>\n" + call + "\n</tool_call>\n<tool_call>\n" + call +
                              "\n</tool_call>"));  // parallel_tool_calls false
  EXPECT_FALSE(Accepts(g, "Sure!"));
  // A named function is called once, parallel_tool_calls or not.
  named.parallel = true;
  g = ToolCallGrammar(ToolCallFormat::kHermes, named, *tokenizer_);
  EXPECT_TRUE(Accepts(g, "<tool_call>\n" + call + "\n</tool_call>"));
  EXPECT_FALSE(Accepts(
      g, "<tool_call>\n" + call + "\n</tool_call>\n<tool_call>\n" + call + "\n</tool_call>"));
  g = ToolCallGrammar(ToolCallFormat::kHermes, required, *tokenizer_);
  EXPECT_TRUE(Accepts(
      g, "<tool_call>\n" + call + "\n</tool_call>\n<tool_call>\n" + noop + "\n</tool_call>"));
  g = ToolCallGrammar(ToolCallFormat::kLlama3Json, required, *tokenizer_);
  EXPECT_TRUE(Accepts(g, R"({"name":"get_weather","parameters":{"city":"Paris","days":1}})"));
  EXPECT_FALSE(Accepts(g, call));  // Llama's key is "parameters"
  g = ToolCallGrammar(ToolCallFormat::kMistral, required, *tokenizer_);
  EXPECT_TRUE(Accepts(g, "[TOOL_CALLS] [" + call + ", " + noop + "]"));
  EXPECT_FALSE(Accepts(g, "[TOOL_CALLS] []"));
}

// Mistral's [TOOL_CALLS] is a special token on real checkpoints: the grammar
// forces that token (by id), and the parser reads the decoded text, which
// drops it.
TEST_F(ToolCallGrammarTest, MistralsSpecialMarkerIsForcedAsItsToken) {
  const std::string dir = testing::MakeTempDir("tessera-tool-marker");
  const std::string src = testing::FixturePath("models/mistral_sliding_window");
  json tj = json::parse(testing::ReadFileOrDie(src + "/tokenizer.json"));
  const int32_t marker = static_cast<int32_t>(tj["model"]["vocab"].size());
  tj["added_tokens"].push_back({{"id", marker},
                                {"content", "[TOOL_CALLS]"},
                                {"single_word", false},
                                {"lstrip", false},
                                {"rstrip", false},
                                {"normalized", false},
                                {"special", true}});
  std::ofstream(dir + "/tokenizer.json") << tj.dump();
  std::ofstream(dir + "/tokenizer_config.json")
      << testing::ReadFileOrDie(src + "/tokenizer_config.json");
  Load(dir);
  ASSERT_TRUE(tokenizer_->IsSpecial(marker));
  const ToolsRequest required = *Parse(Body({{"tool_choice", "required"}})).tools;
  const GrammarSpec g = ToolCallGrammar(ToolCallFormat::kMistral, required, *tokenizer_);
  EXPECT_NE(g.schema.find("<[" + std::to_string(marker) + "]>"), std::string::npos) << g.schema;
  const std::string output = "[TOOL_CALLS] [{\"name\":\"noop\",\"arguments\":{}}]";
  const std::vector<int32_t> ids = tokenizer_->Encode(output, false);
  ASSERT_EQ(ids[0], marker);
  EXPECT_TRUE(Accepts(g, output));
  EXPECT_FALSE(Accepts(g, "[TOOL_CALL] [{\"name\":\"noop\",\"arguments\":{}}]"));
  // The text the API sees drops the special token; the call still parses.
  const ToolCallOutput parsed =
      ParseToolCallOutput(ToolCallFormat::kMistral, tokenizer_->Decode(ids, true));
  ASSERT_EQ(parsed.calls.size(), 1u);
  EXPECT_EQ(parsed.calls[0].name, "noop");
  EXPECT_EQ(parsed.calls[0].arguments, "{}");
}

TEST_F(ToolCallGrammarTest, PlanRefusesTemplatesWithoutToolsAndSchemasTheEngineCannotCompile) {
  GrammarCheck check(DefaultGrammarLibraryPaths(), tokenizer_.get());
  ToolCallPlan plan;
  ToolsRequest tools = *Parse(Body({{"tool_choice", "required"}})).tools;
  auto e = PlanToolCalls(tools, Template("smollm2", "", "<|im_end|>"), *tokenizer_, check,
                         "tiny-model", &plan);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->param, "tools");
  EXPECT_NE(e->message.find("tiny-model"), std::string::npos) << e->message;
  const ChatTemplate qwen = Template("qwen2_5", "", "<|im_end|>");
  ASSERT_FALSE(PlanToolCalls(tools, qwen, *tokenizer_, check, "m", &plan).has_value());
  EXPECT_EQ(plan.format, ToolCallFormat::kHermes);
  EXPECT_EQ(plan.grammar.kind, GrammarKind::kLark);
  // auto: parsed, not enforced.
  ASSERT_FALSE(
      PlanToolCalls(*Parse(Body()).tools, qwen, *tokenizer_, check, "m", &plan).has_value());
  EXPECT_EQ(plan.format, ToolCallFormat::kHermes);
  EXPECT_FALSE(plan.grammar.active());
  // A schema that passes the shape checks but LLGuidance refuses.
  json bad = Weather();
  bad["function"]["name"] = "broken";
  bad["function"]["parameters"] = {{"$ref", "#/$defs/missing"}};
  tools = *Parse(Body({{"tools", {Weather(), bad}}})).tools;
  e = PlanToolCalls(tools, qwen, *tokenizer_, check, "m", &plan);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->param, "tools[1].function.parameters") << e->message;
  EXPECT_NE(e->message.find("missing"), std::string::npos) << e->message;  // LLGuidance's reason
  // One that compiles but under which no output can start (it only recurses).
  bad["function"]["parameters"] = {{"$ref", "#"}};
  tools = *Parse(Body({{"tools", {Weather(), bad}}})).tools;
  e = PlanToolCalls(tools, qwen, *tokenizer_, check, "m", &plan);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->param, "tools[1].function.parameters") << e->message;
  EXPECT_EQ(e->code, "invalid_json_schema") << e->message;
  EXPECT_NE(e->message.find("cannot start an output"), std::string::npos) << e->message;
}

// The enforced grammar holds each function's parameters in the request's
// key order, the order LLGuidance generates the arguments in.
TEST_F(ToolCallGrammarTest, TheGrammarKeepsTheParametersKeyOrder) {
  const std::string body =
      R"({"model":"m","messages":[{"role":"user","content":"x"}],"tool_choice":"required",)"
      R"("tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object",)"
      R"("properties":{"zeta":{"type":"integer"},"alpha":{"type":"boolean"}},)"
      R"("required":["zeta","alpha"]}}}]})";
  auto r = ParseChatCompletionRequest(body);
  ASSERT_TRUE(r.ok()) << r.error().message;
  const GrammarSpec g = ToolCallGrammar(ToolCallFormat::kHermes, *r->tools, *tokenizer_);
  EXPECT_NE(g.schema.find(R"("properties":{"zeta":{"type":"integer"},"alpha":{"type":"boolean"}})"),
            std::string::npos)
      << g.schema;
}

}  // namespace
}  // namespace tessera
