// The CPU kernels Gemma added (issue 22), against the formulas in their
// headers: the (1 + weight) RMSNorm (hidden and per-head), GeGLU with the
// tanh GELU (anchored at PyTorch's values), tanh soft-capping of logits and
// of attention scores (prefill, chunked and decode, with a sliding window),
// and the embedding multiplier.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "kernels/geglu.h"
#include "kernels/head_rms_norm.h"
#include "kernels/paged_attention.h"
#include "kernels/rms_norm.h"
#include "kernels/softcap.h"
#include "kernels/tensor_ops.h"

namespace tessera::kernels {
namespace {

Tensor Random(std::vector<int64_t> shape, uint64_t seed, float stddev = 1.0f) {
  Tensor t = Tensor::Empty(std::move(shape));
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, stddev);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = dist(rng);
  return t;
}

Tensor Copy(const Tensor& t) {
  Tensor c = Tensor::Empty(t.shape());
  std::copy(t.data<float>(), t.data<float>() + t.numel(), c.data<float>());
  return c;
}

TEST(GemmaRmsNorm, ScalesByOnePlusWeight) {
  Tensor x = Random({3, 16}, 1), w = Random({16}, 2, 0.2f);
  Tensor y = Tensor::Empty({3, 16}), plain = Tensor::Empty({3, 16});
  ASSERT_TRUE(RmsNorm(x, w, 1e-6f, y, 1.0f).ok());
  ASSERT_TRUE(RmsNorm(x, w, 1e-6f, plain).ok());
  double differs = 0;
  for (int t = 0; t < 3; ++t) {
    double ss = 0;
    for (int i = 0; i < 16; ++i) ss += x.data<float>()[t * 16 + i] * x.data<float>()[t * 16 + i];
    const double inv = 1.0 / std::sqrt(ss / 16 + 1e-6);
    for (int i = 0; i < 16; ++i) {
      const double want = x.data<float>()[t * 16 + i] * inv * (1.0 + w.data<float>()[i]);
      EXPECT_NEAR(y.data<float>()[t * 16 + i], want, 1e-5);
      differs = std::max(differs, std::abs(want - plain.data<float>()[t * 16 + i]));
    }
  }
  EXPECT_GT(differs, 0.5);  // weights near 0: scaling by w alone is far off
  // Fused residual add: residual += x, then the same norm of the sum.
  Tensor r = Random({3, 16}, 3), sum = Copy(r), y2 = Tensor::Empty({3, 16});
  for (int64_t i = 0; i < sum.numel(); ++i) sum.data<float>()[i] += x.data<float>()[i];
  Tensor want2 = Tensor::Empty({3, 16});
  ASSERT_TRUE(RmsNorm(sum, w, 1e-6f, want2, 1.0f).ok());
  ASSERT_TRUE(AddRmsNorm(r, x, w, 1e-6f, y2, 1.0f).ok());
  for (int64_t i = 0; i < y2.numel(); ++i) EXPECT_EQ(y2.data<float>()[i], want2.data<float>()[i]);
  // In place (Gemma normalises the attention and MLP outputs in place).
  Tensor inplace = Copy(x);
  ASSERT_TRUE(RmsNorm(inplace, w, 1e-6f, inplace, 1.0f).ok());
  for (int64_t i = 0; i < y.numel(); ++i) EXPECT_EQ(inplace.data<float>()[i], y.data<float>()[i]);
}

TEST(GemmaRmsNorm, PerHeadScalesByOnePlusWeight) {
  // Gemma 3's q_norm / k_norm: each (token, head) row is what RmsNorm with
  // the offset gives the rows of the [tokens * heads, head_dim] view.
  Tensor x = Random({3, 4, 8}, 4), w = Random({8}, 5, 0.2f);
  Tensor want = Tensor::Empty({12, 8});
  ASSERT_TRUE(RmsNorm(x.Reshape({12, 8}), w, 1e-6f, want, 1.0f).ok());
  Tensor plain = Copy(x);
  ASSERT_TRUE(HeadRmsNorm(plain, w, 1e-6f).ok());
  ASSERT_TRUE(HeadRmsNorm(x, w, 1e-6f, 1.0f).ok());
  double differs = 0;
  for (int64_t i = 0; i < 96; ++i) {
    EXPECT_EQ(x.data<float>()[i], want.data<float>()[i]) << i;
    differs = std::max(differs,
                       static_cast<double>(std::abs(x.data<float>()[i] - plain.data<float>()[i])));
  }
  EXPECT_GT(differs, 0.5);
}

TEST(GeluTanhMul, MatchesPyTorchsTanhGelu) {
  // torch.nn.functional.gelu(x, approximate="tanh") in float32 (transformers'
  // gelu_pytorch_tanh), times up = 1 and up = -2.
  const std::vector<float> xs = {1.0f, -1.0f, 3.0f, -3.0f, 0.5f};
  const std::vector<double> torch_gelu = {0.8411920070648193, -0.15880799293518066,
                                          2.9963626861572266, -0.0036374330520629883,
                                          0.3457140028476715};
  Tensor g = Tensor::Empty({2, 5}), u = Tensor::Empty({2, 5}), o = Tensor::Empty({2, 5});
  for (int i = 0; i < 5; ++i) {
    g.data<float>()[i] = g.data<float>()[5 + i] = xs[static_cast<size_t>(i)];
    u.data<float>()[i] = 1.0f;
    u.data<float>()[5 + i] = -2.0f;
  }
  ASSERT_TRUE(GeluTanhMul(g, u, o).ok());
  for (int i = 0; i < 5; ++i) {
    EXPECT_NEAR(o.data<float>()[i], torch_gelu[static_cast<size_t>(i)], 1e-6) << xs[i];
    EXPECT_NEAR(o.data<float>()[5 + i], -2.0 * torch_gelu[static_cast<size_t>(i)], 2e-6) << xs[i];
  }
  // The formula at random points, in place (out aliases gate).
  Tensor g2 = Random({4, 33}, 6, 2.0f), u2 = Random({4, 33}, 7), keep = Copy(g2);
  ASSERT_TRUE(GeluTanhMul(g2, u2, g2).ok());
  for (int64_t i = 0; i < g2.numel(); ++i) {
    const double x = keep.data<float>()[i];
    const double want = 0.5 * x *
                        (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))) *
                        u2.data<float>()[i];
    EXPECT_NEAR(g2.data<float>()[i], want, 1e-5) << i;
  }
  Tensor bad = Tensor::Empty({4, 32});
  EXPECT_EQ(GeluTanhMul(g2, bad, g2).code(), StatusCode::kInvalidArgument);
}

// The fused gate|up input (gate columns first): bit-equal to GeluTanhMul on
// the two halves.
TEST(GeluTanhMulFused, EqualsGeluTanhMulOnTheTwoHalves) {
  const int64_t rows = 3, n = 17;
  Tensor gu = Random({rows, 2 * n}, 9, 3.0f), o = Tensor::Empty({rows, n});
  Tensor g = Tensor::Empty({rows, n}), u = Tensor::Empty({rows, n}), ref = Tensor::Empty({rows, n});
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < n; ++j) {
      g.data<float>()[r * n + j] = gu.data<float>()[r * 2 * n + j];
      u.data<float>()[r * n + j] = gu.data<float>()[r * 2 * n + n + j];
    }
  }
  ASSERT_TRUE(GeluTanhMul(g, u, ref).ok());
  ASSERT_TRUE(GeluTanhMulFused(gu, o).ok());
  for (int64_t i = 0; i < rows * n; ++i) EXPECT_EQ(o.data<float>()[i], ref.data<float>()[i]) << i;
  Tensor bad = Tensor::Empty({rows + 1, n});
  EXPECT_EQ(GeluTanhMulFused(gu, bad).code(), StatusCode::kInvalidArgument);
}

TEST(SoftCap, CapsLogitsWithTanh) {
  Tensor x = Random({3, 50}, 8, 20.0f), keep = Copy(x);
  ASSERT_TRUE(SoftCap(x, 10.0f).ok());
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double v = keep.data<float>()[i];
    EXPECT_NEAR(x.data<float>()[i], 10.0 * std::tanh(v / 10.0), 1e-5) << v;
    EXPECT_LT(std::abs(x.data<float>()[i]), 10.0f);
  }
  // Small values pass almost unchanged: tanh(y) ~ y - y^3/3.
  Tensor small = Tensor::Empty({1, 1});
  small.data<float>()[0] = 0.1f;
  ASSERT_TRUE(SoftCap(small, 30.0f).ok());
  EXPECT_NEAR(small.data<float>()[0], 0.1f, 1e-6);
  for (float bad : {0.0f, -1.0f, INFINITY, NAN}) {
    Status s = SoftCap(x, bad);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(s.message().find("soft-cap"), std::string::npos) << s.message();
  }
}

TEST(ScaleInPlace, MultipliesEveryElement) {
  Tensor x = Random({4, 8}, 9), keep = Copy(x);
  ASSERT_TRUE(ScaleInPlace(x, std::sqrt(64.0f)).ok());
  for (int64_t i = 0; i < x.numel(); ++i)
    EXPECT_EQ(x.data<float>()[i], keep.data<float>()[i] * 8.0f);
  EXPECT_EQ(ScaleInPlace(x, NAN).code(), StatusCode::kInvalidArgument);
  Tensor undefined;
  EXPECT_EQ(ScaleInPlace(undefined, 2.0f).code(), StatusCode::kInvalidArgument);
}

// Dense causal GQA attention with scale, window and tanh soft-cap, in double.
std::vector<float> DenseCapped(const Tensor& q, const Tensor& k, const Tensor& v, int64_t start,
                               double scale, int64_t window, double cap) {
  const int64_t n = q.dim(0), h = q.dim(1), d = q.dim(2), kvh = k.dim(1);
  std::vector<float> out(static_cast<size_t>(n * h * d), 0.0f);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t hh = 0; hh < h; ++hh) {
      const int64_t g = hh / (h / kvh);
      const int64_t lo = window > 0 ? std::max<int64_t>(0, start + t - window + 1) : 0;
      std::vector<double> s;
      for (int64_t p = lo; p <= start + t; ++p) {
        double dot = 0;
        for (int64_t i = 0; i < d; ++i)
          dot += q.data<float>()[(t * h + hh) * d + i] * k.data<float>()[(p * kvh + g) * d + i];
        dot *= scale;
        s.push_back(cap > 0 ? cap * std::tanh(dot / cap) : dot);
      }
      const double mx = *std::max_element(s.begin(), s.end());
      double den = 0;
      for (double& e : s) den += (e = std::exp(e - mx));
      for (size_t p = 0; p < s.size(); ++p)
        for (int64_t i = 0; i < d; ++i)
          out[static_cast<size_t>((t * h + hh) * d + i)] += static_cast<float>(
              s[p] / den * v.data<float>()[(static_cast<int64_t>(lo + p) * kvh + g) * d + i]);
    }
  return out;
}

// Gemma 2's attention: scores scaled by query_pre_attn_scalar^-0.5, capped
// at 2 (q and k of std 2 make raw scores far past it), optionally inside a
// 4-position window; a 7-token prefill, then decode steps.
TEST(PagedAttention, SoftCappedScoresMatchTheDenseFormula) {
  const int64_t heads = 4, kv_heads = 2, d = 16, block = 4, ctx = 12;
  const float scale = 1.0f / std::sqrt(24.0f), cap = 2.0f;
  Tensor k = Random({ctx, kv_heads, d}, 21, 2.0f), v = Random({ctx, kv_heads, d}, 22);
  Tensor q = Random({ctx, heads, d}, 23, 2.0f);
  std::vector<int32_t> table = {5, 0, 3};
  for (int64_t window : {int64_t{0}, int64_t{4}}) {
    SCOPED_TRACE("window " + std::to_string(window));
    KvCacheLayer cache{Tensor::Zeros({8, block, kv_heads, d}),
                       Tensor::Zeros({8, block, kv_heads, d})};
    auto prefill = MakeAttentionBatch({{0, 7, 0, table}}, 7, block, 8, CpuBackend());
    ASSERT_TRUE(prefill.ok()) << prefill.status().ToString();
    ASSERT_TRUE(WriteKv(cache, k.Slice0(0, 7), v.Slice0(0, 7), *prefill).ok());
    Tensor out = Tensor::Empty({7, heads * d}), uncapped = Tensor::Empty({7, heads * d});
    ASSERT_TRUE(PagedAttention(q.Slice0(0, 7), cache, *prefill, scale, out, window, cap).ok());
    ASSERT_TRUE(PagedAttention(q.Slice0(0, 7), cache, *prefill, scale, uncapped, window).ok());
    const auto ref = DenseCapped(q.Slice0(0, 7), k, v, 0, scale, window, cap);
    double differs = 0;
    for (int64_t i = 0; i < out.numel(); ++i) {
      EXPECT_NEAR(out.data<float>()[i], ref[static_cast<size_t>(i)], 1e-5) << i;
      differs = std::max(
          differs, static_cast<double>(std::abs(out.data<float>()[i] - uncapped.data<float>()[i])));
    }
    EXPECT_GT(differs, 1e-2) << "the cap must change these scores";
    for (int64_t p = 7; p < ctx; ++p) {
      auto dec =
          MakeAttentionBatch({{0, 1, static_cast<int32_t>(p), table}}, 1, block, 8, CpuBackend());
      ASSERT_TRUE(dec.ok());
      ASSERT_TRUE(WriteKv(cache, k.Slice0(p, p + 1), v.Slice0(p, p + 1), *dec).ok());
      Tensor o1 = Tensor::Empty({1, heads * d});
      ASSERT_TRUE(PagedAttention(q.Slice0(p, p + 1), cache, *dec, scale, o1, window, cap).ok());
      const auto r1 = DenseCapped(q.Slice0(p, p + 1), k, v, p, scale, window, cap);
      for (int64_t i = 0; i < o1.numel(); ++i)
        EXPECT_NEAR(o1.data<float>()[i], r1[static_cast<size_t>(i)], 1e-5) << "position " << p;
    }
  }
  KvCacheLayer cache{Tensor::Zeros({8, block, kv_heads, d}),
                     Tensor::Zeros({8, block, kv_heads, d})};
  auto batch = MakeAttentionBatch({{0, 1, 0, table}}, 1, block, 8, CpuBackend());
  ASSERT_TRUE(batch.ok());
  Tensor o = Tensor::Empty({1, heads * d});
  for (float bad : {-1.0f, NAN, INFINITY}) {
    Status s = PagedAttention(q.Slice0(0, 1), cache, *batch, scale, o, 0, bad);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(s.message().find("soft-cap"), std::string::npos) << s.message();
  }
}

}  // namespace
}  // namespace tessera::kernels
