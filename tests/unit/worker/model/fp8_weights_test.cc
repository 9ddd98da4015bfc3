// FP8 checkpoints and online FP8 quantization (issue #35) on the CPU:
//  - the e4m3 conversions (every code, the edges);
//  - quantization_config parsing and its refusals (each message);
//  - sharding: a rank's FP8 weight bytes and scale values are exactly the
//    unsharded tensors' rows (or columns), and it reads no other bytes;
//  - a tp split cutting through a scale block dequantizes exactly (equal to
//    tp 1's rows); per-tensor scales with a static input scale;
//  - refusals at load (missing or misshapen scale, FP8 without a
//    quantization_config, FP8 in a role no format quantizes), each naming the
//    tensor, with nothing loaded;
//  - online FP8: per-output-channel scales over whole rows, so every tp loads
//    the same values, and the reference of tools/fp8_fixtures.py.
// The FP8 fixtures' own references (tp 1) are in model_reference_test.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "common/format/safetensors_writer.h"
#include "support/model_harness.h"
#include "support/test_util.h"
#include "worker/model/model_loader.h"
#include "worker/model/quantized_weight.h"
#include "worker/model/weight_loader.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string Fixture(const std::string& name) {
  return ::tessera::testing::FixturePath("models/" + name);
}

TEST(Fp8E4M3, EveryCodeRoundTripsAndTheEdgesAreRight) {
  for (int b = 0; b < 256; ++b) {
    const float f = F8E4M3ToF32(static_cast<uint8_t>(b));
    if ((b & 0x7f) == 0x7f) {
      EXPECT_TRUE(std::isnan(f)) << b;
      continue;
    }
    EXPECT_EQ(F32ToF8E4M3(f), b) << b << " = " << f;
  }
  EXPECT_EQ(F8E4M3ToF32(0x7e), 448.0f);
  EXPECT_EQ(F8E4M3ToF32(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(F8E4M3ToF32(0xb8), -1.0f);
  EXPECT_EQ(F32ToF8E4M3(1000.0f), 0x7e);                // saturates
  EXPECT_EQ(F32ToF8E4M3(1.0625f), 0x38);                // half way between 1 and 1.125: to even
  EXPECT_EQ(F32ToF8E4M3(1.1875f), 0x3a);                // half way between 1.125 and 1.25: to even
  EXPECT_EQ(F32ToF8E4M3(std::ldexp(1.5f, -10)), 0x01);  // half of subnormals rounds to even
}

// fp32 -> e4m3 by its definition (frexp and round-half-even on the mantissa),
// against which the bit-level F32ToF8E4M3 is checked.
uint8_t ReferenceF32ToF8E4M3(float f) {
  const uint8_t sign = std::signbit(f) ? 0x80u : 0x00u;
  if (std::isnan(f)) return static_cast<uint8_t>(sign | 0x7fu);
  const float a = std::min(std::fabs(f), kF8E4M3Max);
  if (a < 0.015625f)
    return static_cast<uint8_t>(sign | static_cast<uint8_t>(std::nearbyint(a * 512.0f)));
  int e = 0;
  const float m = std::frexp(a, &e);
  const int mant = static_cast<int>(std::nearbyint((2.0f * m - 1.0f) * 8.0f));
  return static_cast<uint8_t>(sign | std::min(((e + 6) << 3) + mant, 0x7e));
}

// Every 61st fp32 bit pattern (all exponents, signs, NaNs and infinities, and
// the rounding ties between e4m3 codes) converts as the definition does.
TEST(Fp8E4M3, ConversionEqualsTheDefinitionAcrossFp32) {
  size_t checked = 0;
  for (uint64_t bits = 0; bits <= 0xffffffffull; bits += 61) {
    const auto u = static_cast<uint32_t>(bits);
    float f;
    std::memcpy(&f, &u, sizeof f);
    ASSERT_EQ(F32ToF8E4M3(f), ReferenceF32ToF8E4M3(f)) << std::hex << u << " = " << f;
    ++checked;
  }
  // Exactly half way between neighbouring codes, at every exponent.
  for (int b = 0; b < 0x7e; ++b) {
    const float lo = F8E4M3ToF32(static_cast<uint8_t>(b));
    const float hi = F8E4M3ToF32(static_cast<uint8_t>(b + 1));
    for (float sgn : {1.0f, -1.0f}) {
      const float mid = sgn * (lo + hi) / 2;
      ASSERT_EQ(F32ToF8E4M3(mid), ReferenceF32ToF8E4M3(mid)) << mid;
      ++checked;
    }
  }
  EXPECT_GT(checked, 70000000u);
}

json FixtureQuant(const std::string& fixture) {
  return json::parse(
      ::tessera::testing::ReadFileOrDie(Fixture(fixture) + "/config.json"))["quantization_config"];
}

// config.json of `fixture` with quantization_config replaced by `q`.
std::string ConfigWith(const std::string& fixture, const json& q) {
  json c = json::parse(::tessera::testing::ReadFileOrDie(Fixture(fixture) + "/config.json"));
  c["quantization_config"] = q;
  return c.dump();
}

std::string ParseError(const std::string& config) {
  auto m = ParseModelConfig(config, "/m/config.json");
  EXPECT_FALSE(m.ok());
  return m.ok() ? "" : m.status().ToString();
}

TEST(Fp8Config, TheFixturesParseAndUnsupportedMethodsAreRefusedNamingTheKey) {
  auto block = LoadModelConfig(Fixture("llama_fp8_block"));
  ASSERT_TRUE(block.ok()) << block.status().ToString();
  EXPECT_EQ(block->quantization.method, QuantMethod::kFp8);
  EXPECT_EQ(block->quantization.weight_scale, WeightScaleKind::kBlock);
  EXPECT_EQ(block->quantization.block_rows, 32);
  EXPECT_EQ(block->quantization.block_cols, 32);
  auto ct = LoadModelConfig(Fixture("qwen3_fp8_channel_ct"));
  ASSERT_TRUE(ct.ok()) << ct.status().ToString();
  EXPECT_EQ(ct->quantization.method, QuantMethod::kCompressedTensors);
  EXPECT_EQ(ct->quantization.weight_scale, WeightScaleKind::kChannel);
  EXPECT_FALSE(ct->quantization.static_input_scale);
  EXPECT_EQ(ct->quantization.ScaleName("a.weight"), "a.weight_scale");
  EXPECT_EQ(block->quantization.ScaleName("a.weight"), "a.weight_scale_inv");

  std::string e = ParseError(ConfigWith("llama_gqa_f32", {{"quant_method", "awq"}, {"bits", 4}}));
  EXPECT_NE(e.find("/m/config.json: key 'quantization_config.quant_method': 'awq' is not "
                   "supported (supported: fp8, compressed-tensors)"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("'awq'"), std::string::npos) << e;
  EXPECT_NE(e.find("supported: fp8, compressed-tensors"), std::string::npos) << e;
  e = ParseError(ConfigWith("llama_gqa_f32", {{"bits", 4}}));
  EXPECT_NE(e.find("quantization_config.quant_method': missing is not supported"),
            std::string::npos)
      << e;
  e = ParseError(ConfigWith("llama_gqa_f32", {{"quant_method", "fp8"}, {"fmt", "e5m2"}}));
  EXPECT_NE(e.find("quantization_config.fmt': 'e5m2' is not supported"), std::string::npos) << e;
  e = ParseError(ConfigWith("llama_gqa_f32", {{"quant_method", "fp8"}, {"scale_fmt", "ue8m0"}}));
  EXPECT_NE(e.find("quantization_config.scale_fmt"), std::string::npos) << e;
  e = ParseError(
      ConfigWith("llama_gqa_f32", {{"quant_method", "fp8"}, {"activation_scheme", "static"}}));
  EXPECT_NE(e.find("quantization_config.activation_scheme': 'static'"), std::string::npos) << e;
  e = ParseError(
      ConfigWith("llama_gqa_f32", {{"quant_method", "fp8"}, {"weight_block_size", {128}}}));
  EXPECT_NE(e.find("quantization_config.weight_block_size': expected [rows, columns]"),
            std::string::npos)
      << e;
  const json q = FixtureQuant("qwen3_fp8_channel_ct");
  json pack = q;
  pack["format"] = "pack-quantized";
  e = ParseError(ConfigWith("llama_gqa_f32", pack));
  EXPECT_NE(e.find("quantization_config.format': 'pack-quantized' is not supported"),
            std::string::npos)
      << e;
  json int8 = q;
  int8["config_groups"]["group_0"]["weights"]["type"] = "int";
  e = ParseError(ConfigWith("llama_gqa_f32", int8));
  EXPECT_NE(e.find("quantization_config.config_groups.group_0.weights.num_bits': weights of 8-bit "
                   "int are not supported"),
            std::string::npos)
      << e;
  json two = q;
  two["config_groups"]["group_1"] = two["config_groups"]["group_0"];
  e = ParseError(ConfigWith("llama_gqa_f32", two));
  EXPECT_NE(e.find("quantization_config.config_groups': has 2 groups"), std::string::npos) << e;
  // kv_cache_scheme: static per-tensor fp8 K/V scales are read (kv_cache.dtype = "fp8" uses
  // them, kv_cache_fp8_test); any other KV quantization is refused naming the key.
  json kv = q;
  kv["kv_cache_scheme"] = {{"num_bits", 4}, {"type", "int"}};
  e = ParseError(ConfigWith("llama_gqa_f32", kv));
  EXPECT_NE(e.find("quantization_config.kv_cache_scheme.num_bits': a KV cache of 4-bit int"),
            std::string::npos)
      << e;
  kv["kv_cache_scheme"] = {{"num_bits", 8}, {"type", "float"}, {"strategy", "attn_head"}};
  e = ParseError(ConfigWith("llama_gqa_f32", kv));
  EXPECT_NE(e.find("quantization_config.kv_cache_scheme.strategy'"), std::string::npos) << e;
  kv["kv_cache_scheme"] = {{"num_bits", 8},
                           {"type", "float"},
                           {"strategy", "tensor"},
                           {"dynamic", false},
                           {"symmetric", true}};
  auto with_kv = ParseQuantizationConfig(kv, "config.json");
  ASSERT_TRUE(with_kv.ok()) << with_kv.status().ToString();
  EXPECT_TRUE(with_kv->kv_cache_scales);
  EXPECT_NE(with_kv->Describe().find(", static K/V scales)"), std::string::npos)
      << with_kv->Describe();
  EXPECT_FALSE(ParseOnlineQuantization("int4").ok());
  EXPECT_NE(ParseOnlineQuantization("int4").status().ToString().find("supported: none, fp8"),
            std::string::npos);
}

// The bytes of W[r0:r1, c0:c1] (row-major) of a whole row-major tensor of
// `cols` columns and `esize`-byte elements.
std::vector<uint8_t> Window(const std::vector<uint8_t>& whole, int64_t cols, size_t esize,
                            int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
  std::vector<uint8_t> out;
  for (int64_t r = r0; r < r1; ++r)
    out.insert(out.end(), whole.begin() + (r * cols + c0) * static_cast<int64_t>(esize),
               whole.begin() + (r * cols + c1) * static_cast<int64_t>(esize));
  return out;
}

std::vector<uint8_t> Whole(const Checkpoint& ckpt, const std::string& name, DType dtype) {
  auto info = ckpt.Find(name);
  EXPECT_TRUE(info.ok());
  std::vector<uint8_t> bytes(static_cast<size_t>(info->NumElements()) * DTypeSize(dtype));
  EXPECT_TRUE(ckpt.ReadAll(name, dtype, bytes.data()).ok());
  return bytes;
}

// Every rank of tp 1, 2 and 4 reads exactly its rows (columns) of each FP8
// weight and the scale rows (columns) over them, and nothing else.
TEST(Fp8Shards, SliceBytesAreTheUnshardedTensorsRowsAndNothingElseIsRead) {
  for (const std::string fixture : {"llama_fp8_block", "qwen3_fp8_channel_ct"}) {
    auto config = LoadModelConfig(Fixture(fixture));
    ASSERT_TRUE(config.ok());
    const QuantizationConfig& q = config->quantization;
    auto whole = Checkpoint::Open(Fixture(fixture));
    ASSERT_TRUE(whole.ok());
    int checked = 0, cut = 0;
    for (int tp : {1, 2, 4}) {
      auto par = ParallelConfig::Make(*config, tp, 1);
      ASSERT_TRUE(par.ok()) << par.status().ToString();
      for (int rank = 0; rank < tp; ++rank) {
        auto spec = ShardSpec::Make(*config, *par, rank);
        ASSERT_TRUE(spec.ok());
        for (const TensorShard& t : spec->tensors()) {
          if (!RoleIsQuantizable(t.role)) continue;
          SCOPED_TRACE(fixture + " tp " + std::to_string(tp) + " " + t.name);
          auto ckpt = Checkpoint::Open(Fixture(fixture));  // fresh: BytesRead counts this read
          ASSERT_TRUE(ckpt.ok());
          auto w = ReadQuantizedShard(**ckpt, t, q);
          ASSERT_TRUE(w.ok()) << w.status().ToString();
          const int64_t rows = t.full_shape[0], cols = t.full_shape[1];
          const int64_t r0 = t.split_dim == 0 ? t.begin : 0, r1 = t.split_dim == 0 ? t.end : rows;
          const int64_t c0 = t.split_dim == 1 ? t.begin : 0, c1 = t.split_dim == 1 ? t.end : cols;
          const auto values = Whole(**whole, t.name, DType::kF8E4M3);
          const std::vector<uint8_t> want = Window(values, cols, 1, r0, r1, c0, c1);
          ASSERT_EQ(w->values.nbytes(), want.size());
          EXPECT_EQ(std::memcmp(w->values.raw(), want.data(), want.size()), 0);
          // The scales: the rows (block rows, or block columns) covering the slice.
          const auto info = (*whole)->Find(q.ScaleName(t.name));
          ASSERT_TRUE(info.ok());
          const auto scales = Whole(**whole, q.ScaleName(t.name), DType::kF32);
          std::vector<uint8_t> want_scales;
          if (q.weight_scale == WeightScaleKind::kChannel) {
            want_scales = Window(scales, 1, 4, r0, r1, 0, 1);
          } else {
            const int64_t sc = info->shape[1];
            want_scales =
                Window(scales, sc, 4, r0 / q.block_rows, (r1 + q.block_rows - 1) / q.block_rows,
                       c0 / q.block_cols, (c1 + q.block_cols - 1) / q.block_cols);
            if (!w->BlockAligned(rows, cols)) ++cut;
          }
          ASSERT_EQ(w->scales.nbytes(), want_scales.size());
          EXPECT_EQ(std::memcmp(w->scales.raw(), want_scales.data(), want_scales.size()), 0);
          // Read: the slice's FP8 bytes and its scale rows, in the scale's dtype.
          EXPECT_EQ(
              (*ckpt)->BytesRead(),
              static_cast<int64_t>(want.size() + want_scales.size() / 4 * DTypeSize(info->dtype)));
          ++checked;
        }
      }
    }
    EXPECT_GT(checked, 0);
    if (q.weight_scale == WeightScaleKind::kBlock) {
      EXPECT_GT(cut, 0) << "no tp cut a block";
    }
  }
}

StatusOr<StageWeights> LoadRank(const std::string& dir, const ModelConfig& config, int tp,
                                int rank) {
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> ckpt, Checkpoint::Open(dir));
  TESSERA_ASSIGN_OR_RETURN(ParallelConfig par, ParallelConfig::Make(config, tp, 1));
  TESSERA_ASSIGN_OR_RETURN(ShardSpec spec, ShardSpec::Make(config, par, rank));
  return LoadStageWeights(*ckpt, config, par, spec);
}

// Rows [r0, r1) x columns [c0, c1) of a 2-D fp32 tensor.
std::vector<float> Rows(const Tensor& t, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
  std::vector<float> out;
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t c = c0; c < c1; ++c) out.push_back(t.data<float>()[r * t.dim(1) + c]);
  return out;
}
std::vector<float> All(const Tensor& t) { return Rows(t, 0, t.dim(0), 0, t.dim(1)); }

// Each tp 2 rank's dequantized k_proj (16 of a 32-row block) and down_proj
// (48 of 96 columns: through block 1) equal tp 1's rows and columns.
void ExpectTp2EqualsTp1(const std::string& dir, const ModelConfig& config) {
  auto one = LoadRank(dir, config, 1, 0);
  ASSERT_TRUE(one.ok()) << one.status().ToString();
  for (int rank = 0; rank < 2; ++rank) {
    auto two = LoadRank(dir, config, 2, rank);
    ASSERT_TRUE(two.ok()) << two.status().ToString();
    for (size_t l = 0; l < two->layers.size(); ++l) {
      const LayerWeights& a = one->layers[l];
      const LayerWeights& b = two->layers[l];
      const int64_t kr = b.k_proj.dim(0), dc = b.down_proj.dim(1), qr = b.q_proj.dim(0);
      EXPECT_EQ(All(b.k_proj), Rows(a.k_proj, rank * kr, (rank + 1) * kr, 0, a.k_proj.dim(1)));
      EXPECT_EQ(All(b.q_proj), Rows(a.q_proj, rank * qr, (rank + 1) * qr, 0, a.q_proj.dim(1)));
      EXPECT_EQ(All(b.down_proj),
                Rows(a.down_proj, 0, a.down_proj.dim(0), rank * dc, (rank + 1) * dc));
      EXPECT_EQ(All(b.o_proj), Rows(a.o_proj, 0, a.o_proj.dim(0), rank * b.o_proj.dim(1),
                                    (rank + 1) * b.o_proj.dim(1)));
    }
    EXPECT_GT(two->quantized_bytes, 0);
  }
  EXPECT_GT(one->quantized_bytes, 0);
}

TEST(Fp8Shards, ATpSplitThroughABlockDequantizesToTp1sValues) {
  auto config = LoadModelConfig(Fixture("llama_fp8_block"));
  ASSERT_TRUE(config.ok());
  ExpectTp2EqualsTp1(Fixture("llama_fp8_block"), *config);
  // FP8 bytes + fp32 scales at tp 1: per layer q, k, v, o, gate, up, down.
  auto one = LoadRank(Fixture("llama_fp8_block"), *config, 1, 0);
  ASSERT_TRUE(one.ok());
  const int64_t per_layer = (64 * 64 + 2 * 32 * 64 + 64 * 64 + 3 * 96 * 64) +
                            4 * (2 * 2 + 2 * 1 * 2 + 2 * 2 + 2 * 3 * 2 + 2 * 3);
  EXPECT_EQ(one->quantized_bytes, 2 * per_layer);
}

// A copy of fixture `from` in a fresh directory with `tensors` (as Checkpoint
// reads them) replaced or dropped (a null entry), and config.json's
// quantization_config set to `q` (null: removed).
std::string Rewrite(const std::string& from, const std::map<std::string, SafetensorsEntry*>& edits,
                    const json& q) {
  const std::string dir = ::tessera::testing::MakeTempDir("tessera-fp8");
  for (const auto& e : fs::directory_iterator(Fixture(from)))
    if (e.path().filename() != "model.safetensors") fs::copy(e.path(), dir);
  auto ckpt = Checkpoint::Open(Fixture(from));
  TESSERA_CHECK(ckpt.ok());
  std::vector<SafetensorsEntry> out;
  for (const std::string& name : (*ckpt)->TensorNames()) {
    auto it = edits.find(name);
    if (it != edits.end()) {
      if (it->second) out.push_back(*it->second);
      continue;
    }
    auto info = (*ckpt)->Find(name);
    SafetensorsEntry e{name, info->dtype, info->shape, Whole(**ckpt, name, info->dtype)};
    out.push_back(std::move(e));
  }
  for (const auto& [name, e] : edits)
    if (e && !(*ckpt)->Has(name)) out.push_back(*e);
  TESSERA_CHECK(WriteSafetensors(dir + "/model.safetensors", out).ok());
  json c = json::parse(::tessera::testing::ReadFileOrDie(dir + "/config.json"));
  if (q.is_null())
    c.erase("quantization_config");
  else
    c["quantization_config"] = q;
  std::ofstream(dir + "/config.json") << c.dump();
  return dir;
}

std::string LoadError(const std::string& dir, int tp = 2) {
  auto config = LoadModelConfig(dir);
  if (!config.ok()) return config.status().ToString();
  auto par = ParallelConfig::Make(*config, tp, 1);
  TESSERA_CHECK(par.ok());
  auto loaded = LoadModel(dir, *par, 1, nullptr);
  EXPECT_FALSE(loaded.ok()) << dir;
  return loaded.ok() ? "" : loaded.status().ToString();
}

TEST(Fp8Refusals, EachNamesTheTensorAndNothingLoads) {
  const std::string k = "model.layers.1.self_attn.k_proj.weight";
  std::map<std::string, SafetensorsEntry*> drop = {{k + "_scale_inv", nullptr}};
  std::string e = LoadError(Rewrite("llama_fp8_block", drop, FixtureQuant("llama_fp8_block")));
  EXPECT_NE(e.find("tensor '" + k + "_scale_inv' is not in checkpoint"), std::string::npos) << e;
  EXPECT_NE(e.find("loading FP8 tensor '" + k + "'"), std::string::npos) << e;

  SafetensorsEntry bad{k + "_scale_inv", DType::kF32, {2, 2}, std::vector<uint8_t>(16, 0)};
  std::map<std::string, SafetensorsEntry*> misshapen = {{k + "_scale_inv", &bad}};
  e = LoadError(Rewrite("llama_fp8_block", misshapen, FixtureQuant("llama_fp8_block")));
  EXPECT_NE(e.find("scale tensor '" + k + "_scale_inv'"), std::string::npos) << e;
  EXPECT_NE(e.find("has shape [2, 2] but block scales of '" + k +
                   "' [32, 64] need [1, 2] (weight_block_size 32x32)"),
            std::string::npos)
      << e;

  e = LoadError(Rewrite("llama_fp8_block", {}, json()));
  EXPECT_NE(e.find("is F8_E4M3 but config.json has no FP8 quantization_config"), std::string::npos)
      << e;

  auto ckpt = Checkpoint::Open(Fixture("llama_fp8_block"));
  ASSERT_TRUE(ckpt.ok());
  SafetensorsEntry norm{"model.layers.1.input_layernorm.weight",
                        DType::kF8E4M3,
                        {64},
                        std::vector<uint8_t>(64, 0x38)};
  std::map<std::string, SafetensorsEntry*> fp8_norm = {{norm.name, &norm}};
  e = LoadError(Rewrite("llama_fp8_block", fp8_norm, FixtureQuant("llama_fp8_block")));
  EXPECT_NE(e.find("tensor 'model.layers.1.input_layernorm.weight'"), std::string::npos) << e;
  EXPECT_NE(e.find("input_layernorm is not a linear projection"), std::string::npos) << e;

  json unknown = {{"quant_method", "gptq"}, {"bits", 4}};
  e = LoadError(Rewrite("llama_fp8_block", {}, unknown));
  EXPECT_NE(e.find("config.json: key 'quantization_config.quant_method': 'gptq' is not supported "
                   "(supported: fp8, compressed-tensors)"),
            std::string::npos)
      << e;
}

// compressed-tensors with one scale per tensor and static input scales, made
// here from the dense llama_gqa_f32: each projection loads as e4m3(W / s) x s
// at tp 2, and the input scale is read.
TEST(Fp8Shards, PerTensorScalesAndStaticInputScales) {
  auto dense = Checkpoint::Open(Fixture("llama_gqa_f32"));
  ASSERT_TRUE(dense.ok());
  std::vector<SafetensorsEntry> entries;
  std::map<std::string, std::vector<float>> expect;  // dequantized projections
  for (const std::string& name : (*dense)->TensorNames()) {
    const bool proj = name.find("_proj.weight") != std::string::npos;
    auto info = (*dense)->Find(name);
    const auto bytes = Whole(**dense, name, DType::kF32);
    if (!proj) {
      entries.push_back({name, DType::kF32, info->shape, bytes});
      continue;
    }
    std::vector<float> w(bytes.size() / 4);
    std::memcpy(w.data(), bytes.data(), bytes.size());
    float amax = 0;
    for (float v : w) amax = std::max(amax, std::fabs(v));
    const float s = amax / kF8E4M3Max;
    std::vector<uint8_t> q(w.size());
    std::vector<float>& deq = expect[name];
    for (size_t i = 0; i < w.size(); ++i) {
      q[i] = F32ToF8E4M3(w[i] / s);
      deq.push_back(F8E4M3ToF32(q[i]) * s);
    }
    entries.push_back({name, DType::kF8E4M3, info->shape, q});
    entries.push_back({name + "_scale", DType::kF32, {1}, EncodeFloats(DType::kF32, {s})});
    const std::string base = name.substr(0, name.size() - 7);
    entries.push_back({base + ".input_scale", DType::kF32, {}, EncodeFloats(DType::kF32, {0.5f})});
  }
  const std::string dir = ::tessera::testing::MakeTempDir("tessera-fp8-tensor");
  for (const auto& e : fs::directory_iterator(Fixture("llama_gqa_f32")))
    if (e.path().filename() != "model.safetensors") fs::copy(e.path(), dir);
  ASSERT_TRUE(WriteSafetensors(dir + "/model.safetensors", entries).ok());
  json q = FixtureQuant("qwen3_fp8_channel_ct");
  q["config_groups"]["group_0"]["weights"]["strategy"] = "tensor";
  q["config_groups"]["group_0"]["input_activations"]["dynamic"] = false;
  q["config_groups"]["group_0"]["input_activations"]["strategy"] = "tensor";
  json c = json::parse(::tessera::testing::ReadFileOrDie(dir + "/config.json"));
  c["quantization_config"] = q;
  std::ofstream(dir + "/config.json") << c.dump();

  auto config = LoadModelConfig(dir);
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_TRUE(config->quantization.static_input_scale);
  EXPECT_EQ(config->quantization.weight_scale, WeightScaleKind::kTensor);
  auto ckpt = Checkpoint::Open(dir);
  ASSERT_TRUE(ckpt.ok());
  auto par = ParallelConfig::Make(*config, 2, 1);
  ASSERT_TRUE(par.ok());
  auto spec = ShardSpec::Make(*config, *par, 1);
  ASSERT_TRUE(spec.ok());
  auto o = spec->Find(TensorRole::kOProj, 0);
  ASSERT_TRUE(o.ok());
  auto w = ReadQuantizedShard(**ckpt, **o, config->quantization);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ(w->input_scale, 0.5f);
  EXPECT_EQ(w->scales.numel(), 1);
  ExpectTp2EqualsTp1(dir, *config);
  auto one = LoadRank(dir, *config, 1, 0);
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(All(one->layers[1].gate_proj), expect.at("model.layers.1.mlp.gate_proj.weight"));
  EXPECT_EQ(All(one->layers[0].o_proj), expect.at("model.layers.0.self_attn.o_proj.weight"));
}

TEST(OnlineFp8, PerChannelScalesOverWholeRowsGiveTheSameValuesAtEveryTp) {
  auto config = LoadModelConfig(Fixture("llama_mha_tied_bf16"));
  ASSERT_TRUE(config.ok());
  ModelConfig online = *config;
  online.quantization = OnlineFp8Quantization();
  ExpectTp2EqualsTp1(Fixture("llama_mha_tied_bf16"), online);
  auto q = LoadRank(Fixture("llama_mha_tied_bf16"), online, 1, 0);
  auto d = LoadRank(Fixture("llama_mha_tied_bf16"), *config, 1, 0);
  ASSERT_TRUE(q.ok() && d.ok());
  // Quantized: every row of o_proj holds at most 256 distinct values (e4m3
  // codes x its scale), and its largest |value| is the row's own maximum.
  const Tensor& qo = q->layers[0].o_proj;
  const Tensor& dn = d->layers[0].o_proj;
  EXPECT_NE(All(qo), All(dn));
  for (int64_t r = 0; r < qo.dim(0); ++r) {
    float qmax = 0, dmax = 0;
    for (int64_t c = 0; c < qo.dim(1); ++c) {
      qmax = std::max(qmax, std::fabs(qo.data<float>()[r * qo.dim(1) + c]));
      dmax = std::max(dmax, std::fabs(dn.data<float>()[r * dn.dim(1) + c]));
    }
    EXPECT_FLOAT_EQ(qmax, dmax) << "row " << r;
  }
  // 1 byte per projection parameter plus an fp32 scale per output row.
  const int64_t h = 64, inter = 128;
  EXPECT_EQ(q->quantized_bytes, 2 * (4 * h * h + 3 * h * inter + 4 * (4 * h + 2 * inter + h)));
  EXPECT_EQ(d->quantized_bytes, 0);
}

// compressed-tensors "block" strategy: llama_fp8_block's values and scales
// renamed to weight_scale, loading to the same weights as the HF fp8 one.
TEST(Fp8Shards, CompressedTensorsBlockScalesLoadAsTheHfFp8Checkpoint) {
  auto ckpt = Checkpoint::Open(Fixture("llama_fp8_block"));
  ASSERT_TRUE(ckpt.ok());
  std::vector<SafetensorsEntry> renamed;
  std::map<std::string, SafetensorsEntry*> edits;
  for (const std::string& name : (*ckpt)->TensorNames()) {
    const std::string tail = "_scale_inv";
    if (name.size() < tail.size() || name.compare(name.size() - tail.size(), tail.size(), tail))
      continue;
    auto info = (*ckpt)->Find(name);
    renamed.push_back({name.substr(0, name.size() - tail.size()) + "_scale", info->dtype,
                       info->shape, Whole(**ckpt, name, info->dtype)});
    edits[name] = nullptr;
  }
  for (SafetensorsEntry& e : renamed) edits[e.name] = &e;
  json q = FixtureQuant("qwen3_fp8_channel_ct");
  q["config_groups"]["group_0"]["weights"]["strategy"] = "block";
  q["config_groups"]["group_0"]["weights"]["block_structure"] = {32, 32};
  const std::string dir = Rewrite("llama_fp8_block", edits, q);
  auto config = LoadModelConfig(dir);
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_EQ(config->quantization.method, QuantMethod::kCompressedTensors);
  EXPECT_EQ(config->quantization.weight_scale, WeightScaleKind::kBlock);
  auto hf_config = LoadModelConfig(Fixture("llama_fp8_block"));
  ASSERT_TRUE(hf_config.ok());
  for (int rank = 0; rank < 2; ++rank) {
    auto ct = LoadRank(dir, *config, 2, rank);
    auto hf = LoadRank(Fixture("llama_fp8_block"), *hf_config, 2, rank);
    ASSERT_TRUE(ct.ok() && hf.ok()) << ct.status().ToString();
    EXPECT_EQ(All(ct->layers[1].gate_up_proj), All(hf->layers[1].gate_up_proj));
    EXPECT_EQ(All(ct->layers[1].down_proj), All(hf->layers[1].down_proj));
    EXPECT_EQ(All(ct->layers[0].qkv_proj), All(hf->layers[0].qkv_proj));
  }
  ExpectTp2EqualsTp1(dir, *config);
}

// Phi-3's fused qkv_proj and gate_up_proj quantized online: each part's rows
// of the fused tensor get their own rows' scales, the same at tp 1 and 2.
TEST(OnlineFp8, FusedCheckpointTensorsQuantizeTheSameAtEveryTp) {
  auto config = LoadModelConfig(Fixture("phi3_fused_longrope_bf16"));
  ASSERT_TRUE(config.ok());
  config->quantization = OnlineFp8Quantization();
  ExpectTp2EqualsTp1(Fixture("phi3_fused_longrope_bf16"), *config);
}

TEST(OnlineFp8, MatchesTheQuantizedReference) {
  const std::string dir = Fixture("llama_mha_tied_bf16");
  const json ref =
      json::parse(::tessera::testing::ReadFileOrDie(dir + "/reference_online_fp8.json"));
  auto model = ::tessera::testing::LocalModel::Load(dir, 256, 16, nullptr, QuantMethod::kOnlineFp8);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  for (const json& p : ref["prompts"]) {
    const auto ids = p["ids"].get<std::vector<int32_t>>();
    auto logits = (*model)->LastLogits(ids);
    ASSERT_TRUE(logits.ok());
    EXPECT_LE(::tessera::testing::RelMaxDiff(*logits, p["last_logits"]), 1e-4);
    auto greedy = (*model)->Greedy({ids}, 16);
    ASSERT_TRUE(greedy.ok());
    EXPECT_EQ((*greedy)[0], p["greedy"].get<std::vector<int32_t>>());
  }
}

}  // namespace
}  // namespace tessera
