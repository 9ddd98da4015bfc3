// GPU tests: every CUDA kernel against the CPU kernels on random inputs, the
// fixture models on the CUDA backend against the transformers references,
// NCCL collectives and tp=2 on two GPUs, and (given --hf-dir/--hf-ref) a
// model against transformers computing in bf16 on the same GPU.
//
// Not part of ctest (CI has no GPU); scripts/gpu-run runs it on the device.
//
// Tolerances. Inputs are drawn in fp32 and rounded to the dtype under test;
// the CPU reference computes in fp32 on exactly those rounded values, so the
// GPU's only extra errors are the rounding of its outputs (and of
// intermediates it stores in the dtype) and fp32 summation order:
//   F32:  |gpu - cpu| <= 1e-4 * scale + 1e-4 * |cpu|
//   BF16: |gpu - cpu| <= 1e-2 * scale + 1.6e-2 * |cpu|  (8 mantissa bits: 2^-8 = 3.9e-3 per
//   rounding) F16:  |gpu - cpu| <= 2e-3 * scale + 2e-3 * |cpu|    (11 bits: 2^-11 = 4.9e-4 per
//   rounding)
// where scale is the largest |cpu| of the output. Copies (embedding, KV
// writes, gathers) must be bit-exact; sampling must pick the CPU's token.
//
// Usage: tessera_gpu_test [--fixtures DIR] [--hf-dir DIR --hf-ref JSON] [gtest flags]
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <thread>

#include "common/engine/engine.h"
#include "common/net/file_store.h"
#include "common/net/http_client.h"
#include "common/tokenizer/tokenizer.h"
#include "kernels/backend.h"
#include "kernels/cuda_runtime.h"
#include "kernels/embedding.h"
#include "kernels/linear.h"
#include "kernels/paged_attention.h"
#include "kernels/rms_norm.h"
#include "kernels/rope.h"
#include "kernels/sampling.h"
#include "kernels/swiglu.h"
#include "kernels/tensor_ops.h"
#include "support/model_harness.h"
#include "support/test_util.h"
#include "worker/comm/nccl_communicator.h"
#include "worker/exec/pipeline_executor.h"
#include "worker/model/rope_frequencies.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string g_fixtures = "tests/fixtures";
std::string g_hf_dir, g_hf_ref;
int g_devices = 0;

std::string ReadFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// One CUDA backend per compute dtype on device 0.
kernels::Backend& Gpu(DType dtype) {
  static std::map<DType, std::unique_ptr<kernels::Backend>> backends;
  auto it = backends.find(dtype);
  if (it == backends.end()) {
    auto b = kernels::CreateCudaBackend(0, dtype);
    if (!b.ok()) {
      std::fprintf(stderr, "CreateCudaBackend: %s\n", b.status().ToString().c_str());
      std::abort();
    }
    it = backends.emplace(dtype, std::move(*b)).first;
  }
  TESSERA_CHECK(kernels::MakeCurrent(*it->second).ok());
  return *it->second;
}

struct Tol {
  double atol, rtol;
};
Tol TolFor(DType d) {
  if (d == DType::kBF16) return {1e-2, 1.6e-2};
  if (d == DType::kF16) return {2e-3, 2e-3};
  return {1e-4, 1e-4};
}

// A host tensor of `dtype` holding N(0, 1) * scale rounded to dtype, and its
// F32 copy (the same values exactly).
struct HostPair {
  Tensor f32, raw;
};
HostPair Random(std::vector<int64_t> shape, uint64_t seed, DType dtype, float scale = 1.0f) {
  HostPair p{Tensor::Empty(shape), Tensor::Empty(shape, dtype)};
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(p.f32.numel()));
  for (float& x : v) x = dist(rng) * scale;
  ConvertFromF32(dtype, v.data(), p.raw.raw(), v.size());
  ConvertToF32(dtype, p.raw.raw(), p.f32.data<float>(), v.size());
  return p;
}

Tensor Up(kernels::Backend& b, const Tensor& host) {
  auto t = b.Upload(host);
  TESSERA_CHECK(t.ok());
  return *t;
}

Tensor Dev(kernels::Backend& b, std::vector<int64_t> shape, DType dtype) {
  auto t = b.Zeros(shape, dtype);
  TESSERA_CHECK(t.ok());
  return *t;
}

std::vector<float> Down(kernels::Backend& b, const Tensor& dev) {
  auto h = b.ToHost(dev);
  TESSERA_CHECK(h.ok());
  std::vector<float> out(static_cast<size_t>(h->numel()));
  ConvertToF32(h->dtype(), h->raw(), out.data(), out.size());
  return out;
}

std::vector<float> Vec(const Tensor& host_f32) {
  return std::vector<float>(host_f32.data<float>(), host_f32.data<float>() + host_f32.numel());
}

// Expects got ~ want within the dtype's tolerance; prints the worst element.
void ExpectClose(const std::vector<float>& got, const std::vector<float>& want, DType dtype,
                 const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  const Tol tol = TolFor(dtype);
  double scale = 1e-30;
  for (float w : want) scale = std::max(scale, static_cast<double>(std::abs(w)));
  size_t bad = 0, worst = 0;
  double worst_err = -1;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::abs(static_cast<double>(got[i]) - want[i]);
    const double bound = tol.atol * scale + tol.rtol * std::abs(want[i]);
    if (!(err <= bound)) ++bad;
    if (!(err <= worst_err)) {
      worst_err = err;
      worst = i;
    }
  }
  std::printf("  %-48s %-4s max |err| %.3g (scale %.3g) at %zu\n", what.c_str(), DTypeName(dtype),
              worst_err, scale, worst);
  EXPECT_EQ(bad, 0u) << what << " " << DTypeName(dtype) << ": " << bad << " of " << got.size()
                     << " outside tolerance; worst index " << worst << " got " << got[worst]
                     << " want " << want[worst];
}

class Kernels : public ::testing::TestWithParam<DType> {};

TEST_P(Kernels, LinearMatchesCpu) {
  const DType dt = GetParam();
  kernels::Backend& g = Gpu(dt);
  for (int64_t m : {1, 7, 64}) {
    const int64_t k = 256, n = 384;
    HostPair x = Random({m, k}, 1 + m, dt), w = Random({n, k}, 2, dt, 1.0f / 16),
             b = Random({n}, 3, dt);
    Tensor ref = Tensor::Empty({m, n});
    ASSERT_TRUE(kernels::cpu::Linear(x.f32, w.f32, b.f32, ref).ok());
    Tensor y = Dev(g, {m, n}, dt);
    Status s = kernels::Linear(Up(g, x.raw), Up(g, w.raw), Up(g, b.raw), y);
    ASSERT_TRUE(s.ok()) << s.ToString();
    ExpectClose(Down(g, y), Vec(ref), dt, "linear+bias m=" + std::to_string(m));
    // No bias, fp32 output (the lm_head path).
    Tensor ref2 = Tensor::Empty({m, n});
    ASSERT_TRUE(kernels::cpu::Linear(x.f32, w.f32, Tensor(), ref2).ok());
    Tensor y32 = Dev(g, {m, n}, DType::kF32);
    s = kernels::Linear(Up(g, x.raw), Up(g, w.raw), Tensor(), y32);
    ASSERT_TRUE(s.ok()) << s.ToString();
    ExpectClose(Down(g, y32), Vec(ref2), DType::kF32 == dt ? dt : DType::kF32,
                "linear -> f32 m=" + std::to_string(m));
  }
}

TEST_P(Kernels, RmsNormAndFusedAddMatchCpu) {
  const DType dt = GetParam();
  kernels::Backend& g = Gpu(dt);
  const int64_t rows = 5, hidden = 1000;
  HostPair x = Random({rows, hidden}, 10, dt), w = Random({hidden}, 11, dt),
           r = Random({rows, hidden}, 12, dt);
  Tensor ref = Tensor::Empty({rows, hidden});
  ASSERT_TRUE(kernels::cpu::RmsNorm(x.f32, w.f32, 1e-5f, ref).ok());
  Tensor y = Dev(g, {rows, hidden}, dt);
  ASSERT_TRUE(kernels::RmsNorm(Up(g, x.raw), Up(g, w.raw), 1e-5f, y).ok());
  ExpectClose(Down(g, y), Vec(ref), dt, "rms_norm");
  // Fused: the residual is rounded to the dtype before normalising, as HF does.
  Tensor res_ref = Tensor::Empty({rows, hidden});
  std::vector<float> sum(static_cast<size_t>(rows * hidden));
  for (size_t i = 0; i < sum.size(); ++i) sum[i] = r.f32.data<float>()[i] + x.f32.data<float>()[i];
  Tensor tmp = Tensor::Empty({rows, hidden}, dt);
  ConvertFromF32(dt, sum.data(), tmp.raw(), sum.size());
  ConvertToF32(dt, tmp.raw(), res_ref.data<float>(), sum.size());
  Tensor ref2 = Tensor::Empty({rows, hidden});
  ASSERT_TRUE(kernels::cpu::RmsNorm(res_ref, w.f32, 1e-5f, ref2).ok());
  Tensor res = Up(g, r.raw), y2 = Dev(g, {rows, hidden}, dt);
  ASSERT_TRUE(kernels::AddRmsNorm(res, Up(g, x.raw), Up(g, w.raw), 1e-5f, y2).ok());
  EXPECT_EQ(Down(g, res), Vec(res_ref)) << "residual after the fused add";
  ExpectClose(Down(g, y2), Vec(ref2), dt, "add_rms_norm");
}

TEST_P(Kernels, RopeSwigluAddMatchCpu) {
  const DType dt = GetParam();
  kernels::Backend& g = Gpu(dt);
  const int64_t tokens = 9, heads = 3, hd = 64;
  HostPair x = Random({tokens, heads, hd}, 20, dt);
  std::vector<int32_t> pos = {0, 1, 2, 17, 100, 511, 1000, 4095, 30000};
  Tensor pos_h = Tensor::Empty({tokens}, DType::kI32);
  std::copy(pos.begin(), pos.end(), pos_h.data<int32_t>());
  for (RopeType type :
       {RopeType::kDefault, RopeType::kLinear, RopeType::kDynamic, RopeType::kLlama3}) {
    ModelConfig c;
    c.head_dim = hd;
    c.rope_theta = 500000.0;
    c.max_position_embeddings = 2048;
    c.rope_scaling.type = type;
    c.rope_scaling.factor = 8.0;
    c.rope_scaling.original_max_position_embeddings = 1024;
    const std::vector<float> inv = RopeInvFreq(c, 40000);
    Tensor inv_h = Tensor::Empty({hd / 2});
    std::copy(inv.begin(), inv.end(), inv_h.data<float>());
    Tensor ref = Tensor::Empty({tokens, heads, hd});
    std::copy(x.f32.data<float>(), x.f32.data<float>() + ref.numel(), ref.data<float>());
    ASSERT_TRUE(kernels::cpu::ApplyRope(ref, pos_h, inv_h).ok());
    Tensor xd = Up(g, x.raw);
    Status s = kernels::ApplyRope(xd, Up(g, pos_h), Up(g, inv_h));
    ASSERT_TRUE(s.ok()) << s.ToString();
    ExpectClose(Down(g, xd), Vec(ref), dt, std::string("rope ") + RopeTypeName(type));
  }
  HostPair gate = Random({7, 300}, 21, dt, 3.0f), up = Random({7, 300}, 22, dt);
  Tensor ref = Tensor::Empty({7, 300});
  ASSERT_TRUE(kernels::cpu::SiluMul(gate.f32, up.f32, ref).ok());
  Tensor gd = Up(g, gate.raw);
  ASSERT_TRUE(kernels::SiluMul(gd, Up(g, up.raw), gd).ok());
  ExpectClose(Down(g, gd), Vec(ref), dt, "swiglu (out aliases gate)");
  HostPair acc = Random({4, 50}, 23, dt), add = Random({4, 50}, 24, dt),
           bias = Random({50}, 25, dt);
  Tensor aref = Tensor::Empty({4, 50});
  std::copy(acc.f32.data<float>(), acc.f32.data<float>() + 200, aref.data<float>());
  ASSERT_TRUE(kernels::cpu::AddInPlace(aref, add.f32, bias.f32).ok());
  Tensor ad = Up(g, acc.raw);
  ASSERT_TRUE(kernels::AddInPlace(ad, Up(g, add.raw), Up(g, bias.raw)).ok());
  ExpectClose(Down(g, ad), Vec(aref), dt, "add in place (+bias)");
}

TEST_P(Kernels, EmbeddingGatherAndCopyColumnsAreExact) {
  const DType dt = GetParam();
  kernels::Backend& g = Gpu(dt);
  HostPair table = Random({40, 24}, 30, dt);
  Tensor ids = Tensor::Empty({6}, DType::kI32);
  const int32_t id_values[] = {0, 19, 20, 39, 5, 25};
  std::copy(id_values, id_values + 6, ids.data<int32_t>());
  for (int r = 0; r < 2; ++r) {  // two vocab-parallel ranks of 20 rows
    Tensor ref = Tensor::Empty({6, 24});
    const Tensor part = table.f32.Slice0(r * 20, r * 20 + 20);
    ASSERT_TRUE(kernels::cpu::EmbeddingLookup(ids, part, r * 20, ref).ok());
    Tensor out = Dev(g, {6, 24}, dt);
    ASSERT_TRUE(kernels::EmbeddingLookup(Up(g, ids), Up(g, table.raw.Slice0(r * 20, r * 20 + 20)),
                                         r * 20, out)
                    .ok());
    EXPECT_EQ(Down(g, out), Vec(ref)) << "embedding rank " << r;
  }
  Tensor src = Up(g, table.raw);
  Tensor picked = Dev(g, {3, 24}, dt);
  ASSERT_TRUE(kernels::GatherRows(src, {39, 0, 7}, picked).ok());
  const auto pv = Down(g, picked);
  EXPECT_EQ(
      std::vector<float>(pv.begin(), pv.begin() + 24),
      std::vector<float>(table.f32.data<float>() + 39 * 24, table.f32.data<float>() + 40 * 24));
  Tensor wide = Dev(g, {40, 30}, dt);
  ASSERT_TRUE(kernels::CopyColumns(src, 4, wide, 10, 20).ok());
  const auto wv = Down(g, wide);
  EXPECT_EQ(wv[5 * 30 + 10], table.f32.data<float>()[5 * 24 + 4]);
  EXPECT_EQ(wv[5 * 30 + 9], 0.0f);
}

// Attention over mixed sequences: chunked prefill with earlier context,
// fresh prefills of several lengths and decode tokens, GQA groups 1..8,
// head dims 16..256, scattered blocks. Covers both CUDA kernels (decode
// split-K when every sequence has few tokens; tiled prefill otherwise).
void RunAttentionCase(DType dt, int64_t heads, int64_t kv_heads, int64_t hd, bool decode_only,
                      uint64_t seed) {
  kernels::Backend& g = Gpu(dt);
  const int64_t block = 16, num_blocks = 300;
  std::mt19937 rng(static_cast<uint32_t>(seed));
  struct Seq {
    int32_t start, n;
    std::vector<int32_t> table;
  };
  std::vector<Seq> seqs;
  if (decode_only) {
    for (int32_t ctx : {1, 40, 700, 1500}) seqs.push_back({ctx - 1, 1, {}});
    seqs.push_back({300, 3, {}});
  } else {
    seqs = {{0, 130, {}}, {0, 1, {}}, {200, 77, {}}, {64, 5, {}}, {999, 1, {}}, {0, 37, {}}};
  }
  // Scattered, distinct blocks.
  std::vector<int32_t> ids(num_blocks);
  for (int i = 0; i < num_blocks; ++i) ids[static_cast<size_t>(i)] = i;
  std::shuffle(ids.begin(), ids.end(), rng);
  size_t next = 0;
  int64_t tokens = 0;
  for (Seq& s : seqs) {
    const int64_t need = (s.start + s.n + block - 1) / block;
    for (int64_t j = 0; j < need; ++j) s.table.push_back(ids[next++]);
    tokens += s.n;
  }
  // Cache contents for the earlier context: random, identical on both sides.
  HostPair kc = Random({num_blocks, block, kv_heads, hd}, seed + 1, dt);
  HostPair vc = Random({num_blocks, block, kv_heads, hd}, seed + 2, dt);
  HostPair q = Random({tokens, heads, hd}, seed + 3, dt);
  HostPair k = Random({tokens, kv_heads, hd}, seed + 4, dt);
  HostPair v = Random({tokens, kv_heads, hd}, seed + 5, dt);
  std::vector<kernels::AttentionSeq> as;
  int64_t begin = 0;
  for (const Seq& s : seqs) {
    as.push_back({begin, s.n, s.start, std::span<const int32_t>(s.table.data(), s.table.size())});
    begin += s.n;
  }
  kernels::KvCacheLayer cpu_cache{kc.f32, vc.f32};
  auto cpu_batch =
      kernels::MakeAttentionBatch(as, tokens, block, num_blocks, kernels::CpuBackend());
  ASSERT_TRUE(cpu_batch.ok()) << cpu_batch.status().ToString();
  ASSERT_TRUE(kernels::cpu::WriteKv(cpu_cache, k.f32, v.f32, *cpu_batch).ok());
  Tensor ref = Tensor::Empty({tokens, heads * hd});
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  ASSERT_TRUE(kernels::cpu::PagedAttention(q.f32, cpu_cache, *cpu_batch, scale, ref).ok());

  kernels::KvCacheLayer dev_cache{Up(g, kc.raw), Up(g, vc.raw)};
  auto batch = kernels::MakeAttentionBatch(as, tokens, block, num_blocks, g);
  ASSERT_TRUE(batch.ok()) << batch.status().ToString();
  Status s = kernels::WriteKv(dev_cache, Up(g, k.raw), Up(g, v.raw), *batch);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(Down(g, dev_cache.k), Vec(cpu_cache.k)) << "K cache after WriteKv";
  EXPECT_EQ(Down(g, dev_cache.v), Vec(cpu_cache.v)) << "V cache after WriteKv";
  Tensor out = Dev(g, {tokens, heads * hd}, dt);
  s = kernels::PagedAttention(Up(g, q.raw), dev_cache, *batch, scale, out);
  ASSERT_TRUE(s.ok()) << s.ToString();
  char what[128];
  std::snprintf(what, sizeof what, "attention %s h%lld kv%lld d%lld",
                decode_only ? "decode" : "prefill", static_cast<long long>(heads),
                static_cast<long long>(kv_heads), static_cast<long long>(hd));
  ExpectClose(Down(g, out), Vec(ref), dt, what);
}

TEST_P(Kernels, PagedAttentionMatchesCpu) {
  const DType dt = GetParam();
  uint64_t seed = 100;
  for (bool decode : {true, false}) {
    RunAttentionCase(dt, 8, 8, 128, decode, seed += 10);   // MHA, 7B-like head dim
    RunAttentionCase(dt, 8, 2, 64, decode, seed += 10);    // GQA 4
    RunAttentionCase(dt, 9, 3, 64, decode, seed += 10);    // SmolLM2 shape (GQA 3)
    RunAttentionCase(dt, 16, 2, 128, decode, seed += 10);  // GQA 8
    RunAttentionCase(dt, 4, 1, 16, decode, seed += 10);    // fixture head dim
    RunAttentionCase(dt, 4, 2, 256, decode, seed += 10);   // largest head dim
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, Kernels, ::testing::Values(DType::kF32, DType::kBF16, DType::kF16),
                         [](const auto& info) { return std::string(DTypeName(info.param)); });

TEST(Sampling, DeviceDrawsTheCpuTokens) {
  kernels::Backend& g = Gpu(DType::kF32);
  const int64_t rows = 64, vocab = 32000;
  HostPair logits = Random({rows, vocab}, 7, DType::kF32, 3.0f);
  // Ties: row 0 has two equal maxima; greedy takes the first.
  logits.f32.data<float>()[100] = 50.0f;
  logits.f32.data<float>()[200] = 50.0f;
  std::vector<kernels::SampleRow> params(rows);
  std::mt19937_64 rng(9);
  for (int64_t i = 0; i < rows; ++i) {
    kernels::SampleRow& r = params[static_cast<size_t>(i)];
    r.temperature = i % 4 == 0 ? 0.0f : 0.3f + 0.1f * static_cast<float>(i % 7);
    r.top_k = i % 3 == 0 ? 0 : static_cast<int32_t>(1 + i * 13 % 200);
    if (i % 5 == 1) r.top_k = 0;
    r.top_p = i % 2 == 0 ? 1.0f : 0.5f + 0.05f * static_cast<float>(i % 9);
    r.uniform = static_cast<double>(rng() >> 11) * (1.0 / 9007199254740992.0);
  }
  std::vector<int32_t> want(rows), got;
  for (int64_t i = 0; i < rows; ++i)
    want[static_cast<size_t>(i)] = kernels::SampleRowCpu(logits.f32.data<float>() + i * vocab,
                                                         vocab, params[static_cast<size_t>(i)]);
  Tensor dev = Up(g, logits.f32);
  Status s = kernels::SampleTokens(dev, params, got);
  ASSERT_TRUE(s.ok()) << s.ToString();
  int same = 0;
  for (int64_t i = 0; i < rows; ++i)
    same += got[static_cast<size_t>(i)] == want[static_cast<size_t>(i)];
  std::printf("  sampling: %d of %lld rows drew the CPU's token (greedy rows: 16)\n", same,
              static_cast<long long>(rows));
  EXPECT_EQ(got[0], 100);
  EXPECT_EQ(same, rows);
  // Greedy timing at decode shapes.
  std::vector<kernels::SampleRow> greedy(rows);
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(kernels::SampleTokens(dev, greedy, got).ok());
  const double us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / 20;
  std::printf("  greedy sampling of 64 x 32000 incl. readback: %.1f us\n", us);
}

// ---------------------------------------------------------------------------
// Model level: fixtures on the CUDA backend.

constexpr double kNearTie = 1e-3;

using ::tessera::testing::RelMaxDiff;

std::vector<std::string> FixtureNames() {
  std::vector<std::string> names;
  const fs::path root = fs::path(g_fixtures) / "models";
  if (fs::exists(root))
    for (const auto& e : fs::directory_iterator(root))
      if (fs::exists(e.path() / "reference.json")) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// Greedy ids equal the reference up to the first step whose reference margin
// is below `near_tie`; returns the steps compared.
size_t GreedyAgreement(const std::vector<int32_t>& got, const json& prompt, double near_tie,
                       bool strict, const std::string& what) {
  const auto want = prompt["greedy"].get<std::vector<int32_t>>();
  const auto margins = prompt["greedy_margins"].get<std::vector<double>>();
  size_t i = 0;
  for (; i < std::min(got.size(), want.size()); ++i) {
    if (got[i] != want[i]) {
      if (strict)
        ADD_FAILURE() << what << " step " << i << ": " << got[i] << " vs " << want[i] << " (margin "
                      << margins[i] << ")";
      else
        std::printf("  %s: first difference at step %zu (reference margin %.4g)\n", what.c_str(), i,
                    margins[i]);
      break;
    }
    if (margins[i] < near_tie) break;
  }
  return i;
}

TEST(Models, FixturesOnCudaMatchTransformers) {
  const auto names = FixtureNames();
  ASSERT_FALSE(names.empty()) << "no fixtures under " << g_fixtures;
  for (const std::string& name : names) {
    const std::string dir = g_fixtures + "/models/" + name;
    const json ref = json::parse(ReadFile(dir + "/reference.json"));
    const std::string torch_dtype = ref["torch_dtype"].get<std::string>();
    const DType native = torch_dtype == "bfloat16"  ? DType::kBF16
                         : torch_dtype == "float16" ? DType::kF16
                                                    : DType::kF32;
    std::vector<DType> dtypes = {DType::kF32};
    if (native != DType::kF32) dtypes.push_back(native);
    auto cpu = testing::LocalModel::Load(dir);
    ASSERT_TRUE(cpu.ok()) << cpu.status().ToString();
    for (DType dt : dtypes) {
      kernels::Backend& g = Gpu(dt);
      auto model = testing::LocalModel::Load(dir, 256, 16, &g);
      ASSERT_TRUE(model.ok()) << name << ": " << model.status().ToString();
      std::vector<std::vector<int32_t>> prompts;
      double worst_ref = 0, worst_cpu = 0;
      for (const json& p : ref["prompts"]) {
        prompts.push_back(p["ids"].get<std::vector<int32_t>>());
        auto logits = (*model)->LastLogits(prompts.back());
        ASSERT_TRUE(logits.ok()) << logits.status().ToString();
        auto cpu_logits = (*cpu)->LastLogits(prompts.back());
        ASSERT_TRUE(cpu_logits.ok());
        const json& want = dt == DType::kF32 ? p["last_logits"] : p["last_logits_native"];
        worst_ref = std::max(worst_ref, RelMaxDiff(*logits, want));
        worst_cpu = std::max(worst_cpu, RelMaxDiff(*logits, json(*cpu_logits)));
      }
      // fp32: the CPU test's bound. 16-bit: against transformers computing
      // in the same dtype, a few output roundings of the logit scale.
      const double bound = dt == DType::kF32 ? 1e-4 : dt == DType::kBF16 ? 6e-2 : 1e-2;
      std::printf(
          "  %-24s %-4s last logits vs transformers %.3g (bound %.0e), vs cpu backend %.3g\n",
          name.c_str(), DTypeName(dt), worst_ref, bound, worst_cpu);
      EXPECT_LE(worst_ref, bound) << name << " " << DTypeName(dt);
      auto batched = (*model)->Greedy(prompts, 16);
      ASSERT_TRUE(batched.ok()) << batched.status().ToString();
      size_t agree = 0, total = 0;
      for (size_t i = 0; i < prompts.size(); ++i) {
        agree += GreedyAgreement((*batched)[i], ref["prompts"][i], kNearTie, dt == DType::kF32,
                                 name + " " + DTypeName(dt) + " prompt " + std::to_string(i));
        total += 16;
        auto alone = (*model)->Greedy({prompts[i]}, 16);
        ASSERT_TRUE(alone.ok());
        if (dt == DType::kF32) {
          EXPECT_EQ((*alone)[0], (*batched)[i]) << name << " prompt " << i << ": batched != alone";
        } else if ((*alone)[0] != (*batched)[i]) {
          std::printf("  %s %s prompt %zu: batched and alone differ\n", name.c_str(), DTypeName(dt),
                      i);
        }
      }
      std::printf(
          "  %-24s %-4s greedy: %zu of %zu steps equal to the reference before a "
          "near-tie/difference\n",
          name.c_str(), DTypeName(dt), agree, total);
    }
  }
}

// ---------------------------------------------------------------------------
// A transformers model made on the device, compared in bf16 on the same GPU.

TEST(Models, HfModelBf16MatchesTransformersOnGpu) {
  if (g_hf_dir.empty()) GTEST_SKIP() << "no --hf-dir";
  const json ref = json::parse(ReadFile(g_hf_ref));
  kernels::Backend& g = Gpu(DType::kBF16);
  const auto t0 = std::chrono::steady_clock::now();
  auto model = testing::LocalModel::Load(g_hf_dir, 2048, 16, &g);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  std::printf("  loaded %s in %.2f s\n", g_hf_dir.c_str(),
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  // Judged against the fp32 values of the same weights: tessera bf16 must
  // be at least about as close to them as transformers bf16 is.
  double worst_hf = 0, worst_fp32 = 0, worst_hf_fp32 = 0;
  std::vector<std::vector<int32_t>> prompts;
  for (const json& p : ref["prompts"]) {
    prompts.push_back(p["ids"].get<std::vector<int32_t>>());
    auto logits = (*model)->LastLogits(prompts.back());
    ASSERT_TRUE(logits.ok()) << logits.status().ToString();
    const std::vector<float> hf = p["last_logits"].get<std::vector<float>>();
    const double d_hf = RelMaxDiff(*logits, p["last_logits"]);
    const double d_fp32 = RelMaxDiff(*logits, p["last_logits_fp32"]);
    const double d_hf_fp32 = RelMaxDiff(hf, p["last_logits_fp32"]);
    worst_hf = std::max(worst_hf, d_hf);
    worst_fp32 = std::max(worst_fp32, d_fp32);
    worst_hf_fp32 = std::max(worst_hf_fp32, d_hf_fp32);
    std::printf(
        "  prompt of %3zu tokens: max |diff| / max |ref| of last logits: tessera-bf16 vs hf-bf16 "
        "%.4f, "
        "tessera-bf16 vs fp32 %.4f, hf-bf16 vs fp32 %.4f\n",
        prompts.back().size(), d_hf, d_fp32, d_hf_fp32);
  }
  EXPECT_LE(worst_fp32, std::max(1.5 * worst_hf_fp32, 1e-2))
      << "tessera bf16 is further from fp32 than transformers bf16 is";
  auto batched = (*model)->Greedy(prompts, 16);
  ASSERT_TRUE(batched.ok()) << batched.status().ToString();
  for (size_t i = 0; i < prompts.size(); ++i) {
    const size_t n = GreedyAgreement((*batched)[i], ref["prompts"][i], 0.05, false,
                                     "hf prompt " + std::to_string(i));
    std::printf(
        "  hf prompt %zu: %zu of 16 greedy ids equal before a near-tie (< 0.05) or difference\n", i,
        n);
    auto alone = (*model)->Greedy({prompts[i]}, 16);
    ASSERT_TRUE(alone.ok());
    std::printf("  hf prompt %zu: batched %s alone\n", i,
                (*alone)[0] == (*batched)[i] ? "==" : "!=");
  }
  // Top-1 agreement over teacher-forced positions (decode path, growing context).
  const auto ids = ref["positions"]["ids"].get<std::vector<int32_t>>();
  const auto top1 = ref["positions"]["top1"].get<std::vector<int32_t>>();
  const auto margin = ref["positions"]["margins"].get<std::vector<double>>();
  testing::LocalModel& m = **model;
  StepBatch b;
  SeqStep s;
  s.want_logits = true;
  s.prompt_len = 1;
  std::vector<int32_t> table;
  ASSERT_TRUE(
      m.allocator()
          .Allocate(BlockAllocator::BlocksFor(static_cast<int64_t>(ids.size()), m.block_size()),
                    table)
          .ok());
  s.block_table = table;
  const auto top1_fp32 = ref["positions"]["top1_fp32"].get<std::vector<int32_t>>();
  size_t agree = 0, agree_clear = 0, clear = 0, agree_fp32 = 0, hf_agree_fp32 = 0;
  Tensor logits = Tensor::Empty({1, m.config().vocab_size});
  for (size_t i = 0; i < ids.size(); ++i) {
    b.token_ids = {ids[i]};
    s.start_pos = static_cast<int32_t>(i);
    s.num_tokens = 1;
    b.seqs = {s};
    ASSERT_TRUE(m.executor().RunLogits(b, logits).ok());
    const float* l = logits.data<float>();
    const int32_t t = static_cast<int32_t>(std::max_element(l, l + m.config().vocab_size) - l);
    agree += t == top1[i];
    agree_fp32 += t == top1_fp32[i];
    hf_agree_fp32 += top1[i] == top1_fp32[i];
    if (margin[i] >= 0.05) {
      ++clear;
      agree_clear += t == top1[i];
    }
  }
  m.allocator().Free(table);
  std::printf(
      "  top-1 agreement with transformers bf16 over %zu teacher-forced positions: %zu (%.1f%%); "
      "%zu of %zu with reference margin >= 0.05\n",
      ids.size(), agree, 100.0 * static_cast<double>(agree) / static_cast<double>(ids.size()),
      agree_clear, clear);
  std::printf("  top-1 agreement with the fp32 argmax: tessera-bf16 %zu, hf-bf16 %zu of %zu\n",
              agree_fp32, hf_agree_fp32, ids.size());
  EXPECT_GE(static_cast<double>(agree), 0.85 * static_cast<double>(ids.size()));
  EXPECT_GE(agree_fp32 + 5, hf_agree_fp32)
      << "tessera bf16 agrees less with fp32 than transformers bf16";
}

// ---------------------------------------------------------------------------
// CUDA graphs: decode steps replayed from recorded graphs give exactly the
// tokens of eager decode (same kernels, same inputs: bit-identical logits).

TEST(DecodeGraphs, GraphAndEagerDecodeGiveIdenticalTokens) {
  std::vector<std::string> dirs;
  for (const std::string& name : FixtureNames()) dirs.push_back(g_fixtures + "/models/" + name);
  if (!g_hf_dir.empty()) dirs.push_back(g_hf_dir);
  ASSERT_FALSE(dirs.empty());
  for (const std::string& dir : dirs) {
    const bool hf = dir == g_hf_dir;
    for (DType dt : {DType::kF32, DType::kBF16}) {
      if (hf && dt == DType::kF32) continue;  // the large model in bf16 only
      kernels::Backend& g = Gpu(dt);
      auto graphs = testing::LocalModel::Load(dir, 512, 16, &g);
      ASSERT_TRUE(graphs.ok()) << dir << ": " << graphs.status().ToString();
      auto eager = testing::LocalModel::Load(dir, 512, 16, &g);
      ASSERT_TRUE(eager.ok());
      LlamaModel& gm = (*graphs)->executor().model();
      (*eager)->executor().model().set_decode_graphs(false);
      ASSERT_TRUE(gm.decode_graphs()) << "graphs are off on the CUDA backend";
      std::mt19937 rng(7);
      const int32_t vocab =
          static_cast<int32_t>(std::min<int64_t>((*graphs)->config().vocab_size, 1000));
      auto prompt = [&](int n) {
        std::vector<int32_t> p(static_cast<size_t>(n));
        for (int32_t& t : p) t = static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab));
        return p;
      };
      // Four sequences of mixed lengths in one batch, then one sequence
      // alone whose context crosses the 256-position bucket (when the model
      // takes that many positions).
      const bool long_ctx = (*graphs)->config().max_position_embeddings >= 512;
      const std::vector<std::vector<int32_t>> batch = {prompt(3), prompt(17), prompt(40),
                                                       prompt(1)};
      const std::vector<std::vector<int32_t>> alone = {prompt(long_ctx ? 230 : 20)};
      for (const auto* prompts : {&batch, &alone}) {
        auto a = (*graphs)->Greedy(*prompts, 40);
        ASSERT_TRUE(a.ok()) << dir << ": " << a.status().ToString();
        auto b = (*eager)->Greedy(*prompts, 40);
        ASSERT_TRUE(b.ok()) << b.status().ToString();
        EXPECT_EQ(*a, *b) << dir << " " << DTypeName(dt) << ": graph decode != eager decode";
      }
      // B=4; B=1 (in two context buckets with long_ctx). Dynamic NTK RoPE
      // past max_position_embeddings runs eagerly.
      if ((*graphs)->config().rope_scaling.type != RopeType::kDynamic) {
        EXPECT_GE(gm.decode_graphs_recorded(), long_ctx ? 3 : 2);
        EXPECT_GE(gm.decode_graph_replays(), 70);
      }
      EXPECT_EQ((*eager)->executor().model().decode_graph_replays(), 0);
      std::printf("  %-40s %-4s graph == eager over 2 x 40 steps (%lld graphs, %lld replays)\n",
                  fs::path(dir).filename().c_str(), DTypeName(dt),
                  static_cast<long long>(gm.decode_graphs_recorded()),
                  static_cast<long long>(gm.decode_graph_replays()));
      if (hf) {
        // Batch-1 decode speed with and without graphs (informational).
        for (auto* m : {graphs->get(), eager->get()}) {
          const auto t0 = std::chrono::steady_clock::now();
          auto r = m->Greedy({prompt(8)}, 128);
          ASSERT_TRUE(r.ok());
          const double s =
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          std::printf("  batch-1 decode, %s: %.3f ms per token (128 tokens incl. prefill)\n",
                      m == graphs->get() ? "graphs" : "eager ", 1e3 * s / 128);
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------
// NCCL on two GPUs (skipped with one).

template <typename F>
void OnTwoRanks(F&& body) {
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) threads.emplace_back([&, r] { body(r); });
  for (auto& t : threads) t.join();
}

std::unique_ptr<FileStore> TempStore(const std::string& tag) {
  const std::string dir =
      (fs::temp_directory_path() / ("tessera-gpu-" + tag + "-" + std::to_string(::getpid())))
          .string();
  fs::create_directories(dir);
  auto s = FileStore::Open(dir);
  TESSERA_CHECK(s.ok());
  return std::move(*s);
}

TEST(Nccl, CollectivesOnDeviceBuffers) {
  if (g_devices < 2) GTEST_SKIP() << "needs 2 GPUs";
  auto store = TempStore("coll");
  std::vector<std::string> failures(2);
  OnTwoRanks([&](int r) {
    auto fail = [&](const std::string& m) { failures[static_cast<size_t>(r)] += m + "\n"; };
    auto backend = kernels::CreateCudaBackend(r, DType::kBF16);
    if (!backend.ok()) return fail(backend.status().ToString());
    kernels::Backend& b = **backend;
    NcclCommunicatorOptions o;
    o.group = "tp.test";
    o.rank = r;
    o.size = 2;
    o.timeout_seconds = 10;
    auto comm = CreateNcclCommunicator(*store, o, b);
    if (!comm.ok()) return fail(comm.status().ToString());
    Communicator& c = **comm;
    // bf16 all-reduce: rank r holds (r + 1) * i / 64, exact in bf16.
    const int64_t n = 4096;
    Tensor h = Tensor::Empty({n});
    for (int64_t i = 0; i < n; ++i)
      h.data<float>()[i] = static_cast<float>((r + 1) * (i % 64)) / 64.0f;
    Tensor hb = Tensor::Empty({n}, DType::kBF16);
    ConvertFromF32(DType::kBF16, h.data<float>(), hb.raw(), static_cast<size_t>(n));
    Tensor d = *b.Upload(hb);
    Status s = c.AllReduceSumTyped(d.raw(), static_cast<size_t>(n), DType::kBF16);
    if (!s.ok()) return fail(s.ToString());
    auto back = Down(b, d);
    for (int64_t i = 0; i < n; ++i)
      if (back[static_cast<size_t>(i)] != 3.0f * static_cast<float>(i % 64) / 64.0f)
        return fail("all_reduce bf16 wrong at " + std::to_string(i));
    // fp32 all-gather in place.
    Tensor g32 = *b.Zeros({2, 8}, DType::kF32);
    Tensor mine = Tensor::Empty({8});
    for (int i = 0; i < 8; ++i) mine.data<float>()[i] = static_cast<float>(r * 100 + i);
    Tensor slot = g32.Slice0(r, r + 1).Reshape({8});
    if (!b.Copy(slot, mine).ok()) return fail("copy");
    s = c.AllGatherTyped(slot.raw(), 8, DType::kF32, g32.raw());
    if (!s.ok()) return fail(s.ToString());
    auto gv = Down(b, g32);
    if (gv[3] != 3.0f || gv[8 + 3] != 103.0f) return fail("all_gather wrong");
    // Broadcast and send/recv of bytes.
    Tensor bytes = *b.Zeros({16}, DType::kU8);
    if (r == 0) {
      Tensor src = Tensor::Empty({16}, DType::kU8);
      for (int i = 0; i < 16; ++i) src.data<uint8_t>()[i] = static_cast<uint8_t>(i + 1);
      if (!b.Copy(bytes, src).ok()) return fail("copy");
    }
    s = c.Broadcast(bytes.raw(), 16, 0);
    if (!s.ok()) return fail(s.ToString());
    Tensor bh = *b.ToHost(bytes);
    if (bh.data<uint8_t>()[15] != 16) return fail("broadcast wrong");
    s = r == 0 ? c.Send(bytes.raw(), 16, 1) : c.Recv(bytes.raw(), 16, 0);
    if (!s.ok()) return fail(s.ToString());
    s = c.Barrier();
    if (!s.ok()) return fail(s.ToString());
    // Latency of the decode-size all-reduce (batch 1 hidden 4096 bf16 = 8 KiB).
    Tensor ar = *b.Zeros({4096}, DType::kBF16);
    for (int i = 0; i < 20; ++i) (void)c.AllReduceSumTyped(ar.raw(), 4096, DType::kBF16);
    (void)b.Synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    const int iters = 200;
    for (int i = 0; i < iters; ++i) (void)c.AllReduceSumTyped(ar.raw(), 4096, DType::kBF16);
    const auto t1 = std::chrono::steady_clock::now();
    (void)b.Synchronize();
    const auto t2 = std::chrono::steady_clock::now();
    const double us = std::chrono::duration<double, std::micro>(t2 - t0).count() / iters;
    const double enq = std::chrono::duration<double, std::micro>(t1 - t0).count() / iters;
    if (r == 0)
      std::printf(
          "  nccl all-reduce 8 KiB bf16, 2 GPUs, back to back on the stream: %.1f us per call "
          "(host enqueue %.1f us per call)\n",
          us, enq);
  });
  EXPECT_EQ(failures[0], "");
  EXPECT_EQ(failures[1], "");
}

// tp = 2 on the fixtures: logits and greedy tokens equal tp = 1 on the GPU.
TEST(Nccl, TensorParallelFixturesMatchTp1) {
  if (g_devices < 2) GTEST_SKIP() << "needs 2 GPUs";
  for (const std::string& name : FixtureNames()) {
    const std::string dir = g_fixtures + "/models/" + name;
    const json ref = json::parse(ReadFile(dir + "/reference.json"));
    auto config = LoadModelConfig(dir);
    ASSERT_TRUE(config.ok());
    auto par = ParallelConfig::Make(*config, 2, 1);
    if (!par.ok()) {
      std::printf("  %s: tp=2 not possible (%s)\n", name.c_str(), par.status().message().c_str());
      continue;
    }
    std::vector<std::vector<int32_t>> prompts;
    for (const json& p : ref["prompts"]) prompts.push_back(p["ids"].get<std::vector<int32_t>>());
    auto tp1 = testing::LocalModel::Load(dir, 256, 16, &Gpu(DType::kF32));
    ASSERT_TRUE(tp1.ok());
    auto want_tokens = (*tp1)->Greedy(prompts, 16);
    ASSERT_TRUE(want_tokens.ok());
    auto want_logits = (*tp1)->LastLogits(prompts[0]);
    ASSERT_TRUE(want_logits.ok());
    auto store = TempStore(name);
    std::vector<std::string> failures(2);
    std::vector<std::vector<std::vector<int32_t>>> tokens(2);
    std::vector<std::vector<float>> logits(2);
    OnTwoRanks([&](int r) {
      auto fail = [&](const std::string& m) { failures[static_cast<size_t>(r)] += m + "\n"; };
      auto backend = kernels::CreateCudaBackend(r, DType::kF32);
      if (!backend.ok()) return fail(backend.status().ToString());
      NcclCommunicatorOptions o;
      o.group = "tp." + name;
      o.rank = r;
      o.size = 2;
      o.timeout_seconds = 20;
      auto comm = CreateNcclCommunicator(*store, o, **backend);
      if (!comm.ok()) return fail(comm.status().ToString());
      auto loaded = LoadModel(dir, *par, r, comm->get(), {}, backend->get());
      if (!loaded.ok()) return fail(loaded.status().ToString());
      const StageLayout lay = loaded->model->layout();
      auto cache = KvCache::Create(**backend, lay.num_layers(), 256, 16, lay.kv_heads_local,
                                   config->head_dim);
      if (!cache.ok()) return fail(cache.status().ToString());
      PipelineLinks links;
      links.tp_rank = r;
      links.tp = comm->get();
      {
        PipelineExecutor exec(
            loaded->model.get(), cache->get(), links, [&](const StepBatch& b, const Tensor& l) {
              if (logits[static_cast<size_t>(r)].empty() && b.seqs.size() == prompts.size() &&
                  b.seqs[0].num_tokens == static_cast<int32_t>(prompts[0].size()))
                logits[static_cast<size_t>(r)].assign(l.data<float>(), l.data<float>() + l.dim(1));
            });
        BlockAllocator alloc(256);
        Engine engine(*config, &exec, &alloc, 16, nullptr);
        std::vector<GenerationRequest> reqs;
        for (const auto& p : prompts) {
          GenerationRequest q;
          q.prompt_ids = p;
          q.max_tokens = 16;
          q.ignore_eos = true;
          reqs.push_back(q);
        }
        auto results = engine.Generate(reqs);
        if (!results.ok()) return fail(results.status().ToString());
        for (const auto& res : *results) tokens[static_cast<size_t>(r)].push_back(res.tokens);
      }
    });
    ASSERT_EQ(failures[0], "") << name;
    ASSERT_EQ(failures[1], "") << name;
    EXPECT_EQ(tokens[0], *want_tokens) << name << ": tp=2 greedy != tp=1";
    EXPECT_EQ(tokens[1], *want_tokens) << name << ": tp rank 1 disagrees";
    ASSERT_EQ(logits[0].size(), want_logits->size());
    const double d = RelMaxDiff(logits[0], json(*want_logits));
    std::printf("  %-24s tp=2 vs tp=1 (F32, GPU): first-prompt logits rel diff %.3g, greedy %s\n",
                name.c_str(), d, tokens[0] == *want_tokens ? "equal" : "DIFFERENT");
    EXPECT_LE(d, 1e-4) << name;
  }
}

TEST(Nccl, HungCollectiveTimesOutAndNamesRankAndGroup) {
  if (g_devices < 2) GTEST_SKIP() << "needs 2 GPUs";
  auto store = TempStore("hang");
  std::vector<Status> results(2);
  OnTwoRanks([&](int r) {
    auto backend = kernels::CreateCudaBackend(r, DType::kF32);
    if (!backend.ok()) return;
    NcclCommunicatorOptions o;
    o.group = "tp.hang";
    o.rank = r;
    o.size = 2;
    o.timeout_seconds = 3;
    o.blocking = true;
    auto comm = CreateNcclCommunicator(*store, o, **backend);
    if (!comm.ok()) {
      results[static_cast<size_t>(r)] = comm.status();
      return;
    }
    Tensor d = *(*backend)->Zeros({1024}, DType::kF32);
    if (r == 0) {
      const auto t0 = std::chrono::steady_clock::now();
      results[0] = (*comm)->AllReduceSum(d.data<float>(), 1024);  // rank 1 never joins
      std::printf("  hung all-reduce returned after %.1f s: %s\n",
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
                  results[0].ToString().c_str());
      Status again = (*comm)->AllReduceSum(d.data<float>(), 1024);
      std::printf("  next call: %s\n", again.ToString().c_str());
    } else {
      std::this_thread::sleep_for(std::chrono::seconds(6));
    }
  });
  EXPECT_EQ(results[0].code(), StatusCode::kDeadlineExceeded) << results[0].ToString();
  EXPECT_NE(results[0].message().find("rank 0 of group tp.hang"), std::string::npos)
      << results[0].ToString();
}

// ---------------------------------------------------------------------------
// The daemons on GPUs: tessera-coordinator and tessera-worker processes (one
// per GPU, NCCL for tp) answer a greedy completion with exactly the tokens
// of the single-process engine on the same GPU in the same dtype.

std::string SelfDir() {
  char exe[4096];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  TESSERA_CHECK(n > 0);
  exe[n] = '\0';
  return fs::path(exe).parent_path().string();
}

using ::tessera::testing::Spawn;

// Starts a coordinator and tp * pp workers (worker i on GPU i) serving `model`
// in `dtype` ("float32", "bfloat16"), sends each prompt as a greedy
// completion of `n` tokens, and returns the completion texts. Logs of a
// failed start are printed.
std::vector<std::string> DaemonCompletions(const std::string& model, const std::string& dtype,
                                           int tp, int pp,
                                           const std::vector<std::vector<int32_t>>& prompts,
                                           int n) {
  const std::string dir = testing::MakeTempDir("tessera-gpu-daemons");
  const int port = testing::FreeTcpPort(), control = testing::FreeTcpPort();
  const auto keys = testing::MakeControlKeys(dir, tp * pp);
  std::ofstream(dir + "/c.toml") << "[model]\npath = \"" << model << "\"\nname = \"m\"\ndtype = \""
                                 << dtype
                                 << "\"\nchat_template = \"chatml\"\n[parallel]\ntp = " << tp
                                 << "\npp = " << pp << "\n[server]\nport = " << port
                                 << "\ncontrol_endpoint = \"tcp://127.0.0.1:" << control
                                 << "\"\n[admin]\nport = 0\n[kv_cache]\nmax_blocks = 512\n"
                                 << "block_size = 16\n[scheduler]\nmax_context = 128\n"
                                 << "[worker]\nbackend = \"cuda\"\n"
                                 << keys.CoordinatorToml();
  const std::string bin = SelfDir();
  std::vector<pid_t> pids;
  pids.push_back(
      Spawn({bin + "/tessera-coordinator", "--config", dir + "/c.toml"}, dir + "/coordinator.log"));
  for (int i = 0; i < tp * pp; ++i)
    pids.push_back(
        Spawn(testing::Concat({bin + "/tessera-worker", "--config", dir + "/c.toml",
                               "--coordinator", "tcp://127.0.0.1:" + std::to_string(control),
                               "--device", std::to_string(i), "--timeout", "20"},
                              keys.WorkerArgs(i)),
              dir + "/worker" + std::to_string(i) + ".log"));
  bool ready = false;
  for (int i = 0; i < 900 && !ready; ++i) {  // up to 90 s
    ready = HttpCall(port, "GET", "/readyz").status == 200;
    if (!ready) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  std::vector<std::string> texts;
  if (ready) {
    for (const auto& p : prompts) {
      json req = {{"model", "m"},
                  {"prompt", p},
                  {"max_tokens", n},
                  {"temperature", 0},
                  {"ignore_eos", true}};
      auto r = HttpCall(port, "POST", "/v1/completions", req.dump());
      if (r.status != 200) {
        ADD_FAILURE() << "completion: HTTP " << r.status << " " << r.body;
        break;
      }
      texts.push_back(json::parse(r.body)["choices"][0]["text"].get<std::string>());
    }
  } else {
    ADD_FAILURE() << "daemons not ready within 90 s";
  }
  testing::StopProcesses(pids);
  if (!ready || texts.size() != prompts.size()) {
    for (const char* log : {"coordinator", "worker0", "worker1"})
      std::printf("---- %s.log\n%s\n", log, ReadFile(dir + "/" + log + ".log").c_str());
  } else {
    // Which backend the workers ran on, as they logged it.
    const std::string w0 = ReadFile(dir + "/worker0.log");
    const size_t at = w0.find(" loaded layers");
    if (at != std::string::npos)
      std::printf("  worker0:%s\n", w0.substr(at, w0.find('\n', at) - at).c_str());
  }
  return texts;
}

TEST(Daemons, GreedyCompletionOnGpusEqualsSingleProcessEngine) {
  struct Case {
    std::string model, dtype;
    DType dt;
    int tp, pp;
  };
  const std::string fixture = g_fixtures + "/models/llama_gqa_f32";
  std::vector<Case> cases = {{fixture, "float32", DType::kF32, 1, 1}};
  if (g_devices >= 2) {
    cases.push_back({fixture, "float32", DType::kF32, 2, 1});
    cases.push_back({fixture, "float32", DType::kF32, 1, 2});
  }
  for (const Case& c : cases) {
    auto local = testing::LocalModel::Load(c.model, 512, 16, &Gpu(c.dt));
    ASSERT_TRUE(local.ok()) << local.status().ToString();
    auto tok = Tokenizer::Load(c.model);
    ASSERT_TRUE(tok.ok()) << tok.status().ToString();
    std::mt19937 rng(11);
    std::vector<std::vector<int32_t>> prompts;
    for (int len : {5, 33}) {
      std::vector<int32_t> p(static_cast<size_t>(len));
      for (int32_t& t : p) t = static_cast<int32_t>(rng() % 200 + 3);
      prompts.push_back(p);
    }
    auto want = (*local)->Greedy(prompts, 16);  // one batch, EOS ignored
    ASSERT_TRUE(want.ok()) << want.status().ToString();
    const auto got = DaemonCompletions(c.model, c.dtype, c.tp, c.pp, prompts, 16);
    ASSERT_EQ(got.size(), prompts.size()) << c.model << " tp=" << c.tp << " pp=" << c.pp;
    for (size_t i = 0; i < prompts.size(); ++i)
      EXPECT_EQ(got[i], (*tok)->Decode((*want)[i], true))
          << fs::path(c.model).filename() << " " << c.dtype << " tp=" << c.tp << " pp=" << c.pp
          << " prompt " << i;
    std::printf("  daemons %-24s %-8s tp=%d pp=%d: %zu greedy completions %s the engine's\n",
                fs::path(c.model).filename().c_str(), c.dtype.c_str(), c.tp, c.pp, prompts.size(),
                ::testing::Test::HasFailure() ? "vs" : "equal to");
  }
}

// ---------------------------------------------------------------------------
// Plans changing on GPUs: two CUDA workers serve tp=2; POST /admin/plan moves
// them to tp=1 x pp=2 and back (weights held in device memory are reused
// where the slice is the same); then one worker is SIGSTOPped with a request
// in flight and killed: the coordinator detects it, re-plans onto the other
// GPU (the stuck NCCL all-reduce is aborted by the worker's watchdog), and the
// request completes with the engine's tokens.

struct GpuCluster {
  std::string dir;
  int port = 0, control = 0;
  std::vector<pid_t> pids;  // [0] = coordinator, then worker i on GPU i
  ~GpuCluster() {
    for (pid_t p : pids) kill(p, SIGCONT), kill(p, SIGTERM);
    for (pid_t p : pids) {
      for (int i = 0; i < 50 && waitpid(p, nullptr, WNOHANG) == 0; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      kill(p, SIGKILL);
      waitpid(p, nullptr, 0);
    }
  }
  json Get(const std::string& path) const {
    auto r = HttpCall(port, "GET", path);
    return r.status == 200 ? json::parse(r.body, nullptr, false) : json();
  }
  bool WaitReady(double seconds) const {
    for (int i = 0; i < seconds * 10; ++i) {
      if (HttpCall(port, "GET", "/readyz").status == 200) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return false;
  }
  StatusOr<std::string> Complete(const std::vector<int32_t>& prompt, int n) const {
    json req = {{"model", "m"},
                {"prompt", prompt},
                {"max_tokens", n},
                {"temperature", 0},
                {"ignore_eos", true}};
    auto r = HttpCall(port, "POST", "/v1/completions", req.dump());
    if (r.status != 200)
      return Internal("completion: HTTP " + std::to_string(r.status) + " " + r.body);
    return json::parse(r.body)["choices"][0]["text"].get<std::string>();
  }
  void PrintLogs() const {
    for (const char* log : {"coordinator", "worker0", "worker1"})
      std::printf("---- %s.log (tail)\n%s\n", log,
                  Tail(ReadFile(dir + "/" + log + ".log"), 4000).c_str());
  }
  static std::string Tail(const std::string& s, size_t n) {
    return s.size() > n ? s.substr(s.size() - n) : s;
  }
};

void PrintPlanChange(const char* what, const json& r) {
  std::printf(
      "  %s: plan %d %s; detect %.2f s, drain %.2f s, re-plan and load %.2f s (total %.2f s), "
      "re-queued %d, weights reused %lld of %lld bytes\n",
      what, r.value("plan_version", 0), r.value("layout", json()).dump().c_str(),
      r.value("detect_seconds", 0.0), r.value("drain_seconds", 0.0), r.value("load_seconds", 0.0),
      r.value("total_seconds", 0.0), r.value("requeued_requests", 0),
      static_cast<long long>(r.value("reused_weight_bytes", int64_t{0})),
      static_cast<long long>(r.value("weight_bytes", int64_t{0})));
}

TEST(Daemons, PlanChangesAndWorkerLossOnGpus) {
  if (g_devices < 2) GTEST_SKIP() << "needs two GPUs";
  const std::string model = g_fixtures + "/models/llama_gqa_f32";
  auto local = testing::LocalModel::Load(model, 512, 16, &Gpu(DType::kF32));
  ASSERT_TRUE(local.ok()) << local.status().ToString();
  auto tok = Tokenizer::Load(model);
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  const std::vector<int32_t> prompt = {17, 4, 99, 23, 150, 7, 61};
  auto want_tokens = (*local)->Greedy({prompt}, 96);
  ASSERT_TRUE(want_tokens.ok()) << want_tokens.status().ToString();
  const std::string want96 = (*tok)->Decode((*want_tokens)[0], true);
  const std::string want16 = (*tok)->Decode(
      std::vector<int32_t>((*want_tokens)[0].begin(), (*want_tokens)[0].begin() + 16), true);

  GpuCluster c;
  c.dir = testing::MakeTempDir("tessera-gpu-reconf");
  c.port = testing::FreeTcpPort();
  c.control = testing::FreeTcpPort();
  const auto keys = testing::MakeControlKeys(c.dir, 2);
  std::ofstream(c.dir + "/c.toml")
      << "[model]\npath = \"" << model << "\"\nname = \"m\"\ndtype = \"float32\"\n"
      << "chat_template = \"chatml\"\n[parallel]\ntp = 2\npp = 1\n[server]\nport = " << c.port
      << "\ncontrol_endpoint = \"tcp://127.0.0.1:" << c.control << "\"\n[admin]\nport = 0\n"
      << "[heartbeat]\ninterval_seconds = 0.25\ntimeout_seconds = 1.0\n"
      << "[kv_cache]\nmax_blocks = 512\nblock_size = 16\n[scheduler]\nmax_context = 128\n"
      << "drain_timeout_seconds = 0\n[worker]\nbackend = \"cuda\"\n"
      << keys.CoordinatorToml();
  const std::string bin = SelfDir();
  c.pids.push_back(Spawn({bin + "/tessera-coordinator", "--config", c.dir + "/c.toml"},
                         c.dir + "/coordinator.log"));
  for (int i = 0; i < 2; ++i)
    c.pids.push_back(Spawn(
        testing::Concat(
            {bin + "/tessera-worker", "--config", c.dir + "/c.toml", "--device", std::to_string(i),
             "--coordinator", "tcp://127.0.0.1:" + std::to_string(c.control), "--timeout", "4"},
            keys.WorkerArgs(i)),
        c.dir + "/worker" + std::to_string(i) + ".log"));
  if (!c.WaitReady(90)) {
    c.PrintLogs();
    FAIL() << "daemons not ready within 90 s";
  }
  auto text = c.Complete(prompt, 16);
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  EXPECT_EQ(*text, want16) << "tp=2";

  // Logprobs from the CUDA workers (the last stage copies the logits rows of
  // the sequences that ask to the host): the log-softmax of the engine's
  // logits on the same GPU, the greedy token the best alternative.
  {
    const int n = 8;
    json req = {{"model", "m"},     {"prompt", prompt},   {"max_tokens", n},
                {"temperature", 0}, {"ignore_eos", true}, {"logprobs", 3}};
    auto r = HttpCall(c.port, "POST", "/v1/completions", req.dump());
    ASSERT_EQ(r.status, 200) << r.body;
    const json lp = json::parse(r.body)["choices"][0]["logprobs"];
    ASSERT_EQ(lp["token_logprobs"].size(), static_cast<size_t>(n)) << r.body;
    std::vector<int32_t> seq = prompt;
    double max_diff = 0;
    for (int i = 0; i < n; ++i) {
      auto logits = (*local)->LastLogits(seq);
      ASSERT_TRUE(logits.ok()) << logits.status().ToString();
      const int32_t id = (*want_tokens)[0][static_cast<size_t>(i)];
      const double m = *std::max_element(logits->begin(), logits->end());
      double sum = 0;
      for (float l : *logits) sum += std::exp(l - m);
      const double want = (*logits)[static_cast<size_t>(id)] - m - std::log(sum);
      const double got = lp["token_logprobs"][i].get<double>();
      max_diff = std::max(max_diff, std::fabs(got - want));
      EXPECT_NEAR(got, want, 2e-3) << "token " << i;
      double best = -1e30;
      for (const auto& [key, value] : lp["top_logprobs"][i].items())
        best = std::max(best, value.get<double>());
      EXPECT_EQ(best, got) << "token " << i << ": " << lp["top_logprobs"][i];
      seq.push_back(id);
    }
    std::printf("  logprobs from CUDA workers at tp=2: %d tokens, max |diff| vs the engine %.2e\n",
                n, max_diff);
  }

  // tp=2 -> tp=1 x pp=2 -> tp=2, each answered with the change report.
  for (const json& layout : {json{{"tp", 1}, {"pp", 2}}, json{{"tp", 2}, {"pp", 1}}}) {
    auto r = HttpCall(c.port, "POST", "/admin/plan", layout.dump());
    if (r.status != 200) c.PrintLogs();
    ASSERT_EQ(r.status, 200) << layout.dump() << ": " << r.body;
    const json report = json::parse(r.body);
    PrintPlanChange(("POST /admin/plan " + layout.dump()).c_str(), report);
    EXPECT_GT(report.value("reused_weight_bytes", int64_t{0}), 0) << report.dump();
    ASSERT_TRUE(c.WaitReady(30));
    text = c.Complete(prompt, 16);
    ASSERT_TRUE(text.ok()) << text.status().ToString();
    EXPECT_EQ(*text, want16) << layout.dump();
  }

  // Worker 1 hangs with a request in flight, then dies: the request is
  // re-queued and completes on worker 0 alone with the same tokens.
  kill(c.pids[2], SIGSTOP);
  StatusOr<std::string> in_flight = Internal("not run");
  std::thread client([&] { in_flight = c.Complete(prompt, 96); });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  kill(c.pids[2], SIGKILL);
  waitpid(c.pids[2], nullptr, 0);
  c.pids.erase(c.pids.begin() + 2);
  client.join();
  if (!in_flight.ok()) c.PrintLogs();
  ASSERT_TRUE(in_flight.ok()) << in_flight.status().ToString();
  EXPECT_EQ(*in_flight, want96) << "after the re-plan onto one GPU";
  const json plan = c.Get("/admin/plan");
  ASSERT_TRUE(plan.contains("history") && !plan["history"].empty()) << plan.dump();
  const json fault = plan["history"].back();
  PrintPlanChange("worker 1 SIGSTOPped then killed", fault);
  EXPECT_EQ(plan["ranks"].size(), 1u) << plan.dump();
  EXPECT_GT(fault.value("requeued_requests", 0), 0) << fault.dump();
  const json cluster = c.Get("/admin/cluster");
  int failed = 0;
  for (const json& w : cluster["workers"]) failed += w["state"] == "failed";
  EXPECT_EQ(failed, 1) << cluster.dump();
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // keep the log up to a crash
  ::testing::InitGoogleTest(&argc, argv);
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--fixtures")
      tessera::g_fixtures = next();
    else if (a == "--hf-dir")
      tessera::g_hf_dir = next();
    else if (a == "--hf-ref")
      tessera::g_hf_ref = next();
    else {
      std::fprintf(stderr, "unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  auto count = tessera::kernels::CudaDeviceCount();
  if (!count.ok() || *count == 0) {
    std::fprintf(stderr, "no CUDA device: %s\n",
                 count.ok() ? "0 devices" : count.status().ToString().c_str());
    return 1;
  }
  tessera::g_devices = *count;
  std::printf("CUDA devices: %d\n", tessera::g_devices);
  return RUN_ALL_TESTS();
}
