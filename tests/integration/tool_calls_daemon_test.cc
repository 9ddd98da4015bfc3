// Tool calls end to end (issue 37 section 2) against real daemons
// (coordinator and workers as processes, CURVE on the control plane) serving
// the Qwen2 fixture model with a chat template in Qwen's <tool_call> format:
//  - tool_choice "required" and a named function, greedy and sampled
//    (n = 3, seeded): every call parses, names an allowed function and has
//    arguments valid against its schema (LLGuidance enforces the format);
//  - the round trip: the call, then a tool message with its result, then a
//    final answer; the prompt is the template's rendering of that history;
//  - streamed tool-call deltas join into the whole response's call;
//  - tool_choice auto: text without calls is content, whole and streamed;
//    the legacy functions/function_call answer with message.function_call;
//  - bad input is a 400 naming the field, and the deployment keeps serving;
//  - the official `openai` client does the same (tests/support/
//    openai_tools_check.py), at tp 1 and at tp 2 x pp 2;
//  - a model whose template has no tools refuses them naming tools and the model.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "common/net/http_client.h"
#include "common/tokenizer/chat_template.h"
#include "common/tokenizer/tokenizer.h"
#include "coordinator/api/openai_api.h"
#include "coordinator/api/tool_calls.h"
#include "support/daemons_fixture.h"
#include "support/test_util.h"

namespace tessera {
namespace {

using json = nlohmann::json;

// Qwen2.5's tool format and history handling (tests/fixtures/chat_templates/
// qwen2_5.jinja) with a one-line system text: the original's would not leave
// room in the fixture model's 512 positions.
constexpr const char* kTemplate = R"JINJA({%- if tools %}
    {{- '<|im_start|>system\n<tools>' }}
    {%- for tool in tools %}{{- tool.function | tojson }}{%- endfor %}
    {{- '</tools>\nCall as <tool_call>\n{"name": ..., "arguments": ...}\n</tool_call><|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == "assistant" and message.tool_calls %}
        {{- '<|im_start|>assistant' }}
        {%- if message.content %}{{- '\n' + message.content }}{%- endif %}
        {%- for tool_call in message.tool_calls %}
            {{- '\n<tool_call>\n{"name": "' + tool_call.function.name + '", "arguments": ' }}
            {{- tool_call.function.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {{- '<|im_start|>user\n<tool_response>\n' + message.content + '\n</tool_response><|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %})JINJA";

constexpr const char* kModel = "qwen2_bias_f16";

json Weather() {
  return {{"type", "function"},
          {"function",
           {{"name", "get_weather"},
            {"parameters",
             {{"type", "object"},
              {"properties",
               {{"city", {{"enum", {"Paris", "Oslo", "Lima"}}}},
                {"days", {{"type", "integer"}, {"minimum", 1}, {"maximum", 7}}}}},
              {"required", {"city", "days"}},
              {"additionalProperties", false}}}}}};
}
json Noop() {
  return {
      {"type", "function"},
      {"function",
       {{"name", "noop"},
        {"parameters",
         {{"type", "object"}, {"properties", json::object()}, {"additionalProperties", false}}}}}};
}

json Question() { return {{{"role", "user"}, {"content", "weather in Paris?"}}}; }

json Chat(json extra) {
  json body = {{"model", kModel},
               {"messages", Question()},
               {"tools", {Weather(), Noop()}},
               {"max_tokens", 120},
               {"temperature", 0}};
  for (auto& [k, v] : extra.items()) body[k] = v;
  return body;
}

// A call's arguments, checked against its function's schema.
void ExpectValidCall(const json& call, const std::set<std::string>& allowed) {
  ASSERT_EQ(call["type"], "function") << call;
  EXPECT_EQ(call["id"].get<std::string>().rfind("call_", 0), 0u) << call;
  const std::string name = call["function"]["name"];
  EXPECT_TRUE(allowed.count(name)) << call;
  const json args = json::parse(call["function"]["arguments"].get<std::string>(), nullptr, false);
  ASSERT_TRUE(args.is_object()) << call;
  if (name == "noop") {
    EXPECT_TRUE(args.empty()) << call;
    return;
  }
  EXPECT_EQ(args.size(), 2u) << call;
  ASSERT_TRUE(args.contains("city") && args["city"].is_string()) << call;
  EXPECT_TRUE((std::set<std::string>{"Paris", "Oslo", "Lima"}.count(args["city"]))) << call;
  ASSERT_TRUE(args.contains("days") && args["days"].is_number_integer()) << call;
  EXPECT_GE(args["days"].get<int>(), 1);
  EXPECT_LE(args["days"].get<int>(), 7);
}

json Post(int port, const json& body, int want = 200) {
  const HttpReply r = HttpCall(port, "POST", "/v1/chat/completions", body.dump());
  EXPECT_EQ(r.status, want) << r.body;
  return json::parse(r.body, nullptr, false);
}

class ToolCallDaemons : public Daemons {
 protected:
  testing::DaemonClusterOptions Options() const override {
    auto o = Daemons::Options();
    o.parallel_toml = "tp = 1\npp = 1\n";
    o.workers = 1;
    o.model_toml = "";  // the checkpoint's own template
    o.scheduler_toml = "max_context = 512\nqueue_limit = 40\nmax_sequences = 40\n";
    o.kv_cache_toml = "max_blocks = 512\nblock_size = 4\n";
    return o;
  }
  std::string ModelName() const override { return kModel; }
  std::string ModelPath() const override {
    namespace fs = std::filesystem;
    const fs::path dst = fs::path(dir_) / kModel;
    fs::create_directories(dst);
    for (const auto& e :
         fs::directory_iterator(testing::FixturePath(std::string("models/") + kModel)))
      fs::copy_file(e.path(), dst / e.path().filename(), fs::copy_options::overwrite_existing);
    json cfg = json::parse(testing::ReadFileOrDie((dst / "tokenizer_config.json").string()));
    cfg["chat_template"] = kTemplate;
    std::ofstream(dst / "tokenizer_config.json") << cfg.dump(2);
    return dst.string();
  }
};

// tool_choice required (one call, greedy and three seeded samples) and named.
void CheckEnforcedCalls(int port, json* whole) {
  *whole = Post(port, Chat({{"tool_choice", "required"}, {"parallel_tool_calls", false}}));
  for (const json& extra :
       {json{{"tool_choice", "required"}, {"parallel_tool_calls", false}},
        json{{"tool_choice", "required"},
             {"parallel_tool_calls", false},
             {"temperature", 1.0},
             {"seed", 5},
             {"n", 3}},
        json{{"tool_choice", {{"type", "function"}, {"function", {{"name", "get_weather"}}}}}}}) {
    SCOPED_TRACE(extra.dump());
    const json r = Post(port, Chat(extra));
    ASSERT_EQ(r["choices"].size(), extra.value("n", 1u)) << r;
    for (const json& c : r["choices"]) {
      EXPECT_EQ(c["finish_reason"], "tool_calls") << c;
      EXPECT_TRUE(c["message"]["content"].is_null()) << c;
      ASSERT_EQ(c["message"]["tool_calls"].size(), 1u) << c;
      ExpectValidCall(c["message"]["tool_calls"][0],
                      extra["tool_choice"].is_object()
                          ? std::set<std::string>{"get_weather"}
                          : std::set<std::string>{"get_weather", "noop"});
    }
  }
}

// The call, its result in a tool message, a final answer; the prompt is the
// template's rendering of that history with the tools.
void CheckRoundTrip(int port, const json& first, const std::string& model_dir) {
  const json call = first["choices"][0]["message"]["tool_calls"][0];
  json messages = Question();
  messages.push_back({{"role", "assistant"}, {"content", nullptr}, {"tool_calls", {call}}});
  messages.push_back({{"role", "tool"}, {"tool_call_id", call["id"]}, {"content", "sunny, 21 C"}});
  const json body = Chat({{"messages", messages}, {"tool_choice", "none"}, {"max_tokens", 5}});
  const json r = Post(port, body);
  const json& c = r["choices"][0];
  EXPECT_TRUE(c["message"]["content"].is_string()) << r;
  EXPECT_FALSE(c["message"].contains("tool_calls")) << r;
  EXPECT_NE(c["finish_reason"], "tool_calls") << r;
  auto parsed = ParseChatCompletionRequest(body.dump());
  ASSERT_TRUE(parsed.ok()) << parsed.error().message;
  auto tpl = ChatTemplate::FromJinja(kTemplate, "", "<|im_end|>");
  ASSERT_TRUE(tpl.ok());
  auto text = tpl->Render(parsed->messages, true, &parsed->tools->tools_json);
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  EXPECT_NE(text->find("<tool_response>\nsunny, 21 C\n</tool_response>"), std::string::npos);
  EXPECT_NE(text->find("\"arguments\": " + call["function"]["arguments"].get<std::string>()),
            std::string::npos)
      << *text;
  auto tok = Tokenizer::Load(model_dir);
  ASSERT_TRUE(tok.ok());
  EXPECT_EQ(r["usage"]["prompt_tokens"].get<size_t>(), (*tok)->Encode(*text, false).size());
}

// The streamed deltas of the greedy required call join into `whole`'s call.
void CheckStream(int port, const json& whole) {
  const HttpReply r = HttpCall(
      port, "POST", "/v1/chat/completions",
      Chat({{"tool_choice", "required"}, {"parallel_tool_calls", false}, {"stream", true}}).dump());
  ASSERT_EQ(r.status, 200) << r.body;
  json call;
  std::string finish;
  int firsts = 0;
  for (const std::string& e : r.events) {
    if (e == "[DONE]") break;
    const json chunk = json::parse(e);
    const json& ch = chunk["choices"][0];
    const json& d = ch["delta"];
    EXPECT_FALSE(d.contains("content")) << e;
    if (ch["finish_reason"].is_string()) finish = ch["finish_reason"];
    if (!d.contains("tool_calls")) continue;
    for (const json& t : d["tool_calls"]) {
      EXPECT_EQ(t["index"], 0) << e;
      if (t.contains("id")) {
        ++firsts;
        call = {{"id", t["id"]}, {"type", t["type"]}, {"function", t["function"]}};
      } else {
        EXPECT_FALSE(t["function"].contains("name")) << e;
        call["function"]["arguments"] = call["function"]["arguments"].get<std::string>() +
                                        t["function"]["arguments"].get<std::string>();
      }
    }
  }
  EXPECT_EQ(firsts, 1);
  EXPECT_EQ(finish, "tool_calls");
  const json& want = whole["choices"][0]["message"]["tool_calls"][0];
  EXPECT_EQ(call["function"], want["function"]);
  ExpectValidCall(call, {"get_weather", "noop"});
}

// tool_choice auto with the random fixture model: free text that holds no
// call comes back as content, whole and streamed alike (nothing held back is
// lost); the legacy functions/function_call answer with function_call.
void CheckAutoAndLegacy(int port) {
  const json whole = Post(port, Chat({{"max_tokens", 12}}));
  const json& c = whole["choices"][0];
  ASSERT_TRUE(c["message"]["content"].is_string()) << whole;
  EXPECT_FALSE(c["message"].contains("tool_calls")) << whole;
  EXPECT_EQ(c["finish_reason"], "length") << whole;
  const HttpReply r = HttpCall(port, "POST", "/v1/chat/completions",
                               Chat({{"max_tokens", 12}, {"stream", true}}).dump());
  ASSERT_EQ(r.status, 200) << r.body;
  std::string text, finish;
  for (const std::string& e : r.events) {
    if (e == "[DONE]") break;
    const json chunk = json::parse(e);
    const json& d = chunk["choices"][0]["delta"];
    EXPECT_FALSE(d.contains("tool_calls")) << e;
    if (d.contains("content")) text += d["content"].get<std::string>();
    if (chunk["choices"][0]["finish_reason"].is_string())
      finish = chunk["choices"][0]["finish_reason"];
  }
  EXPECT_EQ(text, c["message"]["content"]);
  EXPECT_EQ(finish, "length");

  const json legacy = Post(port, {{"model", kModel},
                                  {"messages", Question()},
                                  {"functions", {Weather()["function"]}},
                                  {"function_call", {{"name", "get_weather"}}},
                                  {"max_tokens", 120},
                                  {"temperature", 0}});
  const json& m = legacy["choices"][0];
  EXPECT_EQ(m["finish_reason"], "function_call") << legacy;
  EXPECT_FALSE(m["message"].contains("tool_calls")) << legacy;
  ASSERT_TRUE(m["message"].contains("function_call")) << legacy;
  EXPECT_EQ(m["message"]["function_call"]["name"], "get_weather");
  ExpectValidCall(
      {{"type", "function"}, {"id", "call_legacy"}, {"function", m["message"]["function_call"]}},
      {"get_weather"});
}

void ExpectBadField(int port, const json& body, const std::string& param) {
  const json e = Post(port, body, 400);
  EXPECT_EQ(e["error"]["param"], param) << e;
}

void CheckBadInput(int port) {
  json bad = Weather();
  bad["function"]["parameters"]["properties"]["city"] = {{"type", "place"}};
  ExpectBadField(port, Chat({{"tools", {bad}}}), "tools[0].function.parameters");
  bad["function"]["parameters"] = {{"$ref", "#/$defs/nowhere"}};  // LLGuidance refuses it
  ExpectBadField(port, Chat({{"tools", {Noop(), bad}}}), "tools[1].function.parameters");
  // Compiles, but no output can start under it (it only recurses).
  bad["function"]["parameters"] = {{"$ref", "#"}};
  ExpectBadField(port, Chat({{"tools", {Noop(), bad}}, {"tool_choice", "required"}}),
                 "tools[1].function.parameters");
  ExpectBadField(port,
                 Chat({{"tool_choice", {{"type", "function"}, {"function", {{"name", "nope"}}}}}}),
                 "tool_choice.function.name");
  ExpectBadField(port, Chat({{"tool_choice", 7}}), "tool_choice");
  ExpectBadField(port, Chat({{"tools", "get_weather"}}), "tools");
  ExpectBadField(port, Chat({{"parallel_tool_calls", 1}}), "parallel_tool_calls");
  ExpectBadField(port, Chat({{"tool_choice", "required"}, {"ignore_eos", true}}), "ignore_eos");
  const json ok = Post(port, Chat({{"max_tokens", 2}}));
  EXPECT_EQ(ok["object"], "chat.completion") << ok;
}

void RunClientCheck(int port) {
  const char* python = std::getenv("TESSERA_PYTHON");
  ASSERT_NE(python, nullptr) << "TESSERA_PYTHON is not set: run the tests through scripts/test";
  const std::string script = testing::FixturePath("../support/openai_tools_check.py");
  const auto r = testing::RunCommand(std::string(python) + " " + script + " " +
                                     std::to_string(port) + " " + kModel + " 2>&1");
  EXPECT_EQ(r.rc, 0) << r.output;
  EXPECT_NE(r.output.find("tool call checks passed"), std::string::npos) << r.output;
}

TEST_F(ToolCallDaemons, EnforcedCallsParseRoundTripStreamAndBadInputIs400) {
  json whole;
  CheckEnforcedCalls(port_, &whole);
  ASSERT_FALSE(HasFailure());
  CheckRoundTrip(port_, whole, dir_ + "/" + kModel);
  CheckStream(port_, whole);
  CheckAutoAndLegacy(port_);
  CheckBadInput(port_);
  RunClientCheck(port_);
}

class ToolCallDaemonsTp2Pp2 : public ToolCallDaemons {
 protected:
  testing::DaemonClusterOptions Options() const override {
    auto o = ToolCallDaemons::Options();
    o.parallel_toml = "tp = 2\npp = 2\n";
    o.workers = 4;
    return o;
  }
};

// tp 2 x pp 2: the tool-call grammar is applied on the last stage's sampling rank.
TEST_F(ToolCallDaemonsTp2Pp2, TheOpenAIClientsToolCallsWork) { RunClientCheck(port_); }

// The default fixture serves the built-in chatml format, which has no tools.
class NoToolTemplate : public Daemons {
 protected:
  testing::DaemonClusterOptions Options() const override {
    auto o = Daemons::Options();
    o.parallel_toml = "tp = 1\npp = 1\n";
    o.workers = 1;
    return o;
  }
};

TEST_F(NoToolTemplate, ToolsAreRefusedNamingToolsAndTheModel) {
  json body = {{"model", "llama_gqa_f32"},
               {"messages", Question()},
               {"tools", {Weather()}},
               {"max_tokens", 2}};
  const json e = Post(port_, body, 400);
  EXPECT_EQ(e["error"]["param"], "tools") << e;
  EXPECT_EQ(e["error"]["code"], "tools_unsupported") << e;
  EXPECT_NE(e["error"]["message"].get<std::string>().find("llama_gqa_f32"), std::string::npos) << e;
  body.erase("tools");
  EXPECT_EQ(Post(port_, body)["object"], "chat.completion");
}

}  // namespace
}  // namespace tessera
