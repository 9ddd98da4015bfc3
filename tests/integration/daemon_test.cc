// The daemons end to end: tessera-coordinator and four tessera-worker
// processes (tp=2 x pp=2) on loopback, real ZeroMQ, Gloo and HTTP; and three
// workers with a different tp per stage (tp = [2, 1], pp = 2). The engine
// references come from tests/support/model_harness.h (one process, tp = pp = 1).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "common/net/http_client.h"
#include "common/tokenizer/chat_template.h"
#include "common/tokenizer/tokenizer.h"
#include "coordinator/api/token_texts.h"
#include "support/daemons_fixture.h"
#include "support/model_harness.h"
#include "support/test_util.h"

namespace tessera {
namespace {

using nlohmann::json;

using ::tessera::testing::Spawn;

TEST_F(Daemons, GreedyTokenPromptsMatchTheReferenceAndStreamsComplete) {
  const json ref = json::parse(::tessera::testing::ReadFileOrDie(model_ + "/reference.json"));
  auto tok = Tokenizer::Load(model_);
  ASSERT_TRUE(tok.ok());
  for (const json& p : ref["prompts"]) {
    json req = {{"model", "llama_gqa_f32"},
                {"prompt", p["ids"]},
                {"max_tokens", 16},
                {"temperature", 0},
                {"ignore_eos", true}};
    auto r = HttpCall(port_, "POST", "/v1/completions", req.dump());
    ASSERT_EQ(r.status, 200) << r.body;
    const json body = json::parse(r.body);
    EXPECT_EQ(body["choices"][0]["text"].get<std::string>(),
              (*tok)->Decode(p["greedy"].get<std::vector<int32_t>>(), true));
    EXPECT_EQ(body["usage"]["completion_tokens"].get<int>(), 16);
  }
  // 32 concurrent streamed requests all complete with [DONE].
  std::atomic<int> ok{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 32; ++i) {
    threads.emplace_back([&, i] {
      json req = {{"model", "llama_gqa_f32"},
                  {"prompt", std::vector<int>{5 + i, 17, 42}},
                  {"max_tokens", 8},
                  {"temperature", 0.7},
                  {"seed", i},
                  {"stream", true},
                  {"ignore_eos", true}};
      auto r = HttpCall(port_, "POST", "/v1/completions", req.dump());
      if (r.status == 200 && !r.events.empty() && r.events.back() == "[DONE]") ++ok;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), 32);
}

// The response is an OpenAI error object with `status`, a message, a type
// and (when given) the request field at fault.
void ExpectApiError(const HttpReply& r, int status, const std::string& param,
                    const std::string& what) {
  SCOPED_TRACE(what);
  EXPECT_EQ(r.status, status) << r.body;
  const json body = json::parse(r.body, nullptr, false);
  ASSERT_TRUE(body.is_object() && body.contains("error")) << r.body;
  const json& e = body["error"];
  ASSERT_TRUE(e.contains("message") && e["message"].is_string()) << r.body;
  EXPECT_FALSE(e["message"].get<std::string>().empty());
  ASSERT_TRUE(e.contains("type") && e["type"].is_string()) << r.body;
  if (!param.empty()) {
    ASSERT_TRUE(e.contains("param") && e["param"].is_string()) << r.body;
    EXPECT_EQ(e["param"].get<std::string>(), param) << r.body;
  }
}

// Every bad input the API names: malformed JSON, wrong types, out-of-range
// values, an unknown model, a context that is too long; for completions and
// chat. Each gets its 4xx with OpenAI's error shape, and the daemon serves on.
TEST_F(Daemons, BadRequestsGet4xxAndTheDaemonKeepsServing) {
  const std::string cmp = "/v1/completions", chat = "/v1/chat/completions";
  const std::string m = "\"model\":\"llama_gqa_f32\"";
  const std::string msgs = "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]";
  struct Case {
    std::string target, body, param, what;
    int status = 400;
  };
  const std::vector<Case> cases = {
      // Malformed JSON.
      {cmp, "{not json", "", "malformed JSON (completions)"},
      {chat, "{\"messages\": [", "", "truncated JSON (chat)"},
      {cmp, "[1, 2]", "", "a body that is not an object"},
      // Wrong types.
      {cmp, "{" + m + ",\"prompt\":\"x\",\"temperature\":\"hot\"}", "temperature",
       "temperature as a string"},
      {cmp, "{" + m + ",\"prompt\":5}", "prompt", "prompt as a number"},
      {cmp, "{" + m + ",\"prompt\":\"x\",\"max_tokens\":\"ten\"}", "max_tokens",
       "max_tokens as a string"},
      {cmp, "{" + m + ",\"prompt\":\"x\",\"stop\":7}", "stop", "stop as a number"},
      {cmp, "{" + m + ",\"prompt\":\"x\",\"stream\":\"yes\"}", "stream", "stream as a string"},
      {chat, "{" + m + ",\"messages\":\"hi\"}", "messages", "messages as a string"},
      {chat, "{" + m + ",\"messages\":[{\"role\":\"user\",\"content\":3}]}", "messages[0].content",
       "message content as a number"},
      {chat, "{" + m + "}", "messages", "chat without messages"},
      {cmp, "{" + m + "}", "prompt", "completion without prompt"},
      // Out-of-range values.
      {cmp, "{" + m + ",\"prompt\":\"x\",\"top_p\":7}", "top_p", "top_p 7"},
      {cmp, "{" + m + ",\"prompt\":\"x\",\"temperature\":-1}", "temperature", "temperature -1"},
      {chat, "{" + m + "," + msgs + ",\"temperature\":9}", "temperature", "chat temperature 9"},
      {cmp, "{" + m + ",\"prompt\":\"x\",\"top_k\":-2}", "top_k", "top_k -2"},
      {cmp, "{" + m + ",\"prompt\":\"x\",\"max_tokens\":0}", "max_tokens", "max_tokens 0"},
      {cmp, "{" + m + ",\"prompt\":\"x\",\"n\":500}", "n", "n 500"},
      // (The scheduler names the prompt in the message.)
      {cmp, "{" + m + ",\"prompt\":[1,2,99999]}", "", "token id beyond the vocabulary"},
      {cmp, "{" + m + ",\"prompt\":\"x\",\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\"]}", "stop",
       "five stop sequences"},
      // Unknown model: 404 model_not_found.
      {cmp, "{\"model\":\"gpt-9\",\"prompt\":\"x\"}", "model", "unknown model (completions)", 404},
      {chat, "{\"model\":\"gpt-9\"," + msgs + "}", "model", "unknown model (chat)", 404},
  };
  for (const Case& c : cases)
    ExpectApiError(HttpCall(port_, "POST", c.target, c.body), c.status, c.param, c.what);
  // Context too long: the message names the limit (scheduler.max_context).
  auto too_long = HttpCall(
      port_, "POST", cmp,
      json({{"model", "llama_gqa_f32"}, {"prompt", std::vector<int>(120, 3)}, {"max_tokens", 50}})
          .dump());
  ExpectApiError(too_long, 400, "prompt", "context too long (completions)");
  EXPECT_NE(too_long.body.find("128"), std::string::npos) << too_long.body;
  auto chat_too_long =
      HttpCall(port_, "POST", chat,
               json({{"model", "llama_gqa_f32"},
                     {"messages", {{{"role", "user"}, {"content", std::string(400, 'z')}}}}})
                   .dump());
  ExpectApiError(chat_too_long, 400, "messages", "context too long (chat)");
  EXPECT_NE(chat_too_long.body.find("128"), std::string::npos) << chat_too_long.body;
  // Admin without the token.
  EXPECT_EQ(HttpCall(port_, "GET", "/admin/plan").status, 401);
  auto plan = HttpCall(port_, "GET", "/admin/plan", "", "s3cret");
  ASSERT_EQ(plan.status, 200);
  EXPECT_EQ(json::parse(plan.body)["ranks"].size(), 4u);
  // /admin/cluster in pages: 4 workers 3 to a page are 2 pages; a bad page
  // query is a 400 naming the parameter.
  const json page0 =
      json::parse(HttpCall(port_, "GET", "/admin/cluster?page_size=3", "", "s3cret").body);
  EXPECT_EQ(page0["workers"].size(), 3u);
  EXPECT_EQ(page0["workers_total"], 4);
  EXPECT_EQ(page0["pages"], 2);
  EXPECT_EQ(page0["replicas_total"], 1);
  EXPECT_EQ(page0["replicas_ready"], 1);
  const json page1 =
      json::parse(HttpCall(port_, "GET", "/admin/cluster?page=1&page_size=3", "", "s3cret").body);
  ASSERT_EQ(page1["workers"].size(), 1u);
  EXPECT_TRUE(page1["replicas"].empty());  // replica 0 is on page 0
  for (const json& w : page0["workers"]) EXPECT_NE(w["id"], page1["workers"][0]["id"]);
  for (const char* bad : {"page=-1", "page_size=0", "page_size=5000", "page=x", "pages=1"}) {
    auto r = HttpCall(port_, "GET", std::string("/admin/cluster?") + bad, "", "s3cret");
    EXPECT_EQ(r.status, 400) << bad << ": " << r.body;
    EXPECT_NE(r.body.find(std::string(bad).substr(0, std::string(bad).find('='))),
              std::string::npos)
        << r.body;
  }
  // Still serving, streamed and not.
  auto r = HttpCall(port_, "POST", cmp, "{" + m + ",\"prompt\":[1,2,3],\"max_tokens\":2}");
  EXPECT_EQ(r.status, 200) << r.body;
  auto s =
      HttpCall(port_, "POST", chat, "{" + m + "," + msgs + ",\"max_tokens\":2,\"stream\":true}");
  EXPECT_EQ(s.status, 200) << s.body;
  ASSERT_FALSE(s.events.empty());
  EXPECT_EQ(s.events.back(), "[DONE]");
}

// Stop strings cut the output before the first occurrence of any of them,
// the stop string itself excluded, streamed or not; finish_reason "stop".
TEST_F(Daemons, StopStringsCutTheOutput) {
  const json ref = json::parse(::tessera::testing::ReadFileOrDie(model_ + "/reference.json"));
  auto tok = Tokenizer::Load(model_);
  ASSERT_TRUE(tok.ok());
  int cases = 0;
  for (const json& p : ref["prompts"]) {
    const auto greedy = p["greedy"].get<std::vector<int32_t>>();
    const std::string full = (*tok)->Decode(greedy, true);
    // A 3-byte ASCII piece from the middle of the greedy text (after the
    // first few tokens), so the cut lands inside the generation.
    const size_t from = (*tok)->Decode({greedy.begin(), greedy.begin() + 4}, true).size();
    size_t at = std::string::npos;
    for (size_t i = from; i + 3 <= full.size() && at == std::string::npos; ++i) {
      bool ascii = true;
      for (size_t k = i; k < i + 3; ++k)
        ascii = ascii && static_cast<unsigned char>(full[k]) < 0x80 && full[k] > ' ';
      if (ascii) at = i;
    }
    if (at == std::string::npos) continue;
    const std::string stop = full.substr(at, 3);
    const std::string expected = full.substr(0, full.find(stop));
    ++cases;
    for (bool stream : {false, true}) {
      SCOPED_TRACE("stop \"" + stop + "\" stream " + std::to_string(stream));
      json req = {{"model", "llama_gqa_f32"}, {"prompt", p["ids"]},
                  {"max_tokens", 16},         {"temperature", 0},
                  {"ignore_eos", true},       {"stop", {"never-appears", stop}},
                  {"stream", stream}};
      auto r = HttpCall(port_, "POST", "/v1/completions", req.dump());
      ASSERT_EQ(r.status, 200) << r.body;
      std::string text, finish;
      if (stream) {
        ASSERT_FALSE(r.events.empty());
        EXPECT_EQ(r.events.back(), "[DONE]");
        for (const std::string& e : r.events) {
          if (e == "[DONE]") break;
          const json c = json::parse(e);
          ASSERT_FALSE(c.contains("error")) << e;
          if (c["choices"].empty()) continue;
          text += c["choices"][0].value("text", "");
          if (c["choices"][0]["finish_reason"].is_string())
            finish = c["choices"][0]["finish_reason"].get<std::string>();
        }
      } else {
        const json body = json::parse(r.body);
        text = body["choices"][0]["text"].get<std::string>();
        finish = body["choices"][0]["finish_reason"].get<std::string>();
      }
      EXPECT_EQ(text, expected);
      EXPECT_EQ(finish, "stop");
    }
  }
  EXPECT_GE(cases, 3);
  // Chat, streamed: the greedy answer without a stop string, then cut at a
  // piece of it.
  json chat = {{"model", "llama_gqa_f32"},
               {"messages", {{{"role", "user"}, {"content", "the old man and the sea"}}}},
               {"max_tokens", 16},
               {"temperature", 0},
               {"ignore_eos", true}};
  auto whole = HttpCall(port_, "POST", "/v1/chat/completions", chat.dump());
  ASSERT_EQ(whole.status, 200) << whole.body;
  const std::string content =
      json::parse(whole.body)["choices"][0]["message"]["content"].get<std::string>();
  size_t at = std::string::npos;
  for (size_t i = content.size() / 3; i + 2 <= content.size() && at == std::string::npos; ++i)
    if (static_cast<unsigned char>(content[i]) < 0x80 && content[i] > ' ' &&
        static_cast<unsigned char>(content[i + 1]) < 0x80 && content[i + 1] > ' ')
      at = i;
  ASSERT_NE(at, std::string::npos) << content;
  const std::string stop = content.substr(at, 2);
  chat["stop"] = stop;
  chat["stream"] = true;
  auto cut = HttpCall(port_, "POST", "/v1/chat/completions", chat.dump());
  ASSERT_EQ(cut.status, 200) << cut.body;
  std::string text, finish;
  for (const std::string& e : cut.events) {
    if (e == "[DONE]") break;
    const json c = json::parse(e);
    if (c["choices"].empty()) continue;
    const json& d = c["choices"][0]["delta"];
    if (d.contains("content") && d["content"].is_string()) text += d["content"].get<std::string>();
    if (c["choices"][0]["finish_reason"].is_string())
      finish = c["choices"][0]["finish_reason"].get<std::string>();
  }
  EXPECT_EQ(text, content.substr(0, content.find(stop))) << "stop \"" << stop << "\"";
  EXPECT_EQ(finish, "stop");
}

// The single-process engine's view of a greedy generation: the tokens and,
// per generated position, log_softmax (in double) of the full-vocab logits.
struct EngineLogprobs {
  std::vector<int32_t> tokens;
  std::vector<std::vector<double>> logprobs;  // [tokens][vocab]
};

EngineLogprobs EngineReference(::tessera::testing::LocalModel& local,
                               const std::vector<int32_t>& prompt, int n) {
  EngineLogprobs out;
  auto gen = local.Greedy({prompt}, n);
  EXPECT_TRUE(gen.ok()) << gen.status().ToString();
  if (!gen.ok()) return out;
  out.tokens = (*gen)[0];
  std::vector<int32_t> seq = prompt;
  for (int32_t t : out.tokens) {
    auto logits = local.LastLogits(seq);
    EXPECT_TRUE(logits.ok()) << logits.status().ToString();
    if (!logits.ok()) return out;
    const double m = *std::max_element(logits->begin(), logits->end());
    double sum = 0.0;
    for (float l : *logits) sum += std::exp(l - m);
    std::vector<double> lp;
    for (float l : *logits) lp.push_back(l - m - std::log(sum));
    out.logprobs.push_back(std::move(lp));
    seq.push_back(t);
  }
  return out;
}

// The daemons' logprobs against the engine's log-softmax of the same prompt.
constexpr double kLogprobTol = 2e-3;

// Whether some token of `vocab` whose single-token text is `text` has the
// engine logprob `value`.
bool SomeTokenMatches(const Tokenizer& tok, const std::vector<double>& lp, const std::string& text,
                      double value) {
  for (size_t id = 0; id < lp.size(); ++id) {
    const int32_t i = static_cast<int32_t>(id);
    if (std::abs(lp[id] - value) < kLogprobTol && tok.Decode(&i, 1, false) == text) return true;
  }
  return false;
}

// The k largest values of `lp`, descending.
std::vector<double> TopValues(std::vector<double> lp, size_t k) {
  std::sort(lp.rbegin(), lp.rend());
  lp.resize(std::min(k, lp.size()));
  return lp;
}

// Chat content entries {token, logprob, bytes, top_logprobs} against the
// engine: the sampled token's text and value, top_logprobs best first with
// the engine's values, the greedy token first.
void ExpectChatContent(const json& content, const EngineLogprobs& ref, const Tokenizer& tok,
                       size_t top) {
  ASSERT_TRUE(content.is_array()) << content;
  ASSERT_EQ(content.size(), ref.tokens.size()) << content;
  for (size_t i = 0; i < content.size(); ++i) {
    SCOPED_TRACE("chat token " + std::to_string(i));
    const json& c = content[i];
    const int32_t id = ref.tokens[i];
    const std::string text = tok.Decode(&id, 1, false);
    EXPECT_EQ(c["token"].get<std::string>(), text);
    EXPECT_EQ(c["bytes"].size(), text.size());
    const double v = c["logprob"].get<double>();
    EXPECT_LE(v, 0.0);
    EXPECT_NEAR(v, ref.logprobs[i][static_cast<size_t>(id)], kLogprobTol);
    const json& alts = c["top_logprobs"];
    ASSERT_EQ(alts.size(), top) << c;
    const std::vector<double> want = TopValues(ref.logprobs[i], top);
    for (size_t j = 0; j < alts.size(); ++j) {
      const double a = alts[j]["logprob"].get<double>();
      EXPECT_LE(a, 0.0);
      if (j > 0) {
        EXPECT_GE(alts[j - 1]["logprob"].get<double>(), a);
      }
      EXPECT_NEAR(a, want[j], kLogprobTol) << "top " << j;
      EXPECT_TRUE(SomeTokenMatches(tok, ref.logprobs[i], alts[j]["token"].get<std::string>(), a))
          << alts[j];
    }
    // Greedy: the sampled token is the top-1 entry.
    EXPECT_EQ(alts[0]["token"], c["token"]);
    EXPECT_EQ(alts[0]["logprob"].get<double>(), v);
  }
}

// logprobs on /v1/completions (legacy shape) and /v1/chat/completions
// (content shape), streamed and not, through the tp=2 x pp=2 daemons (the
// vocab-parallel lm_head's logits all-gathered on the last stage): the
// values equal the single-process engine's log-softmax of the same prompt.
TEST_F(Daemons, LogprobsMatchTheSingleProcessEngine) {
  const json reference = json::parse(::tessera::testing::ReadFileOrDie(model_ + "/reference.json"));
  auto tok_or = Tokenizer::Load(model_);
  ASSERT_TRUE(tok_or.ok());
  const Tokenizer& tok = **tok_or;
  auto local = ::tessera::testing::LocalModel::Load(model_);
  ASSERT_TRUE(local.ok()) << local.status().ToString();
  const int n = 5;

  // Completions: logprobs 5 (top alternatives as {text: logprob} maps).
  const auto prompt = reference["prompts"][0]["ids"].get<std::vector<int32_t>>();
  const EngineLogprobs ref = EngineReference(**local, prompt, n);
  ASSERT_EQ(ref.tokens.size(), static_cast<size_t>(n));
  json req = {{"model", "llama_gqa_f32"}, {"prompt", prompt},   {"max_tokens", n},
              {"temperature", 0},         {"ignore_eos", true}, {"logprobs", 5}};
  auto r = HttpCall(port_, "POST", "/v1/completions", req.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  const json lp = json::parse(r.body)["choices"][0]["logprobs"];
  ASSERT_TRUE(lp.is_object()) << r.body;
  for (const char* key : {"tokens", "token_logprobs", "top_logprobs", "text_offset"})
    ASSERT_EQ(lp[key].size(), static_cast<size_t>(n)) << key << ": " << lp;
  int64_t offset = 0;
  // tokens[i] is the text token i added to the choice text (issue 16: so
  // text_offset indexes the text; a partial UTF-8 byte adds ""), the
  // alternatives stay single-token decodes.
  const std::string choice_text = json::parse(r.body)["choices"][0]["text"].get<std::string>();
  const std::vector<std::string> added = IncrementalTokenTexts(tok, ref.tokens, choice_text);
  for (int i = 0; i < n; ++i) {
    SCOPED_TRACE("completion token " + std::to_string(i));
    const int32_t id = ref.tokens[static_cast<size_t>(i)];
    const std::string text = tok.Decode(&id, 1, false);
    EXPECT_EQ(lp["tokens"][i].get<std::string>(), added[static_cast<size_t>(i)]);
    EXPECT_EQ(choice_text.substr(static_cast<size_t>(offset), added[static_cast<size_t>(i)].size()),
              added[static_cast<size_t>(i)]);
    const double v = lp["token_logprobs"][i].get<double>();
    EXPECT_LE(v, 0.0);
    EXPECT_NEAR(v, ref.logprobs[static_cast<size_t>(i)][static_cast<size_t>(id)], kLogprobTol);
    EXPECT_EQ(lp["text_offset"][i].get<int64_t>(), offset);
    offset += static_cast<int64_t>(added[static_cast<size_t>(i)].size());
    const json& alts = lp["top_logprobs"][i];
    ASSERT_TRUE(alts.is_object() && !alts.empty() && alts.size() <= 5u) << alts;
    double best = -1e30;
    for (const auto& [key, value] : alts.items()) {
      EXPECT_LE(value.get<double>(), 0.0);
      EXPECT_TRUE(
          SomeTokenMatches(tok, ref.logprobs[static_cast<size_t>(i)], key, value.get<double>()))
          << key << ": " << value;
      best = std::max(best, value.get<double>());
    }
    // Greedy: the sampled token is the best alternative, with its own value.
    EXPECT_EQ(best, v);
    ASSERT_TRUE(alts.contains(text)) << alts;
    EXPECT_EQ(alts[text].get<double>(), v);
  }

  // Streamed, the chunks' logprobs add up to the same lists (within the
  // prefix cache's 1e-5: this second request of the same prompt reuses the
  // first one's KV blocks and prefills only its last block, in another
  // shape).
  req["stream"] = true;
  auto st = HttpCall(port_, "POST", "/v1/completions", req.dump());
  ASSERT_EQ(st.status, 200) << st.body;
  ASSERT_FALSE(st.events.empty());
  EXPECT_EQ(st.events.back(), "[DONE]");
  json tokens = json::array(), values = json::array(), offsets = json::array();
  for (size_t e = 0; e + 1 < st.events.size(); ++e) {
    const json chunk = json::parse(st.events[e]);
    const json& l = chunk["choices"][0]["logprobs"];
    if (l.is_null()) continue;
    for (size_t k = 0; k < l["tokens"].size(); ++k) {
      tokens.push_back(l["tokens"][k]);
      values.push_back(l["token_logprobs"][k]);
      offsets.push_back(l["text_offset"][k]);
    }
  }
  EXPECT_EQ(tokens, lp["tokens"]);
  EXPECT_EQ(offsets, lp["text_offset"]);
  ASSERT_EQ(values.size(), static_cast<size_t>(n));
  for (int i = 0; i < n; ++i)
    EXPECT_NEAR(values[i].get<double>(), lp["token_logprobs"][i].get<double>(), 1e-5);

  // Chat: logprobs true, top_logprobs 3, on the chatml-rendered prompt.
  auto tmpl = ChatTemplate::FromName("chatml");
  ASSERT_TRUE(tmpl.ok());
  const std::vector<ChatMessage> messages = {{"user", "the cat"}};
  auto rendered = tmpl->Render(messages);
  ASSERT_TRUE(rendered.ok());
  const EngineLogprobs chat_ref = EngineReference(**local, tok.Encode(*rendered, true), n);
  ASSERT_EQ(chat_ref.tokens.size(), static_cast<size_t>(n));
  json chat = {
      {"model", "llama_gqa_f32"}, {"messages", {{{"role", "user"}, {"content", "the cat"}}}},
      {"max_tokens", n},          {"temperature", 0},
      {"ignore_eos", true},       {"logprobs", true},
      {"top_logprobs", 3}};
  auto c = HttpCall(port_, "POST", "/v1/chat/completions", chat.dump());
  ASSERT_EQ(c.status, 200) << c.body;
  const json content = json::parse(c.body)["choices"][0]["logprobs"]["content"];
  {
    SCOPED_TRACE("chat");
    ExpectChatContent(content, chat_ref, tok, 3);
  }
  chat["stream"] = true;
  auto cs = HttpCall(port_, "POST", "/v1/chat/completions", chat.dump());
  ASSERT_EQ(cs.status, 200) << cs.body;
  ASSERT_FALSE(cs.events.empty());
  EXPECT_EQ(cs.events.back(), "[DONE]");
  json streamed = json::array();
  for (size_t e = 0; e + 1 < cs.events.size(); ++e) {
    const json chunk = json::parse(cs.events[e]);
    const json& l = chunk["choices"][0]["logprobs"];
    if (l.is_null()) continue;
    for (const json& entry : l["content"]) streamed.push_back(entry);
  }
  {
    SCOPED_TRACE("chat stream");
    ExpectChatContent(streamed, chat_ref, tok, 3);
  }

  // Without the fields, no logprobs; logprobs true alone: no alternatives.
  chat.erase("stream");
  chat.erase("top_logprobs");
  chat["logprobs"] = false;
  auto none = HttpCall(port_, "POST", "/v1/chat/completions", chat.dump());
  ASSERT_EQ(none.status, 200) << none.body;
  EXPECT_TRUE(json::parse(none.body)["choices"][0]["logprobs"].is_null()) << none.body;
  chat["logprobs"] = true;
  auto bare = HttpCall(port_, "POST", "/v1/chat/completions", chat.dump());
  ASSERT_EQ(bare.status, 200) << bare.body;
  const json bare_content = json::parse(bare.body)["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(bare_content.size(), static_cast<size_t>(n)) << bare.body;
  for (const json& entry : bare_content) EXPECT_TRUE(entry["top_logprobs"].empty()) << entry;
}

// A deployment with a tiny admission queue and no chat template.
class SmallQueueDaemons : public Daemons {
 protected:
  ::tessera::testing::DaemonClusterOptions Options() const override {
    auto o = Daemons::Options();
    o.scheduler_toml = "max_context = 128\nqueue_limit = 2\nmax_sequences = 1\n";
    o.model_toml = "";
    return o;
  }
};

// Overload: one running sequence and two queue places; of 12 concurrent
// requests the surplus gets 429 with OpenAI's error shape, the admitted ones
// complete in full, and the daemon serves afterwards.
TEST_F(SmallQueueDaemons, OverloadGets429AndAdmittedRequestsComplete) {
  constexpr int kRequests = 12;
  std::vector<HttpReply> replies(kRequests);
  std::vector<std::thread> threads;
  for (int i = 0; i < kRequests; ++i) {
    threads.emplace_back([&, i] {
      json req = {{"model", "llama_gqa_f32"}, {"prompt", std::vector<int>{5 + i, 17, 42}},
                  {"max_tokens", 60},         {"temperature", 0},
                  {"ignore_eos", true},       {"stream", i % 2 == 1}};
      replies[i] = HttpCall(port_, "POST", "/v1/completions", req.dump());
    });
  }
  for (auto& t : threads) t.join();
  int ok = 0, rejected = 0;
  for (int i = 0; i < kRequests; ++i) {
    const HttpReply& r = replies[i];
    if (r.status == 429) {
      ++rejected;
      ExpectApiError(r, 429, "", "overload");
      const json e = json::parse(r.body)["error"];
      EXPECT_EQ(e["type"], "rate_limit_error") << r.body;
      EXPECT_EQ(e["code"], "queue_full") << r.body;
      continue;
    }
    ASSERT_EQ(r.status, 200) << "request " << i << ": " << r.body;
    ++ok;
    if (i % 2 == 1) {
      int tokens = 0;
      ASSERT_FALSE(r.events.empty());
      EXPECT_EQ(r.events.back(), "[DONE]");
      for (const std::string& e : r.events)
        if (e != "[DONE]") tokens += json::parse(e)["choices"].empty() ? 0 : 1;
      EXPECT_GE(tokens, 2) << "request " << i;
    } else {
      EXPECT_EQ(json::parse(r.body)["usage"]["completion_tokens"].get<int>(), 60) << r.body;
    }
  }
  EXPECT_GE(rejected, 1);
  EXPECT_GE(ok, 1);
  EXPECT_EQ(ok + rejected, kRequests);
  // Still serving once the burst is over.
  auto after =
      HttpCall(port_, "POST", "/v1/completions",
               R"({"model":"llama_gqa_f32","prompt":[1,2,3],"max_tokens":4,"ignore_eos":true})");
  EXPECT_EQ(after.status, 200) << after.body;
  EXPECT_EQ(json::parse(after.body)["usage"]["completion_tokens"].get<int>(), 4);
}

// The model has no recognised chat template and the config names none:
// chat requests get a 400 that says which key to set; completions work.
TEST_F(SmallQueueDaemons, UnknownChatTemplateGets400) {
  auto r = HttpCall(port_, "POST", "/v1/chat/completions",
                    R"({"model":"llama_gqa_f32","messages":[{"role":"user","content":"hi"}]})");
  ExpectApiError(r, 400, "messages", "unknown chat template");
  EXPECT_NE(r.body.find("model.chat_template"), std::string::npos) << r.body;
  auto c = HttpCall(port_, "POST", "/v1/completions",
                    R"({"model":"llama_gqa_f32","prompt":"hi","max_tokens":2})");
  EXPECT_EQ(c.status, 200) << c.body;
}

// The official `openai` Python package (installed by scripts/setup into its
// venv; scripts/test exports TESSERA_PYTHON) against the running daemons.
TEST_F(Daemons, OfficialOpenAIClientWorks) {
  const char* python = std::getenv("TESSERA_PYTHON");
  ASSERT_NE(python, nullptr) << "TESSERA_PYTHON is not set: run the tests through scripts/test";
  const std::string script = ::tessera::testing::FixturePath("../support/openai_client_check.py");
  const std::string cmd =
      std::string(python) + " " + script + " " + std::to_string(port_) + " llama_gqa_f32 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[512];
  while (fgets(buf, sizeof buf, p)) out += buf;
  const int status = pclose(p);
  EXPECT_EQ(WEXITSTATUS(status), 0) << out;
  EXPECT_NE(out.find("openai client checks passed"), std::string::npos) << out;
}

// A lost worker triggers a re-plan onto the survivors (tp=2 x pp=1 from 3
// workers): the request in flight completes instead of failing, and the
// worker is reported failed. tests/integration/reconfigure_test.cc covers faults in
// depth.
TEST_F(Daemons, KilledWorkerIsReportedAndItsRequestCompletesAfterAReplan) {
  HttpReply reply;
  std::thread client([&] {
    json req = {{"model", "llama_gqa_f32"}, {"prompt", std::vector<int>{5, 17}},
                {"max_tokens", 100},        {"stream", true},
                {"ignore_eos", true},       {"temperature", 0}};
    reply = HttpCall(port_, "POST", "/v1/completions", req.dump());
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  kill(cluster_->worker_pid(2), SIGKILL);  // a worker of the plan
  client.join();
  EXPECT_EQ(reply.status, 200);
  EXPECT_EQ(reply.body.find("error"), std::string::npos) << reply.body;
  ASSERT_FALSE(reply.events.empty());
  EXPECT_EQ(reply.events.back(), "[DONE]");
  bool reported = false;
  for (int i = 0; i < 50 && !reported; ++i) {
    auto c = HttpCall(port_, "GET", "/admin/cluster", "", "s3cret");
    reported = c.body.find("\"failed\"") != std::string::npos;
    if (!reported) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(reported);
  const Status ready = cluster_->WaitReady(30);
  EXPECT_TRUE(ready.ok()) << ready.ToString();
  EXPECT_EQ(HttpCall(port_, "GET", "/healthz").status, 200);
}

// Stage 0 at tp=2 feeds stage 1 at tp=1 (common/model/stage_handoff.h): stage 0's
// tp rank 1 sends nothing, the single last-stage rank returns the tokens.
class DaemonsPerStageTp : public Daemons {
 protected:
  ::tessera::testing::DaemonClusterOptions Options() const override {
    auto o = Daemons::Options();
    o.parallel_toml = "tp = [2, 1]\npp = 2\n";
    o.workers = 3;
    return o;
  }
};

TEST_F(DaemonsPerStageTp, GreedyTokensMatchTheReferenceAndThePlanShowsEachStagesTp) {
  const json ref = json::parse(::tessera::testing::ReadFileOrDie(model_ + "/reference.json"));
  auto tok = Tokenizer::Load(model_);
  ASSERT_TRUE(tok.ok());
  for (const json& p : ref["prompts"]) {
    json req = {{"model", "llama_gqa_f32"},
                {"prompt", p["ids"]},
                {"max_tokens", 16},
                {"temperature", 0},
                {"ignore_eos", true}};
    auto r = HttpCall(port_, "POST", "/v1/completions", req.dump());
    ASSERT_EQ(r.status, 200) << r.body;
    const json body = json::parse(r.body);
    EXPECT_EQ(body["choices"][0]["text"].get<std::string>(),
              (*tok)->Decode(p["greedy"].get<std::vector<int32_t>>(), true));
  }
  // Concurrent streams keep the pipeline full (pp micro-batches in flight).
  std::atomic<int> ok{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&, i] {
      json req = {{"model", "llama_gqa_f32"},
                  {"prompt", std::vector<int>{5 + i, 17, 42}},
                  {"max_tokens", 8},
                  {"stream", true},
                  {"ignore_eos", true}};
      auto r = HttpCall(port_, "POST", "/v1/completions", req.dump());
      if (r.status == 200 && !r.events.empty() && r.events.back() == "[DONE]") ++ok;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), 8);
  auto plan = HttpCall(port_, "GET", "/admin/plan", "", "s3cret");
  ASSERT_EQ(plan.status, 200) << plan.body;
  const json pj = json::parse(plan.body);
  EXPECT_EQ(pj["tp"].get<int>(), 0);
  EXPECT_EQ(pj["tp_per_stage"].get<std::vector<int>>(), (std::vector<int>{2, 1}));
  EXPECT_EQ(pj["pp"].get<int>(), 2);
  ASSERT_EQ(pj["ranks"].size(), 3u);
  const int want[3][2] = {{0, 0}, {0, 1}, {1, 0}};  // (stage, tp_rank) of world ranks 0..2
  for (size_t r = 0; r < 3; ++r) {
    EXPECT_EQ(pj["ranks"][r]["world_rank"].get<int>(), static_cast<int>(r));
    EXPECT_EQ(pj["ranks"][r]["stage"].get<int>(), want[r][0]) << "rank " << r;
    EXPECT_EQ(pj["ranks"][r]["tp_rank"].get<int>(), want[r][1]) << "rank " << r;
  }
  // Each worker loaded the shard of its own stage's tp: what it reports
  // equals ShardSpec's prediction, and the two stage-0 halves are equal.
  for (size_t r = 0; r < 3; ++r) {
    EXPECT_EQ(pj["ranks"][r]["weight_bytes"].get<int64_t>(),
              pj["ranks"][r]["predicted_weight_bytes"].get<int64_t>())
        << "rank " << r;
  }
  EXPECT_EQ(pj["ranks"][0]["weight_bytes"].get<int64_t>(),
            pj["ranks"][1]["weight_bytes"].get<int64_t>());
}

}  // namespace
}  // namespace tessera
