// `tessera generate` on the MoE fixtures (Mixtral, Qwen2-MoE, Qwen3-MoE) as
// a user runs it: the CLI launches the rank processes of the layout itself
// (Gloo over loopback), with --expert-parallel on and off, and its greedy
// text must be transformers' greedy continuation of the fixture's prompt
// (tools/make_fixtures.py, reference.json). The logits-level checks of every
// layout run in sharded_equivalence_test.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/tokenizer/tokenizer.h"
#include "support/test_util.h"

namespace tessera {
namespace {

using nlohmann::json;

struct Case {
  std::string fixture;
  std::string flags;  // layout flags
};

class MoeGenerate : public ::testing::TestWithParam<Case> {};

TEST_P(MoeGenerate, GreedyTextIsTransformers) {
  const Case& c = GetParam();
  const std::string dir = ::tessera::testing::FixturePath("models/" + c.fixture);
  const json ref = json::parse(::tessera::testing::ReadFileOrDie(dir + "/reference.json"));
  auto tok = Tokenizer::Load(dir);
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  // The longest prompt: its prefill spans several experts' tokens.
  const json* prompt = &ref["prompts"][0];
  for (const json& p : ref["prompts"])
    if (p["ids"].size() > (*prompt)["ids"].size()) prompt = &p;
  const std::string text = (*prompt)["text"].get<std::string>();
  ASSERT_EQ(text.find('\''), std::string::npos);  // quoted for the shell below
  const std::vector<int32_t> greedy = (*prompt)["greedy"].get<std::vector<int32_t>>();
  const std::string tmp = ::tessera::testing::MakeTempDir("tessera-moe-generate");
  const auto r = ::tessera::testing::RunCommand(
      ::tessera::testing::BinaryDir() + "/tessera generate --model " + dir + " --prompt '" + text +
      "' --raw --ignore-eos --max-tokens " + std::to_string(greedy.size()) + " --timeout 20 " +
      c.flags + " 2>" + tmp + "/err");
  ASSERT_EQ(r.rc, 0) << ::tessera::testing::ReadFileOrDie(tmp + "/err");
  const std::string out = r.output.substr(0, r.output.find("tessera: tp="));
  EXPECT_EQ(out, (*tok)->Decode(greedy, false) + "\n") << c.fixture << " " << c.flags;
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, MoeGenerate,
    ::testing::Values(Case{"mixtral_moe_top3", "--tp 1"},
                      Case{"mixtral_moe_top3", "--tp 2 --expert-parallel"},
                      Case{"qwen2_moe_shared_mixed", "--tp 2 --pp 2 --expert-parallel"},
                      Case{"qwen2_moe_shared_mixed", "--tp 4"},
                      Case{"qwen3_moe_top1_fused", "--tp 4 --expert-parallel"},
                      Case{"qwen3_moe_top1_fused", "--tp 2,1 --expert-parallel"}),
    [](const auto& info) {
      std::string name = info.param.fixture + "_" + info.param.flags;
      for (char& ch : name)
        if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
      return name;
    });

}  // namespace
}  // namespace tessera
