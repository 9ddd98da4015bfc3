// The placement planner: golden plans on the shipped topologies with the
// reasoning that makes them right, per-stage tp on hosts of different sizes,
// the stage handoff pairing, the cost model's formulas, the cluster model's
// islands, and properties that hold for every plan on random clusters and
// models.
#include "coordinator/placement/placement_planner.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <random>
#include <set>
#include <sstream>

#include "common/model/stage_handoff.h"
#include "common/model/tensor_roles.h"
#include "common/topology/topology_file.h"
#include "coordinator/placement/cluster_model.h"
#include "support/test_util.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;

std::string ConfigPath(const std::string& rel) {
  return std::string(TESSERA_FIXTURES_DIR) + "/../../configs/" + rel;
}

ModelConfig Model(const std::string& name) {
  const std::string path = ConfigPath("models/" + name + ".json");
  auto m = ParseModelConfig(::tessera::testing::ReadFileOrDie(path), path);
  TESSERA_CHECK(m.ok());
  return *m;
}

ClusterModel Cluster(const std::string& file) {
  auto t = LoadTopologyFile(ConfigPath("topologies/" + file));
  TESSERA_CHECK(t.ok());
  auto c = BuildClusterModel(*t);
  TESSERA_CHECK(c.ok());
  return *c;
}

PlanResult MustPlan(const ModelConfig& m, const ClusterModel& c, const PlanOptions& o) {
  PlacementPlanner p;
  auto r = p.Plan(m, c, o);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  TESSERA_CHECK(r.ok());
  return *r;
}

// --- golden plans ----------------------------------------------------------

// Llama-2-70B (fp16: 80 layers x 1.71 GB + 2 x 0.26 GB embedding/lm_head =
// 138 GB) on 2 DGX H100 (8 x 80 GB, NV18) by latency.
//
// Default serving constraints (one 4096-token sequence of KV per replica):
// one host holds it at tp=8 with 17.2 GB of weights per GPU and ~60 GB of KV
// to spare. Batch-1 decode reads every weight once per token, so its time is
// (weights per GPU) / HBM + 161 all-reduces; a second pipeline stage on the
// other host halves neither (each stage reads half the layers, one after the
// other) and adds a network hop. So tp=8, pp=1, and the second host serves a
// second replica.
TEST(PlannerGolden, Llama70BOnTwoDgxH100ByLatencyFitsOneHost) {
  PlanOptions o;
  o.objective = Objective::kLatency;
  const PlanResult r = MustPlan(Model("llama-2-70b"), Cluster("dgx_h100_x2.toml"), o);
  ASSERT_EQ(r.plan.replicas.size(), 2u) << r.ToText();
  for (const PlannedReplica& rep : r.plan.replicas) {
    ASSERT_EQ(rep.pp(), 1);
    EXPECT_EQ(rep.stages[0].tp, 8);
    EXPECT_EQ(rep.stages[0].tp_link, "NV18");
    EXPECT_EQ(rep.stages[0].layers(), 80);
  }
  EXPECT_NE(r.plan.replicas[0].stages[0].hosts, r.plan.replicas[1].stages[0].hosts);
  // tp=8 pp=2 is the runner-up: the same bytes per token plus a hop.
  ASSERT_GE(r.explanation.top.size(), 2u);
  EXPECT_EQ(r.explanation.top[1].layout, "tp=8 pp=2");
  EXPECT_GT(r.explanation.top[1].decode_latency_s, r.explanation.top[0].decode_latency_s);
  // The predicted latency is the formula's: 17.2 GB / (0.85 x 3.35 TB/s) =
  // 6.0 ms of weights plus 161 all-reduces of ~24 us.
  EXPECT_GT(r.plan.decode_latency_s, 8e-3);
  EXPECT_LT(r.plan.decode_latency_s, 12e-3);
  EXPECT_THAT(r.ToText(), HasSubstr("tp=3: tp=3 does not divide num_attention_heads=64"));
}

// The same model and cluster when every replica must hold 2M KV tokens (e.g.
// 500 concurrent 4k-token sequences: 2M x 0.33 MB = 655 GB): one host offers
// 8 x 77 GB - 138 GB = 478 GB, so every layout needs both hosts. tp=16 would
// span the hosts (not allowed), so the fastest layout is tp=8 inside each
// host's NVSwitch island and pp=2 across the hosts: each stage reads 8.6 GB
// per GPU per token; tp=4 pp=4 would read 17.2 GB per GPU per stage.
TEST(PlannerGolden, Llama70BOnTwoDgxH100ByLatencyWithLargeKvIsTp8Pp2) {
  PlanOptions o;
  o.objective = Objective::kLatency;
  o.min_kv_tokens = 2'000'000;
  const PlanResult r = MustPlan(Model("llama-2-70b"), Cluster("dgx_h100_x2.toml"), o);
  ASSERT_EQ(r.plan.replicas.size(), 1u) << r.ToText();
  const PlannedReplica& rep = r.plan.replicas[0];
  ASSERT_EQ(rep.pp(), 2) << r.ToText();
  EXPECT_EQ(r.plan.layout, "tp=8 pp=2");
  for (const PlannedStage& s : rep.stages) EXPECT_EQ(s.tp, 8);
  EXPECT_NE(rep.stages[0].hosts, rep.stages[1].hosts);
  EXPECT_EQ(rep.hop_links[0], "network");
  // Equal hosts: an even split.
  EXPECT_EQ(rep.stages[0].layers(), 40);
  EXPECT_GE(rep.kv_tokens, 2'000'000);
  EXPECT_EQ(r.plan.gpus_used, 16);
  EXPECT_THAT(r.ToText(), HasSubstr("tp=8 pp=1: does not fit"));
  // Equal tp on both stages: the uniform layout.
  auto pc = r.plan.ParallelConfigOf(Model("llama-2-70b"), 0);
  ASSERT_TRUE(pc.ok()) << pc.status().ToString();
  EXPECT_TRUE(pc->uniform_tp());
  EXPECT_EQ(pc->tp, 8);
  EXPECT_EQ(pc->layers_per_stage, (std::vector<int>{40, 40}));
}

// Llama-2-13B (26 GB fp16, 40 MHA heads: 0.82 MB of KV per token) on 4 hosts
// of 4 L40S (48 GB, 864 GB/s), GPU pairs behind a PCIe switch (PIX), the
// pairs joined across sockets (SYS).
//
// By throughput, tp over the slow SYS link loses to pp: a 4-GPU replica as
// tp=2 pp=2 (tp inside each PIX pair, the pipeline across the pairs) beats
// tp=4 pp=1 (tp across the pairs), and best of all are tp=2 replicas inside
// each pair: at tp=1 a GPU keeps only 17 GB for KV after 26 GB of weights
// (27 sequences of 768 tokens), at tp=2 two GPUs keep 60 GB (96 sequences),
// and the PIX all-reduces cost far less than the weight reads they halve.
TEST(PlannerGolden, Llama13BOnL40sByThroughputKeepsTpInsidePcieSwitchPairs) {
  PlanOptions o;
  o.objective = Objective::kThroughput;
  const PlanResult r = MustPlan(Model("llama-2-13b"), Cluster("l40s_pcie_x4.toml"), o);
  ASSERT_EQ(r.plan.replicas.size(), 8u) << r.ToText();
  for (const PlannedReplica& rep : r.plan.replicas) {
    ASSERT_EQ(rep.pp(), 1);
    const PlannedStage& s = rep.stages[0];
    ASSERT_EQ(s.tp, 2);
    EXPECT_EQ(s.tp_link, "PIX");
    // GPUs 0-1 or 2-3: never one from each socket.
    EXPECT_EQ(s.gpus[0].gpu / 2, s.gpus[1].gpu / 2);
  }
  double tp2pp2 = -1, tp4pp1 = -1;
  for (const CandidateSummary& c : r.explanation.top) {
    if (c.layout == "tp=2 pp=2") tp2pp2 = c.throughput_tokens_per_s;
    if (c.layout == "tp=4 pp=1") tp4pp1 = c.throughput_tokens_per_s;
  }
  ASSERT_GT(tp2pp2, 0) << r.ToText();
  ASSERT_GT(tp4pp1, 0) << r.ToText();
  EXPECT_GT(tp2pp2, tp4pp1) << "pp across the PCIe pairs should beat tp across them";
}

// By latency the same cluster does use tp=4 across the pairs: batch-1
// decode is bound by reading 26 GB of weights at 864 GB/s (35 ms on one
// GPU); tp=4 cuts that to 8.9 ms for 81 all-reduces over SYS of ~48 us each
// (3.9 ms), still well under tp=2's 17.7 ms + 1.3 ms.
TEST(PlannerGolden, Llama13BOnL40sByLatencyUsesTheWholeHost) {
  PlanOptions o;
  o.objective = Objective::kLatency;
  const PlanResult r = MustPlan(Model("llama-2-13b"), Cluster("l40s_pcie_x4.toml"), o);
  ASSERT_EQ(r.plan.replicas.size(), 4u) << r.ToText();
  EXPECT_EQ(r.plan.layout, "tp=4 pp=1");
  EXPECT_EQ(r.plan.replicas[0].stages[0].tp_link, "SYS");
  EXPECT_LT(r.plan.decode_latency_s, 15e-3);
}

// Llama-3.1-405B (bf16, 126 layers of 6.4 GB: 812 GB) at 8k context on 2 DGX
// A100-40GB + 2 DGX H100 by throughput. An A100 host offers 8 x 38.7 GB =
// 310 GB, an H100 host 616 GB: only an H100 host plus another host holds the
// model, and two A100 hosts together (619 GB) cannot. Pairing each H100 host
// with an A100 host (hosts interleaved) gives two replicas where grouping
// gives one. Inside a pair the split follows memory and speed: the H100
// stage has twice the memory and 2.15x the HBM bandwidth, so it takes about
// two thirds of the layers and both stages take about as long per token.
TEST(PlannerGolden, MixedFleetSplitsLayersUnevenly) {
  PlanOptions o;
  o.objective = Objective::kThroughput;
  o.max_context = 8192;
  const PlanResult r = MustPlan(Model("llama-3.1-405b"), Cluster("mixed_a100_h100.toml"), o);
  ASSERT_EQ(r.plan.replicas.size(), 2u) << r.ToText();
  for (const PlannedReplica& rep : r.plan.replicas) {
    ASSERT_EQ(rep.pp(), 2) << r.ToText();
    const PlannedStage* a100 = nullptr;
    const PlannedStage* h100 = nullptr;
    for (const PlannedStage& s : rep.stages)
      (s.gpu_name.find("A100") != std::string::npos ? a100 : h100) = &s;
    ASSERT_TRUE(a100 && h100) << r.ToText();
    EXPECT_EQ(a100->tp, 8);
    EXPECT_EQ(h100->tp, 8);
    EXPECT_GE(h100->layers(), 2 * a100->layers() - 2) << r.ToText();
    EXPECT_EQ(h100->layers() + a100->layers(), 126);
    EXPECT_NEAR(h100->decode_seconds / a100->decode_seconds, 1.0, 0.1);
  }
  EXPECT_EQ(r.plan.gpus_used, 32);
}

// A host of 8 H100 feeding a host of 4 H100 (the 405B needs both: 616 GB +
// 308 GB usable for 812 GB of weights): each host runs its own tp, 8 and 4,
// and the layer split gives the tp=8 stage the layers it reads faster.
TEST(PlannerGolden, PerStageTpOnHostsOfDifferentSizes) {
  const std::string toml = R"(
name = "8 + 4 H100"
[[nodes]]
hostname = "big"
[[nodes.gpus]]
count = 8
name = "NVIDIA H100 80GB HBM3"
memory_gib = 79.647
compute_capability = "9.0"
[nodes.links]
nvswitch = 18
[[nodes.nics]]
name = "mlx5_0"
type = "infiniband"
speed_gbit_per_s = 400
[[nodes]]
hostname = "small"
[[nodes.gpus]]
count = 4
name = "NVIDIA H100 80GB HBM3"
memory_gib = 79.647
compute_capability = "9.0"
[nodes.links]
nvswitch = 18
[[nodes.nics]]
name = "mlx5_0"
type = "infiniband"
speed_gbit_per_s = 400
)";
  auto t = ParseTopologyToml(toml, "inline.toml");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  auto c = BuildClusterModel(*t);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->num_shapes(), 2);
  PlanOptions o;
  o.max_context = 8192;
  const ModelConfig m = Model("llama-3.1-405b");
  const PlanResult r = MustPlan(m, *c, o);
  ASSERT_EQ(r.plan.replicas.size(), 1u) << r.ToText();
  const PlannedReplica& rep = r.plan.replicas[0];
  ASSERT_EQ(rep.pp(), 2) << r.ToText();
  std::multiset<int> tps;
  for (const PlannedStage& s : rep.stages) tps.insert(s.tp);
  EXPECT_EQ(tps, (std::multiset<int>{4, 8})) << r.ToText();
  for (const PlannedStage& s : rep.stages) {
    if (s.tp == 8) {
      EXPECT_EQ(s.hosts, std::vector<std::string>{"big"});
      EXPECT_GT(s.layers(), 63);
    }
  }
  // The plan runs as a per-stage layout: each stage's tp and layers, world
  // ranks stage by stage.
  auto pc = r.plan.ParallelConfigOf(m, 0);
  ASSERT_TRUE(pc.ok()) << pc.status().ToString();
  EXPECT_FALSE(pc->uniform_tp());
  EXPECT_EQ(pc->pp, 2);
  EXPECT_EQ(pc->world_size(), 12);
  for (int s = 0; s < 2; ++s) {
    EXPECT_EQ(pc->TpOfStage(s), rep.stages[static_cast<size_t>(s)].tp) << "stage " << s;
    EXPECT_EQ(pc->layers_per_stage[static_cast<size_t>(s)],
              rep.stages[static_cast<size_t>(s)].layers())
        << "stage " << s;
  }
  EXPECT_EQ(pc->WorldRank(1, 0), rep.stages[0].tp);
  EXPECT_EQ(r.plan.ParallelConfigOf(m, 1).status().code(), StatusCode::kOutOfRange);
}

TEST(StageHandoff, EveryReceiverHasExactlyOneSender) {
  for (int from = 1; from <= 8; ++from) {
    for (int to = 1; to <= 8; ++to) {
      std::vector<int> got(to, 0);
      for (int s = 0; s < from; ++s) {
        for (int j : HandoffReceivers(s, from, to)) {
          ASSERT_LT(j, to);
          ++got[j];
          EXPECT_EQ(HandoffSender(j, from, to), s);
        }
      }
      for (int j = 0; j < to; ++j) EXPECT_EQ(got[j], 1) << from << "->" << to;
    }
  }
  // 8 -> 4: ranks 0-3 send, 4-7 do not; 4 -> 8: each sends twice.
  EXPECT_EQ(HandoffReceivers(5, 8, 4), std::vector<int>{});
  EXPECT_EQ(HandoffReceivers(1, 4, 8), (std::vector<int>{1, 5}));
  EXPECT_EQ(HandoffSender(6, 4, 8), 2);
}

// --- cost model ------------------------------------------------------------

TEST(CostModel, FormulasByHand) {
  CostConstants k;
  // Ring all-reduce of 16 KiB over 8 GPUs at 450 GB/s:
  // 10 us + 14 x 1 us + 2 x 7/8 x 16384 / (0.7 x 450e9).
  EXPECT_NEAR(AllReduceSeconds(8, 16384, 450e9, k.nvlink_step_s, k),
              24e-6 + 1.75 * 16384 / (0.7 * 450e9), 1e-12);
  EXPECT_EQ(AllReduceSeconds(1, 16384, 450e9, 1e-6, k), 0.0);
  EXPECT_NEAR(AllGatherSeconds(2, 1e6, 100e9, 3e-6, k), 10e-6 + 3e-6 + 0.5 * 1e6 / 70e9, 1e-12);
  EXPECT_NEAR(HopSeconds(16384, 50e9, 5e-6, k), 5e-6 + 16384 / 35e9, 1e-12);

  const ModelConfig m = Model("llama-2-70b");
  const ModelSizes s = ModelSizes::From(m, DType::kF16, DType::kF16);
  EXPECT_DOUBLE_EQ(s.layer_bytes, 2.0 * LayerParameterCount(m));
  EXPECT_DOUBLE_EQ(s.embed_bytes, 2.0 * 32000 * 8192);
  StageShape one;
  one.tp = 8;
  one.layers = 80;
  one.first = one.last = one.single_stage = true;
  one.spec = {"H100", 3350, 989};
  one.link_bytes_per_s = 18 * 26.562e9;
  one.link_step_s = k.nvlink_step_s;
  // Weights per GPU: sharded layers + replicated norms + embedding and lm_head
  // slices + the final norm.
  const double w =
      80 * (2 * 8192 * 2 + (s.layer_bytes - 2 * 8192 * 2) / 8) + 2 * s.embed_bytes / 8 + 8192 * 2;
  EXPECT_DOUBLE_EQ(WeightBytesPerGpu(s, one), w);
  // KV: 8 KV heads over tp=8 -> 1 head of 128 per rank, K and V, fp16.
  EXPECT_DOUBLE_EQ(KvBytesPerTokenPerGpu(s, one), 80 * 2 * 1 * 128 * 2);
  // Batch-1 decode: memory-bound weight read plus 161 all-reduces and the
  // logits all-gather.
  const double expect =
      w / (0.85 * 3350e9) +
      161 * AllReduceSeconds(8, 8192 * 2, one.link_bytes_per_s, k.nvlink_step_s, k) +
      AllGatherSeconds(8, 32000 * 4.0, one.link_bytes_per_s, k.nvlink_step_s, k);
  EXPECT_NEAR(StageSeconds(s, one, k, 1, 1, 0), expect, 1e-12);
  // Tied embeddings on one stage are held once.
  ModelSizes tied = s;
  tied.tied = true;
  EXPECT_DOUBLE_EQ(WeightBytesPerGpu(s, one) - WeightBytesPerGpu(tied, one), s.embed_bytes / 8);
}

// --- cluster model ---------------------------------------------------------

TEST(ClusterModel, IslandsAreCliquesOfTheNvlinkGraph) {
  // DGX-1 hybrid cube-mesh: two fully connected quads (0-3, 4-7) plus links
  // i <-> i+4; the islands are the two quads.
  std::vector<std::vector<bool>> adj(8, std::vector<bool>(8, false));
  auto link = [&](int a, int b) { adj[a][b] = adj[b][a] = true; };
  for (int q = 0; q < 8; q += 4)
    for (int a = q; a < q + 4; ++a)
      for (int b = a + 1; b < q + 4; ++b) link(a, b);
  for (int i = 0; i < 4; ++i) link(i, i + 4);
  auto parts = GreedyCliquePartition(adj);
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(parts[0], (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(parts[1], (std::vector<int>{4, 5, 6, 7}));

  const ClusterModel pairs = Cluster("a100_nvlink_pairs_x2.toml");
  ASSERT_EQ(pairs.num_classes(), 1);
  EXPECT_EQ(pairs.nodes[0].nvlink_islands, (std::vector<std::vector<int>>{{0, 1}, {2, 3}}));
  const ClusterModel l40s = Cluster("l40s_pcie_x4.toml");
  EXPECT_EQ(l40s.nodes[0].nvlink_islands.size(), 4u);
  EXPECT_EQ(l40s.nodes[0].pcie_groups, (std::vector<std::vector<int>>{{0, 1}, {2, 3}}));
  EXPECT_DOUBLE_EQ(l40s.nodes[0].network_bytes_per_s, 200e9 / 8);
  const ClusterModel mixed = Cluster("mixed_a100_h100.toml");
  EXPECT_EQ(mixed.num_classes(), 2);
  EXPECT_EQ(mixed.nodes[0].nvlink_islands.size(), 1u);
  EXPECT_DOUBLE_EQ(mixed.nodes[3].network_bytes_per_s, 8 * 400e9 / 8);
  EXPECT_THAT(mixed.Describe(), HasSubstr("relative speed 0.46"));
}

TEST(ClusterModel, UnknownGpuUsesFallbackOrOverride) {
  const std::string base = R"(
[[nodes]]
hostname = "h"
[[nodes.gpus]]
count = 2
name = "Acme X1"
memory_gib = 16
)";
  auto t = ParseTopologyToml(base, "x.toml");
  ASSERT_TRUE(t.ok());
  auto c = BuildClusterModel(*t);
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(c->nodes[0].gpus[0].spec_known);
  EXPECT_THAT(c->notes[0], HasSubstr("unknown GPU model 'Acme X1'"));
  auto t2 = ParseTopologyToml("[gpu_specs.\"X1\"]\nhbm_gb_per_s = 500\nbf16_tflops = 50\n" + base,
                              "x.toml");
  ASSERT_TRUE(t2.ok()) << t2.status().ToString();
  auto c2 = BuildClusterModel(*t2);
  EXPECT_TRUE(c2->nodes[0].gpus[0].spec_known);
  EXPECT_EQ(c2->nodes[0].gpus[0].spec.hbm_gb_per_s, 500);
}

// --- properties over random clusters and models ----------------------------

struct GpuKind {
  const char* name;
  double gib;
  const char* cc;
};

std::string RandomTopology(std::mt19937& rng) {
  const GpuKind kinds[] = {{"NVIDIA H100 80GB HBM3", 79.6, "9.0"},
                           {"NVIDIA A100-SXM4-40GB", 40, "8.0"},
                           {"NVIDIA L40S", 45, "8.9"},
                           {"NVIDIA H200", 139.8, "9.0"},
                           {"NVIDIA L4", 22, "8.9"}};
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<unsigned>(n)); };
  std::ostringstream t;
  t << "name = \"random\"\n";
  const int shapes = 1 + pick(3);
  for (int s = 0; s < shapes; ++s) {
    const GpuKind& k = kinds[pick(5)];
    const int gpus = std::vector<int>{1, 2, 4, 8}[pick(4)];
    t << "[[nodes]]\nhostname = \"s" << s << "\"\ncount = " << 1 + pick(3) << "\n";
    t << "[[nodes.gpus]]\ncount = " << gpus << "\nname = \"" << k.name
      << "\"\nmemory_gib = " << k.gib << "\ncompute_capability = \"" << k.cc << "\"\n";
    t << "[nodes.links]\n";
    const int links = pick(3);
    if (gpus > 1 && links == 0) t << "nvswitch = " << 6 + pick(13) << "\n";
    if (gpus > 1 && links == 1) {
      t << "nvlink_groups = [";
      for (int g = 0; g + 1 < gpus; g += 2)
        t << (g ? ", " : "") << "[" << g << ", " << g + 1 << "]";
      t << "]\nnvlink_links = 4\n";
    }
    t << "default = \"" << (pick(2) ? "PIX" : "SYS") << "\"\n";
    t << "[[nodes.nics]]\nname = \"nic\"\ntype = \"" << (pick(2) ? "infiniband" : "ethernet")
      << "\"\nspeed_gbit_per_s = " << std::vector<int>{25, 100, 400}[pick(3)] << "\n";
  }
  return t.str();
}

ModelConfig RandomModel(std::mt19937& rng) {
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<unsigned>(n)); };
  ModelConfig m;
  m.architecture = Architecture::kLlama;
  m.num_attention_heads = std::vector<int>{8, 12, 16, 32, 40, 64}[pick(6)];
  std::vector<int> kv;
  for (int d = 1; d <= m.num_attention_heads; ++d)
    if (m.num_attention_heads % d == 0) kv.push_back(d);
  m.num_key_value_heads = kv[pick(static_cast<int>(kv.size()))];
  m.head_dim = pick(2) ? 64 : 128;
  m.hidden_size = m.num_attention_heads * m.head_dim;
  m.intermediate_size = m.hidden_size * (2 + pick(3)) + 128 * pick(3);
  m.num_hidden_layers = 2 + pick(80);
  m.vocab_size = std::vector<int>{1000, 32000, 128256}[pick(3)];
  m.max_position_embeddings = std::vector<int>{2048, 4096, 8192}[pick(3)];
  m.tie_word_embeddings = pick(2);
  m.torch_dtype = pick(4) ? DType::kBF16 : DType::kF32;
  return m;
}

void CheckPlanProperties(const ModelConfig& m, const ClusterModel& c, const PlanOptions& o,
                         const PlanResult& r, const std::string& ctx) {
  const ModelSizes sizes =
      ModelSizes::From(m, o.weight_dtype.value_or(m.torch_dtype),
                       o.kv_dtype.value_or(o.weight_dtype.value_or(m.torch_dtype)));
  const int64_t max_context = o.max_context > 0 ? o.max_context : m.max_position_embeddings;
  std::set<GpuRef> used;
  ASSERT_FALSE(r.plan.replicas.empty()) << ctx;
  int gpus = 0;
  for (const PlannedReplica& rep : r.plan.replicas) {
    // Covers every layer exactly once: contiguous, non-empty, 0 .. L.
    int next = 0;
    double shard_bytes = 0;
    for (int s = 0; s < rep.pp(); ++s) {
      const PlannedStage& st = rep.stages[s];
      ASSERT_EQ(st.first_layer, next) << ctx;
      ASSERT_GE(st.layers(), 1) << ctx;
      next = st.end_layer;
      EXPECT_EQ(st.embedding, s == 0) << ctx;
      EXPECT_EQ(st.lm_head, s == rep.pp() - 1) << ctx;
      // tp divides the heads (and passes every ParallelConfig rule).
      EXPECT_EQ(m.num_attention_heads % st.tp, 0) << ctx;
      EXPECT_TRUE(ParallelConfig::Make(m, st.tp, 1).ok()) << ctx;
      ASSERT_EQ(static_cast<int>(st.gpus.size()), st.tp) << ctx;
      // Fits memory, with usable memory within the fraction.
      EXPECT_LE(st.weight_bytes + st.kv_bytes + st.activation_bytes, st.usable_bytes) << ctx;
      const ClusterGpu& g0 = c.nodes[st.gpus[0].node].gpus[st.gpus[0].gpu];
      EXPECT_LE(st.usable_bytes, static_cast<int64_t>(g0.memory_bytes * o.gpu_memory_fraction) + 1)
          << ctx;
      shard_bytes += static_cast<double>(st.weight_bytes) * st.tp;
      // No GPU twice, anywhere in the plan.
      for (const GpuRef& g : st.gpus)
        EXPECT_TRUE(used.insert(g).second) << ctx << " GPU used twice";
      gpus += st.tp;
      // tp groups stay on one host, inside one NVLink island unless the
      // group is over PCIe (and then only when allowed).
      if (st.tp > 1) {
        const int node = st.gpus[0].node;
        for (const GpuRef& g : st.gpus) ASSERT_EQ(g.node, node) << ctx << " tp group spans hosts";
        int island = -1;
        bool one_island = true;
        for (const GpuRef& g : st.gpus) {
          const auto& isl = c.nodes[node].nvlink_islands;
          for (size_t i = 0; i < isl.size(); ++i) {
            if (std::find(isl[i].begin(), isl[i].end(), g.gpu) == isl[i].end()) continue;
            if (island < 0) island = static_cast<int>(i);
            one_island = one_island && island == static_cast<int>(i);
          }
        }
        if (!o.allow_pcie_tp) {
          EXPECT_TRUE(one_island) << ctx << " tp group leaves its NVLink island";
        }
        if (st.tp_link.rfind("NV", 0) == 0) {
          EXPECT_TRUE(one_island) << ctx;
        }
        if (!one_island) {
          EXPECT_TRUE(IsPcieLevel(ParseLinkType(st.tp_link).value())) << ctx << st.tp_link;
        }
      }
    }
    EXPECT_EQ(next, m.num_hidden_layers) << ctx;
    // The shards together hold the whole model.
    EXPECT_GE(shard_bytes * (1 + 1e-9), sizes.TotalBytes()) << ctx;
    // The KV reserve is honoured.
    EXPECT_GE(rep.kv_tokens, max_context) << ctx;
    EXPECT_GT(rep.decode_latency_s, 0) << ctx;
    EXPECT_GT(rep.throughput_tokens_per_s, 0) << ctx;
  }
  EXPECT_EQ(gpus, r.plan.gpus_used) << ctx;
  EXPECT_LE(r.plan.gpus_used, c.total_gpus()) << ctx;
}

TEST(PlannerProperties, RandomClustersAndModels) {
  std::mt19937 rng(20261129);
  int planned = 0, exhausted = 0;
  for (int i = 0; i < 60; ++i) {
    const std::string toml = RandomTopology(rng);
    auto t = ParseTopologyToml(toml, "random.toml");
    ASSERT_TRUE(t.ok()) << t.status().ToString() << "\n" << toml;
    auto c = BuildClusterModel(*t);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    const ModelConfig m = RandomModel(rng);
    PlanOptions o;
    o.objective = i % 2 ? Objective::kThroughput : Objective::kLatency;
    o.allow_pcie_tp = i % 3 != 0;
    o.gpu_memory_fraction = 0.8 + 0.05 * (i % 3);
    PlacementPlanner p;
    auto r = p.Plan(m, *c, o);
    const std::string ctx = "case " + std::to_string(i) + "\n" + toml;
    if (!r.ok()) {
      ASSERT_EQ(r.status().code(), StatusCode::kResourceExhausted) << r.status().ToString() << ctx;
      ++exhausted;
      continue;
    }
    ++planned;
    CheckPlanProperties(m, *c, o, *r, ctx);
    if (::testing::Test::HasFailure()) {
      ADD_FAILURE() << r->ToText();
      return;
    }
  }
  // The generator makes mostly plannable cases; a broken planner rejecting
  // everything must not pass.
  EXPECT_GT(planned, 40) << exhausted << " cases did not fit";
}

TEST(PlannerProperties, ShippedTopologiesAndModels) {
  for (const char* topo : {"dgx_h100_x1.toml", "dgx_h100_x4.toml", "l40s_pcie_x4.toml",
                           "a100_nvlink_pairs_x2.toml", "mixed_a100_h100.toml", "h200_x2.toml"}) {
    const ClusterModel c = Cluster(topo);
    for (const char* model : {"llama-3-8b", "llama-2-13b", "llama-2-70b"}) {
      for (Objective obj : {Objective::kLatency, Objective::kThroughput}) {
        PlanOptions o;
        o.objective = obj;
        const ModelConfig m = Model(model);
        PlacementPlanner p;
        auto r = p.Plan(m, c, o);
        const std::string ctx = std::string(topo) + " " + model + " " + ObjectiveName(obj);
        ASSERT_TRUE(r.ok()) << ctx << ": " << r.status().ToString();
        CheckPlanProperties(m, c, o, *r, ctx);
      }
    }
  }
}

TEST(Planner, NothingFitsSaysWhy) {
  const ClusterModel c = Cluster("h200_x2.toml");
  PlanOptions o;
  o.max_context = 8192;
  PlacementPlanner p;
  auto r = p.Plan(Model("llama-3.1-405b"), c, o);
  ASSERT_EQ(r.status().code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(r.status().message(), HasSubstr("does not fit"));
  EXPECT_THAT(r.status().message(), HasSubstr("tp=2 pp=1"));
  o.gpu_memory_fraction = 1.5;
  EXPECT_EQ(p.Plan(Model("llama-3-8b"), c, o).status().code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(ParseObjective("speed").ok());
}

TEST(Planner, NoPcieTpKeepsGroupsInIslands) {
  PlanOptions o;
  o.allow_pcie_tp = false;
  const PlanResult r = MustPlan(Model("llama-2-70b"), Cluster("a100_nvlink_pairs_x2.toml"), o);
  for (const PlannedReplica& rep : r.plan.replicas)
    for (const PlannedStage& s : rep.stages) EXPECT_LE(s.tp, 2);
  EXPECT_THAT(r.ToText(),
              HasSubstr("tp=4: no group of 4 GPUs inside an NVLink island (largest 2)"));
}

TEST(Planner, CliDryRun) {
  const std::string dir = ::tessera::testing::MakeTempDir("plan-cli");
  const std::string cmd = ::tessera::testing::BinaryDir() + "/tessera plan --model " +
                          ConfigPath("models/llama-2-70b.json") + " --topology " +
                          ConfigPath("topologies/dgx_h100_x2.toml") +
                          " --min-kv-tokens 2000000 > " + dir + "/out 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << ::tessera::testing::ReadFileOrDie(dir + "/out");
  const std::string out = ::tessera::testing::ReadFileOrDie(dir + "/out");
  EXPECT_THAT(out, HasSubstr("Plan (objective: latency): tp=8 pp=2"));
  EXPECT_THAT(out, HasSubstr("stage 1  dgx-h100-1"));
  EXPECT_THAT(out, HasSubstr("Rejected:"));
  const std::string bad = ::tessera::testing::BinaryDir() + "/tessera plan --model " +
                          ConfigPath("models/llama-2-70b.json") + " --topology " + dir +
                          "/none.toml > " + dir + "/err 2>&1";
  EXPECT_NE(std::system(bad.c_str()), 0);
  EXPECT_THAT(::tessera::testing::ReadFileOrDie(dir + "/err"),
              HasSubstr("none.toml does not exist"));
}

// FP8 (issue #35): Llama-3.1-405B in bf16 (810 GB) does not fit one DGX
// H100 (8 x 80 GB); with its projections in FP8 it does, and the planner's
// bytes per GPU are 1 byte per projection parameter plus the block scales
// plus the bf16 embedding, lm_head and norms, over 8 GPUs.
TEST(Planner, Fp8ModelsArePlacedByTheirFp8Bytes) {
  PlanOptions o;
  o.min_kv_tokens = 4096;
  ModelConfig m = Model("llama-3.1-405b");
  PlacementPlanner planner;
  EXPECT_FALSE(planner.Plan(m, Cluster("dgx_h100_x1.toml"), o).ok());
  m.quantization.method = QuantMethod::kFp8;  // HF fp8, 128x128 blocks
  const PlanResult r = MustPlan(m, Cluster("dgx_h100_x1.toml"), o);
  EXPECT_EQ(r.plan.quantization, "fp8 (e4m3, block 128x128 weight scales, dynamic activations)");
  EXPECT_THAT(r.ToText(), HasSubstr("weights: fp8 (e4m3, block 128x128"));
  ASSERT_EQ(r.plan.replicas.size(), 1u);
  const PlannedStage& st = r.plan.replicas[0].stages[0];
  EXPECT_EQ(st.tp, 8);
  const double h = 16384, inter = 53248, q = 128 * 128, kv = 8 * 128, layers = 126, vocab = 128256;
  const double proj = h * q + 2 * h * kv + q * h + 3 * h * inter;
  const double scales =
      4 * ((q / 128) * (h / 128) * 2 + 2 * (kv / 128) * (h / 128) + 3 * (inter / 128) * (h / 128));
  const double want =
      (layers * (proj + scales) + 2 * vocab * h * 2) / 8 + layers * 2 * h * 2 + h * 2;
  EXPECT_NEAR(static_cast<double>(st.weight_bytes), want, 1e-6 * want);
  // The CLI: --quantization fp8 plans the bf16 checkpoint as online FP8.
  const std::string dir = ::tessera::testing::MakeTempDir("plan-fp8");
  const std::string cmd = ::tessera::testing::BinaryDir() + "/tessera plan --model " +
                          ConfigPath("models/llama-3.1-405b.json") + " --topology " +
                          ConfigPath("topologies/dgx_h100_x1.toml") +
                          " --quantization fp8 --min-kv-tokens 4096 > " + dir + "/out 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << ::tessera::testing::ReadFileOrDie(dir + "/out");
  EXPECT_THAT(::tessera::testing::ReadFileOrDie(dir + "/out"),
              HasSubstr("weights: online-fp8 (e4m3, per-channel weight scales"));
}

// Workers that dequantize FP8 at load (the CPU backend, keeps_fp8 false, or
// any backend at fp32) hold the projections at the serving dtype: the
// planner counts them so, and the FP8 405B no longer fits a DGX at bf16.
TEST(Planner, Fp8ModelsDequantizedAtLoadArePlacedByTheirDenseBytes) {
  PlanOptions o;
  o.min_kv_tokens = 4096;
  ModelConfig m = Model("llama-3.1-405b");
  m.quantization.method = QuantMethod::kFp8;
  PlacementPlanner planner;
  o.keeps_fp8 = false;
  EXPECT_FALSE(planner.Plan(m, Cluster("dgx_h100_x1.toml"), o).ok());
  // The same at an fp32 weight dtype, whatever keeps_fp8 says: a 8B model
  // at tp 1 holds 4 bytes per projection parameter.
  ModelConfig small = Model("llama-3-8b");
  small.quantization.method = QuantMethod::kFp8;
  o.keeps_fp8 = true;
  o.weight_dtype = o.kv_dtype = DType::kF32;
  o.fixed_tp = 1;
  o.fixed_pp = 1;
  const PlanResult dense = MustPlan(small, Cluster("dgx_h100_x1.toml"), o);
  ModelConfig plain = Model("llama-3-8b");
  const PlanResult f32 = MustPlan(plain, Cluster("dgx_h100_x1.toml"), o);
  EXPECT_EQ(dense.plan.replicas[0].stages[0].weight_bytes,
            f32.plan.replicas[0].stages[0].weight_bytes);
}

// The fp8 KV cache (kv_cache.dtype = "fp8"): one byte per K/V element, so the same KV pool
// holds twice the tokens of a bf16 cache and four times an fp32 one (the CPU's), and the
// model note names the KV dtype.
TEST(Planner, Fp8KvCacheHoldsTwiceTheTokensOfBf16) {
  PlanOptions o;
  o.min_kv_tokens = 4096;
  o.fixed_tp = 1;
  o.fixed_pp = 1;
  const ModelConfig m = Model("llama-3-8b");
  o.weight_dtype = o.kv_dtype = DType::kBF16;
  const PlanResult bf16 = MustPlan(m, Cluster("dgx_h100_x1.toml"), o);
  o.kv_dtype = DType::kF8E4M3;
  const PlanResult fp8 = MustPlan(m, Cluster("dgx_h100_x1.toml"), o);
  o.weight_dtype = o.kv_dtype = DType::kF32;
  const PlanResult f32 = MustPlan(m, Cluster("dgx_h100_x1.toml"), o);
  o.kv_dtype = DType::kF8E4M3;
  const PlanResult f32_fp8 = MustPlan(m, Cluster("dgx_h100_x1.toml"), o);
  const PlannedReplica &a = bf16.plan.replicas[0], &b = fp8.plan.replicas[0];
  EXPECT_EQ(a.stages[0].kv_bytes, b.stages[0].kv_bytes);  // the same pool
  EXPECT_EQ(a.stages[0].weight_bytes, b.stages[0].weight_bytes);
  // 32 layers x 2 x 8 kv heads x 128 = 65536 elements per token: 128 KiB bf16, 64 KiB fp8.
  EXPECT_NEAR(static_cast<double>(b.kv_tokens), 2.0 * static_cast<double>(a.kv_tokens), 2.0);
  EXPECT_NEAR(static_cast<double>(b.kv_tokens), static_cast<double>(b.stages[0].kv_bytes) / 65536.0,
              1.0);
  EXPECT_NEAR(static_cast<double>(f32_fp8.plan.replicas[0].kv_tokens),
              4.0 * static_cast<double>(f32.plan.replicas[0].kv_tokens), 4.0);
  EXPECT_THAT(fp8.explanation.notes[0], HasSubstr("KV 66 KB per token (F8_E4M3)"));
  // The CLI: tessera plan --kv-cache-dtype fp8 plans the same.
  const std::string dir = ::tessera::testing::MakeTempDir("plan-kv-fp8");
  const std::string cmd = ::tessera::testing::BinaryDir() + "/tessera plan --model " +
                          ConfigPath("models/llama-3-8b.json") + " --topology " +
                          ConfigPath("topologies/dgx_h100_x1.toml") +
                          " --dtype BF16 --kv-cache-dtype fp8 > " + dir + "/out 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << ::tessera::testing::ReadFileOrDie(dir + "/out");
  EXPECT_THAT(::tessera::testing::ReadFileOrDie(dir + "/out"),
              HasSubstr("KV 66 KB per token (F8_E4M3)"));
}

}  // namespace
}  // namespace tessera
