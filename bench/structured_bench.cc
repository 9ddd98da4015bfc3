// structured_bench: the cost of structured outputs on decode (CPU, or one
// GPU with --device cuda, where the logits and the mask live on the device). The same
// batch of requests (batch 64 by default, greedy, EOS ignored) decodes
// through the real Engine / LocalExecutor / SequenceSamplers path twice per
// round, unconstrained and with a response_format json_schema (LLGuidance's
// mask computed on the mask threads while the step runs, then applied to the
// logits), alternating over --rounds rounds so that both see the same host
// load. The schema is a typical extraction schema (strings, an integer, an
// array of strings); EOS is ignored, so a sequence whose document completed
// keeps the batch at its size and then draws EOS (its mask, EOS alone, costs
// no LLGuidance work): the summary says how many completed.
//
// Prints one JSON object per run and a summary:
//   {"what":"decode","mode":"json_schema","batch":64,"tokens_per_s":...,"ms_per_step":...}
//   {"what":"summary","unconstrained_tokens_per_s":...,"json_schema_tokens_per_s":...,
//    "cost_percent":...}
//
// Usage: structured_bench [--model DIR] [--batch 64] [--prompt-len 16]
//        [--new-tokens 32] [--rounds 3] [--device cpu|cuda] [--dtype bf16|f16|f32]
//        (--dtype: CUDA's compute dtype, bf16 by default; the CPU computes in f32)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/engine/engine.h"
#include "common/grammar/grammar_library_paths.h"
#include "kernels/backend.h"
#include "worker/exec/local_executor.h"
#include "worker/model/grammar_masks.h"
#include "worker/model/model_loader.h"

namespace tessera {
namespace {

struct Args {
  std::string model = "models/default";
  int batch = 64;
  int prompt_len = 16;
  int new_tokens = 32;
  int rounds = 3;
  std::string device = "cpu";
  std::string dtype = "bf16";
};

constexpr const char* kSchema =
    R"({"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"},)"
    R"("city":{"type":"string"},"tags":{"type":"array","items":{"type":"string"}}},)"
    R"("required":["name","age","city","tags"],"additionalProperties":false})";

std::vector<GenerationRequest> Requests(const Args& a, int64_t vocab, bool constrained) {
  std::mt19937_64 rng(7);
  std::vector<GenerationRequest> reqs(static_cast<size_t>(a.batch));
  for (auto& r : reqs) {
    for (int i = 0; i < a.prompt_len; ++i)
      r.prompt_ids.push_back(static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab)));
    r.max_tokens = a.new_tokens + 1;
    r.ignore_eos = true;
    if (constrained) r.sampling.grammar = {GrammarKind::kJsonSchema, kSchema};
  }
  return reqs;
}

// LLGuidance's own cost on this vocabulary: one matcher walks the schema
// (the first allowed token each step, EOS last) and every ComputeMask is
// timed; what a step costs the mask threads is about batch x this.
Status MaskCost(const std::string& model, int64_t vocab, int steps) {
  TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<const GrammarEngine> engine,
                           ModelGrammarSource(model, vocab, DefaultGrammarLibraryPaths())());
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<GrammarMatcher> m,
                           engine->NewMatcher({GrammarKind::kJsonSchema, kSchema}));
  std::vector<uint32_t> mask;
  double total_us = 0, max_us = 0;
  int n = 0;
  for (; n < steps; ++n) {
    const auto t0 = std::chrono::steady_clock::now();
    TESSERA_RETURN_IF_ERROR(m->ComputeMask(mask));
    const double us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    total_us += us;
    max_us = std::max(max_us, us);
    int32_t pick = -1;
    for (int32_t t = 0; t < vocab && pick < 0; ++t)
      if (t != engine->eos_id() && ((mask[t / 32] >> (t % 32)) & 1u)) pick = t;
    if (pick < 0) break;
    TESSERA_RETURN_IF_ERROR(m->Accept(pick));
  }
  std::printf("{\"what\":\"mask\",\"vocab\":%lld,\"masks\":%d,\"mean_us\":%.1f,\"max_us\":%.1f}\n",
              static_cast<long long>(vocab), n, total_us / std::max(n, 1), max_us);
  return Status::Ok();
}

Status Run(const Args& a) {
  std::unique_ptr<kernels::Backend> gpu;
  kernels::Backend* backend = &kernels::CpuBackend();
  if (a.device == "cuda") {
    const DType dtype = a.dtype == "f32"   ? DType::kF32
                        : a.dtype == "f16" ? DType::kF16
                                           : DType::kBF16;
    TESSERA_ASSIGN_OR_RETURN(gpu, kernels::CreateCudaBackend(0, dtype));
    backend = gpu.get();
  } else if (a.device != "cpu") {
    return InvalidArgument("--device must be cpu or cuda, not '" + a.device + "'");
  }
  kernels::Backend& dev = *backend;
  TESSERA_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(a.model));
  TESSERA_ASSIGN_OR_RETURN(ParallelConfig par, ParallelConfig::Make(config, 1, 1));
  TESSERA_ASSIGN_OR_RETURN(LoadedModel loaded, LoadModel(a.model, par, 0, nullptr, {}, &dev));
  const StageLayout lay = loaded.model->layout();
  const int64_t block = 16;
  const int64_t blocks = a.batch * ((a.prompt_len + a.new_tokens + 2) / block + 2);
  TESSERA_ASSIGN_OR_RETURN(
      std::unique_ptr<KvCache> cache,
      KvCache::Create(dev, lay.num_layers(), blocks, block, lay.kv_heads_local, config.head_dim));
  LocalExecutor exec(std::move(loaded.model), std::move(cache),
                     ModelGrammarSource(a.model, config.vocab_size, DefaultGrammarLibraryPaths()));
  BlockAllocator alloc(blocks);
  TESSERA_RETURN_IF_ERROR(MaskCost(a.model, config.vocab_size, 64));
  EngineOptions eo;
  eo.max_batch_tokens = std::max<int64_t>(eo.max_batch_tokens, int64_t{a.batch} * a.prompt_len);
  {  // warm-up, the grammar engine's load included
    Engine warm(config, &exec, &alloc, block, nullptr, eo);
    Args w = a;
    w.batch = 2;
    w.new_tokens = 2;
    TESSERA_RETURN_IF_ERROR(warm.Generate(Requests(w, config.vocab_size, true)).status());
  }
  double tokens[2] = {0, 0}, seconds[2] = {0, 0};
  int completed = 0;  // constrained sequences whose document closed (EOS drawn)
  for (int r = 0; r < a.rounds; ++r)
    for (int mode = 0; mode < 2; ++mode) {
      Engine e(config, &exec, &alloc, block, nullptr, eo);
      TESSERA_ASSIGN_OR_RETURN(std::vector<GenerationResult> results,
                               e.Generate(Requests(a, config.vocab_size, mode == 1)));
      if (mode == 1)
        for (const GenerationResult& g : results)
          completed += std::count(g.tokens.begin(), g.tokens.end(), config.eos_token_ids.at(0)) > 0;
      const EngineStats& s = e.stats();
      tokens[mode] += static_cast<double>(s.decode_tokens);
      seconds[mode] += s.decode_seconds;
      std::printf(
          "{\"what\":\"decode\",\"device\":\"%s\",\"mode\":\"%s\",\"round\":%d,\"batch\":%d,"
          "\"tokens_per_s\":%.1f,\"ms_per_step\":%.2f}\n",
          a.device.c_str(), mode ? "json_schema" : "unconstrained", r, a.batch,
          static_cast<double>(s.decode_tokens) / s.decode_seconds,
          1e3 * s.decode_seconds / (static_cast<double>(s.decode_tokens) / a.batch));
      std::fflush(stdout);
    }
  const double free_tps = tokens[0] / seconds[0], json_tps = tokens[1] / seconds[1];
  std::printf(
      "{\"what\":\"summary\",\"device\":\"%s\",\"batch\":%d,\"new_tokens\":%d,\"rounds\":%d,"
      "\"unconstrained_tokens_per_s\":%.1f,\"json_schema_tokens_per_s\":%.1f,"
      "\"cost_percent\":%.1f,\"documents_completed\":%d,\"documents\":%d}\n",
      a.device.c_str(), a.batch, a.new_tokens, a.rounds, free_tps, json_tps,
      100.0 * (1.0 - json_tps / free_tps), completed, a.batch * a.rounds);
  return Status::Ok();
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  tessera::Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--model")
      a.model = v;
    else if (k == "--batch")
      a.batch = std::atoi(v.c_str());
    else if (k == "--prompt-len")
      a.prompt_len = std::atoi(v.c_str());
    else if (k == "--new-tokens")
      a.new_tokens = std::atoi(v.c_str());
    else if (k == "--rounds")
      a.rounds = std::atoi(v.c_str());
    else if (k == "--device")
      a.device = v;
    else if (k == "--dtype")
      a.dtype = v;
    else {
      std::fprintf(stderr, "structured_bench: unknown option %s\n", k.c_str());
      return 2;
    }
  }
  const tessera::Status s = tessera::Run(a);
  if (!s.ok()) {
    std::fprintf(stderr, "structured_bench: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
