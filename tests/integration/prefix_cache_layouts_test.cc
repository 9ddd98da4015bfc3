// Prefix caching at every parallel layout: the same requests run with and
// without the cache as real rank processes over Gloo/TCP on loopback (tp1,
// tp2 x pp2, and stages of different tp), fixture llama_gqa_f32 in fp32, and
// the Gemma fixtures (their windows of 4 and 6 positions are narrower than the
// 14-token shared prefixes, so cached blocks hold keys both inside and outside
// the windows of the sliding layers; soft-capped scores; Gemma 3's local RoPE).
// The KV pool holds barely more than one sequence, so the requests run
// nearly one after another and each hits the blocks its predecessors left
// cached (every rank of the pipeline reads the same block ids the
// coordinator-side scheduler chose). Greedy tokens must be equal and every
// sampled step's log-probabilities (log_softmax of the last stage's logits
// rows) within 1e-5.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "support/multi_process.h"
#include "support/store_process.h"
#include "support/test_util.h"
#include "worker/exec/rank_runner.h"

namespace tessera {
namespace {

using nlohmann::json;

struct Layout {
  std::string name;
  int tp, pp;
  std::vector<int> tps;  // a tp per stage, or empty
  std::string fixture = "llama_gqa_f32";
  int World() const {
    if (tps.empty()) return tp * pp;
    int w = 0;
    for (int t : tps) w += t;
    return w;
  }
};

struct RunOutput {
  std::vector<std::vector<int32_t>> tokens;                 // per request
  std::map<int64_t, std::vector<std::vector<float>>> rows;  // seq_id -> logits rows, in order
  int64_t hit_tokens = 0;
  int64_t query_tokens = 0;
  int64_t preemptions = 0;
};

constexpr int64_t kBlockSize = 4;
constexpr int64_t kBlocks = 9;  // the longest sequence (25 tokens) needs 7

RunOutput RunLayout(const Layout& layout, const std::vector<GenerationRequest>& requests,
                    bool prefix_caching) {
  const std::string model = ::tessera::testing::FixturePath("models/" + layout.fixture);
  auto server = ::tessera::testing::StoreProcess::Start();  // RunRanks forks
  TESSERA_CHECK(server.ok());
  const std::string dir = ::tessera::testing::MakeTempDir("tessera-prefix");
  const int port = (*server)->port();
  const auto outcomes = ::tessera::testing::RunRanks(
      layout.World(),
      [&](int rank) -> std::string {
        RankOptions o;
        o.model_dir = model;
        o.tp = layout.tp;
        o.pp = layout.pp;
        o.tp_per_stage = layout.tps;
        o.rank = rank;
        o.store_port = port;
        o.store_secret = ::tessera::testing::TestStoreSecret();
        o.timeout_seconds = 30.0;
        o.kv_blocks = kBlocks;
        o.block_size = kBlockSize;
        o.engine.max_batch_tokens = 24;
        o.engine.prefill_chunk_tokens = 7;  // chunk boundaries inside blocks
        o.engine.prefix_caching = prefix_caching;
        o.engine.model_id = layout.fixture;
        json rows = json::object();
        LogitsSink sink = [&](const StepBatch& batch, const Tensor& l) {
          int64_t row = 0;
          for (const SeqStep& s : batch.seqs) {
            if (!s.want_logits) continue;
            rows[std::to_string(s.seq_id)].push_back(std::vector<float>(
                l.data<float>() + row * l.dim(1), l.data<float>() + (row + 1) * l.dim(1)));
            ++row;
          }
        };
        auto r = RunRank(o, requests, nullptr, {}, sink);
        if (!r.ok()) return r.status().ToString();
        if (!rows.empty()) std::ofstream(dir + "/rows.json") << rows.dump();
        if (r->is_driver && rank == 0) {
          json out;
          for (const auto& g : r->results) out["tokens"].push_back(g.tokens);
          out["hits"] = r->stats.prefix_cache_hit_tokens;
          out["queries"] = r->stats.prefix_cache_query_tokens;
          out["preemptions"] = r->stats.preemptions;
          std::ofstream(dir + "/driver.json") << out.dump();
        }
        return "";
      },
      240.0);
  for (const auto& o : outcomes) EXPECT_EQ(o.exit_code, 0) << ::tessera::testing::Describe(o);
  RunOutput out;
  std::ifstream din(dir + "/driver.json");
  if (!din) return out;
  const json d = json::parse(din);
  out.tokens = d["tokens"].get<std::vector<std::vector<int32_t>>>();
  out.hit_tokens = d["hits"].get<int64_t>();
  out.query_tokens = d["queries"].get<int64_t>();
  out.preemptions = d["preemptions"].get<int64_t>();
  std::ifstream rin(dir + "/rows.json");
  if (rin) {
    const json all = json::parse(rin);
    for (auto it = all.begin(); it != all.end(); ++it)
      out.rows[std::stoll(it.key())] = it.value().get<std::vector<std::vector<float>>>();
  }
  return out;
}

std::vector<double> LogSoftmax(const std::vector<float>& x) {
  double m = x[0];
  for (float v : x) m = std::max(m, static_cast<double>(v));
  double sum = 0.0;
  for (float v : x) sum += std::exp(v - m);
  const double lse = m + std::log(sum);
  std::vector<double> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = x[i] - lse;
  return out;
}

std::vector<int32_t> Tokens(int n, int seed) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back((seed * 131 + i * 17 + 3) % 250 + 1);
  return t;
}

// 8 requests over 2 shared prefixes of 14 tokens (3 full blocks and half of
// one), each with a suffix of its own.
std::vector<GenerationRequest> Requests() {
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 8; ++i) {
    GenerationRequest r;
    r.prompt_ids = Tokens(14, 1 + i % 2);
    const std::vector<int32_t> suffix = Tokens(3 + i % 3, 10 + i);
    r.prompt_ids.insert(r.prompt_ids.end(), suffix.begin(), suffix.end());
    r.max_tokens = 6;
    r.ignore_eos = true;
    reqs.push_back(r);
  }
  return reqs;
}

class PrefixCacheLayouts : public ::testing::TestWithParam<Layout> {};

TEST_P(PrefixCacheLayouts, CachedRunMatchesUncachedTokensAndLogprobs) {
  const Layout& layout = GetParam();
  const std::vector<GenerationRequest> reqs = Requests();
  const RunOutput off = RunLayout(layout, reqs, false);
  const RunOutput on = RunLayout(layout, reqs, true);
  ASSERT_EQ(off.tokens.size(), reqs.size());
  ASSERT_EQ(on.tokens.size(), reqs.size());
  EXPECT_EQ(on.tokens, off.tokens);
  EXPECT_EQ(off.hit_tokens, 0);
  EXPECT_GT(on.hit_tokens, 0);
  EXPECT_GT(on.query_tokens, on.hit_tokens);
  ASSERT_EQ(on.rows.size(), reqs.size());
  ASSERT_EQ(off.rows.size(), reqs.size());
  double worst = 0.0;
  for (const auto& [seq, rows] : off.rows) {
    ASSERT_TRUE(on.rows.count(seq)) << "seq " << seq;
    const auto& got = on.rows.at(seq);
    ASSERT_EQ(got.size(), rows.size()) << "seq " << seq;
    ASSERT_EQ(got.size(), 6u) << "seq " << seq;
    for (size_t k = 0; k < rows.size(); ++k) {
      const std::vector<double> a = LogSoftmax(got[k]), b = LogSoftmax(rows[k]);
      ASSERT_EQ(a.size(), b.size());
      for (size_t v = 0; v < a.size(); ++v) worst = std::max(worst, std::abs(a[v] - b[v]));
    }
  }
  EXPECT_LE(worst, 1e-5) << layout.name;
  std::printf(
      "%s: prefix cache hits %lld of %lld tokens, preemptions %lld (off: %lld), "
      "max |logprob diff| %.2e\n",
      layout.name.c_str(), static_cast<long long>(on.hit_tokens),
      static_cast<long long>(on.query_tokens), static_cast<long long>(on.preemptions),
      static_cast<long long>(off.preemptions), worst);
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, PrefixCacheLayouts,
    ::testing::Values(Layout{"tp1", 1, 1, {}}, Layout{"tp2_pp2", 2, 2, {}},
                      Layout{"tp2x1", 0, 2, {2, 1}}, Layout{"tp1x2", 0, 2, {1, 2}},
                      Layout{"gemma2_tp1", 1, 1, {}, "gemma2_softcap_window"},
                      Layout{"gemma2_tp2_pp2", 2, 2, {}, "gemma2_softcap_window"},
                      Layout{"gemma3_tp2x1", 0, 2, {2, 1}, "gemma3_text_local_rope_bf16"}),
    [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace tessera
