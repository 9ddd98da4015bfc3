// The sampling rank's structured-output state (worker/model/grammar_masks.h)
// through SequenceSamplers on CPU logits, with the real LLGuidance library
// over the fixture model's tokenizer: random logits (so only the mask makes
// JSON) walk greedy and sampled sequences to valid documents; a rank that
// first sees a sequence mid-generation replays its output from the step's
// history and goes on; a sequence whose grammar cannot run gets
// kGrammarFailedToken while the others of its batch are sampled as usual.
#include "worker/model/grammar_masks.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "common/grammar/grammar_library_paths.h"
#include "support/test_util.h"
#include "worker/model/sampler.h"

namespace tessera {
namespace {

using json = nlohmann::json;

constexpr int64_t kVocab = 512;  // the fixture's config.json vocab_size
const std::vector<int32_t> kPrompt = {5, 17, 42, 7, 5, 17};

GrammarSource Source() {
  return ModelGrammarSource(testing::FixturePath("models/llama_gqa_f32"), kVocab,
                            DefaultGrammarLibraryPaths());
}

std::unique_ptr<Tokenizer> FixtureTokenizer() {
  auto t = Tokenizer::Load(testing::FixturePath("models/llama_gqa_f32"));
  EXPECT_TRUE(t.ok());
  return std::move(*t);
}

GrammarSpec Spec() {
  const json schema = {
      {"type", "object"},
      {"properties", {{"ok", {{"type", "boolean"}}}, {"tag", {{"enum", {"a", "b"}}}}}},
      {"required", {"ok", "tag"}},
      {"additionalProperties", false}};
  return {GrammarKind::kJsonSchema, schema.dump()};
}

Tensor RandomLogits(int64_t rows, uint64_t seed) {
  Tensor t = Tensor::Empty({rows, kVocab});
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n(0.0f, 4.0f);
  for (int64_t i = 0; i < rows * kVocab; ++i) t.data<float>()[i] = n(rng);
  return t;
}

// One step of sequence `id`: the prompt at step 0, else the last token.
SeqStep Step(int64_t id, int step, const SamplingParams& p) {
  SeqStep s;
  s.seq_id = id;
  s.start_pos = step == 0 ? 0 : static_cast<int32_t>(kPrompt.size()) + step - 1;
  s.num_tokens = step == 0 ? static_cast<int32_t>(kPrompt.size()) : 1;
  s.prompt_len = static_cast<int32_t>(kPrompt.size());
  s.want_logits = true;
  s.sampling = p;
  s.output_start = static_cast<int32_t>(kPrompt.size());
  return s;
}

// Walks sequence 1 from `first_step` (its earlier output `so_far`, sent as
// history when first_step > 0) until EOS; returns the output's text.
std::string Walk(SequenceSamplers& samplers, const SamplingParams& p, std::vector<int32_t> out,
                 int first_step, const Tokenizer& tok) {
  for (int step = first_step; step < 80; ++step) {
    StepBatch batch;
    SeqStep s = Step(1, step, p);
    if (step == first_step && step > 0) {
      s.history = kPrompt;
      s.history.insert(s.history.end(), out.begin(), out.end() - 1);
    }
    batch.token_ids = step == 0 ? kPrompt : std::vector<int32_t>{out.back()};
    batch.seqs.push_back(s);
    Tensor logits = RandomLogits(1, 1000 + static_cast<uint64_t>(step));
    auto sampled = samplers.Sample(batch, logits);
    EXPECT_TRUE(sampled.ok()) << sampled.status().ToString();
    if (!sampled.ok()) break;
    const int32_t t = (*sampled)[0].token_id;
    EXPECT_GE(t, 0);
    if (t < 0 || t == *tok.eos_id()) break;
    out.push_back(t);
  }
  return tok.Decode(out, true);
}

void ExpectDocument(const std::string& text) {
  const json doc = json::parse(text, nullptr, false);
  ASSERT_TRUE(doc.is_object()) << text;
  EXPECT_EQ(doc.size(), 2u) << text;
  EXPECT_TRUE(doc["ok"].is_boolean()) << text;
  EXPECT_TRUE(doc["tag"] == "a" || doc["tag"] == "b") << text;
}

TEST(SequenceGrammars, RandomLogitsWalkToValidDocumentsGreedyAndSampled) {
  auto tok = FixtureTokenizer();
  for (float temperature : {0.0f, 1.0f}) {
    SCOPED_TRACE(temperature);
    SamplingParams p;
    p.temperature = temperature;
    p.seed = 9;
    p.grammar = Spec();
    SequenceSamplers samplers(Source());
    ExpectDocument(Walk(samplers, p, {}, 0, *tok));
  }
}

TEST(SequenceGrammars, AFreshRankReplaysTheOutputFromHistory) {
  auto tok = FixtureTokenizer();
  SamplingParams p;
  p.grammar = Spec();
  // The first three tokens of a greedy walk, made on one rank...
  SequenceSamplers first(Source());
  std::vector<int32_t> out;
  for (int step = 0; step < 3; ++step) {
    StepBatch batch;
    batch.seqs.push_back(Step(1, step, p));
    batch.token_ids = step == 0 ? kPrompt : std::vector<int32_t>{out.back()};
    Tensor logits = RandomLogits(1, 1000 + static_cast<uint64_t>(step));
    auto sampled = first.Sample(batch, logits);
    ASSERT_TRUE(sampled.ok()) << sampled.status().ToString();
    out.push_back((*sampled)[0].token_id);
  }
  // ...then the sequence moves to a rank that never saw it.
  SequenceSamplers second(Source());
  const std::string text = Walk(second, p, out, 3, *tok);
  ExpectDocument(text);
  SequenceSamplers whole(Source());
  EXPECT_EQ(text, Walk(whole, p, {}, 0, *tok)) << "the replayed walk differs from one rank's";
}

TEST(SequenceGrammars, AFailedGrammarFailsItsSequenceAlone) {
  SequenceSamplers samplers([]() -> StatusOr<std::shared_ptr<const GrammarEngine>> {
    return FailedPrecondition("no LLGuidance here");
  });
  SamplingParams with;
  with.grammar = {GrammarKind::kJsonObject, ""};
  StepBatch batch;
  batch.seqs.push_back(Step(1, 0, with));
  batch.seqs.push_back(Step(2, 0, SamplingParams{}));
  batch.token_ids = kPrompt;
  batch.token_ids.insert(batch.token_ids.end(), kPrompt.begin(), kPrompt.end());
  Tensor logits = RandomLogits(2, 3);
  const float* row1 = logits.data<float>() + kVocab;
  const int32_t argmax = static_cast<int32_t>(std::max_element(row1, row1 + kVocab) - row1);
  auto sampled = samplers.Sample(batch, logits);
  ASSERT_TRUE(sampled.ok()) << sampled.status().ToString();
  EXPECT_EQ((*sampled)[0].token_id, kGrammarFailedToken);
  EXPECT_EQ((*sampled)[1].token_id, argmax);
}

}  // namespace
}  // namespace tessera
