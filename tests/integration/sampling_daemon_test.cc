// Logits processing end to end (issue 37 section 3): presence, frequency and
// repetition penalties, logit_bias, min_tokens, min_p and stop_token_ids sent
// by the official `openai` client (tests/support/openai_sampling_check.py) to
// real daemons at tp 1 and at tp 2 x pp 2 on CPU. The expected outputs come
// from a reference written here from the published formulas (OpenAI's
// presence/frequency penalties, HF's repetition penalty), applied to the
// logits of the fixture model computed in this process (LocalModel, a full
// prefill per step) and decoded greedily. Then bad input: each field with a
// wrong type, out of range or contradictory is a 400 naming it, and the
// deployment keeps serving.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "support/daemons_fixture.h"
#include "support/model_harness.h"
#include "support/test_util.h"

namespace tessera {
namespace {

using json = nlohmann::json;

struct Case {
  std::string name;
  int max_tokens = 10;
  float presence = 0.0f, frequency = 0.0f, repetition = 1.0f;
  std::map<int32_t, float> bias{};
  int min_tokens = 0;
  std::vector<int32_t> stop_ids{};
  json fields = json::object();  // what the client sends besides prompt and max_tokens
};

const std::vector<int32_t> kPrompt = {5, 17, 42, 7, 5, 17};

struct Reference {
  std::vector<int32_t> ids;  // generated, the stopping token included
  bool stopped = false;      // by EOS or a stop id
  double min_margin = 1e9;   // smallest gap between the best and second adjusted logit
};

// Greedy decoding with the penalties written out from their sources, in
// double precision, on the logits of the prompt plus the tokens so far.
Reference Decode(testing::LocalModel& model, const Case& c, const std::set<int32_t>& eos) {
  Reference r;
  std::vector<int32_t> seq = kPrompt;
  for (int step = 0; step < c.max_tokens; ++step) {
    auto logits = model.LastLogits(seq);
    EXPECT_TRUE(logits.ok()) << logits.status().ToString();
    if (!logits.ok()) return r;
    std::vector<double> l(logits->begin(), logits->end());
    for (int32_t t = 0; t < static_cast<int32_t>(l.size()); ++t) {
      if (auto b = c.bias.find(t); b != c.bias.end()) l[t] += b->second;
      const auto count = std::count(r.ids.begin(), r.ids.end(), t);
      const bool in_prompt = std::count(kPrompt.begin(), kPrompt.end(), t) > 0;
      if (c.repetition != 1.0f && (in_prompt || count > 0))  // HF: score / p if > 0 else * p
        l[t] = l[t] > 0 ? l[t] / c.repetition : l[t] * c.repetition;
      // OpenAI: mu[j] -= c[j] * alpha_frequency + (c[j] > 0) * alpha_presence
      l[t] -= count * c.frequency + (count > 0 ? c.presence : 0.0);
      const bool stop = std::count(c.stop_ids.begin(), c.stop_ids.end(), t) > 0;
      if (static_cast<int>(r.ids.size()) < c.min_tokens && (eos.count(t) || stop))
        l[t] = -std::numeric_limits<double>::infinity();
    }
    const auto best = std::max_element(l.begin(), l.end()) - l.begin();
    double second = -std::numeric_limits<double>::infinity();
    for (size_t t = 0; t < l.size(); ++t)
      if (static_cast<long>(t) != best) second = std::max(second, l[t]);
    r.min_margin = std::min(r.min_margin, l[best] - second);
    r.ids.push_back(static_cast<int32_t>(best));
    seq.push_back(static_cast<int32_t>(best));
    if (eos.count(static_cast<int32_t>(best)) ||
        std::count(c.stop_ids.begin(), c.stop_ids.end(), best) > 0) {
      r.stopped = true;
      break;
    }
  }
  return r;
}

// The cases and their expected outputs, as the check script reads them.
json Cases(const std::string& dir) {
  auto model = testing::LocalModel::Load(testing::FixturePath("models/llama_gqa_f32"));
  EXPECT_TRUE(model.ok()) << model.status().ToString();
  auto tokenizer = Tokenizer::Load(testing::FixturePath("models/llama_gqa_f32"));
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status().ToString();
  if (!model.ok() || !tokenizer.ok()) return json::array();
  std::set<int32_t> eos((*model)->config().eos_token_ids.begin(),
                        (*model)->config().eos_token_ids.end());
  if ((*tokenizer)->eos_id()) eos.insert(*(*tokenizer)->eos_id());
  const Reference plain = Decode(**model, Case{}, eos);
  EXPECT_GE(plain.ids.size(), 4u);
  std::vector<Case> cases;
  auto add = [&](Case c) { cases.push_back(std::move(c)); };
  add({.name = "presence", .presence = 2.0f, .fields = {{"presence_penalty", 2.0}}});
  add({.name = "frequency", .frequency = 1.5f, .fields = {{"frequency_penalty", 1.5}}});
  add({.name = "repetition", .repetition = 1.8f, .fields = {{"repetition_penalty", 1.8}}});
  const int32_t first = plain.ids[0];
  add({.name = "logit_bias",
       .bias = {{first, -100.0f}, {77, 3.0f}},
       .fields = {{"logit_bias", {{std::to_string(first), -100}, {"77", 3}}}}});
  // EOS pushed up: min_tokens holds it back for 4 tokens, then it ends the choice.
  const int32_t eos_id = *eos.begin();
  add({.name = "min_tokens",
       .bias = {{eos_id, 40.0f}},
       .min_tokens = 4,
       .fields = {{"logit_bias", {{std::to_string(eos_id), 40}}}, {"min_tokens", 4}}});
  add({.name = "stop_token_ids",
       .stop_ids = {plain.ids[2]},
       .fields = {{"stop_token_ids", {plain.ids[2]}}}});
  add({.name = "combined",
       .presence = 0.5f,
       .frequency = 0.5f,
       .repetition = 1.3f,
       .bias = {{9, 1.0f}},
       .fields = {{"presence_penalty", 0.5},
                  {"frequency_penalty", 0.5},
                  {"repetition_penalty", 1.3},
                  {"logit_bias", {{"9", 1.0}}}}});
  json out = json::array();
  auto text_of = [&](const Reference& r) {
    std::vector<int32_t> ids = r.ids;
    if (r.stopped) ids.pop_back();  // EOS and stop ids leave no text
    return (*tokenizer)->Decode(ids, true);
  };
  for (const Case& c : cases) {
    const Reference r = Decode(**model, c, eos);
    SCOPED_TRACE(c.name);
    EXPECT_GT(r.min_margin, 1e-3) << "a near tie: the case cannot tell layouts apart";
    EXPECT_NE(r.ids, plain.ids) << "the field changes nothing on this prompt";
    out.push_back({{"name", c.name},
                   {"prompt", kPrompt},
                   {"max_tokens", c.max_tokens},
                   {"fields", c.fields},
                   {"text", text_of(r)},
                   {"finish_reason", r.stopped ? "stop" : "length"},
                   {"completion_tokens", r.ids.size()}});
  }
  EXPECT_EQ(out[4]["completion_tokens"], 5) << out[4].dump();  // 4 held back, then EOS
  EXPECT_EQ(out[4]["finish_reason"], "stop");
  // min_p 1 keeps only the most likely token: greedy at any temperature.
  out.push_back({{"name", "min_p"},
                 {"prompt", kPrompt},
                 {"max_tokens", 10},
                 {"fields", {{"min_p", 1.0}, {"temperature", 1.3}, {"seed", 7}}},
                 {"text", text_of(plain)},
                 {"finish_reason", plain.stopped ? "stop" : "length"},
                 {"completion_tokens", plain.ids.size()}});
  const std::string path = dir + "/sampling_cases.json";
  std::ofstream(path) << out.dump(1);
  return out;
}

void RunCheck(int port, const std::string& model, const std::string& dir) {
  const char* python = std::getenv("TESSERA_PYTHON");
  ASSERT_NE(python, nullptr) << "TESSERA_PYTHON is not set: run the tests through scripts/test";
  const json cases = Cases(dir);
  ASSERT_EQ(cases.size(), 8u);
  const std::string script = testing::FixturePath("../support/openai_sampling_check.py");
  const auto r =
      testing::RunCommand(std::string(python) + " " + script + " " + std::to_string(port) + " " +
                          model + " " + dir + "/sampling_cases.json 2>&1");
  EXPECT_EQ(r.rc, 0) << r.output;
  EXPECT_NE(r.output.find("sampling checks passed (8 cases)"), std::string::npos) << r.output;
}

class SamplingDaemonsTp1 : public Daemons {
 protected:
  testing::DaemonClusterOptions Options() const override {
    auto o = Daemons::Options();
    o.parallel_toml = "tp = 1\npp = 1\n";
    o.workers = 1;
    return o;
  }
};

TEST_F(SamplingDaemonsTp1, EveryControlMatchesTheReferenceAndBadInputIs400) {
  RunCheck(port_, ModelName(), dir_);
}

// tp 2 x pp 2: the penalties run on the last stage's tp rank 0, from the
// history it keeps of the batches it sees.
TEST_F(Daemons, SamplingControlsMatchTheReferenceAtTp2Pp2) { RunCheck(port_, ModelName(), dir_); }

}  // namespace
}  // namespace tessera
