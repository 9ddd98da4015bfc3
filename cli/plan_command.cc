// `tessera plan`: a placement dry run. Reads a model config and a topology
// file, runs the PlacementPlanner and prints the placement and its
// explanation; needs no GPU. With --cluster URL it prints the plan and
// reasoning of a running coordinator instead.
#include <sys/stat.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "cli/admin_reply.h"
#include "cli/commands.h"
#include "cli/plan_view.h"
#include "common/format/kv_cache_dtype.h"
#include "common/net/http_client.h"
#include "common/topology/topology_file.h"
#include "coordinator/placement/cluster_model.h"
#include "coordinator/placement/placement_planner.h"

namespace tessera::cli {

namespace {

struct PlanArgs {
  std::string model;
  std::string topology;
  std::string objective = "latency";
  int64_t max_context = 0;
  int64_t min_kv_tokens = 0;
  double memory_fraction = 0.9;
  std::string dtype;
  std::string quantization = "none";    // model.quantization: none or fp8
  std::string kv_cache_dtype = "auto";  // kv_cache.dtype: auto or fp8
  int64_t prompt_tokens = 512;
  int64_t output_tokens = 256;
  int64_t max_batch = 256;
  int max_pp = 0;
  int top = 5;
  bool cross_node_tp = false;
  bool no_pcie_tp = false;
  bool show_cluster = false;
  std::string cluster_url;  // --cluster: ask a running coordinator instead
  std::string token;
  // The dry-run options given on the command line (AddPlanCommand: every option of the
  // subcommand but --cluster, --token and --help): --cluster refuses them, as they would shape
  // a plan it does not make.
  std::vector<std::string> dry_run_options_given;
};

int Fail(const Status& s) {
  std::fprintf(stderr, "tessera: error: %s\n", s.ToString().c_str());
  return 1;
}

// A config.json file, or a model directory holding one.
StatusOr<ModelConfig> LoadModel(const std::string& path) {
  struct stat sb;
  if (stat(path.c_str(), &sb) != 0) return NotFound("--model " + path + " does not exist");
  if (S_ISDIR(sb.st_mode)) return LoadModelConfig(path);
  std::ifstream in(path, std::ios::binary);
  if (!in) return IoError("cannot read " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ParseModelConfig(ss.str(), path);
}

// `tessera plan --cluster URL`: the running coordinator's plan and reasoning
// (GET /admin/plan on its admin listener).
int RunClusterPlan(const PlanArgs& a) {
  std::string host;
  int port = 0;
  if (Status s = ParseHttpUrl(a.cluster_url, &host, &port); !s.ok()) return Fail(s);
  HttpReply r = HttpCall(port, "GET", "/admin/plan", "", a.token, host);
  if (r.status != 200) return Fail(AdminCallError(host, port, "/admin/plan", r, !a.token.empty()));
  const std::string out = FormatServingPlan(r.body, true);
  std::fwrite(out.data(), 1, out.size(), stdout);
  // Exit 1 when the coordinator has no plan (refused or still waiting).
  return out.find("placement: tp=") == std::string::npos ? 1 : 0;
}

int RunPlan(const PlanArgs& a) {
  if (!a.cluster_url.empty()) {
    if (!a.dry_run_options_given.empty()) {
      std::string given;
      for (const std::string& o : a.dry_run_options_given) given += (given.empty() ? "" : ", ") + o;
      return Fail(InvalidArgument("--cluster prints the running coordinator's plan, which " +
                                  given +
                                  " would not change (they shape a dry run): drop them, or drop "
                                  "--cluster for a dry run"));
    }
    return RunClusterPlan(a);
  }
  if (a.model.empty() || a.topology.empty())
    return Fail(InvalidArgument("a dry run needs --model and --topology (or --cluster URL)"));
  auto model = LoadModel(a.model);
  if (!model.ok()) return Fail(model.status());
  auto online = ParseOnlineQuantization(a.quantization);
  if (!online.ok()) return Fail(online.status().WithContext("--quantization"));
  if (*online == QuantMethod::kOnlineFp8 && !model->quantization.quantized())
    model->quantization = OnlineFp8Quantization();
  auto topo = LoadTopologyFile(a.topology);
  if (!topo.ok()) return Fail(topo.status());
  auto cluster = BuildClusterModel(*topo);
  if (!cluster.ok()) return Fail(cluster.status());
  PlanOptions o;
  auto obj = ParseObjective(a.objective);
  if (!obj.ok()) return Fail(obj.status().WithContext("--objective"));
  o.objective = *obj;
  o.max_context = a.max_context;
  o.min_kv_tokens = a.min_kv_tokens;
  o.gpu_memory_fraction = a.memory_fraction;
  if (!a.dtype.empty()) {
    auto dt = ParseDType(a.dtype);
    if (!dt.ok()) return Fail(dt.status().WithContext("--dtype"));
    if (*dt != DType::kF32 && *dt != DType::kF16 && *dt != DType::kBF16)
      return Fail(InvalidArgument("--dtype " + a.dtype +
                                  ": expected BF16, F16 or F32 (FP8 weights: --quantization fp8)"));
    o.weight_dtype = *dt;
  }
  auto kv = ParseKvCacheDType(a.kv_cache_dtype, "--kv-cache-dtype");
  if (!kv.ok()) return Fail(kv.status());
  if (*kv == KvCacheDType::kFp8) o.kv_dtype = DType::kF8E4M3;  // one byte per K/V element
  o.prompt_tokens = a.prompt_tokens;
  o.output_tokens = a.output_tokens;
  o.max_batch = a.max_batch;
  o.max_pp = a.max_pp;
  o.top_candidates = a.top;
  o.allow_cross_node_tp = a.cross_node_tp;
  o.allow_pcie_tp = !a.no_pcie_tp;
  PlacementPlanner planner;
  auto result = planner.Plan(*model, *cluster, o);
  if (!result.ok()) return Fail(result.status());
  std::string out;
  if (a.show_cluster) out = cluster->Describe() + "\n";
  out += result->ToText();
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

}  // namespace

Subcommand AddPlanCommand(CLI::App& app) {
  auto a = std::make_shared<PlanArgs>();
  CLI::App* cmd =
      app.add_subcommand("plan", "dry run: place a model on a described cluster and explain why");
  cmd->add_option("--model", a->model, "a model's config.json, or its directory");
  cmd->add_option("--topology", a->topology,
                  "a topology file (TOML, docs/topology.md; or tessera topo --json)");
  const CLI::Option* cluster =
      cmd->add_option("--cluster", a->cluster_url,
                      "instead: a running coordinator's admin URL (http://HOST:PORT); prints its "
                      "plan and reasoning");
  const CLI::Option* token =
      cmd->add_option("--token", a->token, "admin bearer token for --cluster");
  cmd->add_option("--objective", a->objective, "latency or throughput")
      ->check(CLI::IsMember({"latency", "throughput"}));
  cmd->add_option("--max-context", a->max_context,
                  "longest sequence served, tokens (default: the model's)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--min-kv-tokens", a->min_kv_tokens,
                  "KV cache each replica must hold, tokens (default: max context)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--gpu-memory-fraction", a->memory_fraction, "share of GPU memory to use")
      ->check(CLI::Range(0.01, 1.0));
  cmd->add_option("--dtype", a->dtype,
                  "weight dtype to serve in: BF16, F16 or F32 (default: the checkpoint's)");
  cmd->add_option("--quantization", a->quantization,
                  "none, or fp8: plan for the projections quantized to FP8 at load "
                  "(model.quantization); an FP8 checkpoint is planned in FP8 either way")
      ->check(CLI::IsMember({"none", "fp8"}));
  cmd->add_option("--kv-cache-dtype", a->kv_cache_dtype,
                  "auto (the weight dtype), or fp8: plan the KV cache at one byte per element "
                  "(kv_cache.dtype)")
      ->check(CLI::IsMember({"auto", "fp8"}));
  cmd->add_option("--prompt-tokens", a->prompt_tokens, "throughput workload: prompt length")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--output-tokens", a->output_tokens, "throughput workload: tokens generated")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--max-batch", a->max_batch, "sequences per replica at most")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--max-pp", a->max_pp, "pipeline stages at most (default: layers)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--top", a->top, "candidates to list")->check(CLI::Range(1, 100));
  cmd->add_flag("--allow-cross-node-tp", a->cross_node_tp, "let tp groups span hosts");
  cmd->add_flag("--no-pcie-tp", a->no_pcie_tp, "keep tp groups inside NVLink islands");
  cmd->add_flag("--show-cluster", a->show_cluster, "print the cluster model first");
  // Every other option shapes a dry run, so --cluster refuses it: the registrations above are
  // the one list of them.
  return {cmd, [a, cmd, cluster, token] {
            for (const CLI::Option* opt : cmd->get_options())
              if (opt != cluster && opt != token && opt != cmd->get_help_ptr() &&
                  opt != cmd->get_help_all_ptr() && opt->count() > 0)
                a->dry_run_options_given.push_back(opt->get_name());
            return RunPlan(*a);
          }};
}

}  // namespace tessera::cli
