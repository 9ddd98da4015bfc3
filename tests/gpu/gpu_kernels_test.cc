// GPU tests (tessera_gpu_test, tests/gpu/gpu_test_util.h): every CUDA kernel against the CPU
// kernels on random inputs, and sampling on the device.
#include "gpu/gpu_test_util.h"
#include "kernels/cuda_launch.h"
#include "kernels/logit_adjust.h"

namespace tessera {
namespace {

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

// The decode GEMM (kernels/skinny_gemm_cuda.cu) that Linear picks for m <= 8 rows of bf16/fp16:
// every row count, k not a multiple of a warp's 256-element stride, odd n (the last warp's second
// row repeats and is not stored), k split across warps, bias, and fp32 output; then the launcher
// directly, so the kernel itself is what is checked, and a misaligned x that must go to cuBLASLt.
TEST(SkinnyGemm, EveryRowCountMatchesCpu) {
  for (DType dt : {DType::kBF16, DType::kF16}) {
    kernels::Backend& g = Gpu(dt);
    for (int64_t m = 1; m <= kernels::cuda::kSkinnyGemmMaxRows; ++m) {
      // k split 1, 2 and 4 ways inside a block (kernels/skinny_gemm_cuda.cu Launch): 383 x 1000
      // and 1 x 8 whole, 1501 x 2056 in halves, 13 x 4104 in quarters; 1501 and 13 leave row
      // groups past n in the last block, which must still meet the block's barrier.
      for (auto [n, k] :
           {std::pair<int64_t, int64_t>{383, 1000}, {1501, 2056}, {13, 4104}, {1, 8}}) {
        const std::string what =
            "skinny m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k);
        HostPair x = Random({m, k}, 40 + m, dt), w = Random({n, k}, 41, dt, 1.0f / 16),
                 b = Random({n}, 42, dt);
        Tensor xd = Up(g, x.raw), wd = Up(g, w.raw), bd = Up(g, b.raw);
        ASSERT_TRUE(kernels::cuda::SkinnyGemmApplies(dt, m, k, xd.raw(), wd.raw())) << what;
        Tensor ref = Tensor::Empty({m, n});
        ASSERT_TRUE(kernels::cpu::Linear(x.f32, w.f32, b.f32, ref).ok());
        Tensor y = Dev(g, {m, n}, dt);
        Status s = kernels::Linear(xd, wd, bd, y);
        ASSERT_TRUE(s.ok()) << s.ToString();
        ExpectClose(Down(g, y), Vec(ref), dt, what + " +bias");
        Tensor y32 = Dev(g, {m, n}, DType::kF32);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what;  // the backend's stream is done
        ASSERT_EQ(kernels::cuda::LaunchSkinnyGemm(dt, DType::kF32, xd.raw(), wd.raw(), bd.raw(),
                                                  y32.raw(), m, n, k, nullptr),
                  cudaSuccess)
            << what;
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what;
        ExpectClose(Down(g, y32), Vec(ref), DType::kF32, what + " -> f32, launched directly");
      }
    }
    // x one element past an aligned start: not 16-byte aligned, so cuBLASLt runs it.
    const int64_t k = 256, n = 96;
    HostPair x = Random({1, k + 1}, 50, dt), w = Random({n, k}, 51, dt, 1.0f / 16);
    Tensor xd = Up(g, x.raw).Reshape({k + 1}).Slice0(1, k + 1).Reshape({1, k});
    Tensor wd = Up(g, w.raw);
    EXPECT_FALSE(kernels::cuda::SkinnyGemmApplies(dt, 1, k, xd.raw(), wd.raw()));
    Tensor xs = Tensor::Empty({1, k});
    for (int64_t i = 0; i < k; ++i) xs.data<float>()[i] = x.f32.data<float>()[i + 1];
    Tensor ref = Tensor::Empty({1, n});
    ASSERT_TRUE(kernels::cpu::Linear(xs, w.f32, Tensor(), ref).ok());
    Tensor y = Dev(g, {1, n}, dt);
    Status s = kernels::Linear(xd, wd, Tensor(), y);
    ASSERT_TRUE(s.ok()) << s.ToString();
    ExpectClose(Down(g, y), Vec(ref), dt, "misaligned x (cuBLASLt)");
  }
}

// Programmatic dependent launch (kernels/pdl.cuh): a chain of decode kernels, each reading the
// one before's output, launched back to back (each may start while the one before runs, the
// GEMMs streaming weights before they wait) gives the same bits as the same chain with the
// device synchronized after every kernel. A kernel reading its input before the wait, or an
// early write, shows as a difference. The chain: skinny GEMM (k split 1 and 4 ways), fused
// add + RMSNorm, GEMM into gate|up, the fused SwiGLU, RoPE of q and k, and the argmax of a final
// f32 projection.
TEST(Pdl, ChainedDecodeKernelsMatchTheSynchronizedChain) {
  // PDL is on by default on compute capability 9.0 and later (kernels/pdl_cuda.cu);
  // TESSERA_CUDA_PDL=0 turns it off, and then the chain runs without it.
  const char* env = std::getenv("TESSERA_CUDA_PDL");
  Gpu(DType::kBF16);  // the device is set
  int device = 0, major = 0;
  ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device), cudaSuccess);
  const bool on = (env == nullptr || std::string(env) != "0") && major >= 9;
  for (DType dt : {DType::kBF16, DType::kF16}) {
    kernels::Backend& g = Gpu(dt);
    EXPECT_EQ(kernels::cuda::PdlEnabled(), on)
        << "PDL on unless TESSERA_CUDA_PDL=0, on a compute capability 9.0 or later device";
    const int64_t hidden = 4096, inter = 2048, heads = 32, hd = 128;
    const Tensor w_sq = Up(g, Random({hidden, hidden}, 61, dt, 1.0f / 64).raw);
    const Tensor w_gu = Up(g, Random({2 * inter, hidden}, 62, dt, 1.0f / 64).raw);
    const Tensor w_down = Up(g, Random({hidden, inter}, 63, dt, 1.0f / 32).raw);
    const Tensor w_norm = Up(g, Random({hidden}, 64, dt).raw);
    const Tensor w_head = Up(g, Random({1000, hidden}, 65, dt, 1.0f / 64).raw);
    Tensor pos = Tensor::Empty({1}, DType::kI32);
    pos.data<int32_t>()[0] = 77;
    const Tensor pos_d = Up(g, pos);
    std::vector<float> inv(hd / 2);
    for (int64_t i = 0; i < hd / 2; ++i) inv[i] = std::pow(10000.0f, -2.0f * i / hd);
    Tensor inv_h = Tensor::Empty({hd / 2});
    std::copy(inv.begin(), inv.end(), inv_h.data<float>());
    const Tensor inv_d = Up(g, inv_h);
    const auto run = [&](bool sync_each) {
      const auto step = [&](const Status& s) {
        EXPECT_TRUE(s.ok()) << s.ToString();
        if (sync_each) {
          EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        }
      };
      Tensor h = Up(g, Random({1, hidden}, 66, dt).raw);
      Tensor x = Dev(g, {1, hidden}, dt), o = Dev(g, {1, hidden}, dt);
      Tensor gu = Dev(g, {1, 2 * inter}, dt), act = Dev(g, {1, inter}, dt);
      for (int layer = 0; layer < 12; ++layer) {
        step(kernels::Linear(h, w_sq, Tensor(), o));  // n = k = 4096: k split in the block
        step(kernels::AddRmsNorm(h, o, w_norm, 1e-5f, x));
        step(kernels::Linear(x, w_gu, Tensor(), gu));  // n = 4096 rows of gate|up
        step(kernels::SiluMulFused(gu, act));
        step(kernels::Linear(act, w_down, Tensor(), o));
        step(kernels::AddRmsNorm(h, o, w_norm, 1e-5f, x));
        Tensor q3 = x.Reshape({1, heads, hd});
        Tensor k3 = o.Reshape({1, heads, hd});
        step(kernels::ApplyRopeQk(q3, k3, pos_d, inv_d));
      }
      Tensor logits = Dev(g, {1, 1000}, DType::kF32);
      step(kernels::Linear(x, w_head, Tensor(), logits));
      std::vector<float> out = Down(g, x), l = Down(g, logits);
      out.insert(out.end(), l.begin(), l.end());
      return out;
    };
    const std::vector<float> synced = run(true);
    const std::vector<float> chained = run(false);
    ASSERT_EQ(chained.size(), synced.size());
    size_t differ = 0;
    for (size_t i = 0; i < synced.size(); ++i)
      differ += std::memcmp(&synced[i], &chained[i], sizeof(float)) != 0;
    EXPECT_EQ(differ, 0u) << DTypeName(dt) << ": elements differing between the chains";
  }
}

// Hidden sizes for both kernels (kernels/rms_norm_cuda.cu): 1000 and 4096 take the vectorized
// one-pass kernel with one 16-byte vector per thread, 16384 with two (bf16/fp16) or four (fp32),
// and 1001 (not whole vectors) the scalar kernel.
TEST_P(Kernels, RmsNormAndFusedAddMatchCpu) {
  const DType dt = GetParam();
  kernels::Backend& g = Gpu(dt);
  for (int64_t hidden : {1000, 1001, 4096, 16384}) {
    const int64_t rows = 5;
    const std::string h = " hidden=" + std::to_string(hidden);
    HostPair x = Random({rows, hidden}, 10, dt), w = Random({hidden}, 11, dt),
             r = Random({rows, hidden}, 12, dt);
    Tensor ref = Tensor::Empty({rows, hidden});
    ASSERT_TRUE(kernels::cpu::RmsNorm(x.f32, w.f32, 1e-5f, ref).ok());
    Tensor y = Dev(g, {rows, hidden}, dt);
    ASSERT_TRUE(kernels::RmsNorm(Up(g, x.raw), Up(g, w.raw), 1e-5f, y).ok());
    ExpectClose(Down(g, y), Vec(ref), dt, "rms_norm" + h);
    // Fused: the residual is rounded to the dtype before normalising, as HF does.
    Tensor res_ref = Tensor::Empty({rows, hidden});
    std::vector<float> sum(static_cast<size_t>(rows * hidden));
    for (size_t i = 0; i < sum.size(); ++i)
      sum[i] = r.f32.data<float>()[i] + x.f32.data<float>()[i];
    Tensor tmp = Tensor::Empty({rows, hidden}, dt);
    ConvertFromF32(dt, sum.data(), tmp.raw(), sum.size());
    ConvertToF32(dt, tmp.raw(), res_ref.data<float>(), sum.size());
    Tensor ref2 = Tensor::Empty({rows, hidden});
    ASSERT_TRUE(kernels::cpu::RmsNorm(res_ref, w.f32, 1e-5f, ref2).ok());
    Tensor res = Up(g, r.raw), y2 = Dev(g, {rows, hidden}, dt);
    ASSERT_TRUE(kernels::AddRmsNorm(res, Up(g, x.raw), Up(g, w.raw), 1e-5f, y2).ok());
    EXPECT_EQ(Down(g, res), Vec(res_ref)) << "residual after the fused add" << h;
    ExpectClose(Down(g, y2), Vec(ref2), dt, "add_rms_norm" + h);
  }
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
    // q and k in one launch (GQA: k has fewer heads), each against the CPU's rotation of it.
    HostPair k = Random({tokens, 1, hd}, 23, dt);
    Tensor kref = Tensor::Empty({tokens, 1, hd});
    std::copy(k.f32.data<float>(), k.f32.data<float>() + kref.numel(), kref.data<float>());
    ASSERT_TRUE(kernels::cpu::ApplyRope(kref, pos_h, inv_h).ok());
    Tensor qd = Up(g, x.raw), kd = Up(g, k.raw);
    s = kernels::ApplyRopeQk(qd, kd, Up(g, pos_h), Up(g, inv_h));
    ASSERT_TRUE(s.ok()) << s.ToString();
    ExpectClose(Down(g, qd), Vec(ref), dt, std::string("rope q+k: q ") + RopeTypeName(type));
    ExpectClose(Down(g, kd), Vec(kref), dt, std::string("rope q+k: k ") + RopeTypeName(type));
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

// The fused projections' consumers: SplitColumns (q|k|v -> q, k, v) is a
// copy, exact, for 16-byte rows and for odd widths (the narrower word
// paths), one row and several; SiluMulFused matches the CPU and gives the
// same bits as SiluMul on the two halves, on the vector and the scalar path.
TEST_P(Kernels, FusedQkvSplitAndSwigluMatchCpu) {
  const DType dt = GetParam();
  kernels::Backend& g = Gpu(dt);
  struct Widths {
    int64_t q, k, v;
  };
  for (const Widths w : {Widths{256, 64, 64}, Widths{512, 128, 128}, Widths{7, 3, 5}}) {
    for (int64_t rows : {1, 9, 300}) {
      const std::string what = "split " + std::to_string(w.q) + "|" + std::to_string(w.k) + "|" +
                               std::to_string(w.v) + " rows " + std::to_string(rows);
      HostPair src = Random({rows, w.q + w.k + w.v}, 900 + rows + w.q, dt);
      Tensor rq = Tensor::Empty({rows, w.q}), rk = Tensor::Empty({rows, w.k}),
             rv = Tensor::Empty({rows, w.v});
      ASSERT_TRUE(kernels::cpu::SplitColumns(src.f32, rq, rk, rv).ok());
      Tensor q = Dev(g, {rows, w.q}, dt), k = Dev(g, {rows, w.k}, dt), v = Dev(g, {rows, w.v}, dt);
      Status s = kernels::SplitColumns(Up(g, src.raw), q, k, v);
      ASSERT_TRUE(s.ok()) << s.ToString();
      EXPECT_EQ(Down(g, q), Vec(rq)) << what << " q";
      EXPECT_EQ(Down(g, k), Vec(rk)) << what << " k";
      EXPECT_EQ(Down(g, v), Vec(rv)) << what << " v";
    }
  }
  Tensor a = Dev(g, {4, 8}, dt), b = Dev(g, {4, 8}, dt), c = Dev(g, {4, 7}, dt);
  EXPECT_EQ(kernels::SplitColumns(Dev(g, {4, 24}, dt), a, b, c).code(),
            StatusCode::kInvalidArgument);
  for (int64_t cols : {1024, 300, 777}) {
    HostPair gu = Random({7, 2 * cols}, 950 + cols, dt, 3.0f);
    Tensor ref = Tensor::Empty({7, cols});
    ASSERT_TRUE(kernels::cpu::SiluMulFused(gu.f32, ref).ok());
    const Tensor gud = Up(g, gu.raw);
    Tensor out = Dev(g, {7, cols}, dt);
    Status s = kernels::SiluMulFused(gud, out);
    ASSERT_TRUE(s.ok()) << s.ToString();
    ExpectClose(Down(g, out), Vec(ref), dt, "swiglu fused gate|up " + std::to_string(cols));
    Tensor gate = Dev(g, {7, cols}, dt), up = Dev(g, {7, cols}, dt);
    ASSERT_TRUE(kernels::CopyColumns(gud, 0, gate, 0, cols).ok());
    ASSERT_TRUE(kernels::CopyColumns(gud, cols, up, 0, cols).ok());
    ASSERT_TRUE(kernels::SiluMul(gate, up, gate).ok());
    EXPECT_EQ(Down(g, out), Down(g, gate)) << "fused vs two halves, " << cols;
  }
}

// Attention over mixed sequences: chunked prefill with earlier context,
// fresh prefills of several lengths and decode tokens, GQA groups 1..8,
// head dims 16..256, scattered blocks. Covers both CUDA kernels (decode
// split-K when every sequence has few tokens; tiled prefill otherwise).
void RunAttentionCase(DType dt, int64_t heads, int64_t kv_heads, int64_t hd, bool decode_only,
                      uint64_t seed, int64_t window = 0, float softcap = 0.0f) {
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
  ASSERT_TRUE(
      kernels::cpu::PagedAttention(q.f32, cpu_cache, *cpu_batch, scale, ref, window, softcap).ok());

  kernels::KvCacheLayer dev_cache{Up(g, kc.raw), Up(g, vc.raw)};
  auto batch = kernels::MakeAttentionBatch(as, tokens, block, num_blocks, g);
  ASSERT_TRUE(batch.ok()) << batch.status().ToString();
  Status s = kernels::WriteKv(dev_cache, Up(g, k.raw), Up(g, v.raw), *batch);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(Down(g, dev_cache.k), Vec(cpu_cache.k)) << "K cache after WriteKv";
  EXPECT_EQ(Down(g, dev_cache.v), Vec(cpu_cache.v)) << "V cache after WriteKv";
  Tensor out = Dev(g, {tokens, heads * hd}, dt);
  s = kernels::PagedAttention(Up(g, q.raw), dev_cache, *batch, scale, out, window, softcap);
  ASSERT_TRUE(s.ok()) << s.ToString();
  char what[128];
  std::snprintf(what, sizeof what, "attention %s h%lld kv%lld d%lld window %lld softcap %g",
                decode_only ? "decode" : "prefill", static_cast<long long>(heads),
                static_cast<long long>(kv_heads), static_cast<long long>(hd),
                static_cast<long long>(window), static_cast<double>(softcap));
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

// Sliding windows (Mistral, Phi-3): narrower than one key tile, a few tiles,
// wider than a decode split, and wider than every context (no masking). The
// decode contexts reach 1500, so whole splits fall before the window.
TEST_P(Kernels, PagedAttentionSlidingWindowMatchesCpu) {
  const DType dt = GetParam();
  uint64_t seed = 900;
  for (int64_t window : {1, 5, 37, 300, 4096}) {
    for (bool decode : {true, false}) {
      RunAttentionCase(dt, 8, 2, 64, decode, seed += 10, window);    // GQA 4
      RunAttentionCase(dt, 4, 1, 16, decode, seed += 10, window);    // fixture head dim
      RunAttentionCase(dt, 32, 8, 128, decode, seed += 10, window);  // Mistral-7B shape
    }
  }
}

// Gemma 2's tanh soft-capping of the scores (Tessera's kernels: FlashInfer's
// are instantiated without it), alone and with a sliding window: caps that
// bite (1: unit-variance q and k give scores of about 1) and Gemma 2's 50.
// Shapes: gemma-2-2b (8 heads, 4 KV heads, head_dim 256), gemma-2-27b
// (32 / 16, 128) and the fixture's (4 / 2, 32).
TEST_P(Kernels, PagedAttentionSoftCapMatchesCpu) {
  const DType dt = GetParam();
  uint64_t seed = 1300;
  for (float cap : {1.0f, 50.0f}) {
    for (int64_t window : {0, 37, 4096}) {
      for (bool decode : {true, false}) {
        RunAttentionCase(dt, 8, 4, 256, decode, seed += 10, window, cap);
        RunAttentionCase(dt, 32, 16, 128, decode, seed += 10, window, cap);
        RunAttentionCase(dt, 4, 2, 32, decode, seed += 10, window, cap);
      }
    }
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
  // The argmax's float4 scan (vocab % 4 == 0) and its scalar scan (4001): ties inside one
  // float4, across threads, and at the end of the row each give the first index.
  for (int64_t v : {4000, 4001}) {
    HostPair l = Random({4, v}, 8, DType::kF32, 3.0f);
    float* d = l.f32.data<float>();
    d[0 * v + 2] = d[0 * v + 3] = 40.0f;        // one float4
    d[1 * v + 9] = d[1 * v + 5] = 40.0f;        // two threads' float4s
    d[2 * v + 3999] = d[2 * v + 3998] = 40.0f;  // the end of the row
    d[3 * v + 7] = d[3 * v + 6] = 40.0f;
    std::vector<kernels::SampleRow> rows4(4);
    ASSERT_TRUE(kernels::SampleTokens(Up(g, l.f32), rows4, got).ok());
    EXPECT_EQ(got, (std::vector<int32_t>{2, 5, 3998, 6})) << "vocab " << v;
  }
}

// Logits processing (kernels/logit_adjust.h) and min_p on the device give the
// CPU's logits and draws.
TEST(Sampling, DeviceAdjustsLogitsAndAppliesMinPAsTheCpu) {
  kernels::Backend& g = Gpu(DType::kF32);
  const int64_t rows = 32, vocab = 32000;
  HostPair logits = Random({rows, vocab}, 11, DType::kF32, 3.0f);
  std::vector<kernels::LogitAdjustment> adjust;
  std::mt19937_64 rng(5);
  for (int64_t r = 0; r < rows; ++r)
    for (int32_t k = 0; k < 40; ++k) {
      kernels::LogitAdjustment a;
      a.row = r;
      a.token = static_cast<int32_t>((r * 977 + k * 131) % vocab);
      a.output_count = k % 4;
      a.bias = k % 5 == 0 ? 2.5f : 0.0f;
      a.presence = 0.5f;
      a.frequency = 0.25f;
      a.repetition = r % 2 ? 1.3f : 1.0f;
      a.flags = (k % 3 == 0 ? kernels::kLogitInPrompt : 0) | (k == 7 ? kernels::kLogitBanned : 0);
      adjust.push_back(a);
    }
  Tensor dev = Up(g, logits.f32);
  ASSERT_TRUE(kernels::AdjustLogits(logits.f32, adjust).ok());
  Status s = kernels::AdjustLogits(dev, adjust);
  ASSERT_TRUE(s.ok()) << s.ToString();
  auto back = g.ToHost(dev);
  ASSERT_TRUE(back.ok());
  for (int64_t i = 0; i < rows * vocab; ++i)
    ASSERT_EQ(back->data<float>()[i], logits.f32.data<float>()[i]) << "element " << i;
  std::vector<kernels::SampleRow> params(rows);
  for (int64_t i = 0; i < rows; ++i) {
    kernels::SampleRow& r = params[static_cast<size_t>(i)];
    r.temperature = 0.5f + 0.1f * static_cast<float>(i % 5);
    r.top_p = i % 2 ? 0.9f : 1.0f;
    r.min_p = 0.02f * static_cast<float>(i % 6);
    r.uniform = static_cast<double>(rng() >> 11) * (1.0 / 9007199254740992.0);
  }
  std::vector<int32_t> got;
  s = kernels::SampleTokens(dev, params, got);
  ASSERT_TRUE(s.ok()) << s.ToString();
  for (int64_t i = 0; i < rows; ++i)
    EXPECT_EQ(got[static_cast<size_t>(i)],
              kernels::SampleRowCpu(logits.f32.data<float>() + i * vocab, vocab,
                                    params[static_cast<size_t>(i)]))
        << "row " << i;
}

}  // namespace
}  // namespace tessera

namespace tessera {
namespace {

// A host F8E4M3 [n, k] weight (N(0, 1) values rounded to e4m3) and per-row fp32 scales
// [n, scale_cols] in [0.5, 1.5) / 64.
struct Fp8Host {
  Tensor w, scales;
};
Fp8Host RandomFp8(int64_t n, int64_t k, int64_t scale_cols, uint64_t seed) {
  Fp8Host h{Tensor::Empty({n, k}, DType::kF8E4M3), Tensor::Empty({n, scale_cols})};
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::uniform_real_distribution<float> unit(0.5f, 1.5f);
  auto* w = static_cast<uint8_t*>(h.w.raw());
  for (int64_t i = 0; i < n * k; ++i) w[i] = F32ToF8E4M3(dist(rng));
  for (int64_t i = 0; i < n * scale_cols; ++i) h.scales.data<float>()[i] = unit(rng) / 64;
  return h;
}

// kernels::LinearFp8 on CUDA (kernels/fp8_gemm_cuda.cu): the skinny kernel for 1..8 tokens
// (k split 1, 2 and 4 ways, odd n) and the dequantize + cuBLASLt path for 9 and 33, with one
// scale per row, 128-column block scales, and block scales whose slice starts 64 columns into
// its first block (a row-parallel tp slice), each against the CPU's dequantized fp32 product.
TEST(Fp8Linear, SkinnyAndDequantizedPathsMatchCpu) {
  struct Shape {
    int64_t n, k, cols_per_scale, phase;
  };
  const Shape shapes[] = {
      {383, 1024, 1024, 0}, {1501, 2048, 128, 0}, {13, 4096, 128, 64}, {96, 48, 32, 16}};
  for (DType dt : {DType::kBF16, DType::kF16}) {
    kernels::Backend& g = Gpu(dt);
    for (const Shape& s : shapes) {
      const int64_t scale_cols = (s.k + s.phase + s.cols_per_scale - 1) / s.cols_per_scale;
      const Fp8Host h = RandomFp8(s.n, s.k, scale_cols, 60 + s.n);
      const kernels::Fp8Scales host_scales{h.scales, s.cols_per_scale, s.phase};
      const kernels::Fp8Scales dev_scales{Up(g, h.scales), s.cols_per_scale, s.phase};
      const Tensor wd = Up(g, h.w);
      Tensor cpu_scratch = Tensor::Empty({s.n * s.k});
      Tensor scratch = Dev(g, {s.n * s.k}, dt);
      for (int64_t m : {1, 2, 3, 4, 5, 6, 7, 8, 9, 33}) {
        const std::string what = "fp8 m=" + std::to_string(m) + " n=" + std::to_string(s.n) +
                                 " k=" + std::to_string(s.k) + " block " +
                                 std::to_string(s.cols_per_scale) + " phase " +
                                 std::to_string(s.phase);
        HostPair x = Random({m, s.k}, 70 + m, dt), b = Random({s.n}, 71, dt);
        Tensor ref = Tensor::Empty({m, s.n});
        Status st = kernels::cpu::LinearFp8(x.f32, h.w, host_scales, b.f32, ref, cpu_scratch);
        ASSERT_TRUE(st.ok()) << st.ToString();
        Tensor y = Dev(g, {m, s.n}, dt);
        st = kernels::LinearFp8(Up(g, x.raw), wd, dev_scales, Up(g, b.raw), y, scratch);
        ASSERT_TRUE(st.ok()) << what << ": " << st.ToString();
        ExpectClose(Down(g, y), Vec(ref), dt, what);
        Tensor y32 = Dev(g, {m, s.n}, DType::kF32);
        st = kernels::LinearFp8(Up(g, x.raw), wd, dev_scales, Tensor(), y32, scratch);
        ASSERT_TRUE(st.ok()) << st.ToString();
        Tensor ref_nb = Tensor::Empty({m, s.n});
        ASSERT_TRUE(
            kernels::cpu::LinearFp8(x.f32, h.w, host_scales, Tensor(), ref_nb, cpu_scratch).ok());
        // Up to 8 tokens the weight is dequantized in fp32 registers; more round it to the
        // dtype first (the scratch), so their fp32 output has the dtype's tolerance.
        ExpectClose(Down(g, y32), Vec(ref_nb), m <= kernels::kFp8SkinnyMaxTokens ? DType::kF32 : dt,
                    what + " -> f32");
      }
    }
  }
}

// The skinny kernel's e4m3 conversion: every finite code (subnormals, both zeros, +-448) in
// every row, with row scales far below and far above 1, against the CPU's exact dequantization
// in fp32, for 1, 3 and 8 tokens.
TEST(Fp8Linear, EveryCodeWithTinyAndHugeScalesMatchesCpu) {
  const int64_t n = 96, k = 512;
  kernels::Backend& g = Gpu(DType::kBF16);
  for (float row_scale : {1e-6f, 3e4f}) {
    Fp8Host h{Tensor::Empty({n, k}, DType::kF8E4M3), Tensor::Empty({n, 1})};
    auto* w = static_cast<uint8_t*>(h.w.raw());
    for (int64_t i = 0; i < n * k; ++i) {
      const auto code = static_cast<uint8_t>((i * 7 + i / k) & 0xff);
      w[i] = (code & 0x7f) == 0x7f ? uint8_t{0x80} : code;  // NaN codes -> -0
    }
    for (int64_t r = 0; r < n; ++r) h.scales.data<float>()[r] = row_scale * (1.0f + r / 128.0f);
    const kernels::Fp8Scales host_scales{h.scales, k, 0};
    const kernels::Fp8Scales dev_scales{Up(g, h.scales), k, 0};
    const Tensor wd = Up(g, h.w);
    Tensor cpu_scratch = Tensor::Empty({n * k});
    Tensor scratch = Dev(g, {n * k}, DType::kBF16);
    for (int64_t m : {1, 3, 8}) {
      const std::string what =
          "fp8 codes m=" + std::to_string(m) + " scale " + std::to_string(row_scale);
      HostPair x = Random({m, k}, 80 + m, DType::kBF16);
      Tensor ref = Tensor::Empty({m, n});
      ASSERT_TRUE(
          kernels::cpu::LinearFp8(x.f32, h.w, host_scales, Tensor(), ref, cpu_scratch).ok());
      Tensor y32 = Dev(g, {m, n}, DType::kF32);
      const Status st = kernels::LinearFp8(Up(g, x.raw), wd, dev_scales, Tensor(), y32, scratch);
      ASSERT_TRUE(st.ok()) << what << ": " << st.ToString();
      ExpectClose(Down(g, y32), Vec(ref), DType::kF32, what);
    }
  }
}

// x with each token row quantized as the W8A8 path does (kernels/linear_fp8.h
// Fp8QuantizesActivations): scale = max|row| / 448, e4m3(x * (1 / scale)) * scale, in fp32.
Tensor QuantizedTokens(const Tensor& x) {
  const int64_t m = x.dim(0), k = x.dim(1);
  Tensor out = Tensor::Empty({m, k});
  for (int64_t r = 0; r < m; ++r) {
    const float* row = x.data<float>() + r * k;
    float amax = 0.0f;
    for (int64_t c = 0; c < k; ++c) amax = std::max(amax, std::abs(row[c]));
    const float scale = amax > 0.0f ? amax / 448.0f : 1.0f, inv = 1.0f / scale;
    for (int64_t c = 0; c < k; ++c)
      out.data<float>()[r * k + c] = F8E4M3ToF32(F32ToF8E4M3(row[c] * inv)) * scale;
  }
  return out;
}

// More than 8 tokens with one scale per weight row run W8A8 on FP8 tensor cores (cuBLASLt,
// outer-vector scales): each result against the CPU product of the same per-token quantized
// activations (the dtype's tolerance), and, as a bound on what quantizing the activations
// costs, against the unquantized (W8A16) product: within 4% of the output's largest magnitude.
TEST(Fp8Linear, TensorCorePathMatchesPerTokenQuantizedActivations) {
  struct Shape {
    int64_t n, k;
  };
  for (DType dt : {DType::kBF16, DType::kF16}) {
    kernels::Backend& g = Gpu(dt);
    for (const Shape& s : {Shape{512, 1024}, Shape{4096, 4096}, Shape{96, 11008}}) {
      const Fp8Host h = RandomFp8(s.n, s.k, 1, 90 + s.n);
      const kernels::Fp8Scales host_scales{h.scales, s.k, 0};
      const kernels::Fp8Scales dev_scales{Up(g, h.scales), s.k, 0};
      const Tensor wd = Up(g, h.w);
      Tensor cpu_scratch = Tensor::Empty({s.n * s.k});
      for (int64_t m : {9, 16, 33, 128, 300}) {
        ASSERT_TRUE(kernels::Fp8QuantizesActivations(m, s.n, s.k, dev_scales))
            << "TESSERA_CUDA_FP8_GEMM=0 is set: the W8A8 path is off";
        const std::string what = "w8a8 m=" + std::to_string(m) + " n=" + std::to_string(s.n) +
                                 " k=" + std::to_string(s.k);
        HostPair x = Random({m, s.k}, 80 + m, dt), b = Random({s.n}, 81, dt);
        Tensor scratch =
            Dev(g, {kernels::Fp8ScratchElements(Device::kCUDA, dt, m, s.n, s.k, dev_scales)}, dt);
        Tensor ref = Tensor::Empty({m, s.n}), plain = Tensor::Empty({m, s.n});
        ASSERT_TRUE(kernels::cpu::LinearFp8(QuantizedTokens(x.f32), h.w, host_scales, b.f32, ref,
                                            cpu_scratch)
                        .ok());
        ASSERT_TRUE(
            kernels::cpu::LinearFp8(x.f32, h.w, host_scales, b.f32, plain, cpu_scratch).ok());
        Tensor y = Dev(g, {m, s.n}, dt);
        Status st = kernels::LinearFp8(Up(g, x.raw), wd, dev_scales, Up(g, b.raw), y, scratch);
        ASSERT_TRUE(st.ok()) << what << ": " << st.ToString();
        const std::vector<float> got = Down(g, y);
        ExpectClose(got, Vec(ref), dt, what);
        double peak = 0, worst = 0;
        for (size_t i = 0; i < got.size(); ++i) {
          peak = std::max(peak, static_cast<double>(std::abs(plain.data<float>()[i])));
          worst = std::max(worst, static_cast<double>(std::abs(got[i] - plain.data<float>()[i])));
        }
        std::printf("  %-48s vs unquantized activations: max |err| %.3g = %.2f%% of %.3g\n",
                    what.c_str(), worst, 100 * worst / peak, peak);
        EXPECT_LE(worst, 0.04 * peak) << what;
        Tensor y32 = Dev(g, {m, s.n}, DType::kF32);
        st = kernels::LinearFp8(Up(g, x.raw), wd, dev_scales, Tensor(), y32, scratch);
        ASSERT_TRUE(st.ok()) << what << " -> f32: " << st.ToString();
        Tensor ref_nb = Tensor::Empty({m, s.n});
        ASSERT_TRUE(kernels::cpu::LinearFp8(QuantizedTokens(x.f32), h.w, host_scales, Tensor(),
                                            ref_nb, cpu_scratch)
                        .ok());
        // Hopper's FP8 MMA accumulates with fewer bits than fp32 between cuBLASLt's
        // promotions, so the fp32 output is held to fp16's tolerance (the error is printed).
        ExpectClose(Down(g, y32), Vec(ref_nb), DType::kF16, what + " -> f32");
      }
    }
  }
  // Every product above ran on tensor cores (none fell back to W8A16).
  EXPECT_EQ(kernels::Fp8TensorCoreFallbacks(), 0);
}

}  // namespace
}  // namespace tessera
