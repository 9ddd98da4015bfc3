// GPU tests (tessera_gpu_test, tests/gpu/gpu_test_util.h): the fused per-head norms, RoPE and KV
// write (kernels/rope_write_kv.h) against the separate CUDA kernels it replaces, bit for bit (q
// and k after the call, both caches), and against the CPU within the dtype's tolerance: Qwen3's
// q/k norms at batch 1, Llama's plain RoPE over decode tokens beside a prefill chunk, Gemma 3's
// (1 + weight) norms at head dim 256, one norm without the other, a step of 300 tokens (no PDL),
// and the fp8 KV cache.
#include <cmath>
#include <numeric>

#include "gpu/gpu_test_util.h"
#include "kernels/head_rms_norm.h"
#include "kernels/rope_write_kv.h"

namespace tessera {
namespace {

struct RopeKvCase {
  const char* label;
  int64_t heads, kv_heads, head_dim, block;
  std::vector<std::pair<int32_t, int32_t>> seqs;  // (cached positions, tokens in the step)
  bool q_norm, k_norm;
  float offset;  // 0 (Qwen3) or 1 (Gemma 3)
  bool fp8;      // the cache in e4m3 (BF16 and F16 only)
};

// The batch of `c.seqs` over scattered blocks, its positions, and the block tables it refers to.
struct Step {
  std::vector<std::vector<int32_t>> tables;
  std::vector<kernels::AttentionSeq> seqs;
  std::vector<int32_t> positions;
  int64_t tokens = 0, num_blocks = 0;
};
Step MakeStep(const RopeKvCase& c, uint32_t seed) {
  Step s;
  int64_t needed = 0;
  for (const auto& [start, n] : c.seqs) needed += (start + n + c.block - 1) / c.block;
  s.num_blocks = needed + 5;
  std::vector<int32_t> ids(static_cast<size_t>(s.num_blocks));
  std::iota(ids.begin(), ids.end(), 0);
  std::mt19937 rng(seed);
  std::shuffle(ids.begin(), ids.end(), rng);
  s.tables.resize(c.seqs.size());
  size_t next = 0;
  for (size_t i = 0; i < c.seqs.size(); ++i) {
    const auto [start, n] = c.seqs[i];
    for (int64_t j = 0; j < (start + n + c.block - 1) / c.block; ++j)
      s.tables[i].push_back(ids[next++]);
    for (int32_t p = start; p < start + n; ++p) s.positions.push_back(p);
  }
  for (size_t i = 0; i < c.seqs.size(); ++i) {
    s.seqs.push_back({s.tokens, c.seqs[i].second, c.seqs[i].first,
                      std::span<const int32_t>(s.tables[i].data(), s.tables[i].size())});
    s.tokens += c.seqs[i].second;
  }
  return s;
}

Tensor InvFreq(int64_t head_dim) {
  Tensor t = Tensor::Empty({head_dim / 2});
  for (int64_t i = 0; i < head_dim / 2; ++i)
    t.data<float>()[i] =
        static_cast<float>(1.0 / std::pow(10000.0, 2.0 * static_cast<double>(i) / head_dim));
  return t;
}

Tensor PositionsTensor(const std::vector<int32_t>& p) {
  Tensor t = Tensor::Empty({static_cast<int64_t>(p.size())}, DType::kI32);
  std::copy(p.begin(), p.end(), t.data<int32_t>());
  return t;
}

void RunRopeKvCase(DType dt, const RopeKvCase& c, uint64_t seed) {
  kernels::Backend& g = Gpu(dt);
  const Step st = MakeStep(c, static_cast<uint32_t>(seed));
  const int64_t T = st.tokens, D = c.head_dim;
  HostPair q = Random({T, c.heads, D}, seed + 1, dt, 3.0f);
  HostPair k = Random({T, c.kv_heads, D}, seed + 2, dt, 3.0f);
  HostPair v = Random({T, c.kv_heads, D}, seed + 3, dt);
  HostPair qw = Random({D}, seed + 4, dt, c.offset > 0 ? 0.2f : 1.0f);
  HostPair kw = Random({D}, seed + 5, dt, c.offset > 0 ? 0.2f : 1.0f);
  const std::vector<int64_t> cache_shape = {st.num_blocks, c.block, c.kv_heads, D};
  HostPair kc = Random(cache_shape, seed + 6, dt), vc = Random(cache_shape, seed + 7, dt);
  const Tensor pos = PositionsTensor(st.positions), inv = InvFreq(D);
  const float eps = 1e-6f, k_scale = 0.05f, v_scale = 0.02f;

  // The device cache: the random contents, or e4m3 zeros with the layer's scales.
  const auto cache = [&] {
    if (c.fp8)
      return kernels::KvCacheLayer{Dev(g, cache_shape, DType::kF8E4M3),
                                   Dev(g, cache_shape, DType::kF8E4M3), k_scale, v_scale};
    return kernels::KvCacheLayer{Up(g, kc.raw), Up(g, vc.raw)};
  };
  auto batch = kernels::MakeAttentionBatch(st.seqs, T, c.block, st.num_blocks, g);
  ASSERT_TRUE(batch.ok()) << batch.status().ToString();
  const Tensor qwd = c.q_norm ? Up(g, qw.raw) : Tensor(), kwd = c.k_norm ? Up(g, kw.raw) : Tensor();
  const Tensor posd = Up(g, pos), invd = Up(g, inv);

  // The separate kernels.
  Tensor q_sep = Up(g, q.raw), k_sep = Up(g, k.raw);
  const Tensor vd = Up(g, v.raw);
  kernels::KvCacheLayer cache_sep = cache();
  if (c.q_norm) {
    ASSERT_TRUE(kernels::cuda::HeadRmsNorm(q_sep, qwd, eps, c.offset).ok());
  }
  if (c.k_norm) {
    ASSERT_TRUE(kernels::cuda::HeadRmsNorm(k_sep, kwd, eps, c.offset).ok());
  }
  ASSERT_TRUE(kernels::cuda::ApplyRopeQk(q_sep, k_sep, posd, invd).ok());
  Status s = kernels::cuda::WriteKv(cache_sep, k_sep, vd, *batch);
  ASSERT_TRUE(s.ok()) << s.ToString();

  // The fused kernel.
  Tensor q_fused = Up(g, q.raw), k_fused = Up(g, k.raw);
  kernels::KvCacheLayer cache_fused = cache();
  s = kernels::NormRopeWriteKv(q_fused, k_fused, vd, {qwd, kwd, eps, c.offset}, posd, invd,
                               cache_fused, *batch);
  ASSERT_TRUE(s.ok()) << c.label << ": " << s.ToString();
  const std::vector<float> q_got = Down(g, q_fused), k_got = Down(g, k_fused);
  EXPECT_EQ(q_got, Down(g, q_sep)) << c.label << " " << DTypeName(dt) << ": q";
  EXPECT_EQ(k_got, Down(g, k_sep)) << c.label << " " << DTypeName(dt) << ": k";
  EXPECT_EQ(Down(g, cache_fused.k), Down(g, cache_sep.k)) << c.label << ": K cache";
  EXPECT_EQ(Down(g, cache_fused.v), Down(g, cache_sep.v)) << c.label << ": V cache";

  // The CPU in fp32 on the same rounded inputs: q and k after the call.
  Tensor q_cpu = q.f32, k_cpu = k.f32;
  kernels::KvCacheLayer cache_cpu{kc.f32, vc.f32};
  auto cpu_batch =
      kernels::MakeAttentionBatch(st.seqs, T, c.block, st.num_blocks, kernels::CpuBackend());
  ASSERT_TRUE(cpu_batch.ok());
  s = kernels::NormRopeWriteKv(
      q_cpu, k_cpu, v.f32,
      {c.q_norm ? qw.f32 : Tensor(), c.k_norm ? kw.f32 : Tensor(), eps, c.offset}, pos, inv,
      cache_cpu, *cpu_batch);
  ASSERT_TRUE(s.ok()) << s.ToString();
  const std::string what = std::string(c.label) + (c.fp8 ? " fp8" : "");
  ExpectClose(q_got, Vec(q_cpu), dt, "norm+rope+kv q " + what);
  ExpectClose(k_got, Vec(k_cpu), dt, "norm+rope+kv k " + what);
}

const RopeKvCase kCases[] = {
    {"qwen3-moe b1", 32, 4, 128, 16, {{159, 1}}, true, true, 0.0f, false},
    {"llama decode+chunk",
     8,
     8,
     128,
     16,
     {{40, 1}, {0, 5}, {17, 1}, {31, 1}},
     false,
     false,
     0,
     false},
    {"gemma3 d256", 8, 4, 256, 16, {{3, 2}, {60, 1}}, true, true, 1.0f, false},
    {"k norm only", 6, 2, 64, 8, {{9, 3}}, false, true, 0.0f, false},
    {"q norm only", 6, 3, 64, 8, {{0, 4}}, true, false, 0.0f, false},
    {"300-token prefill", 4, 2, 64, 16, {{0, 300}}, true, true, 0.0f, false},
    {"fp8 cache", 16, 2, 128, 16, {{70, 1}, {0, 9}}, true, true, 0.0f, true},
};

class NormRopeWriteKv : public ::testing::TestWithParam<DType> {};

TEST_P(NormRopeWriteKv, FusedMatchesTheSeparateKernelsAndTheCpu) {
  const DType dt = GetParam();
  uint64_t seed = 9100;
  for (const RopeKvCase& c : kCases) {
    if (c.fp8 && dt == DType::kF32) continue;  // the fp8 cache takes BF16/F16 compute only
    SCOPED_TRACE(c.label);
    RunRopeKvCase(dt, c, seed += 16);
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, NormRopeWriteKv,
                         ::testing::Values(DType::kF32, DType::kBF16, DType::kF16),
                         [](const auto& info) { return std::string(DTypeName(info.param)); });

}  // namespace
}  // namespace tessera
