// Non-finite logits (issue 16 item 1): a checkpoint whose activations
// overflow (layer 0's down_proj scaled by 1e38: every logit NaN or inf) must
// end each request with an error naming the cause, never with tokens: the
// CLI exits 1 with the message; the daemons answer 500 internal_error, a
// stream ends with an error event; tessera_nonfinite_logits_total counts
// the sequences and the sampling worker logs the model, layers and rank.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <regex>
#include <string>

#include "support/daemons_fixture.h"
#include "support/scaled_model.h"
#include "support/test_util.h"

namespace tessera {
namespace {

using json = nlohmann::json;

// The overflowing model, made once per test process in a temp directory.
// x 1e38 makes layer 0's MLP output overflow to inf (x 1e36 stays finite and
// the next RMSNorm scales it back to zeros: finite, uniform logits).
const std::string& OverflowModel() {
  static const std::string dir = [] {
    const std::string d = ::tessera::testing::MakeTempDir("tessera-overflow") + "/overflow_f32";
    Status s =
        ::tessera::testing::MakeScaledModel(::tessera::testing::FixturePath("models/llama_gqa_f32"),
                                            d, "model.layers.0.mlp.down_proj.weight", 1e38f);
    TESSERA_CHECK(s.ok());
    return d;
  }();
  return dir;
}

TEST(NonFiniteLogitsCli, GenerateExitsOneNamingTheCause) {
  for (const std::string layout : {"", " --tp 2"}) {
    SCOPED_TRACE(layout);
    const auto r = ::tessera::testing::RunCommand(
        ::tessera::testing::BinaryDir() + "/tessera generate --model " + OverflowModel() +
        " --prompt 'the quick brown fox' --raw --max-tokens 4 --timeout 60" + layout + " 2>&1");
    EXPECT_EQ(r.rc, 1) << r.output;
    EXPECT_NE(r.output.find("non-finite logits (NaN or inf)"), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("finish: length"), std::string::npos) << r.output;
  }
  // The same command on the unscaled fixture serves tokens (the check does
  // not fire on finite logits).
  const auto ok = ::tessera::testing::RunCommand(
      ::tessera::testing::BinaryDir() + "/tessera generate --model " +
      ::tessera::testing::FixturePath("models/llama_gqa_f32") +
      " --prompt 'the quick brown fox' --raw --max-tokens 4 2>&1");
  EXPECT_EQ(ok.rc, 0) << ok.output;
}

class NonFiniteDaemons : public Daemons {
 protected:
  std::string ModelPath() const override { return OverflowModel(); }

  double NonFiniteTotal() {
    const HttpReply m = HttpCall(port_, "GET", "/metrics");
    EXPECT_EQ(m.status, 200);
    std::smatch match;
    if (!std::regex_search(m.body, match,
                           std::regex("\ntessera_nonfinite_logits_total ([0-9.e+]+)"))) {
      ADD_FAILURE() << "no tessera_nonfinite_logits_total in /metrics";
      return -1;
    }
    return std::stod(match[1]);
  }

  void ExpectErrorsNotTokens() {
    EXPECT_EQ(NonFiniteTotal(), 0);
    const json req = {{"model", "overflow_f32"},
                      {"prompt", "the quick brown fox"},
                      {"max_tokens", 4},
                      {"temperature", 0}};
    HttpReply r = HttpCall(port_, "POST", "/v1/completions", req.dump());
    ASSERT_EQ(r.status, 500) << r.body;
    const json err = json::parse(r.body)["error"];
    EXPECT_EQ(err["code"], "internal_error") << r.body;
    EXPECT_NE(err["message"].get<std::string>().find("non-finite logits (NaN or inf)"),
              std::string::npos)
        << r.body;
    // Streamed (chat, sampled, with logprobs): no token chunk, an error
    // event last.
    const json chat = {
        {"model", "overflow_f32"}, {"messages", {{{"role", "user"}, {"content", "hi"}}}},
        {"max_tokens", 4},         {"temperature", 0.8},
        {"logprobs", true},        {"top_logprobs", 2},
        {"stream", true}};
    r = HttpCall(port_, "POST", "/v1/chat/completions", chat.dump());
    ASSERT_EQ(r.status, 200) << r.body;
    ASSERT_FALSE(r.events.empty()) << r.body;
    for (const std::string& e : r.events) {
      if (e == "[DONE]") continue;
      const json j = json::parse(e);
      if (!j.contains("choices")) continue;
      for (const json& c : j["choices"]) {
        EXPECT_TRUE(!c["delta"].contains("content") || c["delta"]["content"] == "") << e;
      }
    }
    const json last =
        json::parse(r.events.back() == "[DONE]" ? r.events[r.events.size() - 2] : r.events.back());
    ASSERT_TRUE(last.contains("error")) << r.body;
    EXPECT_NE(last["error"]["message"].get<std::string>().find("non-finite logits"),
              std::string::npos)
        << r.body;
    EXPECT_EQ(NonFiniteTotal(), 2);
    // The daemons keep serving (each request fails the same way).
    EXPECT_EQ(HttpCall(port_, "POST", "/v1/completions", req.dump()).status, 500);
    // The sampling worker (tp_rank 0 of the last stage) logged the cause.
    std::string logs;
    for (int i = 0; i < cluster_->workers_started(); ++i) logs += cluster_->WorkerLog(i);
    EXPECT_NE(logs.find("non-finite logits (NaN or inf) for seq_id"), std::string::npos) << logs;
    EXPECT_NE(logs.find("model llama (LlamaForCausalLM), sampling rank stage 0 tp_rank 0 "
                        "holding layers [0, 2) of 2"),
              std::string::npos)
        << logs;
  }
};

class NonFiniteDaemonsTp1 : public NonFiniteDaemons {
 protected:
  ::tessera::testing::DaemonClusterOptions Options() const override {
    auto o = Daemons::Options();
    o.parallel_toml = "tp = 1\npp = 1\n";
    o.workers = 1;
    return o;
  }
};

class NonFiniteDaemonsTp2 : public NonFiniteDaemons {
 protected:
  ::tessera::testing::DaemonClusterOptions Options() const override {
    auto o = Daemons::Options();
    o.parallel_toml = "tp = 2\npp = 1\n";
    o.workers = 2;
    return o;
  }
};

TEST_F(NonFiniteDaemonsTp1, RequestsFailWith500AndTheCounterCounts) { ExpectErrorsNotTokens(); }
TEST_F(NonFiniteDaemonsTp2, RequestsFailWith500AndTheCounterCounts) { ExpectErrorsNotTokens(); }

}  // namespace
}  // namespace tessera
