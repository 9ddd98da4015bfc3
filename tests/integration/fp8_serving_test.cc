// FP8 checkpoints and online FP8 end to end on the CPU (issue #35), as real
// processes: `tessera generate` at tp 1, tp 2 and tp 2 x pp 2 on the HF
// fp8 (block-scaled, tp 2 cuts blocks) and compressed-tensors (per-channel)
// fixtures, and with --quantization fp8 on a bf16 fixture; the daemons
// (coordinator + 4 workers, tp 2 x pp 2) serving the HF fp8 fixture and
// (2 workers, tp 2) the bf16 fixture with model.quantization = "fp8".
// Bound: the 16 greedy tokens equal the reference's (every reference margin
// is at least 2.8e-3 and the dequantized weights are the reference's bit for
// bit, so Tessera's fp32 logits sit within 1e-4 of them:
// fp8_weights_test, model_reference_test). /admin/plan reports the
// quantization.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/net/http_client.h"
#include "common/tokenizer/tokenizer.h"
#include "support/daemon_cluster.h"
#include "support/test_util.h"

namespace tessera {
namespace {

using nlohmann::json;

std::string Fixture(const std::string& name) {
  return ::tessera::testing::FixturePath("models/" + name);
}

// stdout of `tessera generate` over the reference prompt `p`, greedy, 16
// tokens past EOS, with `args` added; fails the test on a non-zero exit.
std::string Generate(const std::string& model, const json& p, const std::string& args) {
  const std::string dir = ::tessera::testing::MakeTempDir("tessera-fp8-generate");
  std::string prompt = p["text"].get<std::string>();
  std::string quoted;
  for (char c : prompt) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  const auto r = ::tessera::testing::RunCommand(
      ::tessera::testing::BinaryDir() + "/tessera generate --model " + model + " --prompt '" +
      quoted + "' --raw --max-tokens 16 --ignore-eos --timeout 20 " + args + " 2>" + dir + "/err");
  EXPECT_EQ(r.rc, 0) << args << "\n" << ::tessera::testing::ReadFileOrDie(dir + "/err");
  return r.output;
}

// Each layout's greedy text of every prompt is the reference's.
void ExpectGenerateMatches(const std::string& name, const std::string& reference,
                           const std::vector<std::string>& layouts, const std::string& extra = "") {
  const std::string model = Fixture(name);
  const json ref = json::parse(::tessera::testing::ReadFileOrDie(model + "/" + reference));
  auto tok = Tokenizer::Load(model);
  ASSERT_TRUE(tok.ok());
  for (const std::string& layout : layouts) {
    // Two prompts per layout keep the test short; the first and the longest.
    for (size_t i : {size_t{0}, size_t{1}}) {
      const json& p = ref["prompts"][i];
      const std::string want = (*tok)->Decode(p["greedy"].get<std::vector<int32_t>>(), true);
      const std::string out = Generate(model, p, layout + " " + extra);
      EXPECT_EQ(out.substr(0, want.size() + 1), want + "\n")
          << name << " " << layout << " " << extra << " prompt " << i << "\n"
          << out;
    }
  }
}

TEST(Fp8Generate, HfFp8BlockCheckpointAtTp1Tp2AndTp2xPp2) {
  ExpectGenerateMatches("llama_fp8_block", "reference.json", {"--tp 1", "--tp 2", "--tp 2 --pp 2"});
}

TEST(Fp8Generate, CompressedTensorsChannelCheckpointAtTp2AndTp2xPp2) {
  ExpectGenerateMatches("qwen3_fp8_channel_ct", "reference.json", {"--tp 2", "--tp 2 --pp 2"});
}

TEST(Fp8Generate, OnlineQuantizationAtTp1AndTp2xPp2) {
  ExpectGenerateMatches("llama_mha_tied_bf16", "reference_online_fp8.json",
                        {"--tp 1", "--tp 2 --pp 2"}, "--quantization fp8");
}

TEST(Fp8Generate, AnUnknownQuantizationIsRefusedNamingTheFlag) {
  const auto r = ::tessera::testing::RunCommand(
      ::tessera::testing::BinaryDir() + "/tessera generate --model " +
      Fixture("llama_mha_tied_bf16") + " --prompt hi --raw --quantization int4 2>&1");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.output.find("--quantization"), std::string::npos) << r.output;
}

// The daemons' greedy completions of every reference prompt.
void ExpectServedMatches(::tessera::testing::DaemonCluster& cluster, const std::string& model,
                         const std::string& reference) {
  const json ref = json::parse(::tessera::testing::ReadFileOrDie(model + "/" + reference));
  auto tok = Tokenizer::Load(model);
  ASSERT_TRUE(tok.ok());
  for (const json& p : ref["prompts"]) {
    json req = {{"model", std::filesystem::path(model).filename().string()},
                {"prompt", p["ids"]},
                {"max_tokens", 16},
                {"temperature", 0},
                {"ignore_eos", true}};
    auto r = HttpCall(cluster.api_port(), "POST", "/v1/completions", req.dump());
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(json::parse(r.body)["choices"][0]["text"].get<std::string>(),
              (*tok)->Decode(p["greedy"].get<std::vector<int32_t>>(), true));
  }
}

// The value of the first sample of `series` (a name and the opening brace)
// in a Prometheus text page; -1 when absent.
double MetricValue(const std::string& page, const std::string& series) {
  const size_t at = page.find("\n" + series);
  if (at == std::string::npos) return -1;
  const size_t close = page.find("} ", at);
  return close == std::string::npos ? -1 : std::stod(page.substr(close + 2));
}

json Plan(::tessera::testing::DaemonCluster& cluster) {
  auto r = HttpCall(cluster.api_port(), "GET", "/admin/plan", "", "s3cret");
  EXPECT_EQ(r.status, 200) << r.body;
  return r.status == 200 ? json::parse(r.body) : json();
}

TEST(Fp8Daemons, ServeTheHfFp8CheckpointAtTp2xPp2) {
  ::tessera::testing::DaemonClusterOptions o;
  o.temp_prefix = "tessera-fp8-daemons";
  o.model_path = Fixture("llama_fp8_block");
  o.worker_metrics = true;
  ::tessera::testing::DaemonCluster cluster(o);
  const Status started = cluster.Start();
  ASSERT_TRUE(started.ok()) << started.ToString();
  ExpectServedMatches(cluster, o.model_path, "reference.json");
  const json plan = Plan(cluster);
  EXPECT_EQ(plan.value("quantization", ""),
            "fp8 (e4m3, block 32x32 weight scales, dynamic activations)")
      << plan.dump();
  // Every worker reports the FP8 bytes of its slices; the dense bytes it holds are more.
  for (int i = 0; i < 4; ++i) {
    auto m = HttpCall(cluster.metrics_port(i), "GET", "/metrics");
    ASSERT_EQ(m.status, 200);
    const double fp8 = MetricValue(m.body, "tessera_gpu_weight_quantized_bytes{");
    const double dense = MetricValue(m.body, "tessera_gpu_weight_bytes{");
    EXPECT_GT(fp8, 0) << "worker " << i;
    EXPECT_GT(dense, fp8) << "worker " << i;
  }
}

TEST(Fp8Daemons, QuantizeABf16CheckpointOnlineAtTp2) {
  ::tessera::testing::DaemonClusterOptions o;
  o.temp_prefix = "tessera-fp8-online";
  o.model_path = Fixture("llama_mha_tied_bf16");
  o.model_toml += "quantization = \"fp8\"\n";
  o.parallel_toml = "tp = 2\npp = 1\n";
  o.workers = 2;
  ::tessera::testing::DaemonCluster cluster(o);
  const Status started = cluster.Start();
  ASSERT_TRUE(started.ok()) << started.ToString();
  ExpectServedMatches(cluster, o.model_path, "reference_online_fp8.json");
  const json plan = Plan(cluster);
  EXPECT_EQ(plan.value("quantization", ""),
            "online-fp8 (e4m3, per-channel weight scales, dynamic activations)")
      << plan.dump();
}

}  // namespace
}  // namespace tessera
