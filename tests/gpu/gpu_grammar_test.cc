// Structured outputs on the device: the token-mask kernel
// (kernels/logit_adjust.h MaskLogits) gives the CPU's logits bit for bit over
// a vocab that is not a multiple of 32, and the sampling rank's whole path
// (SequenceSamplers with LLGuidance over the fixture model's tokenizer,
// worker/model/grammar_masks.h) draws from CUDA logits only tokens the
// grammar allows, so greedy and sampled walks both end in a document that
// parses and validates.
#include <nlohmann/json.hpp>

#include "common/grammar/grammar_library_paths.h"
#include "gpu_test_util.h"
#include "kernels/logit_adjust.h"
#include "worker/model/grammar_masks.h"
#include "worker/model/sampler.h"

namespace tessera {
namespace {

TEST(GrammarMask, DeviceMaskEqualsTheCpusAcrossWordEdges) {
  kernels::Backend& g = Gpu(DType::kF32);
  const int64_t rows = 64, vocab = 49153, words = (vocab + 31) / 32;
  HostPair logits = Random({rows, vocab}, 21, DType::kF32, 3.0f);
  std::mt19937_64 rng(9);
  std::vector<int64_t> masked;
  std::vector<uint32_t> bits;
  for (int64_t r = 0; r < rows; r += 2) {  // every other row; the rest stay unmasked
    masked.push_back(r);
    for (int64_t w = 0; w < words; ++w) bits.push_back(static_cast<uint32_t>(rng()));
  }
  Tensor dev = Up(g, logits.f32);
  ASSERT_TRUE(kernels::MaskLogits(logits.f32, masked, bits, words).ok());
  Status s = kernels::MaskLogits(dev, masked, bits, words);
  ASSERT_TRUE(s.ok()) << s.ToString();
  auto back = g.ToHost(dev);
  ASSERT_TRUE(back.ok());
  for (int64_t i = 0; i < rows * vocab; ++i)
    ASSERT_EQ(back->data<float>()[i], logits.f32.data<float>()[i]) << "element " << i;
  std::vector<int32_t> got;
  ASSERT_TRUE(kernels::SampleTokens(dev, std::vector<kernels::SampleRow>(rows), got).ok());
  for (size_t k = 0; k < masked.size(); ++k) {
    const int32_t t = got[static_cast<size_t>(masked[k])];
    EXPECT_TRUE((bits[k * words + t / 32] >> (t % 32)) & 1u) << "row " << masked[k];
  }
}

// Walks one sequence with a json_schema grammar through SequenceSamplers on
// CUDA logits (random, so only the mask makes the output JSON).
std::string Walk(kernels::Backend& g, const SamplingParams& sampling, const Tokenizer& tok,
                 int64_t vocab) {
  SequenceSamplers samplers(ModelGrammarSource(testing::FixturePath("models/llama_gqa_f32"), vocab,
                                               DefaultGrammarLibraryPaths()));
  std::vector<int32_t> out;
  for (int step = 0; step < 80; ++step) {
    StepBatch batch;
    SeqStep s;
    s.seq_id = 1;
    s.start_pos = step == 0 ? 0 : 5 + step;
    s.num_tokens = step == 0 ? 6 : 1;
    s.want_logits = true;
    s.sampling = sampling;
    s.output_start = 6;
    batch.token_ids =
        step == 0 ? std::vector<int32_t>{5, 17, 42, 7, 5, 17} : std::vector<int32_t>{out.back()};
    batch.seqs.push_back(s);
    Tensor dev =
        Up(g, Random({1, vocab}, 100 + static_cast<uint64_t>(step), DType::kF32, 4.0f).f32);
    auto sampled = samplers.Sample(batch, dev);
    EXPECT_TRUE(sampled.ok()) << sampled.status().ToString();
    if (!sampled.ok()) return "";
    const int32_t t = (*sampled)[0].token_id;
    if (t == *tok.eos_id()) break;
    out.push_back(t);
  }
  return tok.Decode(out, true);
}

TEST(GrammarMask, SamplingRankOnCudaFollowsTheSchema) {
  kernels::Backend& g = Gpu(DType::kF32);
  auto tok = Tokenizer::Load(testing::FixturePath("models/llama_gqa_f32"));
  ASSERT_TRUE(tok.ok());
  const nlohmann::json schema = {
      {"type", "object"},
      {"properties", {{"ok", {{"type", "boolean"}}}, {"color", {{"enum", {"red", "green"}}}}}},
      {"required", {"ok", "color"}},
      {"additionalProperties", false}};
  for (float temperature : {0.0f, 1.0f}) {
    SamplingParams p;
    p.temperature = temperature;
    p.seed = 3;
    p.grammar = {GrammarKind::kJsonSchema, schema.dump()};
    const std::string text = Walk(g, p, **tok, 512);
    const auto doc = nlohmann::json::parse(text, nullptr, false);
    ASSERT_TRUE(doc.is_object()) << "temperature " << temperature << ": " << text;
    EXPECT_TRUE(doc["ok"].is_boolean()) << text;
    EXPECT_TRUE(doc["color"] == "red" || doc["color"] == "green") << text;
    EXPECT_EQ(doc.size(), 2u) << text;
  }
}

}  // namespace
}  // namespace tessera
