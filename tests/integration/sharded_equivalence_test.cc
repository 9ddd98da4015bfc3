// Tensor + pipeline parallel runs, as real processes over Gloo/TCP on
// loopback, against the Hugging Face references of every fixture model:
// last-position logits within 1e-4 (relative to the largest reference logit)
// and greedy tokens equal, under each valid (tp, pp) layout, including stages
// of different tp (tp = [2, 1], [1, 2], [2, 4], ...). Also: seeded
// sampling gives the same tokens at every layout, and killing a rank mid-
// generation makes every other rank fail with a report naming it, within the
// configured timeout.
#include <gtest/gtest.h>
#include <signal.h>

#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>

#include "common/net/tcp_store.h"
#include "support/model_harness.h"
#include "support/multi_process.h"
#include "support/store_process.h"
#include "support/test_util.h"
#include "worker/exec/rank_runner.h"

namespace tessera {
namespace {

using nlohmann::json;

struct Layout {
  int tp, pp;
  std::vector<int> layers;
  std::vector<int> tps = {};  // a different tp per stage (tp is then ignored)
  bool ep = false;            // MoE: ParallelConfig::expert_parallel

  int StageTp(int stage) const { return tps.empty() ? tp : tps[static_cast<size_t>(stage)]; }
  int World() const {
    int w = 0;
    for (int s = 0; s < pp; ++s) w += StageTp(s);
    return w;
  }
};

// A layout with tps[s] ranks in stage s.
Layout PerStage(std::vector<int> tps, std::vector<int> layers = {}) {
  const int pp = static_cast<int>(tps.size());
  return Layout{0, pp, std::move(layers), std::move(tps)};
}

// `l` with expert parallelism (MoE fixtures).
Layout Ep(Layout l) {
  l.ep = true;
  return l;
}

std::string LayoutName(const Layout& l) {
  std::string s = "tp";
  if (l.tps.empty()) {
    s += std::to_string(l.tp);
  } else {
    for (size_t i = 0; i < l.tps.size(); ++i) s += (i ? "x" : "") + std::to_string(l.tps[i]);
  }
  s += "_pp" + std::to_string(l.pp);
  for (int n : l.layers) s += "_" + std::to_string(n);
  if (l.ep) s += "_ep";
  return s;
}

struct RunOutput {
  std::vector<std::vector<int32_t>> tokens;            // per request, from world rank 0
  int max_in_flight = 0;                               // micro-batches in flight at once on rank 0
  std::map<int64_t, std::vector<float>> first_logits;  // seq_id -> logits of its first sampled step
  std::vector<::tessera::testing::RankOutcome> outcomes;
};

// Runs every rank of `layout` as a forked process and collects rank 0's
// tokens and the last stage's first logits per sequence.
RunOutput RunLayout(const std::string& model_dir, const Layout& layout,
                    const std::vector<GenerationRequest>& requests, double timeout = 20.0,
                    std::function<void(int rank, int step)> on_last_stage_step = {}) {
  auto server = ::tessera::testing::StoreProcess::Start();  // RunRanks forks
  TESSERA_CHECK(server.ok());
  const std::string dir = ::tessera::testing::MakeTempDir("tessera-sharded");
  const int world = layout.World();
  const int port = (*server)->port();
  RunOutput out;
  out.outcomes = ::tessera::testing::RunRanks(
      world,
      [&](int rank) -> std::string {
        RankOptions o;
        o.model_dir = model_dir;
        o.tp = layout.tp;
        o.pp = layout.pp;
        o.tp_per_stage = layout.tps;
        o.layers_per_stage = layout.layers;
        o.expert_parallel = layout.ep;
        o.rank = rank;
        o.store_port = port;
        o.store_secret = ::tessera::testing::TestStoreSecret();
        o.timeout_seconds = timeout;
        o.kv_blocks = 128;
        o.block_size = 4;                // small blocks: sequences span several
        o.engine.max_batch_tokens = 24;  // longer prompts get chunked prefill
        json logits = json::object();
        int step = 0;
        LogitsSink sink = [&](const StepBatch& batch, const Tensor& l) {
          int64_t row = 0;
          for (const SeqStep& s : batch.seqs) {
            if (!s.want_logits) continue;
            const std::string key = std::to_string(s.seq_id);
            if (!logits.contains(key))
              logits[key] = std::vector<float>(l.data<float>() + row * l.dim(1),
                                               l.data<float>() + (row + 1) * l.dim(1));
            ++row;
          }
          if (on_last_stage_step) on_last_stage_step(rank, ++step);
        };
        auto r = RunRank(o, requests, nullptr, {}, sink);
        if (!r.ok()) return r.status().ToString();
        if (!logits.empty()) std::ofstream(dir + "/logits.json") << logits.dump();
        if (r->is_driver) {
          json toks = json::array();
          for (const auto& g : r->results) toks.push_back(g.tokens);
          std::ofstream(dir + "/tokens" + std::to_string(rank) + ".json") << toks.dump();
          std::ofstream(dir + "/in_flight" + std::to_string(rank)) << r->stats.max_in_flight;
        }
        return "";
      },
      120.0);
  for (const auto& o : out.outcomes)
    if (o.exit_code != 0) std::printf("%s\n", ::tessera::testing::Describe(o).c_str());
  std::ifstream fin(dir + "/in_flight0");
  if (fin) fin >> out.max_in_flight;
  std::ifstream tin(dir + "/tokens0.json");
  if (tin) out.tokens = json::parse(tin).get<std::vector<std::vector<int32_t>>>();
  // Every stage-0 tp rank ran the same engine: they must agree.
  for (int t = 1; t < layout.StageTp(0); ++t) {
    std::ifstream other(dir + "/tokens" + std::to_string(t) + ".json");
    if (other) {
      EXPECT_EQ(json::parse(other).get<std::vector<std::vector<int32_t>>>(), out.tokens)
          << "tp rank " << t;
    }
  }
  std::ifstream lin(dir + "/logits.json");
  if (lin) {
    const json all = json::parse(lin);
    for (auto it = all.begin(); it != all.end(); ++it)
      out.first_logits[std::stoll(it.key())] = it.value().get<std::vector<float>>();
  }
  return out;
}

using ::tessera::testing::RelMaxDiff;

struct Case {
  std::string fixture;
  Layout layout;
};

class ShardedEquivalence : public ::testing::TestWithParam<Case> {};

TEST_P(ShardedEquivalence, MatchesTransformersReference) {
  const Case& c = GetParam();
  const std::string dir = ::tessera::testing::FixturePath("models/" + c.fixture);
  const json ref = json::parse(::tessera::testing::ReadFileOrDie(dir + "/reference.json"));
  std::vector<GenerationRequest> reqs;
  for (const json& p : ref["prompts"]) {
    GenerationRequest r;
    r.prompt_ids = p["ids"].get<std::vector<int32_t>>();
    r.max_tokens = 16;
    r.ignore_eos = true;
    reqs.push_back(r);
  }
  RunOutput out = RunLayout(dir, c.layout, reqs);
  for (const auto& o : out.outcomes) ASSERT_EQ(o.exit_code, 0) << ::tessera::testing::Describe(o);
  ASSERT_EQ(out.tokens.size(), reqs.size());
  ASSERT_EQ(out.first_logits.size(), reqs.size());
  // With work queued, pp micro-batches are in flight at once, so stages overlap.
  EXPECT_EQ(out.max_in_flight, c.layout.pp);
  size_t i = 0;
  for (const auto& [seq_id, logits] : out.first_logits) {
    const json& p = ref["prompts"][i];
    ASSERT_EQ(logits.size(), p["last_logits"].size());
    const double diff = RelMaxDiff(logits, p["last_logits"]);
    EXPECT_LE(diff, 1e-4) << c.fixture << " " << LayoutName(c.layout) << " prompt " << i;
    const auto want = p["greedy"].get<std::vector<int32_t>>();
    const auto margins = p["greedy_margins"].get<std::vector<double>>();
    for (size_t k = 0; k < want.size(); ++k) {
      EXPECT_EQ(out.tokens[i][k], want[k])
          << c.fixture << " " << LayoutName(c.layout) << " prompt " << i << " step " << k;
      if (out.tokens[i][k] != want[k] || margins[k] < 1e-3) break;
    }
    std::printf("%-24s %-12s prompt %zu: rel max diff %.2e, seq %lld\n", c.fixture.c_str(),
                LayoutName(c.layout).c_str(), i, diff, static_cast<long long>(seq_id));
    ++i;
  }
}

std::vector<Case> Cases() {
  return {
      {"llama_gqa_f32", {1, 1, {}}},
      {"llama_gqa_f32", {2, 1, {}}},
      {"llama_gqa_f32", {4, 1, {}}},  // 2 KV heads < tp = 4: KV heads replicated
      {"llama_gqa_f32", {2, 2, {}}},
      {"llama_mha_tied_bf16", {2, 1, {}}},
      {"llama_mha_tied_bf16", {1, 2, {}}},  // tied embeddings, first and last stage differ
      {"llama_mha_tied_bf16", {4, 1, {}}},
      {"qwen2_bias_f16", {2, 1, {}}},  // vocab 1001: tp does not divide it
      {"qwen2_bias_f16", {2, 2, {}}},
      {"llama3_headdim_sharded", {1, 2, {2, 1}}},  // uneven split
      {"llama3_headdim_sharded", {1, 3, {}}},
      {"llama3_headdim_sharded", {2, 2, {1, 2}}},
      {"mistral_dynamic", {2, 1, {}}},  // 1 KV head < tp
      {"mistral_dynamic", {1, 2, {}}},
      // A different tp per stage (common/model/stage_handoff.h pairs the ranks):
      {"llama_gqa_f32", PerStage({2, 1})},        // tp shrinks: stage 0's tp rank 1 sends nothing
      {"llama_gqa_f32", PerStage({1, 2})},        // tp grows: one sender feeds two receivers
      {"llama_gqa_f32", PerStage({2, 4})},        // KV heads replicated on stage 1 only
      {"llama_mha_tied_bf16", PerStage({4, 2})},  // tied embeddings split 4 ways and 2 ways
      {"qwen2_bias_f16", PerStage({1, 2})},       // vocab 1001 padded on the last stage only
      {"llama3_headdim_sharded", PerStage({1, 2, 4}, {1, 1, 1})},  // 3 stages, growing
      {"mistral_dynamic", PerStage({4, 1})},  // 1 KV head replicated 4 ways, then whole
      // Qwen3: per-head q/k norms (replicated [head_dim] weights, local to a
      // rank's heads), head_dim 32 != hidden / heads, a tied head.
      {"qwen3_qknorm_tied", {1, 1, {}}},
      {"qwen3_qknorm_tied", {2, 1, {}}},
      {"qwen3_qknorm_tied", {4, 1, {}}},  // 2 KV heads < tp = 4: k_norm on a replicated head
      {"qwen3_qknorm_tied", {1, 2, {}}},  // the tied head under pp
      {"qwen3_qknorm_tied", {2, 2, {}}},
      {"qwen3_qknorm_tied", PerStage({4, 2})},
      // Phi-3: fused qkv_proj / gate_up_proj read per part, longrope.
      {"phi3_fused_longrope_bf16", {1, 1, {}}},
      {"phi3_fused_longrope_bf16", {2, 1, {}}},
      {"phi3_fused_longrope_bf16", {4, 1, {}}},
      {"phi3_fused_longrope_bf16", {1, 2, {}}},
      {"phi3_fused_longrope_bf16", {2, 2, {}}},
      {"phi3_fused_longrope_bf16", PerStage({2, 4})},  // 4 KV heads: whole, then 1 per rank
      // Mistral with a 5-position sliding window: prompts and continuations
      // run past it, chunked prefill included (max_batch_tokens 24).
      {"mistral_sliding_window", {1, 1, {}}},
      {"mistral_sliding_window", {2, 1, {}}},
      {"mistral_sliding_window", {4, 1, {}}},
      {"mistral_sliding_window", {1, 2, {}}},
      {"mistral_sliding_window", {2, 2, {}}},
      {"mistral_sliding_window", PerStage({1, 2})},
      // Gemma 2: (1 + w) norms around attention and the MLP, GeGLU, scaled
      // embeddings, soft-capped scores and logits, a 4-position window on
      // the even layers that every prompt passes (chunked prefill included),
      // a tied head.
      {"gemma2_softcap_window", {1, 1, {}}},
      {"gemma2_softcap_window", {2, 1, {}}},
      {"gemma2_softcap_window", {4, 1, {}}},  // 2 KV heads < tp = 4: KV heads replicated
      {"gemma2_softcap_window", {1, 2, {}}},  // the tied head under pp
      {"gemma2_softcap_window", {2, 2, {}}},
      // Stage 1 holds global layers 1-3 (local 0-2): the windows follow the
      // global index (layers 1 and 3 are global, 2 slides).
      {"gemma2_softcap_window", {1, 2, {1, 3}}},
      {"gemma2_softcap_window", PerStage({2, 1})},
      // Gemma 3: per-head (1 + w) q/k norms, sliding layers 0, 1, 3 on the
      // local RoPE table and global layer 2 on the linear-scaled one, a tied
      // head, bf16 weights.
      {"gemma3_text_local_rope_bf16", {1, 1, {}}},
      {"gemma3_text_local_rope_bf16", {2, 1, {}}},
      {"gemma3_text_local_rope_bf16", {4, 1, {}}},
      {"gemma3_text_local_rope_bf16", {1, 2, {}}},  // the tied head under pp; stage 1: layers 2, 3
      {"gemma3_text_local_rope_bf16", {2, 2, {}}},
      {"gemma3_text_local_rope_bf16", {1, 2, {3, 1}}},  // stage 1 holds the sliding layer 3 alone
      {"gemma3_text_local_rope_bf16", PerStage({4, 2})},
      // Mixture of experts (docs/architecture.md "The MoE layer"), with
      // expert_parallel off (a slice of every expert per rank) and on (whole
      // experts, uneven counts: 5 experts over tp 2 are 3 + 2, over tp 4
      // 2 + 1 + 1 + 1). Mixtral: top-3 of 5, published per-expert tensors.
      {"mixtral_moe_top3", {1, 1, {}}},
      {"mixtral_moe_top3", {2, 1, {}}},
      {"mixtral_moe_top3", Ep({2, 1, {}})},
      {"mixtral_moe_top3", {4, 1, {}}},
      {"mixtral_moe_top3", Ep({4, 1, {}})},
      {"mixtral_moe_top3", {1, 2, {}}},
      {"mixtral_moe_top3", Ep({2, 2, {}})},
      {"mixtral_moe_top3", Ep(PerStage({2, 4}))},
      // Qwen2-MoE: a gated shared expert (split as the dense MLP either
      // way), dense layers 0 and 2 around the sparse layer 1.
      {"qwen2_moe_shared_mixed", {1, 1, {}}},
      {"qwen2_moe_shared_mixed", {2, 1, {}}},
      {"qwen2_moe_shared_mixed", Ep({2, 1, {}})},
      {"qwen2_moe_shared_mixed", {4, 1, {}}},
      {"qwen2_moe_shared_mixed", Ep({4, 1, {}})},
      {"qwen2_moe_shared_mixed", {1, 2, {2, 1}}},  // stage 0: a dense and the sparse layer
      {"qwen2_moe_shared_mixed", Ep({2, 2, {}})},
      {"qwen2_moe_shared_mixed", Ep(PerStage({4, 2}))},
      // Qwen3-MoE: top-1 of 6 without renormalising, q/k norms, layer 0
      // dense (mlp_only_layers), transformers 5's stacked expert tensors.
      {"qwen3_moe_top1_fused", {1, 1, {}}},
      {"qwen3_moe_top1_fused", {2, 1, {}}},
      {"qwen3_moe_top1_fused", Ep({2, 1, {}})},
      {"qwen3_moe_top1_fused", {4, 1, {}}},
      {"qwen3_moe_top1_fused", Ep({4, 1, {}})},
      {"qwen3_moe_top1_fused", {1, 2, {}}},  // stage 0 dense, stage 1 sparse
      {"qwen3_moe_top1_fused", Ep({2, 2, {}})},
      {"qwen3_moe_top1_fused", Ep(PerStage({2, 1}))},
  };
}

INSTANTIATE_TEST_SUITE_P(Layouts, ShardedEquivalence, ::testing::ValuesIn(Cases()),
                         [](const auto& info) {
                           return info.param.fixture + "_" + LayoutName(info.param.layout);
                         });

TEST(ShardedSampling, SeededSamplingAgreesAcrossLayouts) {
  const std::string dir = ::tessera::testing::FixturePath("models/llama_gqa_f32");
  std::vector<GenerationRequest> reqs(2);
  reqs[0].prompt_ids = {5, 17, 42, 9};
  reqs[1].prompt_ids = {100, 7};
  for (int i = 0; i < 2; ++i) {
    reqs[static_cast<size_t>(i)].max_tokens = 12;
    reqs[static_cast<size_t>(i)].ignore_eos = true;
    SamplingParams& sp = reqs[static_cast<size_t>(i)].sampling;
    sp.temperature = 0.9f;
    sp.top_k = 40;
    sp.top_p = 0.95f;
    sp.seed = static_cast<uint64_t>(1234 + i);
  }
  std::vector<std::vector<int32_t>> base;
  for (const Layout& l : std::vector<Layout>{
           {1, 1, {}}, {2, 1, {}}, {1, 2, {}}, {2, 2, {}}, PerStage({2, 1}), PerStage({1, 2})}) {
    RunOutput out = RunLayout(dir, l, reqs);
    for (const auto& o : out.outcomes) ASSERT_EQ(o.exit_code, 0) << ::tessera::testing::Describe(o);
    ASSERT_EQ(out.tokens.size(), 2u);
    if (base.empty()) {
      base = out.tokens;
      EXPECT_NE(base[0], base[1]);
    } else {
      EXPECT_EQ(out.tokens, base) << LayoutName(l);
    }
  }
}

TEST(ShardedFailure, KilledRankIsReportedAndNothingHangs) {
  const std::string dir = ::tessera::testing::FixturePath("models/llama_gqa_f32");
  std::vector<GenerationRequest> reqs(1);
  reqs[0].prompt_ids = {5, 17, 42, 9};
  reqs[0].max_tokens = 100;
  reqs[0].ignore_eos = true;
  const double timeout = 3.0;
  // The last stage's tp rank 0 (world rank 2 at tp=2, pp=2) dies after 5 steps.
  RunOutput out = RunLayout(dir, {2, 2, {}}, reqs, timeout, [](int rank, int step) {
    if (rank == 2 && step == 5) raise(SIGKILL);
  });
  ASSERT_EQ(out.outcomes.size(), 4u);
  EXPECT_EQ(out.outcomes[2].signal, SIGKILL);
  for (int r : {0, 1, 3}) {
    const auto& o = out.outcomes[static_cast<size_t>(r)];
    EXPECT_TRUE(o.exited && o.exit_code != 0) << ::tessera::testing::Describe(o);
    EXPECT_LT(o.seconds, 3 * timeout + 10.0) << ::tessera::testing::Describe(o);
    // The report names the rank that failed or the timeout that caught it.
    EXPECT_TRUE(o.message.find("rank") != std::string::npos) << o.message;
    std::printf("rank %d: %s\n", r, ::tessera::testing::Describe(o).c_str());
  }
}

}  // namespace
}  // namespace tessera
