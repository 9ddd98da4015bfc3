// mixing_bench: what long prompts arriving do to the inter-token latency of the sequences
// decoding beside them (issue #34's stall-free mixing), through the real Scheduler (continuous
// batching; each step takes the running sequences' decode tokens first, in running order, then
// at most prefill_chunk_tokens of a prompt, within max_batch_tokens) over a LocalExecutor on
// the CPU or one GPU.
//
// For each chunk size of --chunks, phases of --seconds each on a fresh Scheduler:
//   alone  --decoders sequences (random --prompt-len-token prompts, EOS ignored) decode;
//   mixed  the same, while a prompt of --long-len tokens (max_tokens 1) arrives every
//          --interval seconds from the first decode step on; once per chunk budget of
//          --budgets (scheduler.prefill_chunk_budget: "cost", later chunks of a long prompt
//          shrink with its context, common/engine/prefill_chunk.h; "tokens", fixed chunks).
// The decoders' token times are those of the streaming path (RequestCallbacks::on_token, on the
// scheduler's output thread). A decoder's inter-token latencies are the gaps between its
// consecutive tokens after its first; a long prompt's TTFT runs from its Enqueue to its token.
// A phase starts once every decoder has its first token and ends after --seconds (the decoders
// are then cancelled) or when a decoder reaches --max-new tokens.
//
// Prints one JSON object per phase:
//   {"what":"mixing","device":"cuda","chunk":512,"budget":"cost","phase":"mixed","steps":...,
//    "itl_p50_ms":...,"itl_p99_ms":...,"itl_max_ms":...,"decode_tokens_per_s":...,
//    "long_prompts":3,"long_prompts_answered":3,"ttft_p50_ms":...,"ttft_max_ms":...}
// and per chunk size and budget a summary with the ratio, the mixed phase's p99 over
// the alone phase's p50 (target <= 2):
//   {"what":"mixing_summary","chunk":512,"budget":"cost","p99_mixed_over_p50_alone":...}
//
// Usage: mixing_bench [--model DIR] [--device cpu|cuda] [--dtype bf16|f16|f32] [--decoders 32]
//        [--prompt-len 128] [--long-len 8192] [--interval 1.0] [--seconds 4] [--max-new 1024]
//        [--chunks 256,512,1024] [--budgets cost,tokens]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/engine/scheduler.h"
#include "kernels/backend.h"
#include "worker/exec/local_executor.h"
#include "worker/model/model_loader.h"

namespace tessera {
namespace {

using Clock = std::chrono::steady_clock;

struct Args {
  std::string model = "models/default";
  std::string device = "cpu";
  std::string dtype = "bf16";
  int decoders = 32;
  int prompt_len = 128;
  int long_len = 8192;
  double interval = 1.0;
  double seconds = 4.0;
  int max_new = 1024;
  std::vector<int64_t> chunks = {256, 512, 1024};
  std::vector<std::string> budgets = {"cost", "tokens"};
};

std::vector<int32_t> RandomIds(int n, int64_t vocab, std::mt19937_64& rng) {
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int32_t& id : ids) id = static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab));
  return ids;
}

// Token times of one request, written by the output thread and read by the owner once the
// scheduler has no work left (RunOnce returned false: every callback so far has run).
struct Timeline {
  std::mutex mu;
  std::vector<Clock::time_point> tokens;
};

// Callbacks that record when each generated token reaches the stream into `t`.
RequestCallbacks Recording(Timeline* t) {
  RequestCallbacks cb;
  cb.on_token = [t](const std::string&, int32_t token, const SampledToken*) {
    if (token < 0) return;
    std::lock_guard<std::mutex> lock(t->mu);
    t->tokens.push_back(Clock::now());
  };
  return cb;
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t i = static_cast<size_t>(p * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

// A percentile as JSON: null without samples (a phase with no long prompt has no TTFT).
std::string MsOrNull(const std::vector<double>& v, double p) {
  if (v.empty()) return "null";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3f", Percentile(v, p));
  return buf;
}

struct PhaseResult {
  double itl_p50_ms = 0, itl_p99_ms = 0;
  double ttft_p50_ms = 0;  // the long prompts' (0 without one)
};

StatusOr<PhaseResult> RunPhase(const Args& a, const ModelConfig& config, StepExecutor* exec,
                               BlockAllocator* alloc, int64_t block, int64_t chunk,
                               const std::string& budget, bool mixed) {
  SchedulerOptions so;
  so.prefill_chunk_tokens = chunk;
  so.prefill_chunk_budget =
      budget == "cost" ? PrefillChunkBudget::kCost : PrefillChunkBudget::kTokens;
  so.max_batch_tokens = std::max<int64_t>(chunk + a.decoders, int64_t{a.decoders} * a.prompt_len);
  so.max_sequences = a.decoders + 16;
  so.queue_limit = std::max<int64_t>(so.queue_limit, a.decoders + 64);
  so.max_context = std::max(a.prompt_len + a.max_new, a.long_len + 1);
  so.prefix_caching = false;  // random prompts: nothing to share, nothing to keep
  Scheduler sched(config, exec, alloc, block, nullptr, so);
  std::mt19937_64 rng(11 + static_cast<uint64_t>(chunk));
  std::vector<std::unique_ptr<Timeline>> dec, lng;
  std::vector<int64_t> ids;
  for (int i = 0; i < a.decoders; ++i) {
    GenerationRequest r;
    r.prompt_ids = RandomIds(a.prompt_len, config.vocab_size, rng);
    r.max_tokens = a.max_new;
    r.ignore_eos = true;
    dec.push_back(std::make_unique<Timeline>());
    TESSERA_ASSIGN_OR_RETURN(int64_t id, sched.Enqueue(std::move(r), Recording(dec.back().get())));
    ids.push_back(id);
  }
  const auto started = [&] {
    for (auto& t : dec) {
      std::lock_guard<std::mutex> lock(t->mu);
      if (t->tokens.empty()) return false;
    }
    return true;
  };
  while (!started()) TESSERA_RETURN_IF_ERROR(sched.RunOnce().status());
  const Clock::time_point t0 = Clock::now();
  const auto window = std::chrono::duration<double>(a.seconds);
  std::vector<Clock::time_point> enqueued;
  int64_t steps = 0;
  for (Clock::time_point now = t0; now - t0 < window; now = Clock::now()) {
    if (mixed && now - t0 >= std::chrono::duration<double>(a.interval * enqueued.size())) {
      GenerationRequest r;
      r.prompt_ids = RandomIds(a.long_len, config.vocab_size, rng);
      r.max_tokens = 1;
      r.ignore_eos = true;
      lng.push_back(std::make_unique<Timeline>());
      enqueued.push_back(Clock::now());
      TESSERA_RETURN_IF_ERROR(sched.Enqueue(std::move(r), Recording(lng.back().get())).status());
    }
    TESSERA_ASSIGN_OR_RETURN(bool worked, sched.RunOnce());
    steps += worked ? 1 : 0;
    if (!worked) break;  // every decoder reached max_new
  }
  const Clock::time_point t1 = Clock::now();
  for (int64_t id : ids) sched.Cancel(id);
  // Long prompts still waiting or prefilling finish; then nothing is left.
  for (;;) {
    TESSERA_ASSIGN_OR_RETURN(bool worked, sched.RunOnce());
    if (!worked) break;
  }
  std::vector<double> itl;
  int64_t tokens = 0;
  for (auto& t : dec) {
    std::lock_guard<std::mutex> lock(t->mu);
    for (size_t i = 1; i < t->tokens.size(); ++i) {
      if (t->tokens[i] < t0 || t->tokens[i] > t1) continue;
      itl.push_back(Ms(t->tokens[i] - t->tokens[i - 1]));
      ++tokens;
    }
  }
  std::vector<double> ttft;
  for (size_t i = 0; i < lng.size(); ++i) {
    std::lock_guard<std::mutex> lock(lng[i]->mu);
    if (!lng[i]->tokens.empty()) ttft.push_back(Ms(lng[i]->tokens.front() - enqueued[i]));
  }
  PhaseResult res;
  res.itl_p50_ms = Percentile(itl, 0.5);
  res.itl_p99_ms = Percentile(itl, 0.99);
  res.ttft_p50_ms = Percentile(ttft, 0.5);
  std::printf(
      "{\"what\":\"mixing\",\"device\":\"%s\",\"chunk\":%lld,\"budget\":\"%s\",\"phase\":\"%s\","
      "\"decoders\":%d,"
      "\"prompt\":%d,\"long_prompt\":%d,\"interval_s\":%.3f,\"seconds\":%.3f,\"steps\":%lld,"
      "\"itl_samples\":%zu,\"itl_p50_ms\":%.3f,\"itl_p99_ms\":%.3f,\"itl_max_ms\":%.3f,"
      "\"decode_tokens_per_s\":%.1f,\"long_prompts\":%zu,\"long_prompts_answered\":%zu,"
      "\"ttft_p50_ms\":%s,\"ttft_max_ms\":%s}\n",
      a.device.c_str(), static_cast<long long>(chunk), mixed ? budget.c_str() : "none",
      mixed ? "mixed" : "alone", a.decoders, a.prompt_len, a.long_len, a.interval,
      Ms(t1 - t0) / 1e3, static_cast<long long>(steps), itl.size(), res.itl_p50_ms, res.itl_p99_ms,
      Percentile(itl, 1.0), static_cast<double>(tokens) / (Ms(t1 - t0) / 1e3), enqueued.size(),
      ttft.size(), MsOrNull(ttft, 0.5).c_str(), MsOrNull(ttft, 1.0).c_str());
  std::fflush(stdout);
  return res;
}

// A whole-string number, or an error naming the option.
StatusOr<double> Number(const std::string& option, const std::string& value) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != value.size())
    return InvalidArgument(option + ": '" + value + "' is not a number");
  return v;
}

Status Check(const Args& a, const ModelConfig& config) {
  const auto positive = [](const char* option, double v) {
    char got[32];
    std::snprintf(got, sizeof(got), "%g", v);
    return v > 0 ? Status::Ok() : InvalidArgument(std::string(option) + " must be > 0, got " + got);
  };
  TESSERA_RETURN_IF_ERROR(positive("--decoders", a.decoders));
  TESSERA_RETURN_IF_ERROR(positive("--prompt-len", a.prompt_len));
  TESSERA_RETURN_IF_ERROR(positive("--long-len", a.long_len));
  TESSERA_RETURN_IF_ERROR(positive("--interval", a.interval));
  TESSERA_RETURN_IF_ERROR(positive("--seconds", a.seconds));
  if (a.max_new < 2) return InvalidArgument("--max-new must be >= 2");
  if (a.chunks.empty()) return InvalidArgument("--chunks: no chunk size");
  for (int64_t c : a.chunks)
    if (c < 1) return InvalidArgument("--chunks: every chunk size must be >= 1");
  if (a.budgets.empty()) return InvalidArgument("--budgets: no budget");
  for (const std::string& b : a.budgets)
    if (b != "cost" && b != "tokens")
      return InvalidArgument("--budgets: each must be cost or tokens, not '" + b + "'");
  // What the model's positions hold (the KV cache is sized from these).
  const int64_t positions = config.max_position_embeddings;
  if (a.long_len + 1 > positions || a.prompt_len + a.max_new > positions)
    return InvalidArgument(
        "--long-len + 1 (" + std::to_string(a.long_len + 1) + ") and --prompt-len + --max-new (" +
        std::to_string(a.prompt_len + a.max_new) +
        ") must fit the model's max_position_embeddings " + std::to_string(positions));
  if (a.dtype != "bf16" && a.dtype != "f16" && a.dtype != "f32")
    return InvalidArgument("--dtype must be bf16, f16 or f32, not '" + a.dtype + "'");
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
  TESSERA_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(a.model));
  TESSERA_RETURN_IF_ERROR(Check(a, config));
  TESSERA_ASSIGN_OR_RETURN(ParallelConfig par, ParallelConfig::Make(config, 1, 1));
  TESSERA_ASSIGN_OR_RETURN(LoadedModel loaded, LoadModel(a.model, par, 0, nullptr, {}, backend));
  const StageLayout lay = loaded.model->layout();
  // KV blocks for every decoder at max_new and the long prompts that can be in flight at once
  // (their prefill takes about long_len / chunk steps; two at a time leave room to spare).
  const int64_t block = 16;
  const auto blocks_for = [block](int64_t tokens) { return (tokens + block - 1) / block + 1; };
  const int64_t blocks =
      a.decoders * blocks_for(a.prompt_len + a.max_new) + 3 * blocks_for(a.long_len + 1);
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<KvCache> cache,
                           KvCache::Create(*backend, lay.num_layers(), blocks, block,
                                           lay.kv_heads_local, config.head_dim));
  LocalExecutor exec(std::move(loaded.model), std::move(cache));
  BlockAllocator alloc(blocks);
  for (int64_t chunk : a.chunks) {
    // Nothing is prefilled alone (but the decoders' prompts): one alone phase per chunk size.
    TESSERA_ASSIGN_OR_RETURN(PhaseResult alone,
                             RunPhase(a, config, &exec, &alloc, block, chunk, "tokens", false));
    for (const std::string& budget : a.budgets) {
      TESSERA_ASSIGN_OR_RETURN(PhaseResult mixed,
                               RunPhase(a, config, &exec, &alloc, block, chunk, budget, true));
      std::printf(
          "{\"what\":\"mixing_summary\",\"device\":\"%s\",\"chunk\":%lld,\"budget\":\"%s\","
          "\"itl_p50_alone_ms\":%.3f,\"itl_p99_mixed_ms\":%.3f,\"p99_mixed_over_p50_alone\":%.3f,"
          "\"ttft_p50_ms\":%.3f}\n",
          a.device.c_str(), static_cast<long long>(chunk), budget.c_str(), alone.itl_p50_ms,
          mixed.itl_p99_ms, alone.itl_p50_ms > 0 ? mixed.itl_p99_ms / alone.itl_p50_ms : 0.0,
          mixed.ttft_p50_ms);
      std::fflush(stdout);
    }
  }
  return Status::Ok();
}

}  // namespace
}  // namespace tessera

constexpr const char* kUsage =
    "usage: mixing_bench [--model DIR] [--device cpu|cuda] [--dtype bf16|f16|f32] [--decoders 32]\n"
    "       [--prompt-len 128] [--long-len 8192] [--interval 1.0] [--seconds 4] [--max-new 1024]\n"
    "       [--chunks 256,512,1024] [--budgets cost,tokens]\n";

int main(int argc, char** argv) {
  tessera::Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "--help" || k == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    const bool numeric = k == "--decoders" || k == "--prompt-len" || k == "--long-len" ||
                         k == "--interval" || k == "--seconds" || k == "--max-new";
    if (!numeric && k != "--model" && k != "--device" && k != "--dtype" && k != "--chunks" &&
        k != "--budgets") {
      std::fprintf(stderr, "mixing_bench: unknown option %s\n%s", k.c_str(), kUsage);
      return 2;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "mixing_bench: option %s needs a value\n", k.c_str());
      return 2;
    }
    const std::string v = argv[++i];
    double n = 0;
    if (numeric) {
      auto parsed = tessera::Number(k, v);
      if (!parsed.ok()) {
        std::fprintf(stderr, "mixing_bench: %s\n", parsed.status().message().c_str());
        return 2;
      }
      n = *parsed;
    }
    if (k == "--model") {
      a.model = v;
    } else if (k == "--device") {
      a.device = v;
    } else if (k == "--dtype") {
      a.dtype = v;
    } else if (k == "--decoders") {
      a.decoders = static_cast<int>(n);
    } else if (k == "--prompt-len") {
      a.prompt_len = static_cast<int>(n);
    } else if (k == "--long-len") {
      a.long_len = static_cast<int>(n);
    } else if (k == "--interval") {
      a.interval = n;
    } else if (k == "--seconds") {
      a.seconds = n;
    } else if (k == "--max-new") {
      a.max_new = static_cast<int>(n);
    } else if (k == "--budgets") {
      a.budgets.clear();
      std::stringstream ss(v);
      for (std::string item; std::getline(ss, item, ',');) a.budgets.push_back(item);
    } else {  // --chunks
      a.chunks.clear();
      std::stringstream ss(v);
      for (std::string item; std::getline(ss, item, ',');) {
        auto c = tessera::Number("--chunks", item);
        if (!c.ok()) {
          std::fprintf(stderr, "mixing_bench: %s\n", c.status().message().c_str());
          return 2;
        }
        a.chunks.push_back(static_cast<int64_t>(*c));
      }
    }
  }
  const tessera::Status s = tessera::Run(a);
  if (!s.ok()) {
    std::fprintf(stderr, "mixing_bench: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
