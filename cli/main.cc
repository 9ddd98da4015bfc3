// tessera: the command-line front end.
//   tessera generate --model DIR --prompt TEXT [sampling options]
// streams the model's answer to stdout and reports load time, prefill and
// decode speed on stderr (and, with --logprobs N, each generated token's
// log-probability and its N best alternatives).
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/local_launcher.h"
#include "common/engine/engine.h"
#include "common/net/endpoint.h"
#include "common/net/tcp_store.h"
#include "common/tokenizer/chat_template.h"
#include "common/tokenizer/tokenizer.h"
#include "kernels/cuda_runtime.h"
#include "worker/exec/local_executor.h"
#include "worker/exec/rank_device.h"
#include "worker/exec/rank_runner.h"
#include "worker/model/kv_cache_scales.h"
#include "worker/model/model_loader.h"

namespace {

struct GenerateArgs {
  std::string model;
  std::string prompt;
  int max_tokens = 128;
  float temperature = 0.0f;
  float top_p = 1.0f;
  int top_k = 0;
  uint64_t seed = 0;
  bool raw = false;
  std::string chat_template;
  std::vector<std::string> stop;
  int64_t block_size = 16;
  std::vector<int> tp = {1};  // --tp 2 (every stage) or --tp 2,1 (one entry per stage)
  int pp = 1;
  std::vector<int> layers;       // per stage; empty = even split
  bool expert_parallel = false;  // MoE: each tp rank holds whole experts (--expert-parallel)
  double timeout = 30.0;
  int rank = -1;                        // set in rank processes spawned by the launcher
  std::string store;                    // host:port of the launcher's rendezvous store
  std::string device = "cpu";           // "cpu" or "cuda[:N]" (single process only)
  std::string dtype = "auto";           // CUDA compute dtype: auto, bf16, f16 or f32
  std::string quantization = "none";    // online quantization at load: none or fp8
  std::string kv_cache_dtype = "auto";  // KV cache element type: auto or fp8 ([kv_cache] dtype)
  int logprobs = -1;        // -1 = off; else alternatives per token (SamplingParams::logprobs)
  bool ignore_eos = false;  // generate max_tokens even past EOS (benchmarks, fault tests)
};

// id:"text" of one token, its text decoded alone with \\, \" and control
// bytes escaped (\n, \t, \xNN).
std::string Quoted(const tessera::Tokenizer& tok, int32_t id) {
  std::string out = std::to_string(id) + ":\"";
  for (unsigned char c : tok.Decode(&id, 1, false)) {
    if (c == '\\' || c == '"') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

// One stderr line per generated token: its text, log-probability and the
// alternatives (raw distribution, kernels/sampling.h).
void PrintLogprobs(const tessera::GenerationResult& r, const tessera::Tokenizer& tok) {
  bool any = false;
  for (size_t i = 0; i < r.logprobs.size(); ++i) {
    const tessera::SampledToken& t = r.logprobs[i];
    if (!t.has_logprobs) continue;
    any = true;
    std::string line = "tessera: token " + std::to_string(i) + " " + Quoted(tok, t.token_id) +
                       " logprob " + std::to_string(t.logprob);
    for (size_t k = 0; k < t.top.size(); ++k)
      line += (k ? ", " : " | top ") + Quoted(tok, t.top[k].token_id) + " " +
              std::to_string(t.top[k].logprob);
    std::fprintf(stderr, "%s\n", line.c_str());
  }
  if (!any && !r.logprobs.empty())
    std::fprintf(stderr, "tessera: --logprobs: not returned over a pipeline (pp > 1)\n");
}

std::vector<std::string> g_argv;  // this process's arguments, for spawning ranks
tessera::LocalLauncher* g_launcher = nullptr;

void ForwardToRanks(int sig) {
  if (g_launcher) g_launcher->ForwardSignal(sig);
}

int Fail(const tessera::Status& s) {
  std::fprintf(stderr, "tessera: error: %s\n", s.ToString().c_str());
  return 1;
}

// Spawns one process per rank (this binary with --rank/--store added) and
// waits for them; rank 0 prints the answer.
int Launch(const tessera::ParallelConfig& par) {
  using namespace tessera;
  // The ranks get the store's secret through their environment (readable by
  // this user only), never on the command line.
  auto secret = NewStoreSecret();
  if (!secret.ok()) return Fail(secret.status());
  TcpStoreServerOptions so;
  so.secret = *secret;
  auto server = TcpStoreServer::Start("127.0.0.1", 0, std::move(so));
  if (!server.ok()) return Fail(server.status());
  setenv(kStoreSecretEnv, HexEncode(*secret).c_str(), 1);
  char exe[4096];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0) return Fail(IoError("cannot resolve /proc/self/exe"));
  exe[n] = '\0';
  std::vector<ChildSpec> children;
  for (int r = 0; r < par.world_size(); ++r) {
    ChildSpec c;
    c.name = "rank " + std::to_string(r) + " (stage " + std::to_string(par.StageOf(r)) +
             ", tp_rank " + std::to_string(par.TpRankOf(r)) + ")";
    c.argv.push_back(exe);
    for (size_t i = 1; i < g_argv.size(); ++i) c.argv.push_back(g_argv[i]);
    c.argv.push_back("--rank");
    c.argv.push_back(std::to_string(r));
    c.argv.push_back("--store");
    c.argv.push_back(FormatHostPort("127.0.0.1", (*server)->port()));
    c.quiet_stdout = r != 0;
    children.push_back(std::move(c));
  }
  LocalLauncher launcher;
  g_launcher = &launcher;
  std::signal(SIGINT, ForwardToRanks);
  std::signal(SIGTERM, ForwardToRanks);
  Status s = launcher.Start(children);
  unsetenv(kStoreSecretEnv);  // the ranks have it
  // A rank that fails ends the run: the others are killed at once (a
  // stopped or hung peer would otherwise hold the launch for their own
  // timeouts), so a fault ends `generate` within --timeout of it.
  if (s.ok()) s = launcher.Wait(/*grace_seconds=*/0.0);
  g_launcher = nullptr;
  if (!s.ok()) return Fail(s.WithContext("tp=" + par.TpString() + " pp=" + std::to_string(par.pp)));
  return 0;
}

// The layout of --tp/--pp/--layers: one --tp value is the tp of every stage;
// several (--tp 2,1) give each stage its own and must number --pp (which
// they imply when --pp is not given).
tessera::StatusOr<tessera::ParallelConfig> ParseLayout(const tessera::ModelConfig& cfg,
                                                       const GenerateArgs& a, bool pp_given) {
  using namespace tessera;
  if (a.tp.size() <= 1)
    return ParallelConfig::Make(cfg, a.tp.empty() ? 1 : a.tp[0], a.pp, a.layers, a.expert_parallel);
  const int n = static_cast<int>(a.tp.size());
  if (pp_given && a.pp != n)
    return InvalidArgument("--tp lists " + std::to_string(n) + " stages but --pp is " +
                           std::to_string(a.pp));
  return ParallelConfig::MakePerStage(cfg, a.tp, a.layers, a.expert_parallel);
}

int RunGenerate(const GenerateArgs& a, bool pp_given) {
  using namespace tessera;
  auto tok = Tokenizer::Load(a.model);
  if (!tok.ok()) return Fail(tok.status());
  auto cfg = LoadModelConfig(a.model);
  if (!cfg.ok()) return Fail(cfg.status());
  auto par = ParseLayout(*cfg, a, pp_given);
  if (!par.ok()) return Fail(par.status());
  auto online = ParseOnlineQuantization(a.quantization);
  if (!online.ok()) return Fail(online.status().WithContext("--quantization"));
  auto kv_dtype = ParseKvCacheDType(a.kv_cache_dtype, "--kv-cache-dtype");
  if (!kv_dtype.ok()) return Fail(kv_dtype.status());
  std::string text = a.prompt;
  bool add_special = true;
  if (!a.raw) {
    auto tmpl = a.chat_template.empty()
                    ? ChatTemplate::FromJinja((*tok)->chat_template(), (*tok)->bos_token(),
                                              (*tok)->eos_token())
                    : ChatTemplate::FromName(a.chat_template);
    if (!tmpl.ok()) return Fail(tmpl.status().WithContext("--chat-template (or pass --raw)"));
    auto rendered = tmpl->Render({{"user", a.prompt}});
    if (!rendered.ok()) return Fail(rendered.status());
    text = *rendered;
    add_special = tmpl->add_special_tokens();
  }
  GenerationRequest req;
  req.prompt_ids = (*tok)->Encode(text, add_special);
  req.max_tokens = a.max_tokens;
  req.sampling.temperature = a.temperature;
  req.sampling.top_p = a.top_p;
  req.sampling.top_k = a.top_k;
  req.sampling.seed = a.seed;
  req.sampling.logprobs = a.logprobs;
  req.stop = a.stop;
  req.ignore_eos = a.ignore_eos;
  if (Status s = req.sampling.Validate(); !s.ok()) return Fail(s);
  const int64_t ctx = static_cast<int64_t>(req.prompt_ids.size()) + a.max_tokens;
  // The coordinator's rule (common/format/model_config.h: dynamic NTK RoPE
  // runs past max_position_embeddings).
  if (const ContextLimit limit = ModelContextLimit(*cfg); ctx > limit.max_tokens)
    return Fail(InvalidArgument("prompt (" + std::to_string(req.prompt_ids.size()) +
                                " tokens) + --max-tokens " + std::to_string(a.max_tokens) +
                                " exceeds the model's " + limit.bound));

  const int64_t blocks = BlockAllocator::BlocksFor(ctx, a.block_size);
  auto print_text = [](size_t, const std::string& delta) {
    std::fwrite(delta.data(), 1, delta.size(), stdout);
    std::fflush(stdout);
  };
  GenerationResult result;
  EngineStats st;
  double load_seconds = 0.0;
  int64_t weight_bytes = 0;
  const bool cuda = a.device.rfind("cuda", 0) == 0;
  if (!cuda && a.device != "cpu")
    return Fail(InvalidArgument("--device '" + a.device + "': expected cpu, cuda or cuda:N"));
  if (cuda && par->world_size() != 1)
    return Fail(InvalidArgument(
        "--device cuda runs one process on one GPU; for tp/pp on GPUs start the daemons "
        "(tessera-coordinator and one tessera-worker --device N per GPU)"));
  if (par->world_size() == 1 && a.rank < 0) {
    RankDevice dev;
    if (cuda) {
      const int gpu =
          a.device.size() > 5 && a.device[4] == ':' ? std::atoi(a.device.c_str() + 5) : 0;
      auto dtype = ParseRuntimeDType(a.dtype, *cfg);
      if (!dtype.ok()) return Fail(dtype.status().WithContext("--dtype"));
      auto made = MakeRankDevice(RankBackend::kCuda, gpu, *dtype);
      if (!made.ok()) return Fail(made.status().WithContext("--device " + a.device));
      dev = std::move(*made);
    } else {
      dev.backend = &kernels::CpuBackend();
    }
    auto loaded = LoadModel(a.model, *par, 0, nullptr, {}, dev.backend, nullptr, *online);
    if (!loaded.ok()) return Fail(loaded.status());
    load_seconds = loaded->load_seconds;
    weight_bytes = loaded->weight_bytes;
    const StageLayout lay = loaded->model->layout();
    auto kv = MakeStageKvCache(*dev.backend, a.model, lay, blocks, a.block_size,
                               loaded->config.head_dim, *kv_dtype);
    if (!kv.ok()) return Fail(kv.status());
    std::unique_ptr<KvCache> cache = std::move(*kv);
    BlockAllocator allocator(blocks);
    LocalExecutor executor(std::move(loaded->model), std::move(cache));
    Engine engine(loaded->config, &executor, &allocator, a.block_size, tok->get());
    auto results = engine.Generate({req}, print_text);
    if (!results.ok()) return Fail(results.status());
    result = (*results)[0];
    st = engine.stats();
  } else if (a.rank < 0) {
    return Launch(*par);
  } else {
    RankOptions o;
    o.model_dir = a.model;
    o.tp = par->tp;
    o.pp = par->pp;
    o.tp_per_stage = par->tp_per_stage;
    o.layers_per_stage = a.layers;
    o.expert_parallel = a.expert_parallel;
    o.rank = a.rank;
    StatusOr<TcpEndpoint> store = ParseHostPort(a.store, EndpointUse::kConnect);
    if (!store.ok()) return Fail(store.status().WithContext("--store"));
    o.store_host = store->host;
    o.store_port = store->port;
    auto secret = TakeStoreSecretFromEnv();
    if (!secret.ok()) return Fail(secret.status().WithContext("--rank"));
    o.store_secret = *secret;
    o.timeout_seconds = a.timeout;
    o.kv_blocks = blocks;
    o.block_size = a.block_size;
    o.quantization = *online;
    o.kv_cache_dtype = *kv_dtype;
    auto r = RunRank(o, {req}, tok->get(), a.rank == 0 ? TextCallback(print_text) : TextCallback());
    if (!r.ok()) return Fail(r.status());
    if (a.rank != 0) return 0;
    result = r->results[0];
    st = r->stats;
    load_seconds = r->load_seconds;
    weight_bytes = r->weight_bytes;
  }
  std::fputc('\n', stdout);
  std::fflush(stdout);
  PrintLogprobs(result, **tok);
  std::fprintf(
      stderr,
      "tessera: tp=%s pp=%d | load %.2f s (%.1f MB weights on rank 0) | prefill %lld tokens, %.1f "
      "tokens/s | decode "
      "%lld tokens, %.1f tokens/s | finish: %s\n",
      par->TpString().c_str(), par->pp, load_seconds, static_cast<double>(weight_bytes) / 1e6,
      static_cast<long long>(st.prefill_tokens),
      st.prefill_seconds > 0 ? static_cast<double>(st.prefill_tokens) / st.prefill_seconds : 0.0,
      static_cast<long long>(st.decode_tokens),
      st.decode_seconds > 0 ? static_cast<double>(st.decode_tokens) / st.decode_seconds : 0.0,
      FinishReasonName(result.finish_reason));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"tessera: tensor- and pipeline-parallel LLM serving"};
  app.require_subcommand(1);
  app.set_version_flag("--version", [] {
    std::string v = std::string("tessera ") + TESSERA_VERSION + " (CUDA backend: ";
    v += tessera::kernels::CudaCompiledIn() ? "built" : "not built";
    return v + ")";
  });

  GenerateArgs g;
  CLI::App* gen = app.add_subcommand("generate", "generate text from a prompt on this machine");
  gen->add_option("--model", g.model, "Hugging Face model directory")
      ->required()
      ->check(CLI::ExistingDirectory);
  gen->add_option("--prompt", g.prompt, "prompt text (a user message unless --raw)")->required();
  gen->add_option("--max-tokens", g.max_tokens, "tokens to generate at most")
      ->check(CLI::Range(0, 1 << 20));
  gen->add_option("--temperature", g.temperature, "0 = greedy")->check(CLI::Range(0.0f, 100.0f));
  gen->add_option("--top-p", g.top_p, "nucleus mass in (0, 1]")->check(CLI::Range(0.0f, 1.0f));
  gen->add_option("--top-k", g.top_k, "0 = off")->check(CLI::NonNegativeNumber);
  gen->add_option("--seed", g.seed, "sampling seed");
  gen->add_option("--stop", g.stop, "stop string (repeatable)");
  gen->add_option("--logprobs", g.logprobs,
                  "print each token's log-probability and this many alternatives (0..20) on "
                  "stderr")
      ->check(CLI::Range(0, 20));
  gen->add_flag("--raw", g.raw, "send the prompt as is, without the chat template");
  gen->add_flag("--ignore-eos", g.ignore_eos, "keep generating past EOS, up to --max-tokens");
  gen->add_option("--chat-template", g.chat_template,
                  "chatml, llama3 or llama2 (default: detected)");
  gen->add_option("--tp", g.tp,
                  "tensor-parallel ranks per stage: one value for every stage, or one per stage "
                  "(--tp 2,1)")
      ->delimiter(',')
      ->check(CLI::Range(1, 64));
  CLI::Option* pp_opt = gen->add_option("--pp", g.pp, "pipeline stages")->check(CLI::Range(1, 64));
  gen->add_option("--layers", g.layers,
                  "layers per stage, e.g. --layers 10 20 (default: even split)");
  gen->add_flag("--expert-parallel", g.expert_parallel,
                "MoE models: each tp rank holds whole experts, 1/tp of them (default: a 1/tp "
                "slice of every expert)");
  gen->add_option("--timeout", g.timeout,
                  "seconds before a collective or receive is declared failed")
      ->check(CLI::PositiveNumber);
  gen->add_option("--device", g.device,
                  "cpu, or cuda[:N] to run on GPU N (one process: --tp 1 --pp 1)");
  gen->add_option("--dtype", g.dtype, "CUDA compute dtype: auto (the checkpoint's), bf16, f16, f32")
      ->check(CLI::IsMember({"auto", "bf16", "f16", "f32"}));
  gen->add_option("--quantization", g.quantization,
                  "online quantization at load: none, or fp8 (per-channel FP8 projections, as "
                  "model.quantization)")
      ->check(CLI::IsMember({"none", "fp8"}));
  gen->add_option("--kv-cache-dtype", g.kv_cache_dtype,
                  "KV cache element type: auto (the compute dtype), or fp8 (e4m3 with per-layer "
                  "scales from the checkpoint, else 1.0; as kv_cache.dtype)")
      ->check(CLI::IsMember({"auto", "fp8"}));
  gen->add_option("--rank", g.rank, "")->group("");  // set by the launcher for rank processes
  gen->add_option("--store", g.store, "")->group("");
  tessera::cli::Subcommand topo = tessera::cli::AddTopoCommand(app);
  tessera::cli::Subcommand plan = tessera::cli::AddPlanCommand(app);
  tessera::cli::Subcommand up = tessera::cli::AddUpCommand(app);
  tessera::cli::Subcommand status = tessera::cli::AddStatusCommand(app);
  tessera::cli::Subcommand keygen = tessera::cli::AddKeygenCommand(app);
  g_argv.assign(argv, argv + argc);
  CLI11_PARSE(app, argc, argv);
  if (gen->parsed()) {
    if (g.tp.size() > 1 && pp_opt->count() == 0) g.pp = static_cast<int>(g.tp.size());
    return RunGenerate(g, pp_opt->count() > 0);
  }
  if (topo.app->parsed()) return topo.run();
  if (plan.app->parsed()) return plan.run();
  if (up.app->parsed()) return up.run();
  if (status.app->parsed()) return status.run();
  if (keygen.app->parsed()) return keygen.run();
  return 0;
}
