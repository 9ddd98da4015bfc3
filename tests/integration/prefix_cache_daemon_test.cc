// Prefix caching through the real daemons (tessera-coordinator and four
// tessera-worker processes, tp=2 x pp=2, fixture llama_gqa_f32, blocks of 4
// tokens): the OpenAI usage block reports the cached prompt tokens, the
// coordinator's /metrics counts them, and a plan change clears the cache
// (the request after it is computed in full on the new plan's workers and
// gives the same answer).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>

#include "support/daemons_fixture.h"

namespace tessera {
namespace {

using nlohmann::json;

constexpr char kToken[] = "s3cret";  // the fixture's admin.token

class PrefixCacheDaemons : public Daemons {
 protected:
  json Complete(const std::vector<int32_t>& prompt) {
    const json req = {{"model", "llama_gqa_f32"}, {"prompt", prompt},   {"max_tokens", 5},
                      {"temperature", 0},         {"ignore_eos", true}, {"logprobs", 2}};
    auto r = HttpCall(port_, "POST", "/v1/completions", req.dump());
    EXPECT_EQ(r.status, 200) << r.body;
    return json::parse(r.body, nullptr, false);
  }
  // The value of an unlabelled counter on the coordinator's /metrics.
  double Counter(const std::string& name) {
    auto r = HttpCall(port_, "GET", "/metrics");
    EXPECT_EQ(r.status, 200);
    std::istringstream in(r.body);
    std::string line;
    while (std::getline(in, line))
      if (line.rfind(name + " ", 0) == 0) return std::stod(line.substr(name.size() + 1));
    ADD_FAILURE() << name << " not on /metrics";
    return -1;
  }
  int64_t PlanVersion() {
    auto r = HttpCall(port_, "GET", "/admin/plan", "", kToken);
    EXPECT_EQ(r.status, 200) << r.body;
    return json::parse(r.body)["plan_version"].get<int64_t>();
  }
};

std::vector<int32_t> Tokens(int n, int seed) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back((seed * 131 + i * 17 + 3) % 250 + 1);
  return t;
}

int64_t CachedTokens(const json& reply) {
  return reply["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>();
}

void ExpectSameChoice(const json& a, const json& b, double tolerance) {
  const json& la = a["choices"][0]["logprobs"];
  const json& lb = b["choices"][0]["logprobs"];
  EXPECT_EQ(a["choices"][0]["text"], b["choices"][0]["text"]);
  ASSERT_EQ(la["token_logprobs"].size(), lb["token_logprobs"].size());
  for (size_t i = 0; i < la["token_logprobs"].size(); ++i)
    EXPECT_NEAR(la["token_logprobs"][i].get<double>(), lb["token_logprobs"][i].get<double>(),
                tolerance)
        << "token " << i;
}

TEST_F(PrefixCacheDaemons, UsageAndMetricsReportCachedTokensAndAPlanChangeClearsTheCache) {
  const std::vector<int32_t> a = Tokens(22, 1);
  std::vector<int32_t> b(a.begin(), a.begin() + 20);  // 5 full blocks shared with a
  for (int32_t t : Tokens(6, 2)) b.push_back(t);
  EXPECT_EQ(Counter("tessera_prefix_cache_queries_tokens_total{replica=\"0\"}"), 0);
  const json ra = Complete(a);
  EXPECT_EQ(CachedTokens(ra), 0) << ra;
  EXPECT_EQ(ra["usage"]["prompt_tokens"], 22);
  const json rb = Complete(b);
  EXPECT_EQ(CachedTokens(rb), 20) << rb;
  EXPECT_EQ(rb["usage"]["prompt_tokens"], 26);
  EXPECT_EQ(Counter("tessera_prefix_cache_queries_tokens_total{replica=\"0\"}"), 22 + 26);
  EXPECT_EQ(Counter("tessera_prefix_cache_hits_tokens_total{replica=\"0\"}"), 20);
  // The same prompt again: everything but the block holding its last token.
  const json rb2 = Complete(b);
  EXPECT_EQ(CachedTokens(rb2), 24) << rb2;
  ExpectSameChoice(rb2, rb, 1e-5);

  // A plan change (tp=1 x pp=2 on two of the workers): the new workers'
  // KV caches are empty, and so is the prefix cache.
  const int64_t version = PlanVersion();
  auto change = HttpCall(port_, "POST", "/admin/plan", json({{"tp", 1}, {"pp", 2}}).dump(), kToken);
  ASSERT_EQ(change.status, 200) << change.body;
  for (int i = 0;
       i < 600 && (PlanVersion() <= version || HttpCall(port_, "GET", "/readyz").status != 200);
       ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ASSERT_GT(PlanVersion(), version);
  const json rb3 = Complete(b);
  EXPECT_EQ(CachedTokens(rb3), 0) << rb3;
  EXPECT_EQ(Counter("tessera_prefix_cache_hits_tokens_total{replica=\"0\"}"), 20 + 24);
  // Another layout sums its partial products in another order: the
  // sharded-equivalence bound (1e-4), not the same-layout 1e-5.
  ExpectSameChoice(rb3, rb, 1e-4);
  // Cached again on the new plan, with the new plan's blocks.
  const json rb4 = Complete(b);
  EXPECT_EQ(CachedTokens(rb4), 24) << rb4;
  ExpectSameChoice(rb4, rb3, 1e-5);
}

}  // namespace
}  // namespace tessera
