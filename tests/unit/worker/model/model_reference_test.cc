// Every fixture model in tests/fixtures/models/ against the Hugging Face
// transformers references recorded by tools/make_fixtures.py:
//  - last-position logits within 1e-4 of the fp32 reference, relative to the
//    largest reference logit (bf16/f16 checkpoints are upcast to fp32 on load,
//    as the reference was computed);
//  - logits within a looser bound of the reference computed in the
//    checkpoint's own dtype (kNativeTolerance below, stated per dtype);
//  - 16 greedy tokens identical, except after a step where the reference's
//    top-2 margin is below 1e-3 (a near-tie either side may take);
//  - the prompts batched together give the same tokens as each one alone.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "support/model_harness.h"
#include "support/test_util.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr double kFp32Tolerance = 1e-4;
constexpr double kNearTie = 1e-3;

// Our fp32 compute against HF computing in the checkpoint's own dtype: bf16
// keeps 8 mantissa bits, f16 11, so per-layer rounding accumulates.
double NativeTolerance(const std::string& dtype) {
  if (dtype == "bfloat16") return 6e-2;
  if (dtype == "float16") return 1e-2;
  return kFp32Tolerance;
}

std::vector<std::string> FixtureNames() {
  std::vector<std::string> names;
  const fs::path root = ::tessera::testing::FixturePath("models");
  if (fs::exists(root))
    for (const auto& e : fs::directory_iterator(root))
      if (fs::exists(e.path() / "reference.json")) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

using ::tessera::testing::RelMaxDiff;

// Compares greedy tokens up to the first step whose reference margin is a
// near-tie; returns the number of positions compared.
size_t ExpectGreedyMatch(const std::vector<int32_t>& got, const json& prompt,
                         const std::string& what) {
  const auto want = prompt["greedy"].get<std::vector<int32_t>>();
  const auto margins = prompt["greedy_margins"].get<std::vector<double>>();
  EXPECT_EQ(got.size(), want.size()) << what;
  size_t i = 0;
  for (; i < std::min(got.size(), want.size()); ++i) {
    EXPECT_EQ(got[i], want[i]) << what << " step " << i << " (margin " << margins[i] << ")";
    if (got[i] != want[i] || margins[i] < kNearTie) break;
  }
  return i;
}

class ModelReference : public ::testing::TestWithParam<std::string> {};

TEST_P(ModelReference, LogitsAndGreedyTokensMatchTransformers) {
  const std::string dir = ::tessera::testing::FixturePath("models/" + GetParam());
  const json ref = json::parse(::tessera::testing::ReadFileOrDie(dir + "/reference.json"));
  auto model = ::tessera::testing::LocalModel::Load(dir);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  const std::string dtype = ref["torch_dtype"].get<std::string>();
  std::vector<std::vector<int32_t>> prompts;
  for (const json& p : ref["prompts"]) {
    const auto ids = p["ids"].get<std::vector<int32_t>>();
    prompts.push_back(ids);
    auto logits = (*model)->LastLogits(ids);
    ASSERT_TRUE(logits.ok()) << logits.status().ToString();
    ASSERT_EQ(logits->size(), p["last_logits"].size());
    const double diff = RelMaxDiff(*logits, p["last_logits"]);
    EXPECT_LE(diff, kFp32Tolerance) << GetParam() << " prompt of " << ids.size();
    double native = 0.0;
    if (p.contains("last_logits_native")) {
      native = RelMaxDiff(*logits, p["last_logits_native"]);
      EXPECT_LE(native, NativeTolerance(dtype)) << GetParam() << " native " << dtype;
    }
    std::printf("%-24s %-9s prompt %2zu tokens: rel max diff %.2e (fp32 ref), %.2e (%s ref)\n",
                GetParam().c_str(), dtype.c_str(), ids.size(), diff, native, dtype.c_str());
    auto alone = (*model)->Greedy({ids}, 16);
    ASSERT_TRUE(alone.ok()) << alone.status().ToString();
    ExpectGreedyMatch((*alone)[0], p, GetParam() + " alone");
  }
  // All prompts in one batch: each equals its own solo run.
  auto batched = (*model)->Greedy(prompts, 16);
  ASSERT_TRUE(batched.ok()) << batched.status().ToString();
  for (size_t i = 0; i < prompts.size(); ++i)
    ExpectGreedyMatch((*batched)[i], ref["prompts"][i],
                      GetParam() + " batched #" + std::to_string(i));
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ModelReference, ::testing::ValuesIn(FixtureNames()),
                         [](const auto& info) { return info.param; });

TEST(ModelReferenceFixtures, AllFamiliesPresent) {
  // Guards against a fixture directory going missing silently.
  EXPECT_GE(FixtureNames().size(), 5u);
}

}  // namespace
}  // namespace tessera
