#include "common/format/checkpoint.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "common/format/safetensors_writer.h"
#include "support/test_util.h"

namespace tessera {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Values exactly representable in F16 and BF16 (multiples of 1/8 below 32),
// distinct per element so that a misplaced element is caught.
std::vector<float> Values(int64_t n, float bias = 0) {
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = bias + static_cast<float>((i * 37) % 251 - 125) / 8.0f;
  return v;
}

// Reference slice of a row-major [rows, cols] matrix.
std::vector<float> RefSlice(const std::vector<float>& m, int64_t rows, int64_t cols, int dim,
                            int64_t begin, int64_t end) {
  std::vector<float> out;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t idx = dim == 0 ? r : c;
      if (idx >= begin && idx < end) out.push_back(m[r * cols + c]);
    }
  }
  return out;
}

constexpr int64_t kRows = 7, kCols = 13;

// A model directory with one [7, 13] matrix per float dtype, a 1-D vector, a
// 3-D tensor, an I32 tensor and a scalar.
std::string MakeSingleFileModel() {
  const std::string dir = testing::MakeTempDir("ckpt");
  const std::vector<float> m = Values(kRows * kCols);
  std::vector<SafetensorsEntry> entries = {
      {"w.f32", DType::kF32, {kRows, kCols}, EncodeFloats(DType::kF32, m)},
      {"w.f16", DType::kF16, {kRows, kCols}, EncodeFloats(DType::kF16, m)},
      {"w.bf16", DType::kBF16, {kRows, kCols}, EncodeFloats(DType::kBF16, m)},
      {"v.bf16", DType::kBF16, {kCols}, EncodeFloats(DType::kBF16, Values(kCols, 1))},
      {"t3.f16", DType::kF16, {2, 3, 4}, EncodeFloats(DType::kF16, Values(24, 2))},
      {"ids", DType::kI32, {2}, {1, 0, 0, 0, 2, 0, 0, 0}},
      {"scale", DType::kF32, {}, EncodeFloats(DType::kF32, {0.125f})},
  };
  TESSERA_CHECK(WriteSafetensors(dir + "/model.safetensors", entries).ok());
  return dir;
}

std::unique_ptr<Checkpoint> OpenOrDie(const std::string& dir,
                                      size_t staging = Checkpoint::kDefaultStagingBytes) {
  auto c = Checkpoint::Open(dir, staging);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? std::move(c).value() : nullptr;
}

TEST(Checkpoint, ReadAllConvertsAndCopies) {
  const std::string dir = MakeSingleFileModel();
  auto ckpt = OpenOrDie(dir);
  ASSERT_NE(ckpt, nullptr);
  EXPECT_THAT(ckpt->TensorNames(),
              ElementsAre("ids", "scale", "t3.f16", "v.bf16", "w.bf16", "w.f16", "w.f32"));
  EXPECT_TRUE(ckpt->Has("w.f16"));
  EXPECT_FALSE(ckpt->Has("w.f64"));
  const std::vector<float> m = Values(kRows * kCols);
  for (const char* name : {"w.f32", "w.f16", "w.bf16"}) {
    std::vector<float> out(m.size(), -1.0f);
    ASSERT_TRUE(ckpt->ReadAll(name, DType::kF32, out.data()).ok()) << name;
    EXPECT_EQ(out, m) << name;
  }
  // Raw copy in the source dtype.
  auto info = ckpt->Find("w.bf16");
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->shape, (std::vector<int64_t>{kRows, kCols}));
  EXPECT_EQ(info->file, dir + "/model.safetensors");
  std::vector<uint8_t> raw(info->nbytes);
  ASSERT_TRUE(ckpt->ReadAll("w.bf16", DType::kBF16, raw.data()).ok());
  EXPECT_EQ(raw, EncodeFloats(DType::kBF16, m));
  int32_t ids[2];
  ASSERT_TRUE(ckpt->ReadAll("ids", DType::kI32, ids).ok());
  EXPECT_EQ(ids[0], 1);
  EXPECT_EQ(ids[1], 2);
  float scale = 0;
  ASSERT_TRUE(ckpt->ReadAll("scale", DType::kF32, &scale).ok());
  EXPECT_EQ(scale, 0.125f);
}

// Row and column slices equal the same parts of the full tensor, for each
// dtype, with the default staging buffer and with tiny ones that force runs
// to be split across staging refills.
TEST(Checkpoint, RowAndColumnSlicesMatchFullTensor) {
  const std::string dir = MakeSingleFileModel();
  const std::vector<float> m = Values(kRows * kCols);
  for (size_t staging : {Checkpoint::kDefaultStagingBytes, size_t{8}, size_t{20}, size_t{52}}) {
    auto ckpt = OpenOrDie(dir, staging);
    ASSERT_NE(ckpt, nullptr);
    for (const char* name : {"w.f32", "w.f16", "w.bf16"}) {
      for (int dim : {0, 1}) {
        const int64_t size = dim == 0 ? kRows : kCols;
        for (auto [b, e] : std::vector<std::pair<int64_t, int64_t>>{
                 {0, size}, {0, 1}, {size - 1, size}, {2, size - 2}, {3, 3}}) {
          std::vector<float> out(RefSlice(m, kRows, kCols, dim, b, e).size() + 1, -7.0f);
          Status s = ckpt->ReadSlice(name, dim, b, e, DType::kF32, out.data());
          ASSERT_TRUE(s.ok()) << s.ToString();
          EXPECT_EQ(out.back(), -7.0f) << "wrote past the slice";
          out.pop_back();
          EXPECT_EQ(out, RefSlice(m, kRows, kCols, dim, b, e))
              << name << " dim " << dim << " [" << b << ", " << e << ") staging " << staging;
        }
      }
    }
  }
}

TEST(Checkpoint, RawColumnSliceMatchesSourceBytes) {
  auto ckpt = OpenOrDie(MakeSingleFileModel());
  ASSERT_NE(ckpt, nullptr);
  const std::vector<uint8_t> full = EncodeFloats(DType::kF16, Values(kRows * kCols));
  std::vector<uint8_t> out(kRows * 5 * 2);
  ASSERT_TRUE(ckpt->ReadSlice("w.f16", 1, 4, 9, DType::kF16, out.data()).ok());
  for (int64_t r = 0; r < kRows; ++r) {
    EXPECT_EQ(std::memcmp(&out[r * 5 * 2], &full[(r * kCols + 4) * 2], 5 * 2), 0) << r;
  }
}

TEST(Checkpoint, BytesReadIsExactlyTheSliceBytes) {
  auto ckpt = OpenOrDie(MakeSingleFileModel(), /*staging=*/24);
  ASSERT_NE(ckpt, nullptr);
  EXPECT_EQ(ckpt->BytesRead(), 0);  // Open reads headers only
  std::vector<float> out(kRows * kCols);
  ASSERT_TRUE(ckpt->ReadSlice("w.bf16", 1, 3, 9, DType::kF32, out.data()).ok());
  EXPECT_EQ(ckpt->BytesRead(), kRows * 6 * 2);  // 6 BF16 columns of each of 7 rows
  ASSERT_TRUE(ckpt->ReadSlice("w.f32", 1, 5, 6, DType::kF32, out.data()).ok());
  EXPECT_EQ(ckpt->BytesRead(), kRows * 6 * 2 + kRows * 1 * 4);
  const int64_t before = ckpt->BytesRead();
  ASSERT_TRUE(ckpt->ReadSlice("w.f16", 0, 2, 4, DType::kF32, out.data()).ok());
  EXPECT_EQ(ckpt->BytesRead() - before, 2 * kCols * 2);
}

TEST(Checkpoint, SlicesOneDimAndThreeDimTensors) {
  auto ckpt = OpenOrDie(MakeSingleFileModel());
  ASSERT_NE(ckpt, nullptr);
  const std::vector<float> v = Values(kCols, 1);
  std::vector<float> out(4);
  ASSERT_TRUE(ckpt->ReadSlice("v.bf16", 0, 5, 9, DType::kF32, out.data()).ok());
  EXPECT_EQ(out, std::vector<float>(v.begin() + 5, v.begin() + 9));

  // t3[2, 3, 4], dim 1 range [1, 3) -> [2, 2, 4].
  const std::vector<float> t = Values(24, 2);
  std::vector<float> expect;
  for (int a = 0; a < 2; ++a)
    for (int b = 1; b < 3; ++b)
      for (int c = 0; c < 4; ++c) expect.push_back(t[(a * 3 + b) * 4 + c]);
  std::vector<float> got(expect.size());
  ASSERT_TRUE(ckpt->ReadSlice("t3.f16", 1, 1, 3, DType::kF32, got.data()).ok());
  EXPECT_EQ(got, expect);
}

TEST(Checkpoint, SliceErrorsNameTensorAndShape) {
  const std::string dir = MakeSingleFileModel();
  auto ckpt = OpenOrDie(dir);
  ASSERT_NE(ckpt, nullptr);
  std::vector<float> out(kRows * kCols);

  Status s = ckpt->ReadSlice("w.f32", 1, 4, 14, DType::kF32, out.data());
  EXPECT_EQ(s.code(), StatusCode::kOutOfRange);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("'w.f32'"), HasSubstr("[7, 13]"), HasSubstr("[4, 14)")));
  s = ckpt->ReadSlice("w.f32", 0, 5, 4, DType::kF32, out.data());
  EXPECT_EQ(s.code(), StatusCode::kOutOfRange);
  s = ckpt->ReadSlice("w.f32", 0, -1, 2, DType::kF32, out.data());
  EXPECT_EQ(s.code(), StatusCode::kOutOfRange);

  s = ckpt->ReadSlice("v.bf16", 1, 0, 1, DType::kF32, out.data());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("'v.bf16'"), HasSubstr("[13]"), HasSubstr("dim 1")));

  s = ckpt->ReadAll("w.f32", DType::kBF16, out.data());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("'w.f32'"), HasSubstr("F32 to BF16")));
  s = ckpt->ReadAll("ids", DType::kF32, out.data());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);

  s = ckpt->ReadAll("lm_head.weight", DType::kF32, out.data());
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("'lm_head.weight'"), HasSubstr(dir)));
  auto f = ckpt->Find("lm_head.weight");
  EXPECT_EQ(f.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(f.status().message(), AllOf(HasSubstr("'lm_head.weight'"), HasSubstr(dir)));
  EXPECT_EQ(ckpt->BytesRead(), 0);  // no failed call read anything
}

TEST(Checkpoint, ConcurrentSlicesAreIndependent) {
  auto ckpt = OpenOrDie(MakeSingleFileModel(), /*staging=*/16);
  ASSERT_NE(ckpt, nullptr);
  const std::vector<float> m = Values(kRows * kCols);
  std::vector<std::thread> threads;
  std::vector<int> failures(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int iter = 0; iter < 50; ++iter) {
        const int64_t b = (t + iter) % kCols, e = std::min<int64_t>(kCols, b + 3);
        std::vector<float> out(kRows * (e - b));
        if (!ckpt->ReadSlice("w.bf16", 1, b, e, DType::kF32, out.data()).ok() ||
            out != RefSlice(m, kRows, kCols, 1, b, e)) {
          ++failures[t];
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_THAT(failures, ElementsAre(0, 0, 0, 0));
}

void WriteText(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

// Two shards plus an index, as `save_pretrained(max_shard_size=...)` writes.
std::string MakeShardedModel() {
  const std::string dir = testing::MakeTempDir("ckpt-sharded");
  TESSERA_CHECK(
      WriteSafetensors(dir + "/model-00001-of-00002.safetensors",
                       {{"embed", DType::kBF16, {6, 4}, EncodeFloats(DType::kBF16, Values(24))},
                        {"norm", DType::kF32, {4}, EncodeFloats(DType::kF32, Values(4, 3))}})
          .ok());
  TESSERA_CHECK(
      WriteSafetensors(dir + "/model-00002-of-00002.safetensors",
                       {{"lm_head", DType::kF16, {6, 4}, EncodeFloats(DType::kF16, Values(24, 4))}})
          .ok());
  WriteText(dir + "/model.safetensors.index.json", R"({
  "metadata": {"total_size": 160},
  "weight_map": {
    "embed": "model-00001-of-00002.safetensors",
    "norm": "model-00001-of-00002.safetensors",
    "lm_head": "model-00002-of-00002.safetensors"
  }
})");
  return dir;
}

TEST(Checkpoint, ShardedIndex) {
  const std::string dir = MakeShardedModel();
  auto ckpt = OpenOrDie(dir);
  ASSERT_NE(ckpt, nullptr);
  EXPECT_THAT(ckpt->TensorNames(), ElementsAre("embed", "lm_head", "norm"));
  auto lm = ckpt->Find("lm_head");
  ASSERT_TRUE(lm.ok());
  EXPECT_EQ(lm->file, dir + "/model-00002-of-00002.safetensors");
  EXPECT_EQ(ckpt->Find("embed")->file, dir + "/model-00001-of-00002.safetensors");

  // Vocab-parallel shard of lm_head (rows [3, 6)) and a column slice of embed.
  const std::vector<float> head = Values(24, 4), embed = Values(24);
  std::vector<float> out(12);
  ASSERT_TRUE(ckpt->ReadSlice("lm_head", 0, 3, 6, DType::kF32, out.data()).ok());
  EXPECT_EQ(out, RefSlice(head, 6, 4, 0, 3, 6));
  ASSERT_TRUE(ckpt->ReadSlice("embed", 1, 2, 4, DType::kF32, out.data()).ok());
  EXPECT_EQ(out, RefSlice(embed, 6, 4, 1, 2, 4));
  EXPECT_EQ(ckpt->BytesRead(), 3 * 4 * 2 + 6 * 2 * 2);
  std::vector<float> norm(4);
  ASSERT_TRUE(ckpt->ReadAll("norm", DType::kF32, norm.data()).ok());
  EXPECT_EQ(norm, Values(4, 3));
}

TEST(Checkpoint, IndexNamingMissingShardFails) {
  const std::string dir = MakeShardedModel();
  std::filesystem::remove(dir + "/model-00002-of-00002.safetensors");
  Status s = Checkpoint::Open(dir).status();
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_THAT(s.message(), AllOf(HasSubstr(dir + "/model-00002-of-00002.safetensors"),
                                 HasSubstr("model.safetensors.index.json")));
}

TEST(Checkpoint, IndexNamingTensorAbsentFromShardFails) {
  const std::string dir = MakeShardedModel();
  WriteText(dir + "/model.safetensors.index.json",
            R"({"weight_map": {"embed": "model-00001-of-00002.safetensors",
                               "lm_head": "model-00001-of-00002.safetensors"}})");
  Status s = Checkpoint::Open(dir).status();
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_THAT(s.message(),
              AllOf(HasSubstr("'lm_head'"), HasSubstr(dir + "/model-00001-of-00002.safetensors")));
}

TEST(Checkpoint, MalformedIndexFails) {
  const std::string dir = MakeShardedModel();
  WriteText(dir + "/model.safetensors.index.json", R"({"metadata": {}})");
  Status s = Checkpoint::Open(dir).status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(),
              AllOf(HasSubstr("model.safetensors.index.json"), HasSubstr("'weight_map'")));

  WriteText(dir + "/model.safetensors.index.json", R"({"weight_map": {"x": "../y.safetensors"}})");
  s = Checkpoint::Open(dir).status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("'weight_map.x'"), HasSubstr("../y.safetensors")));
}

TEST(Checkpoint, CorruptShardErrorNamesShard) {
  const std::string dir = MakeShardedModel();
  const std::string shard = dir + "/model-00002-of-00002.safetensors";
  std::filesystem::resize_file(shard, std::filesystem::file_size(shard) - 4);
  Status s = Checkpoint::Open(dir).status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), AllOf(HasSubstr(shard), HasSubstr("'lm_head'")));
}

TEST(Checkpoint, DirectoryWithoutWeightsFails) {
  const std::string dir = testing::MakeTempDir("ckpt-empty");
  Status s = Checkpoint::Open(dir).status();
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_THAT(s.message(), AllOf(HasSubstr(dir), HasSubstr("model.safetensors")));
  EXPECT_EQ(Checkpoint::Open(dir + "/missing").status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace tessera
