// The JSON edge of the plan endpoints (coordinator/api/plan_json.h): POST
// /admin/plan's body parsed into a PlanRequest, and the typed PlanChange
// rendered as the dry run's JSON, on the fixture models' configs.
#include "coordinator/api/plan_json.h"

#include <gtest/gtest.h>

#include <optional>
#include <string>

#include "support/test_util.h"

namespace tessera {
namespace {

ModelConfig Model(const std::string& name) {
  auto m = LoadModelConfig(::tessera::testing::FixturePath("models/" + name));
  TESSERA_CHECK(m.ok());
  return *m;
}

TEST(PlanJson, ParsesTheAcceptedFormsAndNamesTheFieldAtFault) {
  auto even = ParsePlanRequest(R"({"tp":2,"pp":2})");
  ASSERT_TRUE(even.ok()) << even.error().status.ToString();
  EXPECT_EQ(even->tp, 2);
  EXPECT_EQ(even->pp, 2);
  EXPECT_TRUE(even->layers_per_stage.empty());
  auto split = ParsePlanRequest(R"({"tp":1,"pp":2,"layers_per_stage":[20,10]})");
  ASSERT_TRUE(split.ok());
  EXPECT_EQ(split->layers_per_stage, (std::vector<int>{20, 10}));
  auto automatic = ParsePlanRequest(R"({"auto":true,"objective":"throughput"})");
  ASSERT_TRUE(automatic.ok());
  EXPECT_TRUE(automatic->auto_plan);
  EXPECT_EQ(automatic->objective, Objective::kThroughput);

  // A tp per stage: pp is the list's length (given or not).
  for (const char* body : {R"({"tp":[2,1],"pp":2})", R"({"tp":[2,1]})"}) {
    auto per_stage = ParsePlanRequest(body);
    ASSERT_TRUE(per_stage.ok()) << body << ": " << per_stage.error().status.ToString();
    EXPECT_EQ(per_stage->tp, 0);
    EXPECT_EQ(per_stage->tp_per_stage, (std::vector<int>{2, 1}));
    EXPECT_EQ(per_stage->pp, 2);
    auto layout = per_stage->Layout(Model("llama_gqa_f32"));
    ASSERT_TRUE(layout.ok()) << layout.status().ToString();
    EXPECT_EQ(layout->TpPerStage(), (std::vector<int>{2, 1}));
    EXPECT_EQ(layout->world_size(), 3);
  }
  // A list of equal entries is the uniform layout.
  auto equal = ParsePlanRequest(R"({"tp":[2,2]})");
  ASSERT_TRUE(equal.ok());
  auto uniform = equal->Layout(Model("llama_gqa_f32"));
  ASSERT_TRUE(uniform.ok());
  EXPECT_EQ(uniform->tp, 2);
  EXPECT_TRUE(uniform->uniform_tp());
  // A per-stage tp the model cannot take: MakePerStage's error names the stage.
  auto three_heads = ParsePlanRequest(R"({"tp":[3,1]})");
  ASSERT_TRUE(three_heads.ok());
  auto bad_layout = three_heads->Layout(Model("llama_gqa_f32"));
  EXPECT_EQ(bad_layout.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad_layout.status().message().find("stage 0"), std::string::npos)
      << bad_layout.status().message();
  // Every refusal names the field in its message and carries it, typed, as `param`
  // (POST /admin/plan's error.param), null for the body as a whole.
  struct Bad {
    const char* body;
    const char* text;
    std::optional<std::string> param;
  };
  for (const Bad& b : std::vector<Bad>{
           {"[1,2]", "request body", std::nullopt},
           {"{nope", "request body: not valid JSON: line 1, column 3: ", std::nullopt},
           {"{\n  \"tp\": 2,,\n}", "line 2, column 11", std::nullopt},
           {R"({"tp":2,"pp":2,"sp":1})", "'sp'", "sp"},
           {R"({"tp":0,"pp":2})", "tp:", "tp"},
           {R"({"tp":2,"pp":"two"})", "pp:", "pp"},
           {R"({"tp":1,"pp":2,"layers_per_stage":"3,3"})", "layers_per_stage:", "layers_per_stage"},
           {R"({"tp":1,"pp":2,"layers_per_stage":[1,"x"]})", "layers_per_stage[1]",
            "layers_per_stage[1]"},
           {R"({"tp":1,"pp":1,"replica":-1})", "replica:", "replica"},
           {R"({"auto":"yes"})", "auto:", "auto"},
           {R"({"auto":true,"tp":2})", "auto:", "auto"},
           {R"({"auto":true,"objective":7})", "objective:", "objective"},
           // ParseObjective's message ("objective 'cost' is not one of: ...") has no
           // "field: " prefix; the field still travels with the error.
           {R"({"auto":true,"objective":"cost"})", "objective 'cost' is not one of", "objective"},
           {R"({"tp":1,"pp":1,"objective":"latency"})", "objective:", "objective"},
           // "tp, pp: both are required": param is the one missing.
           {R"({"tp":2})", "tp, pp", "pp"},
           {R"({"pp":2})", "tp, pp", "tp"},
           {R"({})", "tp, pp", "tp"},
           {R"({"tp":[]})", "tp:", "tp"},
           {R"({"tp":[2,0]})", "tp[1]", "tp[1]"},
           {R"({"tp":[2,"x"]})", "tp[1]", "tp[1]"},
           {R"({"tp":[2,1],"pp":3})", "pp:", "pp"},
           {R"({"auto":true,"tp":[2,1]})", "auto:", "auto"}}) {
    auto r = ParsePlanRequest(b.body);
    ASSERT_FALSE(r.ok()) << b.body;
    EXPECT_EQ(r.error().status.code(), StatusCode::kInvalidArgument) << b.body;
    EXPECT_NE(r.error().status.message().find(b.text), std::string::npos)
        << b.body << ": " << r.error().status.message();
    EXPECT_EQ(r.error().param, b.param) << b.body << ": " << r.error().status.message();
    // Never the JSON library's exception text.
    EXPECT_EQ(r.error().status.message().find("json.exception"), std::string::npos)
        << r.error().status.message();
  }
}

// The mixed-tp change of plan_change_test.cc, as the dry run renders it:
// tp is 0 when the stages differ, every rank carries its stage's tp.
TEST(PlanJson, APlanChangeRendersLayoutsRanksAndTotals) {
  const ModelConfig m = Model("llama_gqa_f32");
  const ParallelConfig mixed = *ParallelConfig::MakePerStage(m, {2, 1});
  const ParallelConfig flipped = *ParallelConfig::MakePerStage(m, {1, 2});
  auto ranks = PlaceRanks(flipped, {"A", "B", "C"}, {});
  ASSERT_TRUE(ranks.ok());
  const nlohmann::json j =
      PlanChangeJson(DescribePlanChange(&mixed, flipped, *ranks, {"A", "B", "C", "D"}, 3));
  EXPECT_EQ(j["from"]["tp"], 0);
  EXPECT_EQ(j["from"]["tp_per_stage"], nlohmann::json::array({2, 1}));
  EXPECT_EQ(j["to"]["tp_per_stage"], nlohmann::json::array({1, 2}));
  EXPECT_EQ(j["plan_version"], 3);
  EXPECT_EQ(j["ranks"][0]["tp"], 1);
  EXPECT_EQ(j["ranks"][1]["tp"], 2);
  EXPECT_EQ(j["ranks"][1]["layers"], nlohmann::json::array({1, 2}));
  EXPECT_EQ(j["layers_loaded"], 3);
  EXPECT_EQ(j["layers_reused"], 0);
  EXPECT_EQ(j["workers_released"], nlohmann::json::array({"D"}));
  const nlohmann::json first = PlanChangeJson(DescribePlanChange(nullptr, flipped, *ranks, {}, 1));
  EXPECT_TRUE(first["from"].is_null());
  EXPECT_EQ(first["workers_released"], nlohmann::json::array());
}

}  // namespace
}  // namespace tessera
