#include "common/format/safetensors.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <fstream>

#include "common/format/safetensors_writer.h"
#include "support/test_util.h"

namespace tessera {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// Writes a file with an arbitrary header text, header length prefix and data
// size, for building malformed files.
std::string WriteRaw(const std::string& dir, const std::string& name, const std::string& header,
                     size_t data_bytes, uint64_t claimed_header_len = UINT64_MAX) {
  const std::string path = dir + "/" + name;
  std::ofstream out(path, std::ios::binary);
  const uint64_t len = claimed_header_len == UINT64_MAX ? header.size() : claimed_header_len;
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>(len >> (8 * i)));
  out << header << std::string(data_bytes, '\x01');
  return path;
}

Status OpenStatus(const std::string& path) { return SafetensorsFile::Open(path).status(); }

TEST(SafetensorsFile, RoundTripFloatDtypesAndMetadata) {
  const std::string dir = testing::MakeTempDir("st");
  const std::string path = dir + "/m.safetensors";
  const std::vector<float> v = {0.5f, -1.25f, 3.0f, 1024.0f, -0.0078125f, 7.5f};
  std::vector<SafetensorsEntry> entries = {
      {"w.f32", DType::kF32, {2, 3}, EncodeFloats(DType::kF32, v)},
      {"b.f16", DType::kF16, {6}, EncodeFloats(DType::kF16, v)},
      {"a.bf16", DType::kBF16, {3, 2}, EncodeFloats(DType::kBF16, v)},
      {"ids", DType::kI32, {1}, {1, 0, 0, 0}},
      {"empty", DType::kF32, {0, 4}, {}},
  };
  ASSERT_TRUE(WriteSafetensors(path, entries, {{"format", "pt"}}).ok());

  auto f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  const SafetensorsFile& file = **f;
  EXPECT_EQ(file.path(), path);
  EXPECT_EQ(file.metadata().at("format"), "pt");
  ASSERT_EQ(file.tensors().size(), 5u);
  EXPECT_EQ(file.tensors()[0].name, "a.bf16");  // sorted by name
  EXPECT_EQ(file.data_start() % 8, 0u);
  EXPECT_EQ(file.Find("missing"), nullptr);

  uint64_t data_bytes = 0;
  for (const SafetensorsEntry& e : entries) {
    const TensorInfo* t = file.Find(e.name);
    ASSERT_NE(t, nullptr) << e.name;
    EXPECT_EQ(t->dtype, e.dtype);
    EXPECT_EQ(t->shape, e.shape);
    EXPECT_EQ(t->nbytes, e.bytes.size());
    EXPECT_EQ(t->file, path);
    EXPECT_GE(t->data_begin, file.data_start());
    data_bytes += t->nbytes;
    std::vector<uint8_t> got(t->nbytes);
    EXPECT_TRUE(file.ReadBytes(t->data_begin, t->nbytes, got.data()).ok());
    EXPECT_EQ(got, e.bytes) << e.name;
    // (std::equal, not memcmp: an empty tensor's vector has no data pointer.)
    EXPECT_TRUE(std::equal(e.bytes.begin(), e.bytes.end(), file.MappedData(*t))) << e.name;
    if (e.dtype != DType::kI32 && t->nbytes > 0) {
      std::vector<float> f32(v.size());
      ConvertToF32(e.dtype, got.data(), f32.data(), f32.size());
      EXPECT_EQ(f32, v) << e.name;  // every value is exact in F16 and BF16
    }
  }
  EXPECT_EQ(file.file_size(), file.data_start() + data_bytes);
  EXPECT_EQ(file.BytesRead(), static_cast<int64_t>(data_bytes));

  Status past_end = file.ReadBytes(file.file_size() - 2, 4, nullptr);
  EXPECT_EQ(past_end.code(), StatusCode::kOutOfRange);
  EXPECT_THAT(past_end.message(), HasSubstr(path));
}

TEST(SafetensorsFile, MissingFileIsNotFound) {
  const std::string path = testing::MakeTempDir("st") + "/nope.safetensors";
  Status s = OpenStatus(path);
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr(path));
}

TEST(SafetensorsFile, RejectsFileShorterThanLengthPrefix) {
  const std::string dir = testing::MakeTempDir("st");
  const std::string path = dir + "/short.safetensors";
  std::ofstream(path, std::ios::binary) << "abcde";
  Status s = OpenStatus(path);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), AllOf(HasSubstr(path), HasSubstr("truncated"), HasSubstr("5 bytes")));
}

TEST(SafetensorsFile, RejectsHeaderLengthBeyondFile) {
  const std::string dir = testing::MakeTempDir("st");
  const std::string path = WriteRaw(dir, "h.safetensors", "{}", 0, /*claimed_header_len=*/4096);
  Status s = OpenStatus(path);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), AllOf(HasSubstr(path), HasSubstr("header length 4096"),
                                 HasSubstr("beyond the end of the file")));
}

TEST(SafetensorsFile, RejectsHeaderThatIsNotJson) {
  const std::string dir = testing::MakeTempDir("st");
  const std::string path = WriteRaw(dir, "j.safetensors", "{\"w\": [1, 2", 0);
  Status s = OpenStatus(path);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), AllOf(HasSubstr(path), HasSubstr("not valid JSON")));

  const std::string arr = WriteRaw(dir, "a.safetensors", "[1, 2]", 0);
  EXPECT_THAT(OpenStatus(arr).message(), AllOf(HasSubstr(arr), HasSubstr("not a JSON object")));
}

TEST(SafetensorsFile, RejectsHeaderWithWrongTypes) {
  const std::string dir = testing::MakeTempDir("st");
  struct Case {
    std::string header;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {R"({"w": 3})", "entry is not a JSON object"},
      {R"({"w": {"dtype": 5, "shape": [1], "data_offsets": [0, 4]}})", "'dtype'"},
      {R"({"w": {"dtype": "F32", "shape": "2", "data_offsets": [0, 4]}})", "'shape'"},
      {R"({"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", "'shape' holds -1"},
      {R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0]}})", "'data_offsets'"},
      {R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}})", "begin > end"},
      {R"({"w": {"dtype": "F32", "shape": [1]}})", "'data_offsets'"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string path =
        WriteRaw(dir, "t" + std::to_string(i) + ".safetensors", cases[i].header, 16);
    Status s = OpenStatus(path);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << cases[i].header;
    EXPECT_THAT(s.message(),
                AllOf(HasSubstr(path), HasSubstr("tensor 'w'"), HasSubstr(cases[i].expect)))
        << cases[i].header;
  }
  const std::string meta = WriteRaw(dir, "meta.safetensors", R"({"__metadata__": {"k": 1}})", 0);
  EXPECT_THAT(OpenStatus(meta).message(),
              AllOf(HasSubstr(meta), HasSubstr("'__metadata__' key 'k'")));
}

TEST(SafetensorsFile, RejectsOffsetsBeyondFile) {
  const std::string dir = testing::MakeTempDir("st");
  const std::string path =
      WriteRaw(dir, "o.safetensors",
               R"({"w": {"dtype": "F32", "shape": [16], "data_offsets": [0, 64]}})", 16);
  Status s = OpenStatus(path);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), AllOf(HasSubstr(path), HasSubstr("tensor 'w'"), HasSubstr("[0, 64]"),
                                 HasSubstr("beyond the end of the file")));
}

TEST(SafetensorsFile, RejectsOverlappingTensors) {
  const std::string dir = testing::MakeTempDir("st");
  const std::string path =
      WriteRaw(dir, "ov.safetensors",
               R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},)"
               R"( "b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}})",
               24);
  Status s = OpenStatus(path);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), AllOf(HasSubstr(path), HasSubstr("'a' [0, 16)"),
                                 HasSubstr("'b' [8, 24)"), HasSubstr("overlap")));
}

TEST(SafetensorsFile, RejectsUnknownDtype) {
  const std::string dir = testing::MakeTempDir("st");
  const std::string path =
      WriteRaw(dir, "d.safetensors",
               R"({"w": {"dtype": "F8_E5M2", "shape": [4], "data_offsets": [0, 4]}})", 4);
  Status s = OpenStatus(path);
  EXPECT_EQ(s.code(), StatusCode::kUnimplemented);
  EXPECT_THAT(s.message(), AllOf(HasSubstr(path), HasSubstr("tensor 'w'"), HasSubstr("F8_E5M2")));
  // float8 e4m3fn (FP8 checkpoints) is known: one byte per element.
  const std::string fp8 =
      WriteRaw(dir, "e.safetensors",
               R"({"w": {"dtype": "F8_E4M3", "shape": [4], "data_offsets": [0, 4]}})", 4);
  EXPECT_TRUE(OpenStatus(fp8).ok()) << OpenStatus(fp8).ToString();
}

TEST(SafetensorsFile, RejectsShapeThatDisagreesWithOffsets) {
  const std::string dir = testing::MakeTempDir("st");
  const std::string path =
      WriteRaw(dir, "s.safetensors",
               R"({"w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 20]}})", 20);
  Status s = OpenStatus(path);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), AllOf(HasSubstr(path), HasSubstr("tensor 'w'"), HasSubstr("[2, 3]"),
                                 HasSubstr("needs 24 bytes"), HasSubstr("span 20")));
}

TEST(SafetensorsWriter, RejectsBytesThatDisagreeWithShape) {
  const std::string path = testing::MakeTempDir("st") + "/bad.safetensors";
  Status s = WriteSafetensors(path, {{"w", DType::kF16, {3}, {0, 0, 0, 0}}});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("tensor 'w'"), HasSubstr("need 6 bytes, got 4")));
  EXPECT_EQ(OpenStatus(path).code(), StatusCode::kNotFound);  // nothing was written
}

}  // namespace
}  // namespace tessera
