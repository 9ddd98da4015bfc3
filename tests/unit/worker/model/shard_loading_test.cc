// Shard-only loading, end to end, on a 438 MB random-weight Llama-shaped F32
// checkpoint (issue "Shard-only loading"):
//  1. every rank of every tp x pp layout holds exactly ShardSpec::WeightBytes
//     and preads exactly the bytes of its slices (Checkpoint::BytesRead and the
//     kernel's own count of read syscalls, /proc/self/io rchar), with every
//     value checked against the generator;
//  2. its peak RSS while loading stays under its shard bytes + 64 MiB, and no
//     page of the (mmapped) checkpoint is touched;
//  3. per-rank weight bytes and peak RSS fall as 1/(tp*pp) plus the replicated
//     parts;
//  4. a tied-embedding model at pp=2 reads embed_tokens on the first stage and
//     its vocab slice again as lm_head on the last, and no stage reads another
//     stage's layers.
// Each rank loads in a forked child so that its RSS high-water mark is its own;
// the child reports back through a pipe. The checkpoint is written once per
// test binary run (a gtest Environment), tensor by tensor in 1 MiB chunks, as
// a 3-file index checkpoint; the tied model shares its files through hard
// links and an index without lm_head.weight.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common/format/checkpoint.h"
#include "common/format/model_config.h"
#include "common/model/parallel_config.h"
#include "common/model/shard_spec.h"
#include "common/model/tensor_roles.h"
#include "support/test_util.h"
#include "worker/model/weight_loader.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

// The model. vocab 32001 is not a multiple of 2 or 4, so vocab-parallel ranks
// hold zero padding rows; 2 KV heads < tp=4 makes tp=4 replicate KV heads.
// Bytes (F32): embed_tokens and lm_head 131.1 MB each, 4 layers of 44.0 MB.
constexpr int64_t kHidden = 1024;
constexpr int64_t kInter = 2816;
constexpr int kLayers = 4;
constexpr int64_t kHeads = 16;
constexpr int64_t kKvHeads = 2;
constexpr int64_t kHeadDim = kHidden / kHeads;
constexpr int64_t kVocab = 32001;
constexpr int64_t kF32 = 4;
constexpr int64_t kMiB = int64_t{1} << 20;
constexpr double kMB = 1e6;

// Peak RSS allowance above a rank's shard bytes.
constexpr int64_t kRssSlack = 64 * kMiB;
// Growth of file-backed resident pages allowed while loading: library code
// faulted in by the child. Touching the mapped checkpoint would add at least
// one tensor (>= 16 MB at tp=4).
constexpr int64_t kRssFileSlack = 12 * kMiB;

const std::vector<std::pair<int, int>> kLayouts = {{1, 1}, {2, 1}, {4, 1}, {1, 2}, {2, 2}};

// ---- Deterministic random weights ------------------------------------------

uint64_t Mix(uint64_t x) {  // splitmix64 finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// FNV-1a of the checkpoint tensor name: the values of a tensor depend on its
// name, so a loader that reads the wrong tensor (or lm_head for a tied
// embedding) is caught.
uint64_t NameSeed(const std::string& name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : name) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

// Element `i` (row-major flat index) of the tensor with seed `seed`: a
// multiple of 2^-23 in [-1, 1), exact in F32.
float ValueAt(uint64_t seed, uint64_t i) {
  const int64_t bits = static_cast<int64_t>(Mix(seed + i) >> 40);  // 24 bits
  return static_cast<float>(bits - (int64_t{1} << 23)) * (1.0f / static_cast<float>(1 << 23));
}

// ---- The checkpoint ---------------------------------------------------------

struct PlannedTensor {
  std::string name;
  std::vector<int64_t> shape;
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

// The model's config as a ModelConfig (ConfigJson writes the same numbers).
ModelConfig PlannedConfig(bool tied) {
  ModelConfig m;
  m.architecture = Architecture::kLlama;
  m.hidden_size = kHidden;
  m.intermediate_size = kInter;
  m.num_hidden_layers = kLayers;
  m.num_attention_heads = kHeads;
  m.num_key_value_heads = kKvHeads;
  m.head_dim = kHeadDim;
  m.vocab_size = kVocab;
  m.tie_word_embeddings = tied;
  return m;
}

// The checkpoint tensors of `place` (and `layer`), from Llama's tensor table.
std::vector<PlannedTensor> PlannedTensors(RolePlace place, int layer) {
  const ModelConfig m = PlannedConfig(false);
  std::vector<PlannedTensor> out;
  for (const RoleSpec& rs : FamilyRolesOf(m.architecture).roles) {
    if (rs.place == place && RolePresent(rs, m)) {
      out.push_back({RoleTensorName(rs, layer), RoleShape(rs, m)});
    }
  }
  return out;
}

// The three shard files: embed_tokens + the first half of the layers; the
// second half + model.norm; lm_head.
std::vector<std::pair<std::string, std::vector<PlannedTensor>>> ShardFiles() {
  std::vector<PlannedTensor> a = PlannedTensors(RolePlace::kFirstStage, -1);
  std::vector<PlannedTensor> b;
  for (int l = 0; l < kLayers; ++l) {
    for (PlannedTensor& t : PlannedTensors(RolePlace::kLayer, l)) {
      (l < kLayers / 2 ? a : b).push_back(std::move(t));
    }
  }
  std::vector<PlannedTensor> c;
  for (PlannedTensor& t : PlannedTensors(RolePlace::kLastStage, -1)) {
    (t.name == "lm_head.weight" ? c : b).push_back(std::move(t));
  }
  return {{"model-00001-of-00003.safetensors", a},
          {"model-00002-of-00003.safetensors", b},
          {"model-00003-of-00003.safetensors", c}};
}

// Writes `tensors` as one F32 safetensors file (layout: common/format/safetensors.h),
// data in the order given, generating values in 1 MiB chunks so the writer
// never holds more than that. Errors: kIoError naming `path`.
Status WriteRandomSafetensors(const std::string& path, const std::vector<PlannedTensor>& tensors) {
  nlohmann::json header = nlohmann::json::object();
  uint64_t offset = 0;
  for (const PlannedTensor& t : tensors) {
    const uint64_t n = static_cast<uint64_t>(t.numel() * kF32);
    header[t.name] = {{"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {offset, offset + n}}};
    offset += n;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return IoError(path + ": cannot create: " + std::strerror(errno));
  bool ok = true;
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(text.size() >> (8 * i));
  ok = ok && std::fwrite(len, 1, 8, f) == 8;
  ok = ok && std::fwrite(text.data(), 1, text.size(), f) == text.size();
  std::vector<float> chunk(static_cast<size_t>(kMiB / kF32));
  for (const PlannedTensor& t : tensors) {
    const uint64_t seed = NameSeed(t.name);
    const uint64_t numel = static_cast<uint64_t>(t.numel());
    for (uint64_t begin = 0; ok && begin < numel; begin += chunk.size()) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(chunk.size(), numel - begin));
      for (size_t i = 0; i < n; ++i) chunk[i] = ValueAt(seed, begin + i);
      ok = std::fwrite(chunk.data(), sizeof(float), n, f) == n;
    }
  }
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) return IoError(path + ": write failed: " + std::strerror(errno));
  return Status::Ok();
}

Status WriteText(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  out.close();
  if (!out) return IoError(path + ": write failed");
  return Status::Ok();
}

std::string ConfigJson(bool tied) {
  nlohmann::json c = {
      {"architectures", nlohmann::json::array({"LlamaForCausalLM"})},
      {"model_type", "llama"},
      {"hidden_size", kHidden},
      {"intermediate_size", kInter},
      {"num_hidden_layers", kLayers},
      {"num_attention_heads", kHeads},
      {"num_key_value_heads", kKvHeads},
      {"vocab_size", kVocab},
      {"rms_norm_eps", 1e-5},
      {"rope_theta", 10000.0},
      {"max_position_embeddings", 2048},
      {"tie_word_embeddings", tied},
      {"torch_dtype", "float32"},
  };
  return c.dump(2);
}

// Writes the untied model to `untied` (3 shards + index) and the tied model to
// `tied` (hard links to the first two shards, an index without lm_head).
Status WriteModels(const std::string& untied, const std::string& tied) {
  nlohmann::json map_untied = nlohmann::json::object(), map_tied = nlohmann::json::object();
  int64_t size_untied = 0, size_tied = 0;
  for (const auto& [file, tensors] : ShardFiles()) {
    TESSERA_RETURN_IF_ERROR(WriteRandomSafetensors(untied + "/" + file, tensors));
    const bool in_tied = tensors.front().name != "lm_head.weight";
    if (in_tied) {
      std::error_code ec;
      fs::create_hard_link(untied + "/" + file, tied + "/" + file, ec);
      if (ec) return IoError(tied + "/" + file + ": cannot link: " + ec.message());
    }
    for (const PlannedTensor& t : tensors) {
      map_untied[t.name] = file;
      size_untied += t.numel() * kF32;
      if (in_tied) {
        map_tied[t.name] = file;
        size_tied += t.numel() * kF32;
      }
    }
  }
  auto index = [](int64_t size, const nlohmann::json& map) {
    return nlohmann::json{{"metadata", {{"total_size", size}}}, {"weight_map", map}}.dump(2);
  };
  TESSERA_RETURN_IF_ERROR(WriteText(untied + "/config.json", ConfigJson(false)));
  TESSERA_RETURN_IF_ERROR(
      WriteText(untied + "/model.safetensors.index.json", index(size_untied, map_untied)));
  TESSERA_RETURN_IF_ERROR(WriteText(tied + "/config.json", ConfigJson(true)));
  return WriteText(tied + "/model.safetensors.index.json", index(size_tied, map_tied));
}

class ModelEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    root_ = testing::MakeTempDir("shard-loading");
    untied_ = root_ + "/untied";
    tied_ = root_ + "/tied";
    fs::create_directories(untied_);
    fs::create_directories(tied_);
    const auto t0 = std::chrono::steady_clock::now();
    const Status st = WriteModels(untied_, tied_);
    ASSERT_TRUE(st.ok()) << st.ToString();
    std::printf("[ model    ] wrote %.1f MB of F32 weights (3 shard files) in %.1f s\n",
                static_cast<double>(TotalBytes()) / kMB,
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(root_, ec);
  }

  static int64_t TotalBytes() {
    int64_t n = 0;
    for (const auto& [file, tensors] : ShardFiles()) {
      for (const PlannedTensor& t : tensors) n += t.numel() * kF32;
    }
    return n;
  }

  static const std::string& untied() { return untied_; }
  static const std::string& tied() { return tied_; }

 private:
  static inline std::string root_, untied_, tied_;
};

[[maybe_unused]] ::testing::Environment* const kEnvironment =
    ::testing::AddGlobalTestEnvironment(new ModelEnvironment);

// ---- What a rank holds ------------------------------------------------------

// Every tensor of `w` bound to its (role, layer) (layer -1 for embed_tokens,
// the final norm and lm_head). The fields are named here, independently of
// the loader's own binding.
std::map<std::pair<TensorRole, int>, const Tensor*> HeldByRole(const StageWeights& w) {
  std::map<std::pair<TensorRole, int>, const Tensor*> out = {
      {{TensorRole::kEmbedTokens, -1}, &w.embed_tokens},
      {{TensorRole::kFinalNorm, -1}, &w.final_norm},
      {{TensorRole::kLmHead, -1}, &w.lm_head}};
  const std::vector<std::pair<TensorRole, Tensor LayerWeights::*>> fields = {
      {TensorRole::kInputNorm, &LayerWeights::input_norm},
      {TensorRole::kQProj, &LayerWeights::q_proj},
      {TensorRole::kQBias, &LayerWeights::q_bias},
      {TensorRole::kKProj, &LayerWeights::k_proj},
      {TensorRole::kKBias, &LayerWeights::k_bias},
      {TensorRole::kVProj, &LayerWeights::v_proj},
      {TensorRole::kVBias, &LayerWeights::v_bias},
      {TensorRole::kQNorm, &LayerWeights::q_norm},
      {TensorRole::kKNorm, &LayerWeights::k_norm},
      {TensorRole::kOProj, &LayerWeights::o_proj},
      {TensorRole::kOBias, &LayerWeights::o_bias},
      {TensorRole::kPostAttentionNorm, &LayerWeights::post_norm},
      {TensorRole::kPreFeedforwardNorm, &LayerWeights::pre_ff_norm},
      {TensorRole::kGateProj, &LayerWeights::gate_proj},
      {TensorRole::kGateBias, &LayerWeights::gate_bias},
      {TensorRole::kUpProj, &LayerWeights::up_proj},
      {TensorRole::kUpBias, &LayerWeights::up_bias},
      {TensorRole::kDownProj, &LayerWeights::down_proj},
      {TensorRole::kDownBias, &LayerWeights::down_bias},
      {TensorRole::kPostFeedforwardNorm, &LayerWeights::post_ff_norm},
  };
  for (size_t i = 0; i < w.layers.size(); ++i) {
    const int layer = w.layout.first_layer + static_cast<int>(i);
    for (const auto& [role, member] : fields) out[{role, layer}] = &(w.layers[i].*member);
  }
  return out;
}

// Bytes of the slices of `spec` in the checkpoint (F32), each distinct
// (name, begin, end) once: what a shard-only loader must pread.
int64_t SliceFileBytes(const ShardSpec& spec) {
  std::set<std::tuple<std::string, int64_t, int64_t>> seen;
  int64_t bytes = 0;
  for (const TensorShard& t : spec.tensors()) {
    if (!seen.emplace(t.name, t.begin, t.end).second) continue;
    int64_t n = 1;
    for (size_t d = 0; d < t.full_shape.size(); ++d) {
      n *= static_cast<int>(d) == t.split_dim ? t.end - t.begin : t.full_shape[d];
    }
    bytes += n * kF32;
  }
  return bytes;
}

// Checks every element of every shard of `spec` in `w` against the
// generator (padding rows must be zero). Returns the elements checked, or -1
// with `error` set at the first mismatch.
int64_t CheckValues(const ShardSpec& spec, const StageWeights& w, std::string* error) {
  const std::map<std::pair<TensorRole, int>, const Tensor*> held = HeldByRole(w);
  int64_t checked = 0;
  for (const TensorShard& t : spec.tensors()) {
    auto it = held.find({t.role, t.layer});
    if (it == held.end() || !it->second->defined()) {
      *error = "role " + t.role_name + " is not held";
      return -1;
    }
    const Tensor& x = *it->second;
    if (x.shape() != t.local_shape || x.dtype() != DType::kF32) {
      *error =
          "role " + t.role_name + " is " + x.Describe() + ", want " + ShapeToString(t.local_shape);
      return -1;
    }
    const uint64_t seed = NameSeed(t.name);
    const int64_t cols = t.full_shape.size() == 2 ? t.full_shape[1] : 1;
    const int64_t local_rows = t.local_shape[0];
    const int64_t local_cols = t.local_shape.size() == 2 ? t.local_shape[1] : 1;
    const float* v = x.data<float>();
    for (int64_t i = 0; i < local_rows; ++i) {
      const int64_t gi = t.split_dim == 0 ? t.begin + i : i;
      const bool padding = t.split_dim == 0 && gi >= t.end;
      for (int64_t j = 0; j < local_cols; ++j) {
        const int64_t gj = t.split_dim == 1 ? t.begin + j : j;
        const float want = padding ? 0.0f : ValueAt(seed, static_cast<uint64_t>(gi * cols + gj));
        const float got = v[i * local_cols + j];
        if (got != want) {
          char buf[256];
          std::snprintf(buf, sizeof buf, "role %s local [%" PRId64 ", %" PRId64 "] = %g, want %g",
                        t.role_name.c_str(), i, j, static_cast<double>(got),
                        static_cast<double>(want));
          *error = buf;
          return -1;
        }
      }
    }
    checked += local_rows * local_cols;
  }
  return checked;
}

// ---- Loading one rank in a child process ------------------------------------

// What a child reports back through the pipe. Plain data.
struct RankReport {
  char error[512];                 // empty when every step succeeded
  int64_t weight_bytes = 0;        // StageWeights::weight_bytes
  int64_t held_bytes = 0;          // sum of nbytes of the distinct held tensors
  int64_t bytes_read = 0;          // Checkpoint::BytesRead() after loading
  int64_t syscall_read_bytes = 0;  // /proc/self/io rchar growth during LoadStageWeights
  int64_t rss_before = 0;          // VmRSS before anything was opened, bytes
  int64_t hwm_after = 0;           // VmHWM after loading, bytes
  int64_t rss_file_growth = 0;     // RssFile after - before, bytes
  int64_t values_checked = 0;      // elements compared with the generator
  bool holds_embed = false;        // StageWeights::embed_tokens is defined
  bool holds_lm_head = false;      // StageWeights::lm_head is defined
  double seconds = 0;              // LoadStageWeights wall time

  int64_t peak_rss() const { return hwm_after - rss_before; }
};

// Reads a /proc file with raw syscalls (no stdio buffers). Returns the bytes
// the read calls returned, i.e. what they added to rchar.
int64_t ReadProc(const char* path, std::string* text) {
  text->clear();
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  char buf[4096];
  ssize_t n;
  int64_t total = 0;
  while ((n = ::read(fd, buf, sizeof buf)) > 0) {
    text->append(buf, static_cast<size_t>(n));
    total += n;
  }
  ::close(fd);
  return total;
}

// The number after "<key>" in `text` ("VmRSS:\t  1234 kB" -> 1234), or -1.
int64_t Field(const std::string& text, const std::string& key) {
  const size_t p = text.find(key);
  if (p == std::string::npos) return -1;
  return std::strtoll(text.c_str() + p + key.size(), nullptr, 10);
}

void Fail(RankReport* r, const std::string& what) {
  std::snprintf(r->error, sizeof r->error, "%s", what.c_str());
}

// Runs in the child: loads rank `rank` of tp x pp from `dir` and measures.
void LoadAndMeasure(const std::string& dir, int tp, int pp, int rank, RankReport* r) {
  std::string status, io;
  ReadProc("/proc/self/status", &status);
  r->rss_before = Field(status, "VmRSS:") * 1024;
  const int64_t rss_file_before = Field(status, "RssFile:") * 1024;

  auto config = LoadModelConfig(dir);
  if (!config.ok()) return Fail(r, config.status().ToString());
  auto parallel = ParallelConfig::Make(config.value(), tp, pp);
  if (!parallel.ok()) return Fail(r, parallel.status().ToString());
  auto spec = ShardSpec::Make(config.value(), parallel.value(), rank);
  if (!spec.ok()) return Fail(r, spec.status().ToString());
  auto ckpt = Checkpoint::Open(dir);
  if (!ckpt.ok()) return Fail(r, ckpt.status().ToString());

  const int64_t own_read = ReadProc("/proc/self/io", &io);
  const int64_t rchar_before = Field(io, "rchar:");
  const auto t0 = std::chrono::steady_clock::now();
  auto weights = LoadStageWeights(*ckpt.value(), config.value(), parallel.value(), spec.value());
  r->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ReadProc("/proc/self/io", &io);
  r->syscall_read_bytes = Field(io, "rchar:") - rchar_before - own_read;
  if (!weights.ok()) return Fail(r, weights.status().ToString());

  ReadProc("/proc/self/status", &status);
  r->hwm_after = Field(status, "VmHWM:") * 1024;
  r->rss_file_growth = Field(status, "RssFile:") * 1024 - rss_file_before;
  if (r->rss_before <= 0 || r->hwm_after <= 0 || rss_file_before < 0 || rchar_before < 0) {
    return Fail(r, "cannot parse /proc/self/status or /proc/self/io");
  }

  const StageWeights& w = weights.value();
  r->weight_bytes = w.weight_bytes;
  r->bytes_read = ckpt.value()->BytesRead();
  r->holds_embed = w.embed_tokens.defined();
  r->holds_lm_head = w.lm_head.defined();
  std::set<const void*> distinct;
  for (const auto& [role, t] : HeldByRole(w)) {
    if (t->defined() && distinct.insert(t->raw()).second) {
      r->held_bytes += static_cast<int64_t>(t->nbytes());
    }
  }
  std::string error;
  r->values_checked = CheckValues(spec.value(), w, &error);
  if (r->values_checked < 0) Fail(r, error);
}

// Forks a child that runs LoadAndMeasure and returns its report; a child that
// crashes or reports short yields a report with `error` set.
RankReport MeasureInChild(const std::string& dir, int tp, int pp, int rank) {
  RankReport report{};
  int fds[2];
  if (::pipe(fds) != 0) {
    Fail(&report, std::string("pipe: ") + std::strerror(errno));
    return report;
  }
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = ::fork();
  if (pid < 0) {
    Fail(&report, std::string("fork: ") + std::strerror(errno));
    return report;
  }
  if (pid == 0) {  // child: no gtest, no atexit handlers (they would remove the model)
    ::close(fds[0]);
    RankReport r{};
    LoadAndMeasure(dir, tp, pp, rank, &r);
    const char* p = reinterpret_cast<const char*>(&r);
    size_t left = sizeof r;
    while (left > 0) {
      const ssize_t n = ::write(fds[1], p, left);
      if (n <= 0) ::_exit(2);
      p += n;
      left -= static_cast<size_t>(n);
    }
    ::_exit(0);
  }
  ::close(fds[1]);
  char* p = reinterpret_cast<char*>(&report);
  size_t got = 0;
  ssize_t n;
  while (got < sizeof report && (n = ::read(fds[0], p + got, sizeof report - got)) > 0) {
    got += static_cast<size_t>(n);
  }
  ::close(fds[0]);
  int wstatus = 0;
  ::waitpid(pid, &wstatus, 0);
  if (got != sizeof report || !WIFEXITED(wstatus) || WEXITSTATUS(wstatus) != 0) {
    report = RankReport{};
    Fail(&report, "child for rank " + std::to_string(rank) + " died (wait status " +
                      std::to_string(wstatus) + ", " + std::to_string(got) + " bytes reported)");
  }
  return report;
}

// Reports are cached per test binary run: the tests below check different
// properties of the same loads.
const RankReport& Measure(const std::string& dir, int tp, int pp, int rank) {
  static std::map<std::tuple<std::string, int, int, int>, RankReport> cache;
  const auto key = std::make_tuple(dir, tp, pp, rank);
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, MeasureInChild(dir, tp, pp, rank)).first;
  return it->second;
}

ModelConfig Config(const std::string& dir) {
  auto c = LoadModelConfig(dir);
  TESSERA_CHECK(c.ok());
  return c.value();
}

ShardSpec Spec(const ModelConfig& config, int tp, int pp, int rank) {
  auto parallel = ParallelConfig::Make(config, tp, pp);
  TESSERA_CHECK(parallel.ok());
  auto spec = ShardSpec::Make(config, parallel.value(), rank);
  TESSERA_CHECK(spec.ok());
  return std::move(spec).value();
}

std::string Layout(int tp, int pp) {
  return "tp=" + std::to_string(tp) + " pp=" + std::to_string(pp);
}

void PrintRow(const std::string& layout, int rank, int64_t shard_bytes, const RankReport& r) {
  std::printf("[ table    ] %-16s %4d %10.1f %10.1f %12.1f %8.2f\n", layout.c_str(), rank,
              static_cast<double>(shard_bytes) / kMB, static_cast<double>(r.bytes_read) / kMB,
              static_cast<double>(r.peak_rss()) / kMB, r.seconds);
}

void PrintHeader() {
  std::printf("[ table    ] %-16s %4s %10s %10s %12s %8s\n", "layout", "rank", "shard MB",
              "read MB", "peak RSS MB", "load s");
}

// ---- 1. Exact bytes held and read -------------------------------------------

TEST(ShardLoading, EveryRankHoldsAndReadsExactlyItsShard) {
  const ModelConfig config = Config(ModelEnvironment::untied());
  for (const auto& [tp, pp] : kLayouts) {
    int64_t read_by_all = 0;
    for (int rank = 0; rank < tp * pp; ++rank) {
      SCOPED_TRACE(Layout(tp, pp) + " rank " + std::to_string(rank));
      const RankReport& r = Measure(ModelEnvironment::untied(), tp, pp, rank);
      ASSERT_STREQ(r.error, "");
      const ShardSpec spec = Spec(config, tp, pp, rank);
      const int64_t shard_bytes = spec.WeightBytes(DType::kF32);
      EXPECT_EQ(r.weight_bytes, shard_bytes);
      EXPECT_EQ(r.held_bytes, shard_bytes);
      EXPECT_EQ(r.values_checked * kF32, shard_bytes);
      // Only the slices were read, in the file dtype (F32), padding excluded:
      // by the checkpoint's own count and by the kernel's count of read syscalls.
      EXPECT_EQ(r.bytes_read, SliceFileBytes(spec));
      EXPECT_EQ(r.syscall_read_bytes, SliceFileBytes(spec));
      read_by_all += r.bytes_read;
    }
    // Together the ranks read the whole checkpoint (plus replicated parts),
    // and without replication (tp <= kv heads) each byte exactly once.
    if (tp <= kKvHeads) {
      const int64_t norms = (2 * kLayers + 1) * kHidden * kF32;
      EXPECT_EQ(read_by_all, ModelEnvironment::TotalBytes() + (tp - 1) * norms) << Layout(tp, pp);
    } else {
      EXPECT_GT(read_by_all, ModelEnvironment::TotalBytes()) << Layout(tp, pp);
    }
  }
}

// ---- 2. Peak RSS -------------------------------------------------------------

TEST(ShardLoading, PeakRssStaysUnderShardBytesPlus64MiB) {
  const ModelConfig config = Config(ModelEnvironment::untied());
  for (const auto& [tp, pp] : kLayouts) {
    for (int rank = 0; rank < tp * pp; ++rank) {
      SCOPED_TRACE(Layout(tp, pp) + " rank " + std::to_string(rank));
      const RankReport& r = Measure(ModelEnvironment::untied(), tp, pp, rank);
      ASSERT_STREQ(r.error, "");
      const int64_t shard_bytes = Spec(config, tp, pp, rank).WeightBytes(DType::kF32);
      EXPECT_LT(r.peak_rss(), shard_bytes + kRssSlack)
          << "peak RSS " << r.peak_rss() << " B, shard " << shard_bytes << " B";
      // The held weights themselves are resident (a lower bound that shows
      // the measurement sees the load at all).
      EXPECT_GE(r.peak_rss(), shard_bytes - 4 * kMiB);
      // No page of the mmapped checkpoint was faulted in.
      EXPECT_LT(r.rss_file_growth, kRssFileSlack);
    }
  }
}

// ---- 3. Scaling with the world size ------------------------------------------

TEST(ShardLoading, PerRankMemoryFallsAsOneOverWorldSize) {
  const ModelConfig config = Config(ModelEnvironment::untied());
  const double full = static_cast<double>(ModelEnvironment::TotalBytes());
  const double norms = static_cast<double>((2 * kLayers + 1) * kHidden * kF32);
  std::map<std::pair<int, int>, int64_t> peak_rss;  // max over the layout's ranks
  PrintHeader();
  for (const auto& [tp, pp] : kLayouts) {
    SCOPED_TRACE(Layout(tp, pp));
    const int world = tp * pp;
    // Replicated parts, from the config alone: every norm, the vocab padding
    // rows of embed_tokens and lm_head, and for kv heads < tp the KV rows a
    // rank holds beyond kv_heads/tp of a head per layer.
    const int64_t vocab_padded = (kVocab + tp - 1) / tp * tp;
    const double padding = 2.0 * static_cast<double>((vocab_padded - kVocab) * kHidden * kF32);
    const double kv_extra = kKvHeads < tp
                                ? 2.0 * kLayers / pp * (1.0 - static_cast<double>(kKvHeads) / tp) *
                                      static_cast<double>(kHeadDim * kHidden * kF32)
                                : 0.0;
    const double replicated = norms + padding + kv_extra;
    int64_t max_bytes = 0, min_bytes = INT64_MAX;
    for (int rank = 0; rank < world; ++rank) {
      const RankReport& r = Measure(ModelEnvironment::untied(), tp, pp, rank);
      ASSERT_STREQ(r.error, "") << "rank " << rank;
      const int64_t shard_bytes = Spec(config, tp, pp, rank).WeightBytes(DType::kF32);
      ASSERT_EQ(r.weight_bytes, shard_bytes) << "rank " << rank;
      max_bytes = std::max(max_bytes, r.weight_bytes);
      min_bytes = std::min(min_bytes, r.weight_bytes);
      peak_rss[{tp, pp}] = std::max(peak_rss[{tp, pp}], r.peak_rss());
      PrintRow(Layout(tp, pp), rank, shard_bytes, r);
    }
    EXPECT_LE(static_cast<double>(max_bytes), full / world + replicated);
    // ... and the split is even: no rank holds much less than its share.
    EXPECT_GE(static_cast<double>(min_bytes), full / world - norms);
  }
  const double rss1 = static_cast<double>(peak_rss[{1, 1}]);
  EXPECT_LT(static_cast<double>(peak_rss[{2, 1}]), 0.60 * rss1);
  EXPECT_LT(static_cast<double>(peak_rss[{1, 2}]), 0.60 * rss1);
  EXPECT_LT(static_cast<double>(peak_rss[{4, 1}]), 0.35 * rss1);
  EXPECT_LT(static_cast<double>(peak_rss[{2, 2}]), 0.35 * rss1);
}

// ---- 4. Tied embeddings at pp=2 ------------------------------------------------

TEST(ShardLoading, TiedEmbeddingIsReadByFirstAndLastStageOnly) {
  const std::string dir = ModelEnvironment::tied();
  auto ckpt = Checkpoint::Open(dir);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().ToString();
  ASSERT_FALSE(ckpt.value()->Has("lm_head.weight"));
  const ModelConfig config = Config(dir);
  ASSERT_TRUE(config.tie_word_embeddings);

  PrintHeader();
  for (const int tp : {1, 2}) {
    const int pp = 2;
    // One layer's bytes on one tp rank, and a rank's embedding rows, from the
    // config alone; a stage reads only these, never the other stage's layers.
    const int64_t kv_rows = std::max<int64_t>(1, kKvHeads / tp) * kHeadDim;
    const int64_t layer_bytes = (2 * (kHeads / tp) * kHeadDim * kHidden + 2 * kv_rows * kHidden +
                                 3 * (kInter / tp) * kHidden + 2 * kHidden) *
                                kF32;
    const int64_t vocab_local = (kVocab + tp - 1) / tp;
    for (int rank = 0; rank < tp * pp; ++rank) {
      SCOPED_TRACE(Layout(tp, pp) + " rank " + std::to_string(rank));
      const RankReport& r = Measure(dir, tp, pp, rank);
      ASSERT_STREQ(r.error, "");
      const ShardSpec spec = Spec(config, tp, pp, rank);
      PrintRow("tied " + Layout(tp, pp), rank, spec.WeightBytes(DType::kF32), r);
      const bool first = spec.stage() == 0;
      const int64_t tp_rank = rank % tp;
      const int64_t embed_rows =
          std::min(kVocab, (tp_rank + 1) * vocab_local) - std::min(kVocab, tp_rank * vocab_local);
      // First stage: embed_tokens, layers [0, 2). Last stage: its vocab slice
      // of embed_tokens as lm_head, layers [2, 4), model.norm.
      EXPECT_EQ(r.holds_embed, first);
      EXPECT_EQ(r.holds_lm_head, !first);
      const int64_t want_read =
          embed_rows * kHidden * kF32 + kLayers / pp * layer_bytes + (first ? 0 : kHidden * kF32);
      EXPECT_EQ(r.bytes_read, want_read);
      EXPECT_EQ(r.syscall_read_bytes, want_read);
      EXPECT_EQ(r.weight_bytes, spec.WeightBytes(DType::kF32));
      EXPECT_EQ(r.held_bytes, spec.WeightBytes(DType::kF32));
      // lm_head's values are embed_tokens' (the check uses the checkpoint
      // tensor's name for the generator).
      EXPECT_EQ(r.values_checked * kF32, spec.WeightBytes(DType::kF32));
      EXPECT_LT(r.peak_rss(), spec.WeightBytes(DType::kF32) + kRssSlack);
    }
  }
}

}  // namespace
}  // namespace tessera
