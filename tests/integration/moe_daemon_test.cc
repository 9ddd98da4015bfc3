// The MoE fixtures served by the daemons (tessera-coordinator and
// tessera-worker processes on loopback): with parallel.expert_parallel the
// plan gives each tp rank whole experts, /admin/plan lists them, and every
// reference prompt, sent at once so that one batch mixes prompt lengths,
// gets transformers' greedy continuation (tools/make_fixtures.py,
// reference.json), as it would alone.
#include <gtest/gtest.h>

#include <future>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "common/tokenizer/tokenizer.h"
#include "support/daemons_fixture.h"
#include "support/test_util.h"

namespace tessera {
namespace {

using json = nlohmann::json;

// Every reference prompt at once; each completion must be its greedy text.
void ExpectReferenceCompletions(int port, const std::string& model_dir, const std::string& name) {
  const json ref = json::parse(::tessera::testing::ReadFileOrDie(model_dir + "/reference.json"));
  auto tok = Tokenizer::Load(model_dir);
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  std::vector<std::future<HttpReply>> replies;
  for (const json& p : ref["prompts"]) {
    const json req = {{"model", name},
                      {"prompt", p["text"]},
                      {"max_tokens", p["greedy"].size()},
                      {"temperature", 0},
                      {"ignore_eos", true}};
    replies.push_back(std::async(std::launch::async, [port, body = req.dump()] {
      return HttpCall(port, "POST", "/v1/completions", body);
    }));
  }
  for (size_t i = 0; i < replies.size(); ++i) {
    const HttpReply r = replies[i].get();
    ASSERT_EQ(r.status, 200) << r.body;
    const json& p = ref["prompts"][i];
    EXPECT_EQ(json::parse(r.body)["choices"][0]["text"].get<std::string>(),
              (*tok)->Decode(p["greedy"].get<std::vector<int32_t>>(), false))
        << name << " prompt " << i << " (" << p["ids"].size() << " tokens)";
  }
}

class MixtralExpertParallelDaemons : public Daemons {
 protected:
  std::string ModelName() const override { return "mixtral_moe_top3"; }
  ::tessera::testing::DaemonClusterOptions Options() const override {
    auto o = Daemons::Options();
    o.parallel_toml = "tp = 2\npp = 2\nexpert_parallel = true\n";
    o.model_toml = "";
    o.worker_metrics = true;
    return o;
  }
};

TEST_F(MixtralExpertParallelDaemons, RanksHoldWholeExpertsAndServeTransformersTokens) {
  const HttpReply plan = HttpCall(port_, "GET", "/admin/plan", "", "s3cret");
  ASSERT_EQ(plan.status, 200) << plan.body;
  const json p = json::parse(plan.body);
  EXPECT_EQ(p["expert_parallel"], true) << plan.body;
  ASSERT_EQ(p["ranks"].size(), 4u) << plan.body;
  for (const json& r : p["ranks"]) {
    // 5 experts over tp 2: [0, 3) and [3, 5), on each stage.
    const json want = r["tp_rank"] == 0 ? json::array({0, 3}) : json::array({3, 5});
    EXPECT_EQ(r["experts"], want) << r.dump();
    EXPECT_EQ(r["expert_split"], "whole") << r.dump();
    // The rank loaded what the coordinator's shard spec says it holds.
    EXPECT_EQ(r["weight_bytes"], r["shard_weight_bytes"]) << r.dump();
  }
  ExpectReferenceCompletions(port_, model_, "mixtral_moe_top3");
  // tessera_moe_expert_tokens_total: a series per held expert on each rank,
  // and per stage the experts ran top-3 x the tokens of both layers.
  double stage_tokens[2] = {0, 0};
  for (int i = 0; i < cluster_->workers_started(); ++i) {
    const HttpReply m = HttpCall(cluster_->metrics_port(i), "GET", "/metrics");
    ASSERT_EQ(m.status, 200);
    int series = 0;
    std::istringstream lines(m.body);
    for (std::string line; std::getline(lines, line);) {
      if (line.rfind("tessera_moe_expert_tokens_total{", 0) != 0) continue;
      ++series;
      const int stage = line.find("stage=\"1\"") != std::string::npos ? 1 : 0;
      stage_tokens[stage] += std::stod(line.substr(line.rfind(' ') + 1));
    }
    EXPECT_TRUE(series == 3 || series == 2) << m.body;  // experts [0, 3) or [3, 5)
  }
  // One layer per stage; every token the stage ran went to 3 experts.
  EXPECT_GT(stage_tokens[0], 0);
  EXPECT_EQ(stage_tokens[0], stage_tokens[1]);
  EXPECT_EQ(static_cast<int64_t>(stage_tokens[0]) % 3, 0);
}

class Qwen2MoeSlicedDaemons : public Daemons {
 protected:
  std::string ModelName() const override { return "qwen2_moe_shared_mixed"; }
  ::tessera::testing::DaemonClusterOptions Options() const override {
    auto o = Daemons::Options();
    o.parallel_toml = "tp = 2\npp = 1\n";
    o.workers = 2;
    o.model_toml = "";
    return o;
  }
};

TEST_F(Qwen2MoeSlicedDaemons, EveryRankHoldsASliceOfEveryExpert) {
  const HttpReply plan = HttpCall(port_, "GET", "/admin/plan", "", "s3cret");
  ASSERT_EQ(plan.status, 200) << plan.body;
  const json p = json::parse(plan.body);
  EXPECT_EQ(p["expert_parallel"], false) << plan.body;
  for (const json& r : p["ranks"]) {
    EXPECT_EQ(r["experts"], json::array({0, 4})) << r.dump();
    EXPECT_EQ(r["expert_split"], "1/2") << r.dump();
  }
  ExpectReferenceCompletions(port_, model_, "qwen2_moe_shared_mixed");
}

}  // namespace
}  // namespace tessera
