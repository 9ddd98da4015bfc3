// tessera_bench: load time, memory, prefill and decode throughput of a model
// on the CUDA backend at tp = 1 or tp = 2 (one thread and GPU per rank, NCCL),
// through the real Engine / PipelineExecutor path. Greedy decoding, random
// prompt ids (fixed seed), EOS ignored.
//
// Prints one JSON object per measurement on stdout:
//   {"engine":"tessera","tp":1,"what":"decode","batch":16,"prompt":128,
//    "new_tokens":64,"ms_per_step":..,"tokens_per_s":..}
// plus "load" (seconds, weight bytes per GPU, device memory after load) and
// "prefill" (tokens/s over prompts of --prefill-len tokens, in chunks of --prefill-chunk
// tokens; default the whole prompt in one step, as the peers bench/torch_peer.py and
// hf_bench.py prefill; timed after two warm-up runs of the same shape, as torch_peer.py's). A
// decode run prefills its whole batch in one step, then times the pure decode steps.
//
// Usage: tessera_bench --model DIR [--tp 1|2] [--batches 1,16,64]
//        [--prompt-len 128] [--new-tokens 64] [--prefill-len 1024] [--prefill-batch 4]
//        [--prefill-chunk N] [--quantization fp8] [--kv-cache-dtype auto|fp8]
#include <cuda_runtime_api.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/engine/engine.h"
#include "common/format/kv_cache_dtype.h"
#include "common/format/quantization.h"
#include "common/net/file_store.h"
#include "kernels/backend.h"
#include "worker/comm/nccl_communicator.h"
#include "worker/exec/pipeline_executor.h"
#include "worker/model/model_loader.h"

namespace tessera {
namespace {

struct Args {
  std::string model;
  int tp = 1;
  std::vector<int> batches = {1, 16, 64};
  int prompt_len = 128;
  int new_tokens = 64;
  int prefill_len = 1024;
  int prefill_batch = 4;
  int prefill_chunk = 0;  // prompt tokens per sequence per prefill step; 0 = --prefill-len
  QuantMethod quantization = QuantMethod::kNone;      // --quantization fp8: online FP8 at load
  KvCacheDType kv_cache_dtype = KvCacheDType::kAuto;  // --kv-cache-dtype fp8: e4m3, scale 1
};

std::vector<GenerationRequest> Requests(int n, int len, int new_tokens, int64_t vocab,
                                        uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<GenerationRequest> reqs(static_cast<size_t>(n));
  for (auto& r : reqs) {
    for (int i = 0; i < len; ++i)
      r.prompt_ids.push_back(static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab)));
    r.max_tokens = new_tokens;
    r.ignore_eos = true;
  }
  return reqs;
}

// The process's peak resident set (getrusage), bytes.
int64_t PeakRssBytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<int64_t>(u.ru_maxrss) * 1024;
}

// Whether the loader streams shards through pinned buffers (TESSERA_PINNED_LOAD, not "0").
bool PinnedLoad() {
  const char* v = std::getenv("TESSERA_PINNED_LOAD");
  return v == nullptr || std::string(v) != "0";
}

// Runs rank `r` of a tp group; rank 0 prints.
Status RunRank(const Args& a, int r, Store* store) {
  TESSERA_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(a.model));
  TESSERA_ASSIGN_OR_RETURN(ParallelConfig par, ParallelConfig::Make(config, a.tp, 1));
  const DType dtype = config.torch_dtype == DType::kF32 ? DType::kBF16 : config.torch_dtype;
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<kernels::Backend> backend,
                           kernels::CreateCudaBackend(r, dtype));
  std::unique_ptr<Communicator> comm;
  if (a.tp > 1) {
    NcclCommunicatorOptions o;
    o.group = "tp.bench";
    o.rank = r;
    o.size = a.tp;
    o.timeout_seconds = 120;
    TESSERA_ASSIGN_OR_RETURN(comm, CreateNcclCommunicator(*store, o, *backend));
  }
  // The high-water mark of host memory across the load, over what the process held before it
  // (the CUDA context and NCCL): the loader's staging and host copies.
  const int64_t rss_before = PeakRssBytes();
  const auto t0 = std::chrono::steady_clock::now();
  TESSERA_ASSIGN_OR_RETURN(LoadedModel loaded, LoadModel(a.model, par, r, comm.get(), {},
                                                         backend.get(), nullptr, a.quantization));
  const double load_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const kernels::MemoryStats mem = backend->memory_stats();
  size_t free_b = 0, total_b = 0;
  cudaMemGetInfo(&free_b, &total_b);
  if (r == 0)
    std::printf(
        "{\"engine\":\"tessera\",\"tp\":%d,\"what\":\"load\",\"seconds\":%.3f,\"weight_bytes_per_"
        "gpu\":%lld,"
        "\"gb_per_s\":%.2f,\"device_in_use_bytes\":%lld,\"device_used_bytes\":%zu,\"dtype\":\"%s\","
        "\"host_peak_rss_growth_bytes\":%lld,\"pinned_load\":%s}"
        "\n",
        a.tp, load_s, static_cast<long long>(loaded.weight_bytes),
        static_cast<double>(loaded.weight_bytes) * a.tp / load_s / 1e9,
        static_cast<long long>(mem.in_use_bytes), total_b - free_b, DTypeName(dtype),
        static_cast<long long>(PeakRssBytes() - rss_before), PinnedLoad() ? "true" : "false");
  const StageLayout lay = loaded.model->layout();
  // One KV pool serves every phase, so it is sized for the largest phase, not for the largest
  // batch times the longest prompt: the prefill phase holds prefill_batch prompts of
  // prefill_len tokens, a decode phase b sequences of prompt_len + new_tokens + 1 tokens.
  const int64_t block = 16;
  auto blocks_for = [block](int64_t seqs, int64_t tokens) {
    return seqs * ((tokens + block - 1) / block + 1);
  };
  int64_t blocks = blocks_for(a.prefill_batch, a.prefill_len + 1);
  for (int b : a.batches) blocks = std::max(blocks, blocks_for(b, a.prompt_len + a.new_tokens + 1));
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<KvCache> cache,
                           KvCache::Create(*backend, lay.num_layers(), blocks, block,
                                           lay.kv_heads_local, config.head_dim, a.kv_cache_dtype));
  PipelineLinks links;
  links.tp_rank = r;
  links.tp = comm.get();
  PipelineExecutor exec(loaded.model.get(), cache.get(), links);
  BlockAllocator alloc(blocks);
  EngineOptions eo;
  eo.max_batch_tokens = static_cast<int64_t>(a.prefill_len) * a.prefill_batch;
  // Fixed chunks: the prefill row measures the kernels at a chunk size, not the scheduler.
  eo.prefill_chunk_tokens = a.prefill_chunk > 0 ? a.prefill_chunk : a.prefill_len;
  eo.prefill_chunk_budget = PrefillChunkBudget::kTokens;
  {
    // Warm-up: cuBLASLt plans and the allocator's cache for these shapes.
    Engine warm(config, &exec, &alloc, block, nullptr, eo);
    TESSERA_RETURN_IF_ERROR(warm.Generate(Requests(2, 16, 4, config.vocab_size, 1)).status());
  }
  // The prefill's own shape twice before the timed run, as bench/torch_peer.py warms its
  // prefill: the first run of a shape pays for the activations' allocations, cuBLASLt's
  // heuristics for its GEMMs and the attention kernels' first launch. Other prompt ids (seeds
  // 3 and 4) than the timed run's.
  for (uint64_t seed : {3u, 4u}) {
    Engine warm(config, &exec, &alloc, block, nullptr, eo);
    TESSERA_RETURN_IF_ERROR(
        warm.Generate(Requests(a.prefill_batch, a.prefill_len, 1, config.vocab_size, seed))
            .status());
  }
  {
    Engine e(config, &exec, &alloc, block, nullptr, eo);
    TESSERA_RETURN_IF_ERROR(
        e.Generate(Requests(a.prefill_batch, a.prefill_len, 1, config.vocab_size, 2)).status());
    const EngineStats& s = e.stats();
    if (r == 0)
      std::printf(
          "{\"engine\":\"tessera\",\"tp\":%d,\"what\":\"prefill\",\"batch\":%d,\"prompt\":%d,"
          "\"chunk\":%lld,\"seconds\":%.4f,\"tokens_per_s\":%.1f}\n",
          a.tp, a.prefill_batch, a.prefill_len, static_cast<long long>(eo.prefill_chunk_tokens),
          s.prefill_seconds, static_cast<double>(s.prefill_tokens) / s.prefill_seconds);
  }
  for (int b : a.batches) {
    // Every prompt prefills in the first step, so each step counted as decode is a pure
    // decode step, as the peers (bench/torch_peer.py, hf_bench.py) measure it: with a
    // smaller token budget the last prompt chunks share steps with the first sequences'
    // decode tokens, and those mixed steps (a prefill chunk's cost each) land in
    // decode_seconds.
    EngineOptions deo = eo;
    deo.max_batch_tokens =
        std::max<int64_t>(eo.max_batch_tokens, static_cast<int64_t>(b) * a.prompt_len);
    Engine e(config, &exec, &alloc, block, nullptr, deo);
    TESSERA_RETURN_IF_ERROR(
        e.Generate(Requests(b, a.prompt_len, a.new_tokens + 1, config.vocab_size, 3 + b)).status());
    const EngineStats& s = e.stats();
    const double steps = static_cast<double>(s.decode_tokens) / b;
    if (r == 0)
      std::printf(
          "{\"engine\":\"tessera\",\"tp\":%d,\"what\":\"decode\",\"batch\":%d,\"prompt\":%d,"
          "\"new_tokens\":%d,\"ms_per_step\":%.4f,\"tokens_per_s\":%.1f,\"weight_bytes_per_gpu\":%"
          "lld,\"kv_cache_dtype\":\"%s\"}\n",
          a.tp, b, a.prompt_len, a.new_tokens, 1e3 * s.decode_seconds / steps,
          static_cast<double>(s.decode_tokens) / s.decode_seconds,
          static_cast<long long>(loaded.weight_bytes), DTypeName(cache->dtype()));
    std::fflush(stdout);
  }
  const kernels::MemoryStats after = backend->memory_stats();
  if (r == 0)
    std::printf(
        "{\"engine\":\"tessera\",\"tp\":%d,\"what\":\"memory\",\"peak_bytes\":%lld,\"kv_cache_"
        "bytes\":%lld}\n",
        a.tp, static_cast<long long>(after.peak_bytes), static_cast<long long>(cache->bytes()));
  return Status::Ok();
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  tessera::Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    const std::string v = i + 1 < argc ? argv[i + 1] : "";
    ++i;
    if (k == "--model")
      a.model = v;
    else if (k == "--tp")
      a.tp = std::stoi(v);
    else if (k == "--prompt-len")
      a.prompt_len = std::stoi(v);
    else if (k == "--new-tokens")
      a.new_tokens = std::stoi(v);
    else if (k == "--prefill-len")
      a.prefill_len = std::stoi(v);
    else if (k == "--prefill-batch")
      a.prefill_batch = std::stoi(v);
    else if (k == "--prefill-chunk")
      a.prefill_chunk = std::stoi(v);
    else if (k == "--quantization") {
      auto q = tessera::ParseOnlineQuantization(v);
      if (!q.ok()) {
        std::fprintf(stderr, "tessera_bench: --quantization: %s\n", q.status().ToString().c_str());
        return 2;
      }
      a.quantization = *q;
    } else if (k == "--kv-cache-dtype") {
      auto d = tessera::ParseKvCacheDType(v, "--kv-cache-dtype");
      if (!d.ok()) {
        std::fprintf(stderr, "tessera_bench: %s\n", d.status().ToString().c_str());
        return 2;
      }
      a.kv_cache_dtype = *d;
    } else if (k == "--batches") {
      a.batches.clear();
      std::stringstream ss(v);
      std::string item;
      while (std::getline(ss, item, ',')) a.batches.push_back(std::stoi(item));
    } else {
      std::fprintf(stderr, "tessera_bench: unknown argument %s\n", k.c_str());
      return 2;
    }
  }
  if (a.model.empty() || (a.tp != 1 && a.tp != 2)) {
    std::fprintf(stderr, "usage: tessera_bench --model DIR [--tp 1|2] [--batches 1,16,64] ...\n");
    return 2;
  }
  std::unique_ptr<tessera::FileStore> store;
  if (a.tp > 1) {
    const std::string dir =
        (std::filesystem::temp_directory_path() / ("tessera-bench-" + std::to_string(::getpid())))
            .string();
    std::filesystem::create_directories(dir);
    auto s = tessera::FileStore::Open(dir);
    if (!s.ok()) return 1;
    store = std::move(*s);
  }
  std::vector<tessera::Status> results(static_cast<size_t>(a.tp));
  std::vector<std::thread> threads;
  for (int r = 0; r < a.tp; ++r)
    threads.emplace_back(
        [&, r] { results[static_cast<size_t>(r)] = tessera::RunRank(a, r, store.get()); });
  for (auto& t : threads) t.join();
  int rc = 0;
  for (int r = 0; r < a.tp; ++r)
    if (!results[static_cast<size_t>(r)].ok()) {
      std::fprintf(stderr, "tessera_bench rank %d: %s\n", r,
                   results[static_cast<size_t>(r)].ToString().c_str());
      rc = 1;
    }
  return rc;
}
