// tessera: the command-line front end.
//   tessera generate --model DIR --prompt TEXT [sampling options]
// streams the model's answer to stdout and reports load time, prefill and
// decode speed on stderr.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "common/chat_template.h"
#include "common/tokenizer.h"
#include "kernels/cuda_runtime.h"
#include "worker/engine.h"
#include "worker/local_executor.h"
#include "worker/model_loader.h"

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
};

int Fail(const tessera::Status& s) {
  std::fprintf(stderr, "tessera: error: %s\n", s.ToString().c_str());
  return 1;
}

int RunGenerate(const GenerateArgs& a) {
  using namespace tessera;
  auto tok = Tokenizer::Load(a.model);
  if (!tok.ok()) return Fail(tok.status());
  auto cfg = LoadModelConfig(a.model);
  if (!cfg.ok()) return Fail(cfg.status());
  auto par = ParallelConfig::Make(*cfg, 1, 1);
  if (!par.ok()) return Fail(par.status());
  auto loaded = LoadModel(a.model, *par, 0, nullptr);
  if (!loaded.ok()) return Fail(loaded.status());

  std::string text = a.prompt;
  bool add_special = true;
  if (!a.raw) {
    auto tmpl = a.chat_template.empty() ? ChatTemplate::Detect((*tok)->chat_template())
                                        : ChatTemplate::FromName(a.chat_template);
    if (!tmpl.ok()) return Fail(tmpl.status().WithContext("--chat-template (or pass --raw)"));
    auto rendered = tmpl->Render({{"user", a.prompt}});
    if (!rendered.ok()) return Fail(rendered.status());
    text = *rendered;
    add_special = tmpl->format() == ChatFormat::kChatML;
  }
  GenerationRequest req;
  req.prompt_ids = (*tok)->Encode(text, add_special);
  req.max_tokens = a.max_tokens;
  req.sampling.temperature = a.temperature;
  req.sampling.top_p = a.top_p;
  req.sampling.top_k = a.top_k;
  req.sampling.seed = a.seed;
  req.stop = a.stop;
  if (Status s = req.sampling.Validate(); !s.ok()) return Fail(s);
  const int64_t ctx = static_cast<int64_t>(req.prompt_ids.size()) + a.max_tokens;
  if (ctx > loaded->config.max_position_embeddings)
    return Fail(InvalidArgument("prompt (" + std::to_string(req.prompt_ids.size()) +
                                " tokens) + --max-tokens " + std::to_string(a.max_tokens) +
                                " exceeds the model's max_position_embeddings " +
                                std::to_string(loaded->config.max_position_embeddings)));

  const StageLayout lay = loaded->model->layout();
  const int64_t blocks = BlockAllocator::BlocksFor(ctx, a.block_size);
  auto cache = std::make_unique<KvCache>(lay.num_layers(), blocks, a.block_size, lay.kv_heads_local,
                                         loaded->config.head_dim);
  BlockAllocator allocator(blocks);
  LocalExecutor executor(std::move(loaded->model), std::move(cache));
  Engine engine(loaded->config, &executor, &allocator, a.block_size, tok->get());
  auto results = engine.Generate({req}, [](size_t, const std::string& delta) {
    std::fwrite(delta.data(), 1, delta.size(), stdout);
    std::fflush(stdout);
  });
  if (!results.ok()) return Fail(results.status());
  std::fputc('\n', stdout);
  const EngineStats& st = engine.stats();
  std::fprintf(stderr,
               "tessera: load %.2f s (%.1f MB weights) | prefill %lld tokens, %.1f tokens/s | decode "
               "%lld tokens, %.1f tokens/s | finish: %s\n",
               loaded->load_seconds, static_cast<double>(loaded->weight_bytes) / 1e6,
               static_cast<long long>(st.prefill_tokens),
               st.prefill_seconds > 0 ? static_cast<double>(st.prefill_tokens) / st.prefill_seconds : 0.0,
               static_cast<long long>(st.decode_tokens),
               st.decode_seconds > 0 ? static_cast<double>(st.decode_tokens) / st.decode_seconds : 0.0,
               FinishReasonName((*results)[0].finish_reason));
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
  gen->add_option("--model", g.model, "Hugging Face model directory")->required()->check(CLI::ExistingDirectory);
  gen->add_option("--prompt", g.prompt, "prompt text (a user message unless --raw)")->required();
  gen->add_option("--max-tokens", g.max_tokens, "tokens to generate at most")->check(CLI::Range(0, 1 << 20));
  gen->add_option("--temperature", g.temperature, "0 = greedy")->check(CLI::Range(0.0f, 100.0f));
  gen->add_option("--top-p", g.top_p, "nucleus mass in (0, 1]")->check(CLI::Range(0.0f, 1.0f));
  gen->add_option("--top-k", g.top_k, "0 = off")->check(CLI::NonNegativeNumber);
  gen->add_option("--seed", g.seed, "sampling seed");
  gen->add_option("--stop", g.stop, "stop string (repeatable)");
  gen->add_flag("--raw", g.raw, "send the prompt as is, without the chat template");
  gen->add_option("--chat-template", g.chat_template, "chatml, llama3 or llama2 (default: detected)");
  CLI11_PARSE(app, argc, argv);
  if (gen->parsed()) return RunGenerate(g);
  return 0;
}
