// OpenAI request parsing/validation (every field, every error names its
// param) and the JSON shapes of every response builder.
#include "coordinator/api/openai_api.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

namespace tessera {
namespace {

using json = nlohmann::json;

// A completion body: {"model":"m","prompt":"hi", <extra>}.
std::string Completion(const std::string& extra) {
  return R"({"model":"m","prompt":"hi")" + (extra.empty() ? "" : "," + extra) + "}";
}
std::string Chat(const std::string& extra) {
  return R"({"model":"m","messages":[{"role":"user","content":"hi"}])" +
         (extra.empty() ? "" : "," + extra) + "}";
}

// Expects a 400 whose param and message are as given (message: a substring).
void ExpectError(const ApiError& e, const std::optional<std::string>& param,
                 const std::string& message_part, int status = 400) {
  EXPECT_EQ(e.http_status, status);
  EXPECT_EQ(e.type, "invalid_request_error");
  EXPECT_EQ(e.param, param) << e.message;
  EXPECT_NE(e.message.find(message_part), std::string::npos)
      << "message: " << e.message << "\nwanted: " << message_part;
  // The JSON body has OpenAI's shape.
  json j = json::parse(e.ToJson());
  EXPECT_EQ(j["error"]["message"], e.message);
  EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  if (param) {
    EXPECT_EQ(j["error"]["param"], *param);
  } else {
    EXPECT_TRUE(j["error"]["param"].is_null());
  }
  EXPECT_TRUE(j["error"].contains("code"));
}

void ExpectCompletionError(const std::string& body, const std::optional<std::string>& param,
                           const std::string& message_part) {
  auto r = ParseCompletionRequest(body);
  ASSERT_FALSE(r.ok()) << "accepted: " << body;
  ExpectError(r.error(), param, message_part);
}

void ExpectChatError(const std::string& body, const std::optional<std::string>& param,
                     const std::string& message_part) {
  auto r = ParseChatCompletionRequest(body);
  ASSERT_FALSE(r.ok()) << "accepted: " << body;
  ExpectError(r.error(), param, message_part);
}

TEST(OpenAIApiParse, CompletionDefaults) {
  auto r = ParseCompletionRequest(R"({"model":"smol","prompt":"Hello"})");
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->model, "smol");
  ASSERT_EQ(r->prompts.size(), 1u);
  EXPECT_FALSE(r->prompts[0].is_tokens);
  EXPECT_EQ(r->prompts[0].text, "Hello");
  EXPECT_EQ(r->max_tokens, 16);
  EXPECT_FALSE(r->logprobs.has_value());
  EXPECT_EQ(r->gen.temperature, 1.0);
  EXPECT_EQ(r->gen.top_p, 1.0);
  EXPECT_EQ(r->gen.top_k, 0);
  EXPECT_FALSE(r->gen.seed.has_value());
  EXPECT_TRUE(r->gen.stop.empty());
  EXPECT_FALSE(r->gen.stream);
  EXPECT_FALSE(r->gen.include_usage);
  EXPECT_FALSE(r->gen.ignore_eos);
}

TEST(OpenAIApiParse, CompletionAllFields) {
  auto r = ParseCompletionRequest(R"({
    "model": "smol", "prompt": "x", "max_tokens": 7, "temperature": 0.5, "top_p": 0.9,
    "top_k": 40, "seed": 1234, "stop": ["\n", "END"], "n": 1, "stream": true,
    "stream_options": {"include_usage": true}, "logprobs": 3, "ignore_eos": true,
    "echo": false, "best_of": 1, "presence_penalty": 0, "frequency_penalty": 0.0,
    "logit_bias": {}, "user": "u-1", "suffix": null, "unknown_field": [1, 2]})");
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->max_tokens, 7);
  EXPECT_DOUBLE_EQ(r->gen.temperature, 0.5);
  EXPECT_DOUBLE_EQ(r->gen.top_p, 0.9);
  EXPECT_EQ(r->gen.top_k, 40);
  EXPECT_EQ(r->gen.seed, 1234u);
  EXPECT_EQ(r->gen.stop, (std::vector<std::string>{"\n", "END"}));
  EXPECT_TRUE(r->gen.stream);
  EXPECT_TRUE(r->gen.include_usage);
  EXPECT_EQ(r->logprobs, 3);
  EXPECT_TRUE(r->gen.ignore_eos);
  SamplingParams p = r->gen.ToSamplingParams(99);
  EXPECT_FLOAT_EQ(p.temperature, 0.5f);
  EXPECT_FLOAT_EQ(p.top_p, 0.9f);
  EXPECT_EQ(p.top_k, 40);
  EXPECT_EQ(p.seed, 1234u);
  EXPECT_TRUE(p.Validate().ok());
}

TEST(OpenAIApiParse, NullMeansDefault) {
  auto r = ParseCompletionRequest(Completion(
      R"("max_tokens":null,"temperature":null,"top_p":null,"seed":null,"stop":null,"n":null,)"
      R"("stream":null,"logprobs":null)"));
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->max_tokens, 16);
  EXPECT_EQ(r->gen.temperature, 1.0);
  EXPECT_FALSE(r->logprobs.has_value());
  EXPECT_EQ(r->gen.ToSamplingParams(77).seed, 77u);
}

TEST(OpenAIApiParse, PromptShapes) {
  auto r = ParseCompletionRequest(R"({"model":"m","prompt":["a","b"]})");
  ASSERT_TRUE(r.ok()) << r.error().message;
  ASSERT_EQ(r->prompts.size(), 2u);
  EXPECT_EQ(r->prompts[1].text, "b");

  r = ParseCompletionRequest(R"({"model":"m","prompt":[1, 2, 3]})");
  ASSERT_TRUE(r.ok()) << r.error().message;
  ASSERT_EQ(r->prompts.size(), 1u);
  EXPECT_TRUE(r->prompts[0].is_tokens);
  EXPECT_EQ(r->prompts[0].token_ids, (std::vector<int32_t>{1, 2, 3}));

  r = ParseCompletionRequest(R"({"model":"m","prompt":[[5], [6, 7]]})");
  ASSERT_TRUE(r.ok()) << r.error().message;
  ASSERT_EQ(r->prompts.size(), 2u);
  EXPECT_EQ(r->prompts[1].token_ids, (std::vector<int32_t>{6, 7}));

  r = ParseCompletionRequest(R"({"model":"m","prompt":""})");
  ASSERT_TRUE(r.ok());  // empty text is the tokenizer's business (BOS only)

  ExpectCompletionError(R"({"model":"m"})", "prompt", "prompt is required");
  ExpectCompletionError(R"({"model":"m","prompt":5})", "prompt", "got integer 5");
  ExpectCompletionError(R"({"model":"m","prompt":[]})", "prompt", "must not be an empty array");
  ExpectCompletionError(R"({"model":"m","prompt":["a", 3]})", "prompt", "prompt[1] is integer 3");
  ExpectCompletionError(R"({"model":"m","prompt":[1, "a"]})", "prompt",
                        "prompt[1] must be a token id");
  ExpectCompletionError(R"({"model":"m","prompt":[1, -4]})", "prompt",
                        "prompt[1] must be a token id (an integer >= 0), got -4");
  ExpectCompletionError(R"({"model":"m","prompt":[1.5]})", "prompt",
                        "prompt[0] must be a token id");
  ExpectCompletionError(R"({"model":"m","prompt":[3000000000]})", "prompt", "below 2^31");
  ExpectCompletionError(R"({"model":"m","prompt":[[1], []]})", "prompt",
                        "prompt[1] must not be an empty array");
  ExpectCompletionError(R"({"model":"m","prompt":[[1], [2, -1]]})", "prompt", "prompt[1][1]");
  ExpectCompletionError(R"({"model":"m","prompt":{"a":1}})", "prompt", "got object");
}

TEST(OpenAIApiParse, MalformedJsonNamesLineAndColumn) {
  ExpectCompletionError("{\"model\": \"m\",\n  \"prompt\": \"x\",\n  oops}", std::nullopt,
                        "line 3, column 3");
  ExpectCompletionError("{\"model\": \"m\"", std::nullopt, "not valid JSON: line 1");
  ExpectCompletionError("", std::nullopt, "not valid JSON");
  ExpectCompletionError("[1,2]", std::nullopt, "must be a JSON object, got array");
  ExpectCompletionError("\"text\"", std::nullopt, "must be a JSON object, got string");
  ExpectCompletionError(std::string("{\"model\":\"m\xff\"}"), std::nullopt, "not valid JSON");
  ExpectChatError("{\"model\": \"m\", \"messages\": [}", std::nullopt, "line 1, column 29");
}

TEST(OpenAIApiParse, ModelField) {
  ExpectCompletionError(R"({"prompt":"x"})", "model", "model is required");
  ExpectCompletionError(R"({"model":null,"prompt":"x"})", "model", "model is required");
  ExpectCompletionError(R"({"model":7,"prompt":"x"})", "model",
                        "model must be a string, got integer 7");
  ExpectCompletionError(R"({"model":"","prompt":"x"})", "model", "must not be empty");
  ExpectChatError(R"({"messages":[{"role":"user","content":"x"}]})", "model", "model is required");
}

TEST(OpenAIApiParse, TemperatureTopPTopK) {
  ExpectCompletionError(Completion(R"("temperature":5)"), "temperature",
                        "temperature must be between 0 and 2, got 5");
  ExpectCompletionError(Completion(R"("temperature":-0.1)"), "temperature",
                        "temperature must be between 0 and 2, got -0.1");
  ExpectCompletionError(Completion(R"("temperature":"hot")"), "temperature",
                        "temperature must be a number, got string \"hot\"");
  EXPECT_TRUE(ParseCompletionRequest(Completion(R"("temperature":0)")).ok());
  EXPECT_TRUE(ParseCompletionRequest(Completion(R"("temperature":2)")).ok());

  ExpectCompletionError(Completion(R"("top_p":0)"), "top_p", "top_p must be greater than 0");
  ExpectCompletionError(Completion(R"("top_p":1.5)"), "top_p", "got 1.5");
  ExpectCompletionError(Completion(R"("top_p":true)"), "top_p", "must be a number, got boolean");

  ExpectCompletionError(Completion(R"("top_k":-2)"), "top_k", "top_k must be at least -1, got -2");
  ExpectCompletionError(Completion(R"("top_k":2.5)"), "top_k", "top_k must be an integer");
  auto r = ParseCompletionRequest(Completion(R"("top_k":-1)"));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->gen.top_k, 0);  // -1 is "off", as in vLLM
  ExpectChatError(Chat(R"("temperature":3)"), "temperature",
                  "temperature must be between 0 and 2, got 3");
  ExpectChatError(Chat(R"("top_p":-1)"), "top_p", "top_p");
}

TEST(OpenAIApiParse, MaxTokensSeedAndN) {
  ExpectCompletionError(Completion(R"("max_tokens":0)"), "max_tokens",
                        "max_tokens must be at least 1 (0 only with echo: true), got 0");
  ExpectCompletionError(Completion(R"("max_tokens":"10")"), "max_tokens",
                        "max_tokens must be an integer, got string");
  ExpectCompletionError(Completion(R"("max_tokens":10.5)"), "max_tokens",
                        "max_tokens must be an integer, got number 10.5");
  ExpectCompletionError(Completion(R"("max_tokens":99999999999)"), "max_tokens",
                        "max_tokens must be at most 2147483647");
  auto r = ParseCompletionRequest(Completion(R"("max_tokens":12.0)"));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->max_tokens, 12);

  r = ParseCompletionRequest(Completion(R"("seed":18446744073709551615)"));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->gen.seed, 18446744073709551615ull);
  r = ParseCompletionRequest(Completion(R"("seed":-1)"));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->gen.seed, static_cast<uint64_t>(-1));
  ExpectCompletionError(Completion(R"("seed":"42")"), "seed", "seed must be an integer");
  ExpectCompletionError(Completion(R"("seed":0.5)"), "seed", "seed must be an integer");

  ExpectCompletionError(Completion(R"("n":0)"), "n", "n must be between 1 and 128");
  ExpectCompletionError(Completion(R"("n":"1")"), "n", "n must be an integer");

  auto c = ParseChatCompletionRequest(Chat(""));
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(c->max_tokens.has_value());
  c = ParseChatCompletionRequest(Chat(R"("max_tokens":5)"));
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->max_tokens, 5);
  c = ParseChatCompletionRequest(Chat(R"("max_tokens":5,"max_completion_tokens":9)"));
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->max_tokens, 9);
  ExpectChatError(Chat(R"("max_completion_tokens":-3)"), "max_completion_tokens", "at least 1");
  ExpectChatError(Chat(R"("max_tokens":[])"), "max_tokens", "must be an integer, got array");
}

TEST(OpenAIApiParse, Stop) {
  auto r = ParseCompletionRequest(Completion(R"("stop":"###")"));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->gen.stop, (std::vector<std::string>{"###"}));
  EXPECT_TRUE(ParseCompletionRequest(Completion(R"("stop":["a","b","c","d"])")).ok());
  ExpectCompletionError(Completion(R"("stop":["a","b","c","d","e"])"), "stop",
                        "at most 4 sequences, got 5");
  ExpectCompletionError(Completion(R"("stop":["a", 1])"), "stop",
                        "stop[1] must be a string, got integer");
  ExpectCompletionError(Completion(R"("stop":["a", ""])"), "stop",
                        "stop[1] must not be an empty string");
  ExpectCompletionError(Completion(R"("stop":"")"), "stop", "must not be an empty string");
  ExpectCompletionError(Completion(R"("stop":7)"), "stop", "a string or an array of strings");
  ExpectChatError(Chat(R"("stop":{"x":1})"), "stop", "got object");
}

TEST(OpenAIApiParse, StreamAndStreamOptions) {
  ExpectCompletionError(Completion(R"("stream":"yes")"), "stream",
                        "stream must be a boolean, got string");
  ExpectCompletionError(Completion(R"("stream_options":{"include_usage":true})"), "stream_options",
                        "only allowed when stream is true");
  ExpectCompletionError(Completion(R"("stream":true,"stream_options":[])"), "stream_options",
                        "must be an object");
  ExpectChatError(Chat(R"("stream":true,"stream_options":{"include_usage":1})"),
                  "stream_options.include_usage", "must be a boolean");
  auto c =
      ParseChatCompletionRequest(Chat(R"("stream":true,"stream_options":{"include_usage":true})"));
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(c->gen.stream);
  EXPECT_TRUE(c->gen.include_usage);
  ExpectCompletionError(Completion(R"("ignore_eos":1)"), "ignore_eos",
                        "ignore_eos must be a boolean");
}

TEST(OpenAIApiParse, Logprobs) {
  auto r = ParseCompletionRequest(Completion(R"("logprobs":0)"));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->logprobs, 0);
  EXPECT_TRUE(ParseCompletionRequest(Completion(R"("logprobs":20)")).ok());
  ExpectCompletionError(Completion(R"("logprobs":21)"), "logprobs",
                        "logprobs must be between 0 and 20, got 21");
  ExpectCompletionError(Completion(R"("logprobs":-1)"), "logprobs", "between 0 and 20");
  ExpectCompletionError(Completion(R"("logprobs":true)"), "logprobs",
                        "logprobs must be an integer, got boolean");

  auto c = ParseChatCompletionRequest(Chat(R"("logprobs":true,"top_logprobs":5)"));
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(c->logprobs);
  EXPECT_EQ(c->top_logprobs, 5);
  ExpectChatError(Chat(R"("logprobs":3)"), "logprobs", "logprobs must be a boolean");
  ExpectChatError(Chat(R"("top_logprobs":2)"), "top_logprobs", "requires logprobs to be true");
  ExpectChatError(Chat(R"("logprobs":true,"top_logprobs":25)"), "top_logprobs",
                  "between 0 and 20, got 25");
}

TEST(OpenAIApiParse, UnsupportedFeaturesAreRefused) {
  ExpectCompletionError(Completion(R"("suffix":"tail")"), "suffix", "not supported");
  // tools are served (tool_calls_test.cc); a malformed one names its field.
  ExpectChatError(Chat(R"("tools":[{"type":"function"}])"), "tools[0].function",
                  "tools[0].function is required");
  EXPECT_TRUE(
      ParseChatCompletionRequest(Chat(R"("response_format":{"type":"text"},"tools":[])")).ok());
}

// response_format (coordinator/api/response_format.h) on both endpoints: the
// grammar it becomes, and each malformed part a 400 naming it.
TEST(OpenAIApiParse, ResponseFormat) {
  auto text = ParseChatCompletionRequest(Chat(R"("response_format":{"type":"text"})"));
  ASSERT_TRUE(text.ok());
  EXPECT_FALSE(text->gen.grammar.active());
  auto object = ParseChatCompletionRequest(Chat(R"("response_format":{"type":"json_object"})"));
  ASSERT_TRUE(object.ok());
  EXPECT_EQ(object->gen.grammar.kind, GrammarKind::kJsonObject);
  EXPECT_EQ(object->gen.ToSamplingParams(1).grammar.kind, GrammarKind::kJsonObject);
  auto schema = ParseCompletionRequest(Completion(
      R"("response_format":{"type":"json_schema","json_schema":{"name":"a","strict":true,)"
      R"("schema":{"type":"object","required":["x"]}}})"));
  ASSERT_TRUE(schema.ok());
  EXPECT_EQ(schema->gen.grammar.kind, GrammarKind::kJsonSchema);
  EXPECT_EQ(nlohmann::json::parse(schema->gen.grammar.schema),
            nlohmann::json::parse(R"({"type":"object","required":["x"]})"));
  ExpectChatError(Chat(R"("response_format":"json")"), "response_format", "must be an object");
  ExpectChatError(Chat(R"("response_format":{"type":"xml"})"), "response_format.type",
                  "'xml' is not one of text, json_object, json_schema");
  ExpectChatError(Chat(R"("response_format":{"type":"json_schema"})"),
                  "response_format.json_schema", "must be an object");
  ExpectChatError(Chat(R"("response_format":{"type":"json_schema","json_schema":{"name":"a"}})"),
                  "response_format.json_schema.schema", "must be a JSON Schema");
  ExpectCompletionError(
      Completion(R"("response_format":{"type":"json_schema","json_schema":{"name":"a","schema":{},)"
                 R"("strict":1}})"),
      "response_format.json_schema.strict", "must be a boolean");
  ExpectChatError(Chat(R"("response_format":{"type":"json_object"},"ignore_eos":true)"),
                  "ignore_eos", "cannot be combined");
}

// The schema reaches the grammar engine with its keys in the request's order
// (LLGuidance generates properties in that order), on both endpoints.
TEST(OpenAIApiParse, ResponseFormatSchemaKeepsTheRequestsKeyOrder) {
  const std::string schema =
      R"({"type":"object","properties":{"zeta":{"type":"integer"},"alpha":{"type":"boolean"},)"
      R"("mid":{"type":"string","maxLength":3}},"required":["zeta","alpha","mid"],)"
      R"("additionalProperties":false})";
  const std::string format = R"("response_format":{"type":"json_schema","json_schema":{"schema":)" +
                             schema + R"(,"name":"ordered"}})";
  auto chat = ParseChatCompletionRequest(Chat(format));
  ASSERT_TRUE(chat.ok()) << chat.error().message;
  EXPECT_EQ(chat->gen.grammar.kind, GrammarKind::kJsonSchema);
  EXPECT_EQ(chat->gen.grammar.schema, schema);
  auto completion = ParseCompletionRequest(Completion(format));
  ASSERT_TRUE(completion.ok()) << completion.error().message;
  EXPECT_EQ(completion->gen.grammar.schema, schema);
  EXPECT_EQ(completion->gen.ToSamplingParams(1).grammar.schema, schema);
}

// response_format.json_schema.name: required, OpenAI's 1 to 64 of a-z, A-Z,
// 0-9, _ and -.
TEST(OpenAIApiParse, ResponseFormatNameFollowsOpenAIsRule) {
  const auto format = [](const std::string& name_member) {
    return R"("response_format":{"type":"json_schema","json_schema":{)" + name_member +
           R"("schema":{"type":"object"}}})";
  };
  for (const std::string& ok :
       std::vector<std::string>{"a", "Answer_v2-final", std::string(64, 'x')}) {
    SCOPED_TRACE(ok);
    auto r = ParseChatCompletionRequest(Chat(format("\"name\":\"" + ok + "\",")));
    EXPECT_TRUE(r.ok()) << r.error().message;
  }
  ExpectChatError(Chat(format("")), "response_format.json_schema.name", "is required");
  ExpectChatError(Chat(format(R"("name":null,)")), "response_format.json_schema.name",
                  "is required");
  for (const std::string& bad :
       std::vector<std::string>{R"("")", R"("my schema")", R"("a.b")", R"("caf\u00e9")",
                                "\"" + std::string(65, 'x') + "\"", "3", "[]"}) {
    SCOPED_TRACE(bad);
    ExpectChatError(Chat(format("\"name\":" + bad + ",")), "response_format.json_schema.name",
                    "1 to 64 letters, digits, _ or -");
    ExpectCompletionError(Completion(format("\"name\":" + bad + ",")),
                          "response_format.json_schema.name", "1 to 64 letters, digits, _ or -");
  }
}

TEST(OpenAIApiParse, ChatMessages) {
  auto c = ParseChatCompletionRequest(R"({"model":"m","messages":[
      {"role":"developer","content":"be brief"},
      {"role":"user","content":[{"type":"text","text":"Hel"},{"type":"text","text":"lo"}]},
      {"role":"assistant","content":"Hi", "name":"bot"},
      {"role":"user","content":"again"}]})");
  ASSERT_TRUE(c.ok()) << c.error().message;
  ASSERT_EQ(c->messages.size(), 4u);
  EXPECT_EQ(c->messages[0].role, "system");
  EXPECT_EQ(c->messages[0].content, "be brief");
  EXPECT_EQ(c->messages[1].content, "Hello");
  EXPECT_EQ(c->messages[2].role, "assistant");
  EXPECT_EQ(c->gen.temperature, 1.0);

  ExpectChatError(R"({"model":"m"})", "messages", "messages is required");
  ExpectChatError(R"({"model":"m","messages":[]})", "messages", "must not be empty");
  ExpectChatError(R"({"model":"m","messages":"hi"})", "messages", "got string");
  ExpectChatError(R"({"model":"m","messages":[5]})", "messages[0]", "must be an object");
  ExpectChatError(R"({"model":"m","messages":[{"content":"x"}]})", "messages[0].role",
                  "messages[0].role is required");
  ExpectChatError(
      R"({"model":"m","messages":[{"role":"user","content":"a"},{"role":"tool","content":"x"}]})",
      "messages[1].tool_call_id", "tool_call_id is required");
  ExpectChatError(
      R"({"model":"m","messages":[{"role":"user","content":"a"},{"role":"robot","content":"x"}]})",
      "messages[1].role", "'robot' is not supported");
  ExpectChatError(R"({"model":"m","messages":[{"role":4,"content":"x"}]})", "messages[0].role",
                  "must be a string");
  ExpectChatError(R"({"model":"m","messages":[{"role":"user"}]})", "messages[0].content",
                  "is required");
  ExpectChatError(R"({"model":"m","messages":[{"role":"user","content":12}]})",
                  "messages[0].content", "a string or an array of text parts, got integer");
  ExpectChatError(
      R"({"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{}}]}]})",
      "messages[0].content[0].type", "'image_url' is not supported");
  ExpectChatError(R"({"model":"m","messages":[{"role":"user","content":[{"type":"text"}]}]})",
                  "messages[0].content[0].text", "is required");
}

TEST(OpenAIApiParse, LogitsProcessingFields) {
  auto r = ParseCompletionRequest(Completion(
      R"("presence_penalty":0.5,"frequency_penalty":-1.5,"repetition_penalty":1.2,)"
      R"("min_p":0.05,"min_tokens":3,"max_tokens":8,"logit_bias":{"50256":-100,"7":2.5},)"
      R"("stop_token_ids":[13,2])"));
  ASSERT_TRUE(r.ok()) << r.error().message;
  const SamplingParams p = r->gen.ToSamplingParams(1);
  EXPECT_FLOAT_EQ(p.presence_penalty, 0.5f);
  EXPECT_FLOAT_EQ(p.frequency_penalty, -1.5f);
  EXPECT_FLOAT_EQ(p.repetition_penalty, 1.2f);
  EXPECT_FLOAT_EQ(p.min_p, 0.05f);
  EXPECT_EQ(p.min_tokens, 3);
  EXPECT_EQ(p.logit_bias, (std::vector<std::pair<int32_t, float>>{{50256, -100.0f}, {7, 2.5f}}));
  EXPECT_EQ(p.stop_token_ids, (std::vector<int32_t>{13, 2}));
  EXPECT_TRUE(p.Validate().ok());
  // Defaults: nothing changes the logits.
  auto d = ParseChatCompletionRequest(Chat(R"("logit_bias":{},"presence_penalty":0)"));
  ASSERT_TRUE(d.ok());
  EXPECT_FALSE(d->gen.ToSamplingParams(1).AdjustsLogits());
  auto c = ParseChatCompletionRequest(Chat(R"("frequency_penalty":2,"stop_token_ids":[])"));
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_FLOAT_EQ(c->gen.ToSamplingParams(1).frequency_penalty, 2.0f);
}

// Each new field: a wrong type, out of range, or contradictory -> 400 naming it.
TEST(OpenAIApiParse, LogitsProcessingBadInput) {
  ExpectCompletionError(Completion(R"("presence_penalty":"high")"), "presence_penalty",
                        "must be a number, got string");
  ExpectCompletionError(Completion(R"("frequency_penalty":3)"), "frequency_penalty",
                        "between -2 and 2, got 3");
  ExpectChatError(Chat(R"("presence_penalty":-2.5)"), "presence_penalty", "between -2 and 2");
  ExpectCompletionError(Completion(R"("repetition_penalty":0)"), "repetition_penalty",
                        "greater than 0 and at most 100, got 0");
  ExpectCompletionError(Completion(R"("repetition_penalty":true)"), "repetition_penalty",
                        "must be a number, got boolean");
  ExpectCompletionError(Completion(R"("min_p":1.5)"), "min_p", "between 0 and 1, got 1.5");
  ExpectCompletionError(Completion(R"("min_tokens":-1)"), "min_tokens", "at least 0");
  ExpectCompletionError(Completion(R"("min_tokens":2.5)"), "min_tokens", "an integer");
  ExpectCompletionError(Completion(R"("min_tokens":20,"max_tokens":4)"), "min_tokens",
                        "min_tokens (20) must not exceed max_tokens (4)");
  ExpectChatError(Chat(R"("min_tokens":20,"max_tokens":4)"), "min_tokens", "must not exceed");
  EXPECT_TRUE(ParseChatCompletionRequest(Chat(R"("min_tokens":20)")).ok());  // to the context
  ExpectCompletionError(Completion(R"("logit_bias":[1,2])"), "logit_bias", "must be an object");
  ExpectCompletionError(Completion(R"("logit_bias":{"abc":1})"), "logit_bias",
                        "key 'abc' must be a token id");
  ExpectCompletionError(Completion(R"("logit_bias":{"-5":1})"), "logit_bias",
                        "key '-5' must be a token id");
  ExpectCompletionError(Completion(R"("logit_bias":{"99999999999":1})"), "logit_bias",
                        "must be a token id");
  ExpectCompletionError(Completion(R"("logit_bias":{"5":"up"})"), "logit_bias",
                        R"(logit_bias["5"] must be a number, got string)");
  ExpectCompletionError(Completion(R"("logit_bias":{"5":101})"), "logit_bias",
                        R"(logit_bias["5"] must be between -100 and 100, got 101)");
  ExpectChatError(Chat(R"("stop_token_ids":5)"), "stop_token_ids", "must be an array");
  ExpectChatError(Chat(R"("stop_token_ids":[1,"x"])"), "stop_token_ids", "an integer");
  ExpectChatError(Chat(R"("stop_token_ids":[-3])"), "stop_token_ids", "between 0 and");
  std::string many = "{";
  for (int i = 0; i <= 1024; ++i) many += (i ? ",\"" : "\"") + std::to_string(i) + "\":1";
  ExpectCompletionError(Completion("\"logit_bias\":" + many + "}"), "logit_bias",
                        "at most 1024 entries, got 1025");
}

TEST(OpenAIApiParse, EchoPromptLogprobsNAndBestOf) {
  auto r = ParseCompletionRequest(
      Completion(R"("echo":true,"max_tokens":0,"logprobs":2,"prompt_logprobs":3)"));
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_TRUE(r->echo);
  EXPECT_EQ(r->max_tokens, 0);
  EXPECT_EQ(r->prompt_logprobs, 3);
  EXPECT_TRUE(ParseCompletionRequest(Completion(R"("echo":true,"stream":true)")).ok());
  ExpectCompletionError(Completion(R"("echo":1)"), "echo", "must be a boolean");
  ExpectCompletionError(Completion(R"("prompt_logprobs":21)"), "prompt_logprobs",
                        "between 0 and 20, got 21");
  auto n = ParseCompletionRequest(Completion(R"("n":3,"best_of":5)"));
  ASSERT_TRUE(n.ok()) << n.error().message;
  EXPECT_EQ(n->gen.n, 3);
  EXPECT_EQ(n->best_of, 5);
  auto d = ParseCompletionRequest(Completion(R"("n":2)"));
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->best_of, 2);  // best_of defaults to n
  auto c = ParseChatCompletionRequest(Chat(R"("n":4,"stream":true)"));
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->gen.n, 4);
  ExpectCompletionError(Completion(R"("n":3,"best_of":2)"), "best_of",
                        "best_of (2) must be at least n (3)");
  ExpectCompletionError(Completion(R"("best_of":3,"stream":true)"), "best_of",
                        "not supported with stream");
  ExpectCompletionError(Completion(R"("n":0)"), "n", "between 1 and 128, got 0");
  ExpectChatError(Chat(R"("n":129)"), "n", "between 1 and 128, got 129");
  ExpectChatError(Chat(R"("n":"2")"), "n", "must be an integer");
  ApiError e = TooManyChoicesError(40, 5, 10, "n", "scheduler.queue_limit");
  ExpectError(e, "n", "5 prompt(s) x 10 n = 50 requests");
  EXPECT_EQ(e.code, "too_many_choices");
}

TEST(OpenAIApiParse, TokenizeAndDetokenize) {
  auto t = ParseTokenizeRequest(R"({"model":"m","prompt":"hello","add_special_tokens":false})");
  ASSERT_TRUE(t.ok()) << t.error().message;
  EXPECT_FALSE(t->chat);
  EXPECT_EQ(t->prompt, "hello");
  EXPECT_EQ(t->add_special_tokens, false);
  auto c = ParseTokenizeRequest(
      R"({"messages":[{"role":"user","content":"hi"}],"add_generation_prompt":false})");
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_TRUE(c->chat);
  EXPECT_FALSE(c->add_generation_prompt);
  EXPECT_FALSE(c->add_special_tokens.has_value());
  auto both = ParseTokenizeRequest(R"({"prompt":"x","messages":[]})");
  ASSERT_FALSE(both.ok());
  ExpectError(both.error(), "messages", "either prompt");
  ExpectError(ParseTokenizeRequest(R"({})").error(), "prompt", "either prompt");
  ExpectError(ParseTokenizeRequest(R"({"prompt":[1]})").error(), "prompt", "must be a string");
  ExpectError(ParseTokenizeRequest(R"({"prompt":"x","add_special_tokens":1})").error(),
              "add_special_tokens", "must be a boolean");
  auto d = ParseDetokenizeRequest(R"({"tokens":[1,2,3]})");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->tokens, (std::vector<int32_t>{1, 2, 3}));
  ExpectError(ParseDetokenizeRequest(R"({})").error(), "tokens", "tokens is required");
  ExpectError(ParseDetokenizeRequest(R"({"tokens":[1,-1]})").error(), "tokens", "between 0 and");
  ExpectError(ParseDetokenizeRequest(R"({"tokens":"1"})").error(), "tokens", "must be an array");
}

TEST(OpenAIApiErrors, HelpersAndStatusMapping) {
  ApiError e = UnknownModelError("gpt-4", "smol");
  EXPECT_EQ(e.http_status, 404);
  EXPECT_EQ(e.code, "model_not_found");
  EXPECT_NE(e.message.find("gpt-4"), std::string::npos);
  EXPECT_NE(e.message.find("smol"), std::string::npos);

  e = ContextLengthError(2048, 2000, 100, "messages");
  EXPECT_EQ(e.http_status, 400);
  EXPECT_EQ(e.param, "messages");
  EXPECT_EQ(e.code, "context_length_exceeded");
  EXPECT_NE(e.message.find("maximum context length is 2048 tokens"), std::string::npos);
  EXPECT_NE(e.message.find("requested 2100 tokens (2000 in the messages, 100 in the completion)"),
            std::string::npos);

  // max_tokens alone does not fit: it is the field to fix.
  e = ContextLengthError(2048, 1, 3000, "prompt");
  EXPECT_EQ(e.param, "max_tokens");
  EXPECT_EQ(e.code, "context_length_exceeded");
  EXPECT_NE(e.message.find("set max_tokens to at most 2047"), std::string::npos) << e.message;
  // Both too long: the prompt comes first.
  e = ContextLengthError(2048, 3000, 3000, "prompt");
  EXPECT_EQ(e.param, "prompt");

  e = QueueFullError(64);
  EXPECT_EQ(e.http_status, 429);
  json j = json::parse(e.ToJson());
  EXPECT_EQ(j["error"]["type"], "rate_limit_error");
  EXPECT_EQ(j["error"]["code"], "queue_full");
  EXPECT_TRUE(j["error"]["param"].is_null());

  EXPECT_EQ(ApiErrorFromStatus(InvalidArgument("x")).http_status, 400);
  // A serving-path message "field: reason" names the field.
  EXPECT_EQ(ApiErrorFromStatus(InvalidArgument("logit_bias: token id 9 is outside")).param,
            "logit_bias");
  EXPECT_EQ(ApiErrorFromStatus(InvalidArgument("bad thing: x")).param, std::nullopt);
  EXPECT_EQ(ApiErrorFromStatus(NotFound("x")).http_status, 404);
  EXPECT_EQ(ApiErrorFromStatus(ResourceExhausted("x")).http_status, 429);
  EXPECT_EQ(ApiErrorFromStatus(Unavailable("x")).http_status, 503);
  EXPECT_EQ(ApiErrorFromStatus(DeadlineExceeded("x")).http_status, 504);
  ApiError internal = ApiErrorFromStatus(Internal("worker 3 crashed"));
  EXPECT_EQ(internal.http_status, 500);
  EXPECT_EQ(internal.type, "server_error");
  EXPECT_EQ(internal.message, "worker 3 crashed");
}

TEST(OpenAIApiResponses, CompletionShapes) {
  CompletionChoice c;
  c.index = 0;
  c.text = " world";
  c.finish_reason = FinishReason::kLength;
  c.logprobs = std::vector<TokenLogprob>{{" wor", -0.5f, {{" wor", -0.5f}, {" wo", -1.5f}}},
                                         {"ld", -0.25f, {{"ld", -0.25f}, {"ld", -3.0f}}}};
  json j = json::parse(CompletionResponseJson("cmpl-1", 1700000000, "smol", {c}, {5, 2, 4}));
  EXPECT_EQ(j["id"], "cmpl-1");
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["created"], 1700000000);
  EXPECT_EQ(j["model"], "smol");
  ASSERT_EQ(j["choices"].size(), 1u);
  EXPECT_EQ(j["choices"][0]["index"], 0);
  EXPECT_EQ(j["choices"][0]["text"], " world");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  const json& lp = j["choices"][0]["logprobs"];
  EXPECT_EQ(lp["tokens"], json({" wor", "ld"}));
  EXPECT_EQ(lp["token_logprobs"], json({-0.5, -0.25}));
  EXPECT_EQ(lp["text_offset"], json({0, 4}));
  EXPECT_EQ(lp["top_logprobs"][0], json({{" wor", -0.5}, {" wo", -1.5}}));
  EXPECT_EQ(lp["top_logprobs"][1], json({{"ld", -0.25}}));  // duplicate text: best kept
  EXPECT_EQ(j["usage"], json({{"prompt_tokens", 5},
                              {"completion_tokens", 2},
                              {"total_tokens", 7},
                              {"prompt_tokens_details", {{"cached_tokens", 4}}}}));

  CompletionChoice chunk;
  chunk.text = "Hel";
  j = json::parse(CompletionChunkJson("cmpl-2", 1, "smol", {chunk}, std::nullopt, false));
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["choices"][0]["text"], "Hel");
  EXPECT_TRUE(j["choices"][0]["finish_reason"].is_null());
  EXPECT_TRUE(j["choices"][0]["logprobs"].is_null());
  EXPECT_FALSE(j.contains("usage"));
  j = json::parse(CompletionChunkJson("cmpl-2", 1, "smol", {chunk}, std::nullopt, true));
  EXPECT_TRUE(j["usage"].is_null());
  // A later stream chunk's text_offset continues from the earlier chunks' tokens.
  CompletionChoice later = chunk;
  later.logprobs = std::vector<TokenLogprob>{{"lo", -0.1f, {}}, {"!", -0.2f, {}}};
  later.logprobs_offset = 3;
  j = json::parse(CompletionChunkJson("cmpl-2", 1, "smol", {later}, std::nullopt, false));
  EXPECT_EQ(j["choices"][0]["logprobs"]["text_offset"], json({3, 5}));
  EXPECT_EQ(j["choices"][0]["logprobs"]["top_logprobs"], json({json::object(), json::object()}));
  chunk.finish_reason = FinishReason::kStop;
  j = json::parse(CompletionChunkJson("cmpl-2", 1, "smol", {chunk}, Usage{3, 4}, true));
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(j["usage"]["total_tokens"], 7);
}

// CompletionResponseJson and CompletionChunkJson write their objects by
// hand: the bytes must be what the JSON library writes for the same value
// (keys sorted, compact, invalid UTF-8 replaced), whatever the fields hold.
TEST(OpenAIApiResponses, CompletionJsonIsWhatTheJsonLibraryWrites) {
  const auto canonical = [](const std::string& text) {
    return json::parse(text).dump(-1, ' ', false, json::error_handler_t::replace);
  };
  CompletionChoice plain;
  plain.index = 1;
  plain.text = "quote \" backslash \\ newline \n tab \t bell \x07 caf\xc3\xa9 \xe2\x82\xac";
  plain.finish_reason = FinishReason::kStop;
  CompletionChoice invalid;
  invalid.text = "bad \xff\xfe utf-8 \xc3";
  CompletionChoice logprobs;
  logprobs.index = 2;
  logprobs.text = "ab";
  logprobs.finish_reason = FinishReason::kLength;
  logprobs.logprobs =
      std::vector<TokenLogprob>{{"a", -0.5f, {{"a", -0.5f}, {"b", -1.25f}}}, {"b", -0.125f, {}}};
  logprobs.logprobs_offset = 7;
  logprobs.prompt_logprobs = {{std::nullopt, std::vector<std::tuple<int32_t, float, std::string>>{
                                                 {5, -0.75f, "x"}, {9, -2.0f, "\"y\""}}}};
  const std::vector<std::vector<CompletionChoice>> cases = {
      {}, {plain}, {invalid}, {logprobs}, {plain, invalid, logprobs}};
  for (const std::vector<CompletionChoice>& choices : cases) {
    const std::string whole =
        CompletionResponseJson("cmpl-\"id\"", 1700000000, "m\xc3\xa9", choices, {5, 2, 4});
    EXPECT_EQ(whole, canonical(whole));
    for (const std::optional<Usage>& usage : {std::optional<Usage>(), std::optional<Usage>({3, 4})})
      for (const bool include_usage : {false, true}) {
        const std::string chunk =
            CompletionChunkJson("cmpl-2", 1, "smol", choices, usage, include_usage);
        EXPECT_EQ(chunk, canonical(chunk));
        EXPECT_EQ(json::parse(chunk).contains("usage"), usage || include_usage);
      }
  }
  json j = json::parse(CompletionResponseJson("c", 1, "m", {invalid}, {}));
  EXPECT_EQ(j["choices"][0]["text"],  // each bad sequence replaced, as the library does
            json::parse(json(invalid.text).dump(-1, ' ', false, json::error_handler_t::replace)));
  EXPECT_TRUE(j["choices"][0]["finish_reason"].is_null());
  j = json::parse(CompletionResponseJson("c", 1, "m", {logprobs}, {}));
  EXPECT_EQ(j["choices"][0]["prompt_logprobs"][1]["9"]["decoded_token"], "\"y\"");
  EXPECT_EQ(j["choices"][0]["logprobs"]["text_offset"], json({7, 8}));
  EXPECT_EQ(j["usage"]["total_tokens"], 0);
}

TEST(OpenAIApiResponses, ChatShapes) {
  ChatChoice c;
  c.content = "Hello!";
  c.finish_reason = FinishReason::kStop;
  json j = json::parse(ChatCompletionResponseJson("chatcmpl-1", 2, "smol", {c}, {10, 3}));
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["choices"][0]["message"], json({{"role", "assistant"}, {"content", "Hello!"}}));
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_TRUE(j["choices"][0]["logprobs"].is_null());
  EXPECT_EQ(j["usage"]["prompt_tokens"], 10);
  EXPECT_EQ(j["usage"]["completion_tokens"], 3);
  EXPECT_EQ(j["usage"]["total_tokens"], 13);

  // First chunk: the role, empty content.
  j = json::parse(ChatCompletionChunkJson("chatcmpl-1", 2, "smol", 0, true, std::string(),
                                          std::nullopt, std::nullopt, false));
  EXPECT_EQ(j["object"], "chat.completion.chunk");
  EXPECT_EQ(j["choices"][0]["delta"], json({{"role", "assistant"}, {"content", ""}}));
  EXPECT_TRUE(j["choices"][0]["finish_reason"].is_null());
  EXPECT_FALSE(j.contains("usage"));
  // A content chunk with logprobs.
  std::vector<TokenLogprob> lp = {{"Hi", -0.1f, {{"Hi", -0.1f}, {"Hey", -2.0f}}}};
  j = json::parse(ChatCompletionChunkJson("chatcmpl-1", 2, "smol", 0, false, std::string("Hi"),
                                          std::nullopt, lp, true));
  EXPECT_EQ(j["choices"][0]["delta"], json({{"content", "Hi"}}));
  EXPECT_TRUE(j["usage"].is_null());
  const json& content = j["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 1u);
  EXPECT_EQ(content[0]["token"], "Hi");
  EXPECT_FLOAT_EQ(content[0]["logprob"].get<float>(), -0.1f);
  EXPECT_EQ(content[0]["bytes"], json({72, 105}));
  EXPECT_EQ(content[0]["top_logprobs"][1]["token"], "Hey");
  // Last chunk: empty delta, finish_reason.
  j = json::parse(ChatCompletionChunkJson("chatcmpl-1", 2, "smol", 0, false, std::nullopt,
                                          FinishReason::kLength, std::nullopt, false));
  EXPECT_EQ(j["choices"][0]["delta"], json::object());
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  // Usage chunk.
  j = json::parse(ChatCompletionUsageChunkJson("chatcmpl-1", 2, "smol", {4, 6}));
  EXPECT_EQ(j["choices"], json::array());
  EXPECT_EQ(j["usage"]["total_tokens"], 10);
  EXPECT_EQ(kSseDone, "[DONE]");
  EXPECT_STREQ(OpenAIFinishReason(FinishReason::kEos), "stop");
  EXPECT_STREQ(OpenAIFinishReason(FinishReason::kStop), "stop");
  EXPECT_STREQ(OpenAIFinishReason(FinishReason::kLength), "length");
}

TEST(OpenAIApiResponses, InvalidUtf8TokenTextIsReplaced) {
  // A token that ends in the middle of a multi-byte character.
  ChatChoice c;
  c.content = "caf\xc3";
  std::string text = ChatCompletionResponseJson("chatcmpl-1", 2, "smol", {c}, {1, 1});
  json j = json::parse(text);
  EXPECT_EQ(j["choices"][0]["message"]["content"], "caf\xef\xbf\xbd");  // U+FFFD
  CompletionChoice cc;
  cc.text = "\xe2\x82";
  cc.logprobs = std::vector<TokenLogprob>{{"\xe2\x82", -1.0f, {{"\xe2\x82", -1.0f}}}};
  EXPECT_NO_THROW(json::parse(CompletionChunkJson("c", 1, "m", {cc}, std::nullopt, false)));
}

TEST(OpenAIApiResponses, ModelListAndIds) {
  json j = json::parse(ModelListJson({{"smol", 1700000000, "tessera", 4096}}));
  EXPECT_EQ(j["object"], "list");
  ASSERT_EQ(j["data"].size(), 1u);
  EXPECT_EQ(j["data"][0], json({{"id", "smol"},
                                {"object", "model"},
                                {"created", 1700000000},
                                {"owned_by", "tessera"},
                                {"root", "smol"},
                                {"parent", nullptr},
                                {"max_model_len", 4096}}));
  // /tokenize and /detokenize answers (vLLM's shapes).
  EXPECT_EQ(
      json::parse(TokenizeResponseJson({5, 6}, 128)),
      json({{"count", 2}, {"max_model_len", 128}, {"tokens", {5, 6}}, {"token_strs", nullptr}}));
  EXPECT_EQ(json::parse(DetokenizeResponseJson("hi")), json({{"prompt", "hi"}}));
  const std::string a = NewResponseId("chatcmpl"), b = NewResponseId("chatcmpl");
  EXPECT_EQ(a.rfind("chatcmpl-", 0), 0u);
  EXPECT_EQ(a.size(), std::string("chatcmpl-").size() + 24);
  EXPECT_NE(a, b);
  EXPECT_GT(UnixSeconds(), 1700000000);
}

}  // namespace
}  // namespace tessera
