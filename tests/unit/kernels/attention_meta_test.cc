// The packed attention layout (kernels/attention_meta.h): FlashInfer's page arrays and the
// host-planned decode split, checked value by value against the formulas of the header; and
// the attention-kernel choice of kernels/paged_attention.h.
#include "kernels/attention_meta.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <numeric>

#include "kernels/paged_attention.h"

namespace tessera::kernels {
namespace {

TEST(AttentionMeta, LayoutRegionsFollowEachOther) {
  const AttentionMetaLayout L = MetaLayoutFor(/*T=*/7, /*S=*/3, /*P=*/9);
  EXPECT_EQ(L.token_seq, 0);
  EXPECT_EQ(L.token_pos, 7);
  EXPECT_EQ(L.seq_info, 14);
  EXPECT_EQ(L.q_indptr, 14 + 12);
  EXPECT_EQ(L.kv_indptr, L.q_indptr + 4);
  EXPECT_EQ(L.kv_last_page_len, L.kv_indptr + 4);
  EXPECT_EQ(L.decode_chunk, L.kv_last_page_len + 3);
  EXPECT_EQ(L.decode_o_indptr, L.decode_chunk + 1);
  EXPECT_EQ(L.decode_request, L.decode_o_indptr + 4);
  EXPECT_EQ(L.decode_kv_tile, L.decode_request + 9);
  EXPECT_EQ(L.decode_valid, L.decode_kv_tile + 9);
  EXPECT_EQ(L.tables, L.decode_valid + 3);  // 9 bytes in 3 I32 values
}

TEST(AttentionMeta, DecodeWorkItemsFillTwoWaves) {
  EXPECT_EQ(DecodeWorkItems(4, 8, 0), 4);       // CPU: no split
  EXPECT_EQ(DecodeWorkItems(64, 32, 132), 64);  // 2048 CTAs fill the device already
  EXPECT_EQ(DecodeWorkItems(1, 32, 132), 9);    // ceil(264 / 32)
  EXPECT_EQ(DecodeWorkItems(1, 3, 132), 88);    // SmolLM2: 3 kv heads
  EXPECT_EQ(DecodeWorkItems(50, 3, 132), 88);
  EXPECT_EQ(DecodeWorkItems(100, 3, 132), 100);  // 300 >= 264
}

TEST(AttentionMeta, DecodeChunkIsTheSmallestThatFits) {
  const std::vector<int64_t> one = {1000};
  EXPECT_EQ(DecodeChunk(one, 1, 16), 1008);  // no split: the context rounded up to a block
  // ceil(1000 / c) <= 9 needs c >= 111.2: the next multiple of 16 is 112.
  EXPECT_EQ(DecodeChunk(one, 9, 16), 112);
  // Never below kMinDecodeChunk (rounded up to the block size).
  EXPECT_EQ(DecodeChunk(one, 1000, 16), 64);
  EXPECT_EQ(DecodeChunk(one, 1000, 48), 96);
  const std::vector<int64_t> mixed = {1, 40, 700, 1500};
  for (int64_t p : {4, 5, 10, 40, 88}) {
    const int64_t c = DecodeChunk(mixed, p, 16);
    int64_t items = 0;
    for (int64_t l : mixed) items += std::max<int64_t>(1, (l + c - 1) / c);
    EXPECT_LE(items, p) << "P " << p << " chunk " << c;
    EXPECT_EQ(c % 16, 0);
    if (c > 64) {  // one block less would not fit
      int64_t more = 0;
      for (int64_t l : mixed) more += std::max<int64_t>(1, (l + c - 17) / (c - 16));
      EXPECT_GT(more, p) << "P " << p << " chunk " << c;
    }
  }
  // Short contexts: no split even with items to spare.
  const std::vector<int64_t> short_ctx = {10, 20};
  EXPECT_EQ(DecodeChunk(short_ctx, 50, 16), 32);
}

TEST(AttentionMeta, PackHoldsPageArraysAndTheDecodeSplit) {
  // Block size 4. Sequence 0: a decode token at position 8 (context 9: blocks 7, 2, 5, last
  // page holds 1). Sequence 1: a 3-token chunk after 5 cached positions (context 8: blocks 1,
  // 3, last page full).
  const std::vector<int32_t> t0 = {7, 2, 5}, t1 = {1, 3, 0};
  std::vector<AttentionSeq> seqs = {{0, 1, 8, t0}, {1, 3, 5, t1}};
  auto b = CheckAttentionBatch(seqs, 4, 4, 8, /*decode_work_items=*/6);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(b->decode_work_items, 6);
  const std::vector<int32_t> m = PackAttentionMeta(*b, 4);
  const AttentionMetaLayout L = MetaLayoutFor(4, 2, 6);
  ASSERT_EQ(static_cast<int64_t>(m.size()), L.tables + 5);
  EXPECT_EQ(std::vector<int32_t>(m.begin(), m.begin() + 4), (std::vector<int32_t>{0, 1, 1, 1}));
  EXPECT_EQ(std::vector<int32_t>(m.begin() + 4, m.begin() + 8), (std::vector<int32_t>{8, 5, 6, 7}));
  EXPECT_EQ(std::vector<int32_t>(m.begin() + L.seq_info, m.begin() + L.seq_info + 8),
            (std::vector<int32_t>{0, 1, 8, 0, 1, 3, 5, 3}));
  EXPECT_EQ(std::vector<int32_t>(m.begin() + L.q_indptr, m.begin() + L.q_indptr + 3),
            (std::vector<int32_t>{0, 1, 4}));
  EXPECT_EQ(std::vector<int32_t>(m.begin() + L.kv_indptr, m.begin() + L.kv_indptr + 3),
            (std::vector<int32_t>{0, 3, 5}));
  EXPECT_EQ(m[static_cast<size_t>(L.kv_last_page_len)], 1);
  EXPECT_EQ(m[static_cast<size_t>(L.kv_last_page_len + 1)], 4);
  EXPECT_EQ(std::vector<int32_t>(m.begin() + L.tables, m.end()),
            (std::vector<int32_t>{7, 2, 5, 1, 3}));
  // Contexts 9 and 8 are shorter than kMinDecodeChunk: no split (one item each), the chunk
  // being the longest context rounded up to a block.
  EXPECT_EQ(m[static_cast<size_t>(L.decode_chunk)], 12);
  EXPECT_EQ(std::vector<int32_t>(m.begin() + L.decode_o_indptr, m.begin() + L.decode_o_indptr + 3),
            (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(std::vector<int32_t>(m.begin() + L.decode_request, m.begin() + L.decode_request + 6),
            (std::vector<int32_t>{0, 1, 0, 0, 0, 0}));
  uint8_t valid[6];
  std::memcpy(valid, m.data() + L.decode_valid, 6);
  EXPECT_EQ(std::vector<uint8_t>(valid, valid + 6), (std::vector<uint8_t>{1, 1, 0, 0, 0, 0}));
}

TEST(AttentionMeta, PackSplitsLongDecodeContextsIntoChunks) {
  // Block 16; contexts 300 and 20 (decode tokens); 8 work items: ceil(300 / c) + 1 <= 8 needs
  // c >= 50, so c = 64: 5 chunks of sequence 0, then 1 of sequence 1.
  std::vector<int32_t> t0(19), t1 = {40, 41};
  std::iota(t0.begin(), t0.end(), 0);
  std::vector<AttentionSeq> seqs = {{0, 1, 299, t0}, {1, 1, 19, t1}};
  auto b = CheckAttentionBatch(seqs, 2, 16, 64, 8);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  const std::vector<int32_t> m = PackAttentionMeta(*b, 16, /*table_capacity=*/40);
  const AttentionMetaLayout L = MetaLayoutFor(2, 2, 8);
  ASSERT_EQ(static_cast<int64_t>(m.size()), L.tables + 40);
  EXPECT_EQ(m[static_cast<size_t>(L.decode_chunk)], 64);
  EXPECT_EQ(std::vector<int32_t>(m.begin() + L.decode_o_indptr, m.begin() + L.decode_o_indptr + 3),
            (std::vector<int32_t>{0, 5, 6}));
  EXPECT_EQ(std::vector<int32_t>(m.begin() + L.decode_request, m.begin() + L.decode_request + 8),
            (std::vector<int32_t>{0, 0, 0, 0, 0, 1, 0, 0}));
  EXPECT_EQ(std::vector<int32_t>(m.begin() + L.decode_kv_tile, m.begin() + L.decode_kv_tile + 8),
            (std::vector<int32_t>{0, 1, 2, 3, 4, 0, 0, 0}));
  uint8_t valid[8];
  std::memcpy(valid, m.data() + L.decode_valid, 8);
  EXPECT_EQ(std::vector<uint8_t>(valid, valid + 8), (std::vector<uint8_t>{1, 1, 1, 1, 1, 1, 0, 0}));
  EXPECT_EQ(m[static_cast<size_t>(L.kv_last_page_len)], 300 - 18 * 16);
  EXPECT_EQ(m[static_cast<size_t>(L.kv_last_page_len + 1)], 4);
  // Compact tables (19 + 2 blocks), zeros up to the capacity.
  EXPECT_EQ(m[static_cast<size_t>(L.tables + 18)], 18);
  EXPECT_EQ(m[static_cast<size_t>(L.tables + 19)], 40);
  EXPECT_EQ(m[static_cast<size_t>(L.tables + 20)], 41);
  for (int64_t i = 21; i < 40; ++i) EXPECT_EQ(m[static_cast<size_t>(L.tables + i)], 0);
}

TEST(AttentionMeta, FewerWorkItemsThanSequencesIsRefused) {
  const std::vector<int32_t> t = {0};
  std::vector<AttentionSeq> seqs = {{0, 1, 0, t}, {1, 1, 0, t}};
  auto b = CheckAttentionBatch(seqs, 2, 16, 4, 1);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(b.status().message().find("1 decode work items for 2 sequences"), std::string::npos)
      << b.status().ToString();
}

TEST(AttentionKernelChoice, ParsesNamesAndKnowsFlashInferShapes) {
  EXPECT_EQ(*ParseAttentionKernels("flashinfer", "test"), AttentionKernels::kFlashInfer);
  EXPECT_EQ(*ParseAttentionKernels("tessera", "test"), AttentionKernels::kTessera);
  auto bad = ParseAttentionKernels("flash", "TESSERA_ATTENTION");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("TESSERA_ATTENTION"), std::string::npos);
  EXPECT_TRUE(FlashInferTakes(DType::kBF16, 9, 3, 64));    // SmolLM2
  EXPECT_TRUE(FlashInferTakes(DType::kF16, 32, 32, 128));  // Llama-2-7B
  EXPECT_TRUE(FlashInferTakes(DType::kBF16, 32, 8, 128));  // Llama-3-8B
  EXPECT_FALSE(FlashInferTakes(DType::kF32, 32, 8, 128));
  EXPECT_FALSE(FlashInferTakes(DType::kBF16, 4, 2, 256));
  EXPECT_FALSE(FlashInferTakes(DType::kBF16, 10, 2, 64));  // group 5
  // Without TESSERA_ATTENTION the default is FlashInfer exactly when the build has it.
  ASSERT_EQ(std::getenv("TESSERA_ATTENTION"), nullptr) << "run without TESSERA_ATTENTION set";
  auto chosen = DefaultAttentionKernels();
  ASSERT_TRUE(chosen.ok()) << chosen.status().ToString();
  EXPECT_EQ(*chosen,
            FlashInferBuilt() ? AttentionKernels::kFlashInfer : AttentionKernels::kTessera);
}

}  // namespace
}  // namespace tessera::kernels
