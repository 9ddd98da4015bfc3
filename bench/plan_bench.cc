// Placement planner benchmarks (Google Benchmark; built, not run by ctest):
//   ./build/bench/plan_bench
//
// BM_Plan: plans Llama-2-70B on N DGX H100 hosts (8 GPUs each) by latency and
// by throughput; the bar is N = 1024 (8192 GPUs) in under 1 s.
// BM_Parse: reading and modelling the same cluster from its TOML text.
// BM_H200Predictions: the cost model's predictions for the 2 x H200 GPU
// machine (configs/topologies/h200_x2.toml), as counters, to compare with
// what is measured there (shared/gpu-machine.md: NCCL all-reduce of 16 KiB
// ~20 us per call, 512 MiB at ~314 GB/s bus bandwidth; decode bound by
// weight bytes / 4.8 TB/s):
//   allreduce_16KiB_us, allreduce_512MiB_busbw_GBps: one bf16 all-reduce over
//     the NV18 pair;
//   decode_ms_<model>_tp2: predicted batch-1 decode latency per token.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "common/topology/topology_file.h"
#include "coordinator/placement/cluster_model.h"
#include "coordinator/placement/placement_planner.h"

namespace tessera {
namespace {

std::string SourcePath(const std::string& rel) {
  return std::string(TESSERA_SOURCE_DIR) + "/" + rel;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

ModelConfig Model(const std::string& name) {
  const std::string path = SourcePath("configs/models/" + name + ".json");
  auto m = ParseModelConfig(ReadFile(path), path);
  if (!m.ok()) {
    std::fprintf(stderr, "%s\n", m.status().ToString().c_str());
    std::abort();
  }
  return *m;
}

// configs/topologies/dgx_h100_x1.toml with its host count replaced.
std::string DgxToml(int hosts) {
  std::string t = ReadFile(SourcePath("configs/topologies/dgx_h100_x1.toml"));
  const size_t at = t.find("count = 1\n");
  if (at == std::string::npos) std::abort();
  return t.replace(at, 10, "count = " + std::to_string(hosts) + "\n");
}

ClusterModel Dgx(int hosts) {
  auto t = ParseTopologyToml(DgxToml(hosts), "dgx.toml");
  if (!t.ok()) std::abort();
  auto c = BuildClusterModel(*t);
  if (!c.ok()) std::abort();
  return *c;
}

void BM_Plan(benchmark::State& state) {
  const ClusterModel cluster = Dgx(static_cast<int>(state.range(0)));
  const ModelConfig model = Model("llama-2-70b");
  PlanOptions o;
  o.objective = state.range(1) ? Objective::kThroughput : Objective::kLatency;
  PlacementPlanner planner;
  int candidates = 0;
  for (auto _ : state) {
    auto r = planner.Plan(model, cluster, o);
    if (!r.ok()) state.SkipWithError(r.status().ToString().c_str());
    candidates = r->explanation.candidates_evaluated;
    benchmark::DoNotOptimize(r);
  }
  state.counters["gpus"] = cluster.total_gpus();
  state.counters["candidates"] = candidates;
  state.SetLabel(state.range(1) ? "throughput" : "latency");
}
BENCHMARK(BM_Plan)->ArgsProduct({{2, 128, 1024}, {0, 1}})->Unit(benchmark::kMillisecond);

void BM_Parse(benchmark::State& state) {
  const std::string toml = DgxToml(static_cast<int>(state.range(0)));
  for (auto _ : state) {
    auto t = ParseTopologyToml(toml, "dgx.toml");
    auto c = BuildClusterModel(*t);
    benchmark::DoNotOptimize(c);
  }
}
BENCHMARK(BM_Parse)->Arg(1024)->Unit(benchmark::kMillisecond);

void BM_H200Predictions(benchmark::State& state) {
  auto t = LoadTopologyFile(SourcePath("configs/topologies/h200_x2.toml"));
  if (!t.ok()) std::abort();
  auto c = BuildClusterModel(*t);
  const CostConstants k;
  const double link = c->nodes[0].links[0][1].bandwidth_gb_per_s * 1e9;
  double ar16k = 0, ar512m = 0;
  PlacementPlanner planner;
  PlanOptions o;
  o.objective = Objective::kLatency;
  o.max_context = 4096;
  std::map<std::string, double> decode;
  for (auto _ : state) {
    ar16k = AllReduceSeconds(2, 16384, link, k.nvlink_step_s, k);
    ar512m = AllReduceSeconds(2, 512.0 * (1 << 20), link, k.nvlink_step_s, k);
    for (const char* name : {"llama-3-8b", "llama-2-13b", "llama-2-70b"}) {
      auto r = planner.Plan(Model(name), *c, o);
      if (!r.ok()) continue;
      // The tp=2 candidate's latency (the planner's own pick may differ).
      for (const CandidateSummary& s : r->explanation.top)
        if (s.layout == "tp=2 pp=1") decode[name] = s.decode_latency_s;
    }
  }
  state.counters["allreduce_16KiB_us"] = ar16k * 1e6;
  // NCCL's bus bandwidth: 2 (t-1)/t x bytes / time.
  state.counters["allreduce_512MiB_busbw_GBps"] = 2.0 * 0.5 * 512.0 * (1 << 20) / ar512m / 1e9;
  for (const auto& [name, s] : decode) state.counters["decode_ms_" + name + "_tp2"] = s * 1e3;
}
BENCHMARK(BM_H200Predictions)->Iterations(1);

}  // namespace
}  // namespace tessera

BENCHMARK_MAIN();
