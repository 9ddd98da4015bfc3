// Security suite, request bodies: the attacks of issue #14 items 1 and 2 sent
// to real daemons on loopback (a coordinator and four workers, tp=2 x pp=2).
// - 60,000 levels of nested arrays or objects in any field of /v1/completions,
//   /v1/chat/completions or POST /admin/plan once crashed the coordinator
//   (SIGSEGV in the JSON serializer); each must get a 400 naming the limit.
// - 1e400 (or -1e400) in any numeric position once gave a 500 carrying the
//   JSON library's exception text; each must get a 400 naming the field.
// After every attack the coordinator is still running and a greedy request
// returns the reference tokens.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/base/json_parse.h"
#include "common/net/http_client.h"
#include "common/tokenizer/tokenizer.h"
#include "support/daemons_fixture.h"
#include "support/test_util.h"

namespace tessera {
namespace {

using nlohmann::json;

// `levels` nested arrays around `inner`: "[[[...inner...]]]".
std::string NestedArrays(int levels, const std::string& inner = "1") {
  return std::string(levels, '[') + inner + std::string(levels, ']');
}
// `levels` nested objects: {"a":{"a":...{}...}}.
std::string NestedObjects(int levels) {
  std::string s;
  for (int i = 0; i < levels; ++i) s += "{\"a\":";
  s += "{}";
  s += std::string(levels, '}');
  return s;
}

class RequestAttacks : public Daemons {
 protected:
  // The coordinator is alive and serves a greedy request with the reference
  // tokens of the fixture model.
  void ExpectServingCorrectly(const std::string& after) {
    SCOPED_TRACE("after: " + after);
    ASSERT_EQ(waitpid(cluster_->coordinator_pid(), nullptr, WNOHANG), 0)
        << "the coordinator exited";
    const json ref = json::parse(::tessera::testing::ReadFileOrDie(model_ + "/reference.json"));
    const json& p = ref["prompts"][0];
    const json req = {{"model", "llama_gqa_f32"},
                      {"prompt", p["ids"]},
                      {"max_tokens", 8},
                      {"temperature", 0},
                      {"ignore_eos", true}};
    const HttpReply r = HttpCall(port_, "POST", "/v1/completions", req.dump());
    ASSERT_EQ(r.status, 200) << r.body;
    const std::vector<int32_t> greedy = p["greedy"].get<std::vector<int32_t>>();
    auto tok = Tokenizer::Load(model_);
    ASSERT_TRUE(tok.ok());
    const std::vector<int32_t> first8(greedy.begin(), greedy.begin() + 8);
    EXPECT_EQ(json::parse(r.body)["choices"][0]["text"].get<std::string>(),
              (*tok)->Decode(first8, true));
  }

  // A 400 whose OpenAI error object names `param` (when non-empty) and whose
  // message contains `needle`; no library text ("json.exception") anywhere.
  void ExpectBadRequest(const HttpReply& r, const std::string& param, const std::string& needle,
                        const std::string& what) {
    SCOPED_TRACE(what);
    EXPECT_EQ(r.status, 400) << r.body.substr(0, 300);
    EXPECT_EQ(r.body.find("json.exception"), std::string::npos) << r.body.substr(0, 300);
    EXPECT_LT(r.body.size(), 1000u) << "the error quotes too much of the request";
    const json body = json::parse(r.body, nullptr, false);
    ASSERT_TRUE(body.is_object() && body.contains("error")) << r.body.substr(0, 300);
    const std::string message = body["error"].value("message", "");
    EXPECT_NE(message.find(needle), std::string::npos) << message;
    if (!param.empty()) {
      ASSERT_TRUE(body["error"]["param"].is_string()) << r.body;
      EXPECT_EQ(body["error"]["param"].get<std::string>(), param) << r.body;
    }
  }
};

TEST_F(RequestAttacks, DeeplyNestedBodiesGet400NamingTheLimitAndTheDaemonServesOn) {
  const std::string m = "\"model\":\"llama_gqa_f32\"";
  const std::string deep = NestedArrays(60000);
  const std::string limit = std::to_string(kMaxRequestJsonDepth) + " levels";
  struct Case {
    std::string target, body, param, what;
  };
  const std::vector<Case> cases = {
      {"/v1/completions", "{" + m + ",\"max_tokens\":2,\"prompt\":" + deep + "}", "prompt",
       "60000 nested arrays in prompt"},
      {"/v1/completions", "{" + m + ",\"prompt\":\"a\",\"max_tokens\":" + deep + "}", "max_tokens",
       "nested arrays in max_tokens"},
      {"/v1/completions", "{" + m + ",\"prompt\":\"a\",\"max_tokens\":2,\"stop\":" + deep + "}",
       "stop", "nested arrays in stop"},
      {"/v1/completions", "{" + m + ",\"max_tokens\":2,\"prompt\":" + NestedObjects(60000) + "}",
       "prompt", "60000 nested objects in prompt"},
      {"/v1/chat/completions", "{" + m + ",\"max_tokens\":2,\"messages\":" + deep + "}", "messages",
       "nested arrays in messages"},
      {"/v1/chat/completions",
       "{" + m + ",\"messages\":[{\"role\":\"user\",\"content\":" + NestedArrays(30000) + "}]}",
       "messages", "nested arrays in a message's content"},
      // One level over the bound is refused; the document itself is level 1.
      {"/v1/completions",
       "{" + m + ",\"max_tokens\":2,\"prompt\":" + NestedArrays(kMaxRequestJsonDepth) + "}",
       "prompt", "one level over the bound"},
  };
  for (const Case& c : cases) {
    ExpectBadRequest(HttpCall(port_, "POST", c.target, c.body), c.param, limit, c.what);
    ExpectServingCorrectly(c.what);
  }
  // The same through the admin API (behind its token).
  const HttpReply plan = HttpCall(port_, "POST", "/admin/plan?dry_run=true",
                                  "{\"tp\":" + deep + ",\"pp\":1}", "s3cret");
  EXPECT_EQ(plan.status, 400) << plan.body.substr(0, 300);
  EXPECT_NE(plan.body.find(limit), std::string::npos) << plan.body.substr(0, 300);
  EXPECT_EQ(plan.body.find("json.exception"), std::string::npos);
  ExpectServingCorrectly("nested arrays in POST /admin/plan");
  // Nesting within the bound is parsed and judged on its content.
  const HttpReply shallow = HttpCall(
      port_, "POST", "/v1/completions",
      "{" + m + ",\"max_tokens\":2,\"prompt\":" + NestedArrays(kMaxRequestJsonDepth - 1) + "}");
  ExpectBadRequest(shallow, "prompt", "must be a token id", "nesting within the bound");
}

TEST_F(RequestAttacks, NumbersBeyondTheDoubleRangeGet400NamingTheField) {
  const std::string model = "\"model\":\"llama_gqa_f32\"";
  // The body's other members, leaving out the field under test (a member
  // given twice is refused before its value is read).
  auto base = [&model](const std::string& f) {
    return f == "max_tokens" ? model : model + ",\"max_tokens\":2";
  };
  // Every field the completions and chat parsers read, with a value of each
  // sign that no double holds.
  const std::vector<std::string> completion_fields = {"user",
                                                      "max_tokens",
                                                      "temperature",
                                                      "top_p",
                                                      "top_k",
                                                      "seed",
                                                      "n",
                                                      "logprobs",
                                                      "echo",
                                                      "best_of",
                                                      "suffix",
                                                      "presence_penalty",
                                                      "frequency_penalty",
                                                      "stop",
                                                      "stream",
                                                      "ignore_eos",
                                                      "logit_bias",
                                                      "repetition_penalty",
                                                      "min_p",
                                                      "min_tokens",
                                                      "stop_token_ids",
                                                      "prompt_logprobs",
                                                      "prompt"};
  const std::vector<std::string> chat_fields = {
      "user",   "max_tokens",     "max_completion_tokens", "temperature", "top_p",
      "seed",   "logprobs",       "top_logprobs",          "tools",       "functions",
      "stream", "stream_options", "response_format",       "messages"};
  int cases = 0;
  for (const std::string& v : {std::string("1e400"), std::string("-1e400")}) {
    for (const std::string& f : completion_fields) {
      std::string body = "{" + base(f) + ",\"" + f + "\":" + v;
      if (f != "prompt") body += ",\"prompt\":\"a\"";
      body += "}";
      ExpectBadRequest(HttpCall(port_, "POST", "/v1/completions", body), f, "out of range",
                       "completions " + f + "=" + v);
      ++cases;
    }
    for (const std::string& f : chat_fields) {
      std::string body = "{" + base(f) + ",\"" + f + "\":" + v;
      if (f != "messages") body += ",\"messages\":[{\"role\":\"user\",\"content\":\"a\"}]";
      body += "}";
      ExpectBadRequest(HttpCall(port_, "POST", "/v1/chat/completions", body), f, "out of range",
                       "chat " + f + "=" + v);
      ++cases;
    }
  }
  EXPECT_EQ(cases, 74);
  // Inside arrays and objects the path is named in the message.
  ExpectBadRequest(
      HttpCall(port_, "POST", "/v1/completions", "{" + base("") + ",\"prompt\":[1,2,1e400]}"),
      "prompt", "prompt[2]", "1e400 as a token id");
  ExpectBadRequest(
      HttpCall(
          port_, "POST", "/v1/chat/completions",
          "{" + base("") + ",\"messages\":[{\"role\":\"user\",\"content\":\"a\",\"x\":-1e400}]}"),
      "messages", "messages[0].x", "1e400 inside a message");
  // A member given twice (parsers disagree on which copy wins) is refused.
  ExpectBadRequest(HttpCall(port_, "POST", "/v1/completions",
                            "{" + base("") + ",\"prompt\":\"a\",\"prompt\":[1,2]}"),
                   "prompt", "given twice", "prompt given twice");
  ExpectServingCorrectly("1e400 in every field");
  // The admin API: a 400 naming the field, never a 500.
  for (const std::string f : {"tp", "pp", "layers_per_stage"}) {
    const HttpReply r =
        HttpCall(port_, "POST", "/admin/plan?dry_run=true", "{\"" + f + "\":1e400}", "s3cret");
    EXPECT_EQ(r.status, 400) << f << ": " << r.body;
    EXPECT_NE(r.body.find(f + std::string(": the number 1e400 is out of range")), std::string::npos)
        << r.body;
    EXPECT_EQ(r.body.find("json.exception"), std::string::npos) << r.body;
  }
  ExpectServingCorrectly("1e400 in POST /admin/plan");
}

}  // namespace
}  // namespace tessera
