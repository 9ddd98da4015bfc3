// Fused checkpoint tensors (Phi-3 qkv_proj and gate_up_proj; issue 22):
// every tp rank reads exactly its own q rows, k rows and v rows (and gate and
// up rows) of the fused tensor, never "the r-th fraction of it".
//
// The Phi-3 fixture (tests/fixtures/models/phi3_fused_longrope_bf16) is
// rewritten here as the same model with unfused q_proj/k_proj/v_proj and
// gate_proj/up_proj tensors (a Llama checkpoint of the same values). At tp 1,
// 2, 4 and 8 every rank of the fused model must hold bit for bit what the
// same rank of the unfused model holds, read exactly the bytes of its slices
// (the checkpoint's own count and the kernel's count of read syscalls,
// /proc/self/io rchar), and its fused shards name the rows the rule gives.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "common/format/checkpoint.h"
#include "common/format/model_config.h"
#include "common/format/safetensors.h"
#include "common/format/safetensors_writer.h"
#include "common/model/parallel_config.h"
#include "common/model/shard_spec.h"
#include "support/test_util.h"
#include "worker/model/weight_loader.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

constexpr const char* kFixture = "models/phi3_fused_longrope_bf16";

// The rows [begin, end) of a [rows, cols] tensor's bytes.
std::vector<uint8_t> Rows(const uint8_t* data, int64_t row_bytes, int64_t begin, int64_t end) {
  return std::vector<uint8_t>(data + begin * row_bytes, data + end * row_bytes);
}

// Writes `dst`: the fixture with qkv_proj split into q_proj, k_proj, v_proj
// and gate_up_proj into gate_proj, up_proj (rows as Phi3Attention and Phi3MLP
// use them), as a LlamaForCausalLM.
void WriteUnfused(const std::string& src, const std::string& dst, const ModelConfig& m) {
  fs::create_directories(dst);
  nlohmann::json config = nlohmann::json::parse(testing::ReadFileOrDie(src + "/config.json"));
  config["architectures"] = nlohmann::json::array({"LlamaForCausalLM"});
  config["model_type"] = "llama";
  std::ofstream(dst + "/config.json") << config.dump(2);
  auto file = SafetensorsFile::Open(src + "/model.safetensors");
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  std::vector<SafetensorsEntry> out;
  const int64_t q = m.num_attention_heads * m.head_dim, kv = m.num_key_value_heads * m.head_dim;
  const int64_t inter = m.intermediate_size;
  auto add = [&](const std::string& name, const TensorInfo& info, int64_t begin, int64_t end) {
    const int64_t row_bytes = static_cast<int64_t>(info.nbytes) / info.shape[0];
    out.push_back({name,
                   info.dtype,
                   {end - begin, info.shape[1]},
                   Rows((*file)->MappedData(info), row_bytes, begin, end)});
  };
  for (const TensorInfo& info : (*file)->tensors()) {
    const std::string& n = info.name;
    if (const size_t at = n.find("qkv_proj"); at != std::string::npos) {
      const std::string prefix = n.substr(0, at);
      add(prefix + "q_proj.weight", info, 0, q);
      add(prefix + "k_proj.weight", info, q, q + kv);
      add(prefix + "v_proj.weight", info, q + kv, q + 2 * kv);
    } else if (const size_t at2 = n.find("gate_up_proj"); at2 != std::string::npos) {
      const std::string prefix = n.substr(0, at2);
      add(prefix + "gate_proj.weight", info, 0, inter);
      add(prefix + "up_proj.weight", info, inter, 2 * inter);
    } else {
      const uint8_t* p = (*file)->MappedData(info);
      out.push_back({n, info.dtype, info.shape, std::vector<uint8_t>(p, p + info.nbytes)});
    }
  }
  Status s = WriteSafetensors(dst + "/model.safetensors", out);
  ASSERT_TRUE(s.ok()) << s.ToString();
}

// rchar of /proc/self/io, read with raw syscalls; `own` gets what this read
// itself added.
int64_t Rchar(int64_t* own) {
  const int fd = ::open("/proc/self/io", O_RDONLY | O_CLOEXEC);
  std::string text;
  char buf[4096];
  ssize_t n;
  while (fd >= 0 && (n = ::read(fd, buf, sizeof buf)) > 0) text.append(buf, static_cast<size_t>(n));
  if (fd >= 0) ::close(fd);
  *own = static_cast<int64_t>(text.size());
  const size_t p = text.find("rchar:");
  return p == std::string::npos ? -1 : std::strtoll(text.c_str() + p + 6, nullptr, 10);
}

struct Loaded {
  StageWeights weights;
  int64_t bytes_read = 0;    // Checkpoint::BytesRead
  int64_t syscall_read = 0;  // rchar growth during LoadStageWeights
};

Loaded Load(const std::string& dir, const ModelConfig& m, const ParallelConfig& par,
            const ShardSpec& spec) {
  auto ckpt = Checkpoint::Open(dir);
  TESSERA_CHECK(ckpt.ok());
  int64_t own = 0;
  const int64_t before = Rchar(&own);
  auto w = LoadStageWeights(**ckpt, m, par, spec);
  int64_t own_after = 0;
  const int64_t after = Rchar(&own_after);
  TESSERA_CHECK(w.ok());
  return {std::move(*w), (*ckpt)->BytesRead(), after - before - own};
}

// Bytes of the slices of `spec` in a checkpoint of `elem` bytes per element,
// each distinct (name, begin, end) once.
int64_t SliceBytes(const ShardSpec& spec, int64_t elem) {
  std::set<std::tuple<std::string, int64_t, int64_t>> seen;
  int64_t bytes = 0;
  for (const TensorShard& t : spec.tensors()) {
    if (!seen.emplace(t.name, t.begin, t.end).second) continue;
    int64_t n = 1;
    for (size_t d = 0; d < t.full_shape.size(); ++d)
      n *= static_cast<int>(d) == t.split_dim ? t.end - t.begin : t.full_shape[d];
    bytes += n * elem;
  }
  return bytes;
}

std::vector<uint8_t> Bytes(const Tensor& t) {
  const auto* p = static_cast<const uint8_t*>(t.raw());
  return std::vector<uint8_t>(p, p + t.nbytes());
}

TEST(FusedShards, EveryRankHoldsTheUnfusedRowsBitForBitAndReadsOnlyThem) {
  const std::string fused_dir = testing::FixturePath(kFixture);
  auto fused_config = LoadModelConfig(fused_dir);
  ASSERT_TRUE(fused_config.ok()) << fused_config.status().ToString();
  const ModelConfig& m = *fused_config;
  ASSERT_EQ(m.architecture, Architecture::kPhi3);
  const std::string unfused_dir = testing::MakeTempDir("tessera-unfused") + "/model";
  ASSERT_NO_FATAL_FAILURE(WriteUnfused(fused_dir, unfused_dir, m));
  auto unfused_config = LoadModelConfig(unfused_dir);
  ASSERT_TRUE(unfused_config.ok()) << unfused_config.status().ToString();
  ASSERT_EQ(unfused_config->architecture, Architecture::kLlama);

  const int64_t H = m.num_attention_heads, KV = m.num_key_value_heads, d = m.head_dim;
  const int64_t I = m.intermediate_size;
  const int64_t elem = static_cast<int64_t>(DTypeSize(m.torch_dtype));
  for (int tp : {1, 2, 4, 8}) {
    auto par = ParallelConfig::Make(m, tp, 1);
    ASSERT_TRUE(par.ok()) << par.status().ToString();
    auto upar = ParallelConfig::Make(*unfused_config, tp, 1);
    ASSERT_TRUE(upar.ok());
    for (int rank = 0; rank < tp; ++rank) {
      SCOPED_TRACE("tp " + std::to_string(tp) + " rank " + std::to_string(rank));
      auto spec = ShardSpec::Make(m, *par, rank);
      auto uspec = ShardSpec::Make(*unfused_config, *upar, rank);
      ASSERT_TRUE(spec.ok() && uspec.ok());
      // The fused shards' rows, by the rule: this rank's heads within each part.
      const int64_t heads = H / tp;
      const int64_t kv_first = KV >= tp ? rank * (KV / tp) : (rank * heads) / (H / KV);
      const int64_t kv_heads = KV >= tp ? KV / tp : 1;
      const std::vector<std::tuple<TensorRole, int64_t, int64_t>> rows = {
          {TensorRole::kQProj, rank * heads * d, (rank + 1) * heads * d},
          {TensorRole::kKProj, H * d + kv_first * d, H * d + (kv_first + kv_heads) * d},
          {TensorRole::kVProj, (H + KV) * d + kv_first * d,
           (H + KV) * d + (kv_first + kv_heads) * d},
          {TensorRole::kGateProj, rank * I / tp, (rank + 1) * I / tp},
          {TensorRole::kUpProj, I + rank * I / tp, I + (rank + 1) * I / tp},
      };
      for (const auto& [role, begin, end] : rows) {
        auto t = spec->Find(role, 1);
        ASSERT_TRUE(t.ok()) << t.status().ToString();
        EXPECT_EQ((*t)->begin, begin) << TensorRoleName(role);
        EXPECT_EQ((*t)->end, end) << TensorRoleName(role);
        EXPECT_EQ((*t)->split_dim, 0);
        EXPECT_EQ((*t)->local_shape[0], end - begin) << TensorRoleName(role);
      }
      // Each part is found under its unfused name, and read from the fused tensor.
      auto k = spec->Find("model.layers.0.self_attn.k_proj.weight");
      ASSERT_TRUE(k.ok()) << k.status().ToString();
      EXPECT_EQ((*k)->role, TensorRole::kKProj);
      EXPECT_EQ((*k)->name, "model.layers.0.self_attn.qkv_proj.weight");
      EXPECT_EQ((*k)->full_shape, (std::vector<int64_t>{(H + 2 * KV) * d, m.hidden_size}));
      EXPECT_EQ(spec->WeightBytes(DType::kF32), uspec->WeightBytes(DType::kF32));

      const Loaded fused = Load(fused_dir, m, *par, *spec);
      const Loaded unfused = Load(unfused_dir, *unfused_config, *upar, *uspec);
      // Only the slices, in the file dtype: by the checkpoint's count and the kernel's.
      EXPECT_EQ(fused.bytes_read, SliceBytes(*spec, elem));
      EXPECT_EQ(fused.syscall_read, SliceBytes(*spec, elem));
      EXPECT_EQ(fused.bytes_read, unfused.bytes_read);
      EXPECT_EQ(fused.weights.weight_bytes, unfused.weights.weight_bytes);
      ASSERT_EQ(fused.weights.layers.size(), unfused.weights.layers.size());
      for (size_t l = 0; l < fused.weights.layers.size(); ++l) {
        const LayerWeights& a = fused.weights.layers[l];
        const LayerWeights& b = unfused.weights.layers[l];
        const std::vector<std::pair<const char*, Tensor LayerWeights::*>> fields = {
            {"q_proj", &LayerWeights::q_proj},       {"k_proj", &LayerWeights::k_proj},
            {"v_proj", &LayerWeights::v_proj},       {"o_proj", &LayerWeights::o_proj},
            {"gate_proj", &LayerWeights::gate_proj}, {"up_proj", &LayerWeights::up_proj},
            {"down_proj", &LayerWeights::down_proj}, {"input_norm", &LayerWeights::input_norm},
            {"post_norm", &LayerWeights::post_norm}};
        for (const auto& [what, field] : fields) {
          const Tensor& x = a.*field;
          const Tensor& y = b.*field;
          ASSERT_TRUE(x.defined() && y.defined()) << what;
          EXPECT_EQ(x.shape(), y.shape()) << what << " layer " << l;
          EXPECT_TRUE(Bytes(x) == Bytes(y)) << what << " layer " << l << " differs";
        }
      }
      EXPECT_TRUE(Bytes(fused.weights.embed_tokens) == Bytes(unfused.weights.embed_tokens));
      EXPECT_TRUE(Bytes(fused.weights.lm_head) == Bytes(unfused.weights.lm_head));
    }
  }
}

}  // namespace
}  // namespace tessera
