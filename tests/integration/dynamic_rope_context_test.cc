// Dynamic NTK RoPE past max_position_embeddings (issue 16 item 4): one rule
// (ModelContextLimit, common/format/model_config.h) bounds the context for
// the coordinator and the CLI. The mistral_dynamic fixture
// (max_position_embeddings 16, rope_scaling dynamic x2) accepts
// scheduler.max_context = 256 and its daemons serve a 100 + 16 token request
// with the one-process CLI's tokens; a default-rope model still refuses a
// max_context over its max_position_embeddings at start.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "common/format/model_config.h"
#include "support/daemons_fixture.h"
#include "support/test_util.h"

namespace tessera {
namespace {

using json = nlohmann::json;

std::string LongPrompt() {
  std::string p;
  for (int i = 0; i < 8; ++i) p += "the cat is on the mat. ";  // 100+ tokens
  return p;
}

TEST(ModelContextLimit, DynamicNtkRunsPastMaxPositionEmbeddings) {
  auto dynamic = LoadModelConfig(::tessera::testing::FixturePath("models/mistral_dynamic"));
  ASSERT_TRUE(dynamic.ok()) << dynamic.status().ToString();
  const ContextLimit d = ModelContextLimit(*dynamic);
  EXPECT_TRUE(d.unbounded());
  EXPECT_EQ(d.default_tokens, 32);  // 16 x factor 2
  auto plain = LoadModelConfig(::tessera::testing::FixturePath("models/llama_gqa_f32"));
  ASSERT_TRUE(plain.ok());
  const ContextLimit p = ModelContextLimit(*plain);
  EXPECT_EQ(p.max_tokens, 128);
  EXPECT_EQ(p.default_tokens, 128);
  EXPECT_EQ(p.bound, "max_position_embeddings 128");
  // A sliding window bounds nothing: attention applies it past any length.
  ModelConfig windowed = *dynamic;
  windowed.sliding_window = 64;
  EXPECT_TRUE(ModelContextLimit(windowed).unbounded());
}

class DynamicRopeDaemons : public Daemons {
 protected:
  std::string ModelName() const override { return "mistral_dynamic"; }
  ::tessera::testing::DaemonClusterOptions Options() const override {
    auto o = Daemons::Options();
    o.parallel_toml = "tp = 1\npp = 1\n";
    o.workers = 1;
    o.scheduler_toml = "max_context = 256\nqueue_limit = 8\nmax_sequences = 4\n";
    o.model_toml = "";
    return o;
  }
};

TEST_F(DynamicRopeDaemons, ServeAHundredPlusSixteenTokensAsTheCli) {
  json req = {{"model", "mistral_dynamic"},
              {"prompt", LongPrompt()},
              {"max_tokens", 16},
              {"temperature", 0},
              {"ignore_eos", true}};
  const HttpReply r = HttpCall(port_, "POST", "/v1/completions", req.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  const json body = json::parse(r.body);
  EXPECT_GE(body["usage"]["prompt_tokens"].get<int>(), 100) << r.body;
  EXPECT_GT(body["usage"]["prompt_tokens"].get<int>(), 16 * 2);  // past the default context too
  EXPECT_EQ(body["usage"]["completion_tokens"].get<int>(), 16) << r.body;
  // Without ignore_eos (the CLI has no such flag), as the CLI runs it.
  req.erase("ignore_eos");
  const HttpReply plain = HttpCall(port_, "POST", "/v1/completions", req.dump());
  ASSERT_EQ(plain.status, 200) << plain.body;
  const std::string text = json::parse(plain.body)["choices"][0]["text"].get<std::string>();
  // The one-process CLI (whose dynamic-rope output matches transformers)
  // gives the same text.
  const auto cli = ::tessera::testing::RunCommand(
      ::tessera::testing::BinaryDir() + "/tessera generate --model " + model_ + " --prompt '" +
      LongPrompt() + "' --raw --max-tokens 16");
  ASSERT_EQ(cli.rc, 0);
  // RunCommand merges stderr: the answer is what precedes the stats line.
  EXPECT_EQ(cli.output.substr(0, cli.output.find("tessera: tp=")), text + "\n") << cli.output;
}

// A default-rope model (max_position_embeddings 128) still refuses
// scheduler.max_context = 256 at start, naming the key and the bound.
TEST(DynamicRopeContext, DefaultRopeModelRefusesAMaxContextOverItsPositions) {
  const std::string dir = ::tessera::testing::MakeTempDir("tessera-rope-ctx");
  std::ofstream(dir + "/c.toml") << "[model]\npath = \""
                                 << ::tessera::testing::FixturePath("models/llama_gqa_f32")
                                 << "\"\n[server]\nport = 0\ncontrol_endpoint = "
                                    "\"tcp://127.0.0.1:0\"\n[control]\nallow_unauthenticated = "
                                    "true\n[scheduler]\nmax_context = 256\n";
  const int rc = ::tessera::testing::RunDaemonUntilExit(
      "tessera-coordinator", {"--config", dir + "/c.toml"}, dir + "/coordinator.log", 60);
  const std::string log = ::tessera::testing::ReadFileOrDie(dir + "/coordinator.log");
  EXPECT_NE(rc, 0) << log;
  EXPECT_NE(rc, -1) << "the coordinator did not refuse: " << log;
  EXPECT_NE(log.find("scheduler.max_context"), std::string::npos) << log;
  EXPECT_NE(log.find("256 exceeds the model's max_position_embeddings 128"), std::string::npos)
      << log;
}

}  // namespace
}  // namespace tessera
