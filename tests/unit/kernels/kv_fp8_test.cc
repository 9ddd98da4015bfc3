// The fp8 KV cache on the CPU (kernels/kv_quant.h, kernels/paged_attention.h):
// the e4m3 conversion with a scale, and paged attention over an e4m3 cache
// against the same attention over an F32 cache holding the values the fp8
// cache dequantizes to (so the two must agree exactly).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "common/base/dtype.h"
#include "kernels/kv_quant.h"
#include "kernels/paged_attention.h"

namespace tessera::kernels {
namespace {

Tensor Random(std::vector<int64_t> shape, uint64_t seed, float stddev) {
  Tensor t = Tensor::Empty(std::move(shape));
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, stddev);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = dist(rng);
  return t;
}

// x -> e4m3(x / scale) -> e4m3 * scale, elementwise: what an fp8 cache holds.
Tensor QuantizedCopy(const Tensor& x, float scale) {
  Tensor out = Tensor::Empty(x.shape());
  std::vector<uint8_t> q(static_cast<size_t>(x.numel()));
  QuantizeKvRow(x.data<float>(), scale, x.numel(), q.data());
  DequantizeKvRow(q.data(), scale, x.numel(), out.data<float>());
  return out;
}

StatusOr<AttentionBatch> Batch(std::vector<AttentionSeq> seqs, int64_t tokens,
                               const KvCacheLayer& cache) {
  return MakeAttentionBatch(std::move(seqs), tokens, cache.k.dim(1), cache.k.dim(0), CpuBackend());
}

TEST(KvFp8, QuantizeRoundsToNearestEvenAndSaturates) {
  // e4m3 near 1: 1, 1.125, 1.25 (3 mantissa bits); 1.0625 is halfway and
  // rounds to even (1.0), 1.1875 halfway rounds to even (1.25).
  const float in[] = {1.0f, 1.0625f, 1.1875f, 1.2f, -3.0f, 500.0f, -1e6f, 0.0f};
  uint8_t q[8];
  QuantizeKvRow(in, 1.0f, 8, q);
  float back[8];
  DequantizeKvRow(q, 1.0f, 8, back);
  EXPECT_EQ(back[0], 1.0f);
  EXPECT_EQ(back[1], 1.0f);
  EXPECT_EQ(back[2], 1.25f);
  EXPECT_EQ(back[3], 1.25f);
  EXPECT_EQ(back[4], -3.0f);
  EXPECT_EQ(back[5], 448.0f);  // saturates, never NaN
  EXPECT_EQ(back[6], -448.0f);
  EXPECT_EQ(back[7], 0.0f);
  // The scale divides on the way in and multiplies on the way out: with
  // scale 4, 480 is 120 in e4m3 (representable: 1.875 x 64) and comes
  // back as 480; 2000 saturates to 448 x 4.
  const float big[] = {480.0f, 2000.0f, 0.3f};
  uint8_t qb[3];
  QuantizeKvRow(big, 4.0f, 3, qb);
  EXPECT_EQ(qb[0], F32ToF8E4M3(120.0f));
  float bb[3];
  DequantizeKvRow(qb, 4.0f, 3, bb);
  EXPECT_EQ(bb[0], 480.0f);
  EXPECT_EQ(bb[1], 1792.0f);
  EXPECT_EQ(bb[2], F8E4M3ToF32(F32ToF8E4M3(0.3f / 4.0f)) * 4.0f);
}

TEST(KvFp8, ScalesMustBeFinitePositive) {
  EXPECT_TRUE(CheckKvScale(0.5f, "x").ok());
  for (float bad : {0.0f, -1.0f, NAN, INFINITY}) {
    Status s = CheckKvScale(bad, "layer 3 K");
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("layer 3 K"), std::string::npos) << s.message();
  }
}

// Prefill then decode over scattered blocks, GQA, with K/V scales that are
// not 1 and values past 448 x scale (saturating): an e4m3 cache gives the
// exact outputs of an F32 cache holding the dequantized K/V.
TEST(KvFp8, PagedAttentionEqualsAttentionOverTheDequantizedValues) {
  const int64_t heads = 4, kv_heads = 2, d = 8, block = 4, ctx = 11;
  const float k_scale = 0.05f, v_scale = 0.5f;
  KvCacheLayer fp8{Tensor::Zeros({8, block, kv_heads, d}, DType::kF8E4M3),
                   Tensor::Zeros({8, block, kv_heads, d}, DType::kF8E4M3), k_scale, v_scale};
  KvCacheLayer ref{Tensor::Zeros({8, block, kv_heads, d}), Tensor::Zeros({8, block, kv_heads, d})};
  // K up to ~3 sigma = 30 against a range of 448 x 0.05 = 22.4: some saturate.
  Tensor k = Random({ctx, kv_heads, d}, 21, 10.0f), v = Random({ctx, kv_heads, d}, 22, 3.0f);
  Tensor q = Random({ctx, heads, d}, 23, 0.3f);
  const Tensor kq = QuantizedCopy(k, k_scale), vq = QuantizedCopy(v, v_scale);
  int saturated = 0;
  for (int64_t i = 0; i < k.numel(); ++i) saturated += std::abs(k.data<float>()[i]) > 22.4f;
  ASSERT_GT(saturated, 0);
  std::vector<int32_t> table = {5, 2, 7};
  const float scale = 1.0f / std::sqrt(8.0f);
  auto prefill = Batch({{0, 7, 0, table}}, 7, fp8);
  ASSERT_TRUE(prefill.ok()) << prefill.status().ToString();
  ASSERT_TRUE(WriteKv(fp8, k.Slice0(0, 7), v.Slice0(0, 7), *prefill).ok());
  ASSERT_TRUE(WriteKv(ref, kq.Slice0(0, 7), vq.Slice0(0, 7), *prefill).ok());
  Tensor out = Tensor::Empty({7, heads * d}), want = Tensor::Empty({7, heads * d});
  ASSERT_TRUE(PagedAttention(q.Slice0(0, 7), fp8, *prefill, scale, out).ok());
  ASSERT_TRUE(PagedAttention(q.Slice0(0, 7), ref, *prefill, scale, want).ok());
  EXPECT_EQ(0, std::memcmp(out.raw(), want.raw(), out.nbytes()));
  // The cache holds the e4m3 bytes of x / scale.
  const int64_t slot0 = (5 * block + 0) * kv_heads * d;  // position 0: block 5, slot 0
  EXPECT_EQ(fp8.k.data<uint8_t>()[slot0 + 3], F32ToF8E4M3(k.data<float>()[3] / k_scale));
  EXPECT_EQ(fp8.v.data<uint8_t>()[slot0 + 3], F32ToF8E4M3(v.data<float>()[3] / v_scale));
  double max_diff = 0;
  for (int64_t p = 7; p < ctx; ++p) {
    auto dec = Batch({{0, 1, static_cast<int32_t>(p), table}}, 1, fp8);
    ASSERT_TRUE(dec.ok());
    ASSERT_TRUE(WriteKv(fp8, k.Slice0(p, p + 1), v.Slice0(p, p + 1), *dec).ok());
    ASSERT_TRUE(WriteKv(ref, kq.Slice0(p, p + 1), vq.Slice0(p, p + 1), *dec).ok());
    Tensor o1 = Tensor::Empty({1, heads * d}), w1 = Tensor::Empty({1, heads * d});
    ASSERT_TRUE(PagedAttention(q.Slice0(p, p + 1), fp8, *dec, scale, o1).ok());
    ASSERT_TRUE(PagedAttention(q.Slice0(p, p + 1), ref, *dec, scale, w1).ok());
    EXPECT_EQ(0, std::memcmp(o1.raw(), w1.raw(), o1.nbytes())) << "position " << p;
    for (int64_t i = 0; i < o1.numel(); ++i)
      max_diff = std::max(max_diff, std::abs(double{o1.data<float>()[i]}));
  }
  EXPECT_GT(max_diff, 0.0);  // the outputs are not all zero
}

// The same cache read with a sliding window (the dequantized rows skip the
// positions no token sees).
TEST(KvFp8, SlidingWindowOverAnFp8Cache) {
  const int64_t heads = 2, kv_heads = 1, d = 4, block = 2, ctx = 9;
  KvCacheLayer fp8{Tensor::Zeros({6, block, kv_heads, d}, DType::kF8E4M3),
                   Tensor::Zeros({6, block, kv_heads, d}, DType::kF8E4M3), 0.02f, 0.02f};
  KvCacheLayer ref{Tensor::Zeros({6, block, kv_heads, d}), Tensor::Zeros({6, block, kv_heads, d})};
  Tensor k = Random({ctx, kv_heads, d}, 31, 1.0f), v = Random({ctx, kv_heads, d}, 32, 1.0f);
  Tensor q = Random({ctx, heads, d}, 33, 1.0f);
  std::vector<int32_t> table = {4, 0, 5, 1, 3};
  auto b = Batch({{0, ctx, 0, table}}, ctx, fp8);
  ASSERT_TRUE(b.ok());
  ASSERT_TRUE(WriteKv(fp8, k, v, *b).ok());
  ASSERT_TRUE(WriteKv(ref, QuantizedCopy(k, 0.02f), QuantizedCopy(v, 0.02f), *b).ok());
  Tensor out = Tensor::Empty({ctx, heads * d}), want = Tensor::Empty({ctx, heads * d});
  ASSERT_TRUE(PagedAttention(q, fp8, *b, 0.5f, out, /*sliding_window=*/3).ok());
  ASSERT_TRUE(PagedAttention(q, ref, *b, 0.5f, want, /*sliding_window=*/3).ok());
  EXPECT_EQ(0, std::memcmp(out.raw(), want.raw(), out.nbytes()));
}

TEST(KvFp8, BadScaleOrMixedCacheIsRefused) {
  KvCacheLayer fp8{Tensor::Zeros({2, 2, 1, 4}, DType::kF8E4M3),
                   Tensor::Zeros({2, 2, 1, 4}, DType::kF8E4M3), 0.0f, 1.0f};
  std::vector<int32_t> table = {0};
  auto b = Batch({{0, 1, 0, table}}, 1, fp8);
  ASSERT_TRUE(b.ok());
  Tensor k = Random({1, 1, 4}, 41, 1.0f);
  Status s = WriteKv(fp8, k, k, *b);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("kv cache K"), std::string::npos) << s.message();
  // K in e4m3 and V in F32 is no cache.
  KvCacheLayer mixed{Tensor::Zeros({2, 2, 1, 4}, DType::kF8E4M3), Tensor::Zeros({2, 2, 1, 4})};
  EXPECT_EQ(WriteKv(mixed, k, k, *b).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tessera::kernels
