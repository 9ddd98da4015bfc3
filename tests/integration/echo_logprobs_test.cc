// echo with prompt log-probabilities (issue 37 section 3) against
// transformers: tools/make_echo_reference.py recorded, for prompts of the
// llama_gqa_f32 fixture, every prompt token's log-probability and the top 3
// at each position (float32 on CPU); real daemons at tp 1 and tp 2 x pp 2
// answer /v1/completions with echo: true, max_tokens: 0, logprobs: 3 and
// vLLM's prompt_logprobs: 3 (keyed by token id), and must agree within
// 1e-4. text_offset indexes the echoed text; the first token's log-prob is
// null. Also /tokenize, /detokenize and /v1/models on the same daemons.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "support/daemons_fixture.h"
#include "support/test_util.h"

namespace tessera {
namespace {

using json = nlohmann::json;

constexpr double kTolerance = 1e-4;

void CheckEchoAgainstReference(int port, const std::string& model) {
  const json ref = json::parse(
      testing::ReadFileOrDie(testing::FixturePath("models/llama_gqa_f32/echo_reference.json")));
  const int top = ref["top"];
  json prompts = json::array();
  for (const json& p : ref["prompts"]) prompts.push_back(p["ids"]);
  const json body = {{"model", model},  {"prompt", prompts}, {"echo", true},
                     {"max_tokens", 0}, {"logprobs", top},   {"prompt_logprobs", top},
                     {"temperature", 0}};
  const HttpReply r = HttpCall(port, "POST", "/v1/completions", body.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  const json out = json::parse(r.body);
  ASSERT_EQ(out["choices"].size(), ref["prompts"].size()) << r.body;
  EXPECT_EQ(out["usage"]["completion_tokens"], 0);
  for (size_t c = 0; c < ref["prompts"].size(); ++c) {
    SCOPED_TRACE("prompt " + std::to_string(c));
    const json& want = ref["prompts"][c];
    const json& choice = out["choices"][c];
    const size_t n = want["ids"].size();
    EXPECT_EQ(choice["finish_reason"], "length");
    const json& lp = choice["logprobs"];
    ASSERT_EQ(lp["tokens"].size(), n) << choice.dump();
    ASSERT_EQ(lp["token_logprobs"].size(), n);
    EXPECT_TRUE(lp["token_logprobs"][0].is_null());
    EXPECT_TRUE(lp["top_logprobs"][0].is_null());
    // text_offset indexes the echoed text.
    const std::string text = choice["text"];
    size_t at = 0;
    for (size_t i = 0; i < n; ++i) {
      const std::string token = lp["tokens"][i];
      EXPECT_EQ(lp["text_offset"][i], at);
      EXPECT_EQ(text.substr(at, token.size()), token);
      at += token.size();
    }
    EXPECT_EQ(at, text.size());
    const json& pl = choice["prompt_logprobs"];
    ASSERT_EQ(pl.size(), n);
    EXPECT_TRUE(pl[0].is_null());
    for (size_t i = 1; i < n; ++i) {
      SCOPED_TRACE("position " + std::to_string(i));
      const double expected = want["token_logprobs"][i];
      EXPECT_NEAR(lp["token_logprobs"][i].get<double>(), expected, kTolerance);
      const std::string id = std::to_string(want["ids"][i].get<int>());
      ASSERT_TRUE(pl[i].contains(id)) << pl[i].dump();
      EXPECT_NEAR(pl[i][id]["logprob"].get<double>(), expected, kTolerance);
      // The top alternatives, by id, where the reference separates them.
      const json& best = want["top"][i];
      for (int k = 0; k < top; ++k) {
        const bool clear = k + 1 >= top ||
                           best[k][1].get<double>() - best[k + 1][1].get<double>() > 2 * kTolerance;
        const std::string tid = std::to_string(best[k][0].get<int>());
        if (!clear) continue;
        ASSERT_TRUE(pl[i].contains(tid)) << "top " << k << ": " << pl[i].dump();
        EXPECT_NEAR(pl[i][tid]["logprob"].get<double>(), best[k][1].get<double>(), kTolerance);
      }
      EXPECT_LE(lp["top_logprobs"][i].size(), static_cast<size_t>(top));
    }
  }
}

void CheckTokenizeEndpoints(int port, const std::string& model) {
  HttpReply r =
      HttpCall(port, "POST", "/tokenize", json{{"model", model}, {"prompt", "hello world"}}.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  const json t = json::parse(r.body);
  EXPECT_EQ(t["count"], t["tokens"].size());
  EXPECT_EQ(t["max_model_len"], 128);  // scheduler.max_context of the test config
  r = HttpCall(port, "POST", "/detokenize", json{{"tokens", t["tokens"]}}.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_NE(json::parse(r.body)["prompt"].get<std::string>().find("hello world"), std::string::npos)
      << r.body;
  // Chat messages through the template.
  r = HttpCall(port, "POST", "/tokenize",
               json{{"messages", {{{"role", "user"}, {"content", "hi"}}}}}.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_GT(json::parse(r.body)["count"].get<int>(), 1);
  // Bad input: 400 naming the field; unknown model 404.
  for (const auto& [path, bad, param] : std::vector<std::tuple<std::string, json, std::string>>{
           {"/tokenize", json{{"prompt", 5}}, "prompt"},
           {"/tokenize", json::object(), "prompt"},
           {"/detokenize", json{{"tokens", {1, -2}}}, "tokens"},
           {"/detokenize", json{{"tokens", {1, 1000000}}}, "tokens"},
           {"/detokenize", json{{"tokens", "abc"}}, "tokens"}}) {
    r = HttpCall(port, "POST", path, bad.dump());
    EXPECT_EQ(r.status, 400) << path << " " << bad.dump() << ": " << r.body;
    EXPECT_EQ(json::parse(r.body)["error"]["param"], param) << r.body;
  }
  r = HttpCall(port, "POST", "/tokenize", json{{"model", "other"}, {"prompt", "x"}}.dump());
  EXPECT_EQ(r.status, 404) << r.body;
  r = HttpCall(port, "GET", "/v1/models");
  ASSERT_EQ(r.status, 200) << r.body;
  const json m = json::parse(r.body)["data"][0];
  EXPECT_EQ(m["max_model_len"], 128);
  EXPECT_GT(m["created"].get<int64_t>(), 1700000000);
}

class EchoDaemonsTp1 : public Daemons {
 protected:
  testing::DaemonClusterOptions Options() const override {
    auto o = Daemons::Options();
    o.parallel_toml = "tp = 1\npp = 1\n";
    o.workers = 1;
    return o;
  }
};

TEST_F(EchoDaemonsTp1, PromptLogprobsMatchTransformersAndTokenizeWorks) {
  CheckEchoAgainstReference(port_, ModelName());
  CheckTokenizeEndpoints(port_, ModelName());
}

TEST_F(Daemons, EchoPromptLogprobsMatchTransformersAtTp2Pp2) {
  CheckEchoAgainstReference(port_, ModelName());
}

}  // namespace
}  // namespace tessera
