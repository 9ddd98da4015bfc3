// CPU kernels against straightforward reference implementations written
// here from the formulas in each header.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "kernels/embedding.h"
#include "kernels/head_rms_norm.h"
#include "kernels/linear.h"
#include "kernels/paged_attention.h"
#include "kernels/rms_norm.h"
#include "kernels/rope.h"
#include "kernels/swiglu.h"
#include "kernels/tensor_ops.h"
#include "support/random_tensor.h"
#include "worker/model/rope_frequencies.h"

namespace tessera::kernels {
namespace {

Tensor I32(std::vector<int32_t> v) {
  Tensor t = Tensor::Empty({static_cast<int64_t>(v.size())}, DType::kI32);
  std::copy(v.begin(), v.end(), t.data<int32_t>());
  return t;
}

Tensor F32(std::vector<float> v) {
  Tensor t = Tensor::Empty({static_cast<int64_t>(v.size())});
  std::copy(v.begin(), v.end(), t.data<float>());
  return t;
}

StatusOr<AttentionBatch> Batch(std::vector<AttentionSeq> seqs, int64_t tokens,
                               const KvCacheLayer& cache) {
  return MakeAttentionBatch(std::move(seqs), tokens, cache.k.dim(1), cache.k.dim(0), CpuBackend());
}

using ::tessera::testing::RandomNormal;

TEST(Linear, MatchesNaiveWithBias) {
  Tensor x = RandomNormal({3, 5}, 1), w = RandomNormal({4, 5}, 2), b = RandomNormal({4}, 3);
  Tensor y = Tensor::Empty({3, 4});
  ASSERT_TRUE(Linear(x, w, b, y).ok());
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 4; ++j) {
      double acc = b.data<float>()[j];
      for (int k = 0; k < 5; ++k) acc += x.data<float>()[i * 5 + k] * w.data<float>()[j * 5 + k];
      EXPECT_NEAR(y.data<float>()[i * 4 + j], acc, 1e-5);
    }
  Tensor bad = Tensor::Empty({3, 5});
  Status s = Linear(x, w, Tensor(), bad);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("[3, 5]"), std::string::npos);
}

TEST(RmsNorm, MatchesFormulaAndFusedAdd) {
  Tensor x = RandomNormal({2, 8}, 4), w = RandomNormal({8}, 5), y = Tensor::Empty({2, 8});
  ASSERT_TRUE(RmsNorm(x, w, 1e-6f, y).ok());
  for (int t = 0; t < 2; ++t) {
    double ss = 0;
    for (int i = 0; i < 8; ++i) ss += x.data<float>()[t * 8 + i] * x.data<float>()[t * 8 + i];
    const double inv = 1.0 / std::sqrt(ss / 8 + 1e-6);
    for (int i = 0; i < 8; ++i)
      EXPECT_NEAR(y.data<float>()[t * 8 + i], x.data<float>()[t * 8 + i] * inv * w.data<float>()[i],
                  1e-5);
  }
  Tensor r = RandomNormal({2, 8}, 6), r0 = Tensor::Empty({2, 8}), y2 = Tensor::Empty({2, 8});
  std::copy(r.data<float>(), r.data<float>() + 16, r0.data<float>());
  ASSERT_TRUE(AddRmsNorm(r, x, w, 1e-6f, y2).ok());
  EXPECT_FLOAT_EQ(r.data<float>()[3], r0.data<float>()[3] + x.data<float>()[3]);
}

TEST(HeadRmsNorm, NormalisesEveryHeadOnItsOwn) {
  // [tokens 3, heads 4, head_dim 8]: each (token, head) row is RmsNorm'd with
  // the same [head_dim] weight, exactly what RmsNorm does to the rows of the
  // [12, 8] view.
  Tensor x = RandomNormal({3, 4, 8}, 30), w = RandomNormal({8}, 31);
  Tensor want = Tensor::Empty({12, 8});
  ASSERT_TRUE(RmsNorm(x.Reshape({12, 8}), w, 1e-6f, want).ok());
  // Heads differ in scale, so a norm over the whole row would differ.
  for (int64_t i = 0; i < 8; ++i) x.data<float>()[8 + i] *= 10.0f;
  Tensor scaled_want = Tensor::Empty({12, 8});
  ASSERT_TRUE(RmsNorm(x.Reshape({12, 8}), w, 1e-6f, scaled_want).ok());
  ASSERT_TRUE(HeadRmsNorm(x, w, 1e-6f).ok());
  for (int64_t i = 0; i < 96; ++i) EXPECT_EQ(x.data<float>()[i], scaled_want.data<float>()[i]) << i;
  for (int64_t i = 16; i < 96; ++i) EXPECT_EQ(x.data<float>()[i], want.data<float>()[i]) << i;
  Tensor bad_w = RandomNormal({4}, 32);
  Status s = HeadRmsNorm(x, bad_w, 1e-6f);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("head_dim"), std::string::npos) << s.message();
}

TEST(SiluMul, MatchesFormula) {
  Tensor g = RandomNormal({2, 3}, 7), u = RandomNormal({2, 3}, 8), o = Tensor::Empty({2, 3});
  ASSERT_TRUE(SiluMul(g, u, o).ok());
  for (int i = 0; i < 6; ++i) {
    const float a = g.data<float>()[i];
    EXPECT_NEAR(o.data<float>()[i], a / (1 + std::exp(-a)) * u.data<float>()[i], 1e-6);
  }
}

// The fused gate|up input: each row's first half is the gate, the second
// the up; bit-equal to SiluMul on the two halves copied out.
TEST(SiluMulFused, EqualsSiluMulOnTheTwoHalves) {
  const int64_t rows = 3, n = 5;
  Tensor gu = RandomNormal({rows, 2 * n}, 30), o = Tensor::Empty({rows, n});
  Tensor g = Tensor::Empty({rows, n}), u = Tensor::Empty({rows, n}), ref = Tensor::Empty({rows, n});
  ASSERT_TRUE(CopyColumns(gu, 0, g, 0, n).ok());
  ASSERT_TRUE(CopyColumns(gu, n, u, 0, n).ok());
  ASSERT_TRUE(SiluMul(g, u, ref).ok());
  ASSERT_TRUE(SiluMulFused(gu, o).ok());
  for (int64_t i = 0; i < rows * n; ++i) EXPECT_EQ(o.data<float>()[i], ref.data<float>()[i]) << i;
  // Row 1, column 2 by the formula: gate at [1, 2], up at [1, n + 2].
  const float a = gu.data<float>()[2 * n + 2], b = gu.data<float>()[2 * n + n + 2];
  EXPECT_NEAR(o.data<float>()[n + 2], a / (1 + std::exp(-a)) * b, 1e-6);
  // Shapes: out must be [rows, gate_up columns / 2] and must not overlap.
  Tensor wide = Tensor::Empty({rows, 2 * n});
  Status s = SiluMulFused(gu, wide);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("gate_up"), std::string::npos) << s.message();
  Tensor alias = gu.Reshape({2 * rows, n}).Slice0(0, rows);
  s = SiluMulFused(gu, alias);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("overlaps"), std::string::npos) << s.message();
  Tensor odd = RandomNormal({rows, 2 * n + 1}, 31);
  EXPECT_EQ(SiluMulFused(odd, o).code(), StatusCode::kInvalidArgument);
}

TEST(Embedding, VocabParallelSlicesSumToFullLookup) {
  Tensor table = RandomNormal({10, 4}, 9);
  Tensor ids = I32({0, 9, 3, 5});
  Tensor full = Tensor::Empty({4, 4});
  ASSERT_TRUE(EmbeddingLookup(ids, table, 0, full).ok());
  Tensor sum = Tensor::Zeros({4, 4});
  for (int r = 0; r < 2; ++r) {  // two ranks of 5 rows each
    Tensor part = Tensor::Empty({4, 4});
    ASSERT_TRUE(EmbeddingLookup(ids, table.Slice0(r * 5, r * 5 + 5), r * 5, part).ok());
    for (int i = 0; i < 16; ++i) sum.data<float>()[i] += part.data<float>()[i];
  }
  for (int i = 0; i < 16; ++i) EXPECT_EQ(sum.data<float>()[i], full.data<float>()[i]);
  Tensor one = full.Slice0(0, 1);
  EXPECT_EQ(EmbeddingLookup(I32({-1}), table, 0, one).code(), StatusCode::kOutOfRange);
}

ModelConfig RopeConfig(RopeType type) {
  ModelConfig c;
  c.head_dim = 16;
  c.rope_theta = 10000.0;
  c.max_position_embeddings = 32;
  c.rope_scaling.type = type;
  c.rope_scaling.factor = 4.0;
  c.rope_scaling.original_max_position_embeddings = 8;
  return c;
}

TEST(Rope, InvFreqPerScalingType) {
  auto base = RopeInvFreq(RopeConfig(RopeType::kDefault), 1);
  ASSERT_EQ(base.size(), 8u);
  EXPECT_FLOAT_EQ(base[0], 1.0f);
  EXPECT_NEAR(base[1], std::pow(10000.0, -2.0 / 16), 1e-7);
  auto lin = RopeInvFreq(RopeConfig(RopeType::kLinear), 1);
  EXPECT_NEAR(lin[3], base[3] / 4, 1e-9);
  // Dynamic: unchanged up to max_position_embeddings, NTK-scaled beyond.
  EXPECT_EQ(RopeInvFreq(RopeConfig(RopeType::kDynamic), 32), base);
  auto dyn = RopeInvFreq(RopeConfig(RopeType::kDynamic), 64);
  const double b = 10000.0 * std::pow(4.0 * 64 / 32 - 3.0, 16.0 / 14.0);
  EXPECT_NEAR(dyn[1], std::pow(b, -2.0 / 16), 1e-7);
  // Llama3: high frequencies kept, low frequencies divided by factor.
  ModelConfig c3 = RopeConfig(RopeType::kLlama3);
  c3.rope_scaling.original_max_position_embeddings =
      4096;  // wavelens: high < 1024 < medium < 4096 < low
  auto l3 = RopeInvFreq(c3, 1);
  EXPECT_FLOAT_EQ(l3[0], base[0]);        // wavelen 2*pi: high frequency, kept
  EXPECT_NEAR(l3[7], base[7] / 4, 1e-9);  // wavelen ~19869: low frequency, divided by factor
  const double w4 = 2 * M_PI / base[4];   // ~1000 < 1024: still high frequency
  EXPECT_LT(w4, 1024.0);
  EXPECT_FLOAT_EQ(l3[4], base[4]);
  const double w5 = 2 * M_PI / base[5];  // ~3534: medium, smoothed blend
  const double smooth = (4096.0 / w5 - 1.0) / (4.0 - 1.0);
  EXPECT_NEAR(l3[5], (1 - smooth) * base[5] / 4 + smooth * base[5], 1e-8);
}

TEST(Rope, RotatesHalfPairsAndPreservesNorm) {
  Tensor x = RandomNormal({2, 1, 4}, 10), orig = Tensor::Empty({2, 1, 4});
  std::copy(x.data<float>(), x.data<float>() + 8, orig.data<float>());
  ASSERT_TRUE(ApplyRope(x, I32({0, 3}), F32({1.0f, 0.5f})).ok());
  for (int i = 0; i < 4; ++i)
    EXPECT_FLOAT_EQ(x.data<float>()[i], orig.data<float>()[i]);  // position 0
  const float* o = orig.data<float>() + 4;
  const float* r = x.data<float>() + 4;
  EXPECT_NEAR(r[0], o[0] * std::cos(3.f) - o[2] * std::sin(3.f), 1e-6);
  EXPECT_NEAR(r[2], o[2] * std::cos(3.f) + o[0] * std::sin(3.f), 1e-6);
  EXPECT_NEAR(r[1], o[1] * std::cos(1.5f) - o[3] * std::sin(1.5f), 1e-6);
}

// Dense causal GQA attention, the textbook formula, for comparison; with
// window > 0 the query at position p sees positions (p - window, p].
std::vector<float> DenseAttention(const Tensor& q, const Tensor& k, const Tensor& v, int64_t start,
                                  int64_t window = 0) {
  const int64_t n = q.dim(0), h = q.dim(1), d = q.dim(2), kvh = k.dim(1), ctx = k.dim(0);
  std::vector<float> out(static_cast<size_t>(n * h * d), 0.0f);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t hh = 0; hh < h; ++hh) {
      const int64_t g = hh / (h / kvh);
      std::vector<double> s;
      const int64_t lo = window > 0 ? std::max<int64_t>(0, start + t - window + 1) : 0;
      for (int64_t p = lo; p <= start + t && p < ctx; ++p) {
        double dot = 0;
        for (int64_t i = 0; i < d; ++i)
          dot += q.data<float>()[(t * h + hh) * d + i] * k.data<float>()[(p * kvh + g) * d + i];
        s.push_back(dot / std::sqrt(static_cast<double>(d)));
      }
      double mx = *std::max_element(s.begin(), s.end()), den = 0;
      for (double& e : s) den += (e = std::exp(e - mx));
      for (size_t p = 0; p < s.size(); ++p)
        for (int64_t i = 0; i < d; ++i)
          out[static_cast<size_t>((t * h + hh) * d + i)] +=
              static_cast<float>(s[p] / den) *
              v.data<float>()[(static_cast<int64_t>(lo + p) * kvh + g) * d + i];
    }
  return out;
}

TEST(PagedAttention, MatchesDenseCausalGqaAcrossScatteredBlocks) {
  const int64_t heads = 4, kv_heads = 2, d = 8, block = 4, ctx = 11;
  KvCacheLayer cache{Tensor::Zeros({8, block, kv_heads, d}),
                     Tensor::Zeros({8, block, kv_heads, d})};
  Tensor k = RandomNormal({ctx, kv_heads, d}, 11), v = RandomNormal({ctx, kv_heads, d}, 12);
  Tensor q = RandomNormal({ctx, heads, d}, 13);
  std::vector<int32_t> table = {5, 2, 7};  // scattered, out of order
  // Prefill the first 7 tokens, then 4 more one by one (decode).
  auto prefill = Batch({{0, 7, 0, table}}, 7, cache);
  ASSERT_TRUE(prefill.ok()) << prefill.status().ToString();
  ASSERT_TRUE(WriteKv(cache, k.Slice0(0, 7), v.Slice0(0, 7), *prefill).ok());
  Tensor out = Tensor::Empty({7, heads * d});
  ASSERT_TRUE(PagedAttention(q.Slice0(0, 7), cache, *prefill, 1.0f / std::sqrt(8.0f), out).ok());
  auto ref = DenseAttention(q.Slice0(0, 7), k, v, 0);
  for (int64_t i = 0; i < out.numel(); ++i)
    EXPECT_NEAR(out.data<float>()[i], ref[static_cast<size_t>(i)], 1e-5);
  for (int64_t p = 7; p < ctx; ++p) {
    auto dec = Batch({{0, 1, static_cast<int32_t>(p), table}}, 1, cache);
    ASSERT_TRUE(dec.ok());
    ASSERT_TRUE(WriteKv(cache, k.Slice0(p, p + 1), v.Slice0(p, p + 1), *dec).ok());
    Tensor o1 = Tensor::Empty({1, heads * d});
    ASSERT_TRUE(PagedAttention(q.Slice0(p, p + 1), cache, *dec, 1.0f / std::sqrt(8.0f), o1).ok());
    auto r1 = DenseAttention(q.Slice0(p, p + 1), k, v, p);
    for (int64_t i = 0; i < o1.numel(); ++i)
      EXPECT_NEAR(o1.data<float>()[i], r1[static_cast<size_t>(i)], 1e-5);
  }
  // A position past the block table is an error, not a stray write.
  auto over = Batch({{0, 1, 12, table}}, 1, cache);
  EXPECT_EQ(over.status().code(), StatusCode::kOutOfRange);
  EXPECT_NE(over.status().message().find("block index 3"), std::string::npos)
      << over.status().message();
  std::vector<int32_t> bad_table = {5, 8};
  auto bad_block = Batch({{0, 1, 5, bad_table}}, 1, cache);
  EXPECT_EQ(bad_block.status().code(), StatusCode::kOutOfRange);
}

// A 3-position sliding window over a context of 11: the prefill rows past
// the window and every decode step drop the oldest positions, as the dense
// formula with the window does, and differ from full causal attention.
TEST(PagedAttention, SlidingWindowSeesOnlyTheLastWindowPositions) {
  const int64_t heads = 4, kv_heads = 2, d = 8, block = 4, ctx = 11, window = 3;
  KvCacheLayer cache{Tensor::Zeros({8, block, kv_heads, d}),
                     Tensor::Zeros({8, block, kv_heads, d})};
  Tensor k = RandomNormal({ctx, kv_heads, d}, 41), v = RandomNormal({ctx, kv_heads, d}, 42);
  Tensor q = RandomNormal({ctx, heads, d}, 43);
  std::vector<int32_t> table = {6, 1, 3};
  const float scale = 1.0f / std::sqrt(8.0f);
  auto prefill = Batch({{0, 7, 0, table}}, 7, cache);
  ASSERT_TRUE(prefill.ok()) << prefill.status().ToString();
  ASSERT_TRUE(WriteKv(cache, k.Slice0(0, 7), v.Slice0(0, 7), *prefill).ok());
  Tensor out = Tensor::Empty({7, heads * d});
  ASSERT_TRUE(PagedAttention(q.Slice0(0, 7), cache, *prefill, scale, out, window).ok());
  const auto ref = DenseAttention(q.Slice0(0, 7), k, v, 0, window);
  const auto full = DenseAttention(q.Slice0(0, 7), k, v, 0);
  double differs = 0;
  for (int64_t i = 0; i < out.numel(); ++i) {
    EXPECT_NEAR(out.data<float>()[i], ref[static_cast<size_t>(i)], 1e-5) << i;
    differs = std::max(differs, std::abs(static_cast<double>(ref[static_cast<size_t>(i)]) -
                                         full[static_cast<size_t>(i)]));
  }
  EXPECT_GT(differs, 1e-2) << "the window must mask something past position 2";
  // Rows within the window equal full attention (positions 0..2).
  for (int64_t i = 0; i < 3 * heads * d; ++i)
    EXPECT_NEAR(out.data<float>()[i], full[static_cast<size_t>(i)], 1e-5) << i;
  for (int64_t p = 7; p < ctx; ++p) {
    auto dec = Batch({{0, 1, static_cast<int32_t>(p), table}}, 1, cache);
    ASSERT_TRUE(dec.ok());
    ASSERT_TRUE(WriteKv(cache, k.Slice0(p, p + 1), v.Slice0(p, p + 1), *dec).ok());
    Tensor o1 = Tensor::Empty({1, heads * d});
    ASSERT_TRUE(PagedAttention(q.Slice0(p, p + 1), cache, *dec, scale, o1, window).ok());
    const auto r1 = DenseAttention(q.Slice0(p, p + 1), k, v, p, window);
    for (int64_t i = 0; i < o1.numel(); ++i)
      EXPECT_NEAR(o1.data<float>()[i], r1[static_cast<size_t>(i)], 1e-5) << "position " << p;
  }
  // A window wider than the context is full causal attention.
  Tensor wide = Tensor::Empty({7, heads * d});
  ASSERT_TRUE(PagedAttention(q.Slice0(0, 7), cache, *prefill, scale, wide, 64).ok());
  for (int64_t i = 0; i < wide.numel(); ++i)
    EXPECT_NEAR(wide.data<float>()[i], full[static_cast<size_t>(i)], 1e-5) << i;
  Status neg = PagedAttention(q.Slice0(0, 7), cache, *prefill, scale, wide, -1);
  EXPECT_EQ(neg.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(neg.message().find("sliding window"), std::string::npos) << neg.message();
}

TEST(TensorOps, AddGatherAndCopyColumns) {
  Tensor acc = RandomNormal({3, 4}, 20), x = RandomNormal({3, 4}, 21), b = RandomNormal({4}, 22);
  Tensor before = Tensor::Empty({3, 4});
  std::copy(acc.data<float>(), acc.data<float>() + 12, before.data<float>());
  ASSERT_TRUE(AddInPlace(acc, x, b).ok());
  for (int i = 0; i < 12; ++i)
    EXPECT_FLOAT_EQ(acc.data<float>()[i],
                    before.data<float>()[i] + x.data<float>()[i] + b.data<float>()[i % 4]);
  Tensor picked = Tensor::Empty({2, 4});
  ASSERT_TRUE(GatherRows(acc, {2, 0}, picked).ok());
  EXPECT_EQ(picked.data<float>()[0], acc.data<float>()[8]);
  EXPECT_EQ(picked.data<float>()[4], acc.data<float>()[0]);
  EXPECT_EQ(GatherRows(acc, {3, 0}, picked).code(), StatusCode::kOutOfRange);
  Tensor wide = Tensor::Zeros({3, 6});
  ASSERT_TRUE(CopyColumns(acc, 1, wide, 3, 3).ok());
  EXPECT_EQ(wide.data<float>()[6 + 3], acc.data<float>()[4 + 1]);
  EXPECT_EQ(wide.data<float>()[6 + 2], 0.0f);
  EXPECT_EQ(CopyColumns(acc, 2, wide, 4, 3).code(), StatusCode::kOutOfRange);
}

// The fused q|k|v output split into q, k and v: every element in its place.
TEST(TensorOps, SplitColumnsPlacesEveryColumn) {
  const int64_t rows = 4, qc = 6, kc = 2, vc = 3;
  Tensor src = RandomNormal({rows, qc + kc + vc}, 40);
  Tensor q = Tensor::Empty({rows, qc}), k = Tensor::Empty({rows, kc}),
         v = Tensor::Empty({rows, vc});
  ASSERT_TRUE(SplitColumns(src, q, k, v).ok());
  const int64_t w = qc + kc + vc;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < qc; ++j)
      EXPECT_EQ(q.data<float>()[r * qc + j], src.data<float>()[r * w + j]);
    for (int64_t j = 0; j < kc; ++j)
      EXPECT_EQ(k.data<float>()[r * kc + j], src.data<float>()[r * w + qc + j]);
    for (int64_t j = 0; j < vc; ++j)
      EXPECT_EQ(v.data<float>()[r * vc + j], src.data<float>()[r * w + qc + kc + j]);
  }
  // Any dtype: int32 words.
  Tensor isrc = Tensor::Empty({2, 5}, DType::kI32);
  for (int i = 0; i < 10; ++i) isrc.data<int32_t>()[i] = i;
  Tensor a = Tensor::Empty({2, 1}, DType::kI32), b = Tensor::Empty({2, 3}, DType::kI32),
         c = Tensor::Empty({2, 1}, DType::kI32);
  ASSERT_TRUE(SplitColumns(isrc, a, b, c).ok());
  EXPECT_EQ(a.data<int32_t>()[1], 5);
  EXPECT_EQ(b.data<int32_t>()[3], 6);
  EXPECT_EQ(c.data<int32_t>()[1], 9);
  // Columns that do not add up, a row count that differs, an overlap.
  Tensor short_v = Tensor::Empty({rows, vc - 1});
  Status s = SplitColumns(src, q, k, short_v);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("add up"), std::string::npos) << s.message();
  Tensor few = Tensor::Empty({rows - 1, vc});
  EXPECT_EQ(SplitColumns(src, q, k, few).code(), StatusCode::kInvalidArgument);
  Tensor inside = src.Reshape({rows * w}).Slice0(0, rows * vc).Reshape({rows, vc});
  s = SplitColumns(src, q, k, inside);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("overlap"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace tessera::kernels
