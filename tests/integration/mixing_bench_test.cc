// bench/mixing_bench (issue #34's stall-free mixing measurement) on a fixture model on the CPU:
// for each chunk size, an "alone" phase and a "mixed" one per chunk budget, the decoders'
// inter-token latencies measured in both, every long prompt that arrived answered with its TTFT,
// and the summary's ratio. The GPU figures come from scripts/gpu-run mixing; this checks the
// program and its report, not its timings.
#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "support/test_util.h"

namespace tessera {
namespace {

using nlohmann::json;
using testing::BinaryDir;
using testing::FixturePath;
using testing::RunCommand;

TEST(MixingBench, ReportsBothPhasesAndAnswersEveryLongPrompt) {
  const std::string cmd = BinaryDir() + "/bench/mixing_bench --model " +
                          FixturePath("models/llama_gqa_f32") +
                          " --device cpu --decoders 4 --prompt-len 8 --long-len 96"
                          " --interval 0.2 --seconds 0.8 --max-new 100 --chunks 16,64"
                          " --budgets cost,tokens 2>&1";
  const testing::CommandResult run = RunCommand(cmd);
  ASSERT_EQ(run.rc, 0) << cmd << "\n" << run.output;
  std::map<std::tuple<int64_t, std::string, std::string>, json> phases;  // chunk, budget, phase
  std::map<std::pair<int64_t, std::string>, json> summaries;             // chunk, budget
  std::istringstream lines(run.output);
  for (std::string line; std::getline(lines, line);) {
    const json j = json::parse(line, nullptr, false);
    ASSERT_TRUE(j.is_object()) << "not JSON: " << line;
    if (j["what"] == "mixing")
      phases[{j["chunk"].get<int64_t>(), j["budget"].get<std::string>(),
              j["phase"].get<std::string>()}] = j;
    else if (j["what"] == "mixing_summary")
      summaries[{j["chunk"].get<int64_t>(), j["budget"].get<std::string>()}] = j;
  }
  EXPECT_EQ(phases.size(), 6u) << run.output;  // per chunk: alone, mixed twice
  for (const auto& [chunk, budget] : std::vector<std::pair<int64_t, std::string>>{
           {16, "cost"}, {16, "tokens"}, {64, "cost"}, {64, "tokens"}}) {
    SCOPED_TRACE("chunk " + std::to_string(chunk) + ", budget " + budget);
    ASSERT_EQ(phases.count({chunk, "none", "alone"}), 1u) << run.output;
    ASSERT_EQ(phases.count({chunk, budget, "mixed"}), 1u) << run.output;
    const json& alone = phases[{chunk, "none", "alone"}];
    const json& mixed = phases[{chunk, budget, "mixed"}];
    for (const json* p : {&alone, &mixed}) {
      EXPECT_EQ((*p)["decoders"], 4);
      EXPECT_GT((*p)["steps"].get<int64_t>(), 0) << p->dump();
      EXPECT_GT((*p)["itl_samples"].get<int64_t>(), 0) << p->dump();
      EXPECT_GT((*p)["itl_p50_ms"].get<double>(), 0.0) << p->dump();
      EXPECT_GE((*p)["itl_p99_ms"].get<double>(), (*p)["itl_p50_ms"].get<double>());
      EXPECT_GE((*p)["itl_max_ms"].get<double>(), (*p)["itl_p99_ms"].get<double>());
    }
    EXPECT_EQ(alone["long_prompts"], 0);
    // The first long prompt arrives with the first decode step, then every 0.2 s of 0.8.
    EXPECT_GE(mixed["long_prompts"].get<int64_t>(), 1) << mixed.dump();
    EXPECT_EQ(mixed["long_prompts_answered"], mixed["long_prompts"]) << mixed.dump();
    EXPECT_GT(mixed["ttft_p50_ms"].get<double>(), 0.0) << mixed.dump();
    ASSERT_EQ(summaries.count({chunk, budget}), 1u) << run.output;
    const json& summary = summaries[{chunk, budget}];
    EXPECT_EQ(summary["ttft_p50_ms"], mixed["ttft_p50_ms"]) << summary.dump();
    EXPECT_EQ(summary["itl_p50_alone_ms"], alone["itl_p50_ms"]) << summary.dump();
    EXPECT_EQ(summary["itl_p99_mixed_ms"], mixed["itl_p99_ms"]) << summary.dump();
    // Both are printed to the microsecond: the ratio of the printed values within 1%.
    const double ratio = mixed["itl_p99_ms"].get<double>() / alone["itl_p50_ms"].get<double>();
    EXPECT_NEAR(summary["p99_mixed_over_p50_alone"].get<double>(), ratio, 0.01 * ratio)
        << summary.dump();
  }
}

TEST(MixingBench, RefusesABadOptionNamingIt) {
  const testing::CommandResult run =
      RunCommand(BinaryDir() + "/bench/mixing_bench --model " +
                 FixturePath("models/llama_gqa_f32") + " --chunks 0 2>&1");
  EXPECT_EQ(run.rc, 1) << run.output;
  EXPECT_NE(run.output.find("--chunks"), std::string::npos) << run.output;
  const testing::CommandResult budget =
      RunCommand(BinaryDir() + "/bench/mixing_bench --model " +
                 FixturePath("models/llama_gqa_f32") + " --budgets cost,lots 2>&1");
  EXPECT_EQ(budget.rc, 1) << budget.output;
  EXPECT_NE(budget.output.find("--budgets: each must be cost or tokens, not 'lots'"),
            std::string::npos)
      << budget.output;
}

}  // namespace
}  // namespace tessera
