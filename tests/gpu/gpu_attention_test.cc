// GPU tests (tessera_gpu_test, tests/gpu/gpu_test_util.h): FlashInfer's paged decode and
// prefill (kernels/flashinfer_launch.h) against Tessera's CUDA kernels and the CPU reference,
// per dtype, at head dims 64 and 128, GQA groups 1 to 8, contexts crossing block boundaries,
// fresh and chunked prefill over a cached prefix, the split and unsplit decode, both prefill
// query tiles, Hopper's FA3 prefill beside FA2 in one step, and a decode recorded as a CUDA
// graph replayed with other contexts.
#include <numeric>

#include "gpu/gpu_test_util.h"

namespace tessera {
namespace {

struct SeqSpec {
  int32_t start, n;  // cached positions before the step, tokens in the step
};
struct Shape {
  int64_t heads, kv_heads, head_dim;
};

// One step of `seqs` over a cache of random contents with scattered blocks: K/V writes
// (bit-exact against the CPU), then FlashInfer's and Tessera's attention, each against the
// CPU and against each other (the parity check).
void RunCase(DType dt, Shape sh, int64_t block, std::vector<SeqSpec> specs, bool split_decode,
             uint64_t seed, const char* label) {
  kernels::Backend& g = Gpu(dt);
  ASSERT_TRUE(kernels::FlashInferTakes(dt, sh.heads, sh.kv_heads, sh.head_dim)) << label;
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::vector<std::vector<int32_t>> tables(specs.size());
  int64_t blocks_needed = 0, tokens = 0;
  for (const SeqSpec& s : specs) {
    blocks_needed += (s.start + s.n + block - 1) / block;
    tokens += s.n;
  }
  const int64_t num_blocks = blocks_needed + 7;
  std::vector<int32_t> ids(static_cast<size_t>(num_blocks));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  size_t next = 0;
  std::vector<kernels::AttentionSeq> as;
  int64_t begin = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    const int64_t need = (specs[i].start + specs[i].n + block - 1) / block;
    for (int64_t j = 0; j < need; ++j) tables[i].push_back(ids[next++]);
    as.push_back({begin, specs[i].n, specs[i].start,
                  std::span<const int32_t>(tables[i].data(), tables[i].size())});
    begin += specs[i].n;
  }
  HostPair kc = Random({num_blocks, block, sh.kv_heads, sh.head_dim}, seed + 1, dt);
  HostPair vc = Random({num_blocks, block, sh.kv_heads, sh.head_dim}, seed + 2, dt);
  HostPair q = Random({tokens, sh.heads, sh.head_dim}, seed + 3, dt);
  HostPair k = Random({tokens, sh.kv_heads, sh.head_dim}, seed + 4, dt);
  HostPair v = Random({tokens, sh.kv_heads, sh.head_dim}, seed + 5, dt);
  const float scale = 1.0f / std::sqrt(static_cast<float>(sh.head_dim));

  kernels::KvCacheLayer cpu_cache{kc.f32, vc.f32};
  auto cpu_batch =
      kernels::MakeAttentionBatch(as, tokens, block, num_blocks, kernels::CpuBackend());
  ASSERT_TRUE(cpu_batch.ok()) << cpu_batch.status().ToString();
  ASSERT_TRUE(kernels::cpu::WriteKv(cpu_cache, k.f32, v.f32, *cpu_batch).ok());
  Tensor ref = Tensor::Empty({tokens, sh.heads * sh.head_dim});
  ASSERT_TRUE(kernels::cpu::PagedAttention(q.f32, cpu_cache, *cpu_batch, scale, ref, 0).ok());

  const int64_t S = static_cast<int64_t>(specs.size());
  const int64_t work_items =
      split_decode ? kernels::DecodeWorkItems(S, sh.kv_heads, g.multiprocessors()) : S;
  kernels::KvCacheLayer dev_cache{Up(g, kc.raw), Up(g, vc.raw)};
  auto batch = kernels::MakeAttentionBatch(as, tokens, block, num_blocks, g, work_items);
  ASSERT_TRUE(batch.ok()) << batch.status().ToString();
  const Tensor kd = Up(g, k.raw), vd = Up(g, v.raw);
  Status s = kernels::WriteKv(dev_cache, kd, vd, *batch);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(Down(g, dev_cache.k), Vec(cpu_cache.k)) << label << ": K cache after WriteKv";
  EXPECT_EQ(Down(g, dev_cache.v), Vec(cpu_cache.v)) << label << ": V cache after WriteKv";
  const Tensor qd = Up(g, q.raw);
  Tensor out_fi = Dev(g, {tokens, sh.heads * sh.head_dim}, dt);
  Tensor out_ts = Dev(g, {tokens, sh.heads * sh.head_dim}, dt);
  s = kernels::cuda::PagedAttention(qd, dev_cache, *batch, scale, out_fi, 0, 0.0f,
                                    kernels::AttentionKernels::kFlashInfer);
  ASSERT_TRUE(s.ok()) << label << ": " << s.ToString();
  // With the step's K/V rows beside the cache, as a model step passes them: on Hopper, fresh
  // prompts of 128 rows or more read their keys from them (FA3's ragged kernel).
  Tensor out_step = Dev(g, {tokens, sh.heads * sh.head_dim}, dt);
  s = kernels::cuda::PagedAttention(qd, dev_cache, *batch, scale, out_step, 0, 0.0f,
                                    kernels::AttentionKernels::kFlashInfer,
                                    kernels::StepKv{&kd, &vd});
  ASSERT_TRUE(s.ok()) << label << " (step K/V): " << s.ToString();
  s = kernels::cuda::PagedAttention(qd, dev_cache, *batch, scale, out_ts, 0, 0.0f,
                                    kernels::AttentionKernels::kTessera);
  ASSERT_TRUE(s.ok()) << label << ": " << s.ToString();
  char what[160];
  std::snprintf(what, sizeof what, "%s h%lld kv%lld d%lld b%lld P%lld", label,
                static_cast<long long>(sh.heads), static_cast<long long>(sh.kv_heads),
                static_cast<long long>(sh.head_dim), static_cast<long long>(block),
                static_cast<long long>(work_items));
  const std::vector<float> fi = Down(g, out_fi), ts = Down(g, out_ts);
  ExpectClose(fi, Vec(ref), dt, std::string("flashinfer ") + what);
  ExpectClose(ts, Vec(ref), dt, std::string("tessera    ") + what);
  ExpectClose(fi, ts, dt, std::string("fi vs ts    ") + what);
  ExpectClose(Down(g, out_step), Vec(ref), dt, std::string("fi step K/V ") + what);
}

const Shape kShapes[] = {
    {8, 8, 128},   // MHA, the 7B head dim
    {8, 2, 64},    // GQA 4
    {9, 3, 64},    // SmolLM2-135M: 9 q heads over 3 kv heads
    {16, 2, 128},  // GQA 8
    {32, 8, 128},  // Llama-3-8B: 32 heads over 8
};

class AttentionKernels : public ::testing::TestWithParam<DType> {};

TEST_P(AttentionKernels, FlashInferDecodeMatchesTesseraAndCpu) {
  ASSERT_TRUE(kernels::FlashInferBuilt())
      << "this tessera_gpu_test was built without FlashInfer (TESSERA_FLASHINFER=OFF or no "
         "headers: scripts/setup fetches them)";
  const DType dt = GetParam();
  // Contexts around block boundaries (block 16: 15, 16, 17, 32, 33), short and long.
  const std::vector<SeqSpec> decode = {{0, 1},  {14, 1}, {15, 1},  {16, 1},   {31, 1},
                                       {32, 1}, {39, 1}, {699, 1}, {1499, 1}, {4098, 1}};
  const std::vector<SeqSpec> one_long = {{3000, 1}};
  uint64_t seed = 500;
  for (const Shape& sh : kShapes) {
    RunCase(dt, sh, 16, decode, /*split=*/true, seed += 10, "decode split");
    RunCase(dt, sh, 16, decode, /*split=*/false, seed += 10, "decode unsplit");
    RunCase(dt, sh, 16, one_long, /*split=*/true, seed += 10, "decode batch 1");
  }
  RunCase(dt, {9, 3, 64}, 32, decode, true, seed += 10, "decode block 32");
}

TEST_P(AttentionKernels, FlashInferPrefillMatchesTesseraAndCpu) {
  ASSERT_TRUE(kernels::FlashInferBuilt())
      << "this tessera_gpu_test was built without FlashInfer (TESSERA_FLASHINFER=OFF or no "
         "headers: scripts/setup fetches them)";
  const DType dt = GetParam();
  // Fresh prompts of several lengths with decode tokens and chunks after a cached prefix:
  // about 60 query rows per sequence at GQA 1, so the 16-row query tile at GQA 1 and 4 and the
  // 128-row tile above.
  const std::vector<SeqSpec> mixed = {{0, 130}, {0, 1},  {200, 77}, {64, 5},
                                      {999, 1}, {0, 37}, {15, 17},  {0, 16}};
  // Chunked prefill: a 300-token chunk after 1000 cached positions, and a long fresh prompt
  // (128-row tiles).
  const std::vector<SeqSpec> chunked = {{1000, 300}, {0, 513}};
  // Mostly decode tokens beside one small chunk: the 16-row query tile at every group.
  const std::vector<SeqSpec> decode_heavy = {{40, 1},  {700, 1}, {16, 1}, {3, 1},
                                             {100, 1}, {5, 1},   {33, 2}, {0, 9}};
  uint64_t seed = 900;
  for (const Shape& sh : kShapes) {
    RunCase(dt, sh, 16, mixed, false, seed += 10, "prefill mixed");
    RunCase(dt, sh, 16, chunked, false, seed += 10, "prefill chunked");
    RunCase(dt, sh, 16, decode_heavy, false, seed += 10, "prefill decode-heavy");
  }
  RunCase(dt, {9, 3, 64}, 32, chunked, false, seed += 10, "prefill block 32");
  // On Hopper at head_dim 128, sequences of 128 rows or more take the FA3 kernel
  // (kernels/flashinfer_launch.h, LaunchFlashInferPrefillSm90) and the rest FA2 in a second
  // launch: a long prompt of many query tiles beside a decode token and a chunk after a prefix,
  // and a partial last tile in every sequence.
  const std::vector<SeqSpec> long_prompt = {{0, 2100}, {3000, 1}, {50, 300}, {0, 127}};
  RunCase(dt, {8, 2, 128}, 16, long_prompt, false, seed += 10, "prefill long");
  RunCase(dt, {8, 8, 128}, 32, long_prompt, false, seed += 10, "prefill long block 32");
}

// A FlashInfer decode recorded as a CUDA graph (the worker's decode graphs) reads its plan
// from a fixed buffer: replayed after other contexts are packed into it, it computes their
// attention.
TEST_P(AttentionKernels, FlashInferDecodeGraphReplaysNewContexts) {
  ASSERT_TRUE(kernels::FlashInferBuilt())
      << "this tessera_gpu_test was built without FlashInfer (TESSERA_FLASHINFER=OFF or no "
         "headers: scripts/setup fetches them)";
  const DType dt = GetParam();
  kernels::Backend& g = Gpu(dt);
  const Shape sh{32, 8, 128};
  const int64_t block = 16, num_blocks = 400, B = 4;
  const int64_t table_capacity = B * 2048 / block;
  HostPair kc = Random({num_blocks, block, sh.kv_heads, sh.head_dim}, 31, dt);
  HostPair vc = Random({num_blocks, block, sh.kv_heads, sh.head_dim}, 32, dt);
  HostPair q = Random({B, sh.heads, sh.head_dim}, 33, dt);
  std::vector<int32_t> ids(num_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), std::mt19937(34));
  const int64_t work_items = kernels::DecodeWorkItems(B, sh.kv_heads, g.multiprocessors());
  const float scale = 1.0f / std::sqrt(static_cast<float>(sh.head_dim));
  kernels::KvCacheLayer cpu_cache{kc.f32, vc.f32};
  kernels::KvCacheLayer dev_cache{Up(g, kc.raw), Up(g, vc.raw)};
  const Tensor qd = Up(g, q.raw);
  Tensor out = Dev(g, {B, sh.heads * sh.head_dim}, dt);
  // Contexts of the recorded step, then of two replays (shorter and longer; each fits 2048).
  const std::vector<std::vector<int32_t>> steps = {
      {100, 7, 1500, 33}, {1, 16, 17, 900}, {2047, 1024, 64, 2000}};
  kernels::AttentionBatch graph_batch;
  Tensor meta_buf;
  std::unique_ptr<kernels::CapturedWork> work;
  for (size_t step = 0; step < steps.size(); ++step) {
    std::vector<std::vector<int32_t>> tables(B);
    std::vector<kernels::AttentionSeq> as;
    size_t next = 0;
    for (int64_t i = 0; i < B; ++i) {
      const int32_t ctx = steps[step][static_cast<size_t>(i)];
      for (int64_t j = 0; j < (ctx + block - 1) / block; ++j)
        tables[static_cast<size_t>(i)].push_back(ids[next++ % ids.size()]);
      as.push_back({i, 1, ctx - 1, tables[static_cast<size_t>(i)]});
    }
    auto checked = kernels::CheckAttentionBatch(as, B, block, num_blocks, work_items);
    ASSERT_TRUE(checked.ok()) << checked.status().ToString();
    const std::vector<int32_t> meta = kernels::PackAttentionMeta(*checked, block, table_capacity);
    if (step == 0) {
      meta_buf = Dev(g, {static_cast<int64_t>(meta.size())}, DType::kI32);
      // As the worker's graphs: the packed layout and the sizes only (seqs gives S).
      graph_batch = *checked;
      graph_batch.seqs.assign(static_cast<size_t>(B), kernels::AttentionSeq{});
      graph_batch.device_meta = meta_buf;
    }
    ASSERT_EQ(static_cast<int64_t>(meta.size()), meta_buf.numel());
    ASSERT_TRUE(g.CopyFromHost(meta_buf, meta.data(), meta.size() * sizeof(int32_t)).ok());
    if (step == 0) {
      auto captured = g.Capture([&] {
        return kernels::cuda::PagedAttention(qd, dev_cache, graph_batch, scale, out, 0, 0.0f,
                                             kernels::AttentionKernels::kFlashInfer);
      });
      ASSERT_TRUE(captured.ok()) << captured.status().ToString();
      work = std::move(*captured);
    }
    ASSERT_TRUE(work->Replay().ok());
    auto cpu_batch = kernels::MakeAttentionBatch(as, B, block, num_blocks, kernels::CpuBackend());
    ASSERT_TRUE(cpu_batch.ok());
    Tensor ref = Tensor::Empty({B, sh.heads * sh.head_dim});
    ASSERT_TRUE(kernels::cpu::PagedAttention(q.f32, cpu_cache, *cpu_batch, scale, ref, 0).ok());
    ExpectClose(Down(g, out), Vec(ref), dt,
                "flashinfer decode graph, replay " + std::to_string(step));
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, AttentionKernels, ::testing::Values(DType::kBF16, DType::kF16),
                         [](const auto& info) { return std::string(DTypeName(info.param)); });

}  // namespace
}  // namespace tessera
