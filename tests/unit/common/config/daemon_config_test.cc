#include "common/config/daemon_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/model/parallel_config.h"
#include "support/test_util.h"
#include "tests/unit/common/config/config_test_util.h"

namespace tessera {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::StartsWith;

// <repo>/configs, next to tests/.
std::string ConfigsDir() {
  return (std::filesystem::path(TESSERA_FIXTURES_DIR).parent_path().parent_path() / "configs")
      .string();
}

std::string WriteFile(const std::string& dir, const std::string& name, const std::string& text) {
  std::string path = dir + "/" + name;
  std::ofstream out(path, std::ios::binary);
  out << text;
  return path;
}

// Mode 0600: what a token file must have.
void OwnerOnly(const std::string& path) {
  std::filesystem::permissions(
      path, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
}

// ---------------------------------------------------------------------------
// Bundled examples.

TEST(DaemonConfigExamples, LocalCpuIsTheBundledDefault) {
  StatusOr<DaemonConfig> c = LoadDaemonConfig(ConfigsDir() + "/local-cpu.toml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->model.path, "models/default");
  EXPECT_EQ(ServedModelName(c->model), "default");
  EXPECT_EQ(c->model.dtype, DType::kF32);
  EXPECT_EQ(c->model.chat_template, std::nullopt);
  EXPECT_EQ(c->parallel.mode, ParallelMode::kExplicit);
  EXPECT_EQ(c->parallel.tp, 3);
  EXPECT_EQ(c->parallel.pp, 2);
  EXPECT_TRUE(c->parallel.layers_per_stage.empty());
  EXPECT_EQ(c->worker.backend, WorkerBackend::kCpu);
  for (const std::string& host : {c->server.host, c->admin.host, c->worker.gloo_host}) {
    EXPECT_EQ(host, "127.0.0.1");
  }
  EXPECT_EQ(c->server.control_endpoint, "tcp://127.0.0.1:5555");
  EXPECT_EQ(c->worker.coordinator, "tcp://127.0.0.1:5555");
  EXPECT_EQ(c->kv_cache.max_blocks, 512);
  EXPECT_EQ(c->scheduler.max_context, 2048);
  EXPECT_EQ(c->sources.at("parallel.tp"), ConfigsDir() + "/local-cpu.toml:25:6");
}

TEST(DaemonConfigExamples, SingleNodeGpu) {
  StatusOr<DaemonConfig> c = LoadDaemonConfig(ConfigsDir() + "/single-node-gpu.toml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->parallel.mode, ParallelMode::kAuto);
  EXPECT_EQ(c->model.dtype, DType::kBF16);
  EXPECT_EQ(ServedModelName(c->model), "llama-3.1-8b-instruct");
  EXPECT_EQ(c->worker.backend, WorkerBackend::kCuda);
  EXPECT_EQ(c->logging.format, LogFormat::kJson);
  EXPECT_EQ(c->worker.metrics_port, 9100);
}

TEST(DaemonConfigExamples, MultiNode) {
  StatusOr<DaemonConfig> c = LoadDaemonConfig(ConfigsDir() + "/multi-node.toml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->parallel.tp, 8);
  EXPECT_EQ(c->parallel.pp, 4);
  EXPECT_THAT(c->parallel.layers_per_stage, ElementsAre(19, 21, 21, 19));
  EXPECT_EQ(c->server.control_endpoint, "tcp://*:5555");
  EXPECT_EQ(c->worker.coordinator, "tcp://10.0.0.1:5555");
  EXPECT_EQ(c->admin.port, 0);
  EXPECT_EQ(c->admin.effective_token, "change-me-0123456789");
}

// FormatDaemonConfig writes every key; parsing it back gives the same config.
TEST(DaemonConfigExamples, FormatRoundTrips) {
  for (const char* name : {"local-cpu.toml", "single-node-gpu.toml", "multi-node.toml"}) {
    SCOPED_TRACE(name);
    StatusOr<DaemonConfig> c = LoadDaemonConfig(ConfigsDir() + "/" + name);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    std::string text = FormatDaemonConfig(*c, false);
    StatusOr<DaemonConfig> again = ParseDaemonConfig(text, "formatted.toml");
    ASSERT_TRUE(again.ok()) << again.status().ToString() << "\n" << text;
    EXPECT_EQ(FormatDaemonConfig(*again, false), text);
    EXPECT_EQ(again->parallel.mode, c->parallel.mode);
  }
  DaemonConfig secret;
  secret.admin.token = "s3cret";
  EXPECT_THAT(FormatDaemonConfig(secret, true),
              AllOf(HasSubstr("token = \"<redacted>\""), ::testing::Not(HasSubstr("s3cret"))));
}

// docs/configuration.md has a row for every key, in its table's section.
TEST(DaemonConfigExamples, DocsListEveryKey) {
  std::string docs = testing::ReadFileOrDie(ConfigsDir() + "/../docs/configuration.md");
  std::istringstream formatted(FormatDaemonConfig(DaemonConfig{}, false) +
                               "[parallel]\ntp = 1\npp = 1\nlayers_per_stage = []\n"
                               "replica_override = []\n");
  std::string line, section;
  int keys = 0;
  while (std::getline(formatted, line)) {
    if (line.empty()) continue;
    if (line.front() == '[') {
      size_t start = docs.find("### `" + line + "`");
      ASSERT_NE(start, std::string::npos) << line;
      size_t end = docs.find("\n### ", start + 1);
      section = docs.substr(start, end == std::string::npos ? std::string::npos : end - start);
      continue;
    }
    std::string key = line.substr(0, line.find(' '));
    EXPECT_THAT(section, HasSubstr("| `" + key + "` |")) << section.substr(0, 30);
    ++keys;
  }
  EXPECT_EQ(keys, 74);
}

TEST(DaemonConfigParse, TpPerStageArray) {
  StatusOr<DaemonConfig> c =
      ParseDaemonConfig("[parallel]\ntp = [2, 1]\npp = 2\nlayers_per_stage = [1, 1]\n", "x.toml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->parallel.mode, ParallelMode::kExplicit);
  EXPECT_EQ(c->parallel.tp, 0);
  EXPECT_THAT(c->parallel.tp_per_stage, ElementsAre(2, 1));
  EXPECT_EQ(c->parallel.TpOfStage(0), 2);
  EXPECT_EQ(c->parallel.TpOfStage(1), 1);
  EXPECT_EQ(c->parallel.world_size(), 3);
  EXPECT_EQ(c->sources.at("parallel.tp"), "x.toml:2:6");
  // Formats back as an array and parses to the same layout.
  const std::string text = FormatDaemonConfig(*c, false);
  EXPECT_THAT(text, HasSubstr("tp = [2, 1]\n"));
  StatusOr<DaemonConfig> again = ParseDaemonConfig(text, "again.toml");
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_THAT(again->parallel.tp_per_stage, ElementsAre(2, 1));
  // An integer override replaces the array; an array override the integer.
  ASSERT_TRUE(ApplyOverride(*c, "parallel.tp", "4").ok());
  EXPECT_EQ(c->parallel.tp, 4);
  EXPECT_TRUE(c->parallel.tp_per_stage.empty());
  EXPECT_EQ(c->parallel.world_size(), 8);
  ASSERT_TRUE(ApplyOverride(*c, "parallel.tp", "[1, 4]").ok());
  EXPECT_THAT(c->parallel.tp_per_stage, ElementsAre(1, 4));
  EXPECT_EQ(ApplyOverride(*c, "parallel.tp", "[1, 4, 4]").message(),
            "--set parallel.tp=[1, 4, 4]: parallel.tp: must have one entry per stage "
            "(parallel.pp = 2), got 3 entries [1, 4, 4]");
  EXPECT_THAT(c->parallel.tp_per_stage, ElementsAre(1, 4));  // unchanged on error
}

TEST(DaemonConfigParse, TpPerStageTypeErrorsNameLineColAndEntry) {
  auto err = [](const std::string& toml) {
    StatusOr<DaemonConfig> c = ParseDaemonConfig(toml, "x.toml");
    return c.ok() ? std::string() : c.status().message();
  };
  EXPECT_EQ(err("[parallel]\npp = 2\ntp = [2, \"1\"]\n"),
            "x.toml:3:10: parallel.tp[1]: expected an integer, got string \"1\"");
  EXPECT_EQ(err("[parallel]\ntp = \"2\"\n"),
            "x.toml:2:6: parallel.tp: expected an integer or an array of integers (one per "
            "stage), got string \"2\"");
  EXPECT_EQ(err("[parallel]\ntp = []\n"),
            "x.toml:2:6: parallel.tp: expected one entry per stage, got []");
}

// ---------------------------------------------------------------------------
// Defaults.

TEST(DaemonConfigDefaults, EmptyFileGivesDefaults) {
  StatusOr<DaemonConfig> c = ParseDaemonConfig("# nothing\n", "empty.toml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE(c->sources.empty());
  EXPECT_EQ(FormatDaemonConfig(*c, false), FormatDaemonConfig(DaemonConfig{}, false));
  EXPECT_TRUE(ValidateDaemonConfig(DaemonConfig{}).ok());

  EXPECT_EQ(c->model.path, "models/default");
  EXPECT_EQ(c->model.dtype, std::nullopt);
  EXPECT_EQ(c->parallel.mode, ParallelMode::kAuto);
  EXPECT_EQ(c->server.host, "127.0.0.1");
  EXPECT_EQ(c->server.port, 8000);
  EXPECT_EQ(c->admin.host, "127.0.0.1");
  EXPECT_EQ(c->admin.port, 8001);
  EXPECT_EQ(c->server.control_endpoint, "tcp://127.0.0.1:5555");
  EXPECT_EQ(c->worker.coordinator, "tcp://127.0.0.1:5555");
  EXPECT_EQ(c->worker.gloo_host, "");  // the address routing to the coordinator
  EXPECT_EQ(c->worker.topology_file, "");
  EXPECT_EQ(c->parallel.workers, 0);
  EXPECT_EQ(c->parallel.objective, ParallelObjective::kLatency);
  EXPECT_EQ(c->worker.metrics_port, 0);
  EXPECT_EQ(c->heartbeat.interval_seconds, 1.0);
  EXPECT_EQ(c->heartbeat.timeout_seconds, 10.0);
  EXPECT_EQ(c->kv_cache.memory_fraction, 0.9);
  EXPECT_EQ(c->kv_cache.block_size, 16);
  EXPECT_TRUE(c->kv_cache.prefix_caching);
  EXPECT_EQ(c->scheduler.max_batch_tokens, 4096);
  EXPECT_EQ(c->scheduler.queue_limit, 256);
  EXPECT_EQ(c->logging.level, LogLevel::kInfo);
  EXPECT_EQ(c->logging.format, LogFormat::kText);
  EXPECT_EQ(c->admin.effective_token, "");
}

TEST(DaemonConfigDefaults, NamesAndEnums) {
  StatusOr<DaemonConfig> c = ParseDaemonConfig(
      "[model]\ndtype = \"float16\"\nchat_template = \"llama2\"\n"
      "[logging]\nlevel = \"critical\"\n[worker]\nbackend = \"cuda\"\n",
      "x.toml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->model.dtype, DType::kF16);
  EXPECT_EQ(c->model.chat_template, ChatFormat::kLlama2);
  EXPECT_EQ(c->model.quantization, QuantMethod::kNone);
  StatusOr<DaemonConfig> fp8 = ParseDaemonConfig("[model]\nquantization = \"fp8\"\n", "x.toml");
  ASSERT_TRUE(fp8.ok()) << fp8.status().ToString();
  EXPECT_EQ(fp8->model.quantization, QuantMethod::kOnlineFp8);
  EXPECT_STREQ(LogLevelName(c->logging.level), "critical");
  EXPECT_STREQ(WorkerBackendName(c->worker.backend), "cuda");
  EXPECT_STREQ(LogFormatName(LogFormat::kJson), "json");
  EXPECT_STREQ(ParallelModeName(ParallelMode::kExplicit), "explicit");
  ModelSection m;
  m.path = "/models/Qwen2.5-0.5B/";
  EXPECT_EQ(ServedModelName(m), "Qwen2.5-0.5B");
}

TEST(DaemonConfigDefaults, ParallelModeIsInferred) {
  StatusOr<DaemonConfig> c = ParseDaemonConfig("[parallel]\npp = 2\n", "x.toml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->parallel.mode, ParallelMode::kExplicit);
  EXPECT_EQ(c->parallel.tp, 1);
  EXPECT_EQ(c->parallel.pp, 2);
}

// worker.coordinator follows a loopback or wildcard server.control_endpoint
// unless it is set; a wildcard bind host means this machine.
TEST(DaemonConfigDefaults, WorkerCoordinatorFollowsTheControlEndpoint) {
  StatusOr<DaemonConfig> c =
      ParseDaemonConfig("[server]\ncontrol_endpoint = \"tcp://127.0.0.2:6000\"\n", "x.toml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->worker.coordinator, "tcp://127.0.0.2:6000");
  // --set of the control endpoint moves the workers' endpoint too.
  ASSERT_TRUE(ApplyOverrides(*c, {"server.control_endpoint=tcp://127.0.0.1:6002"}).ok());
  EXPECT_EQ(c->worker.coordinator, "tcp://127.0.0.1:6002");
  // A wildcard bind (which needs CURVE on the coordinator's side).
  const std::string curve =
      "[control]\ncoordinator_secret_key_file = \"c.key\"\n"
      "worker_public_keys = [\"0123456789abcdefghijABCDEFGHIJ0123456789\"]\n";
  c = ParseDaemonConfig("[server]\ncontrol_endpoint = \"tcp://*:6001\"\n" + curve, "x.toml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->worker.coordinator, "tcp://127.0.0.1:6001");
  // Another address is left to the workers' own config.
  c = ParseDaemonConfig("[server]\ncontrol_endpoint = \"tcp://10.1.2.3:6001\"\n" + curve, "x.toml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->worker.coordinator, "tcp://127.0.0.1:5555");
  // An explicit worker.coordinator wins.
  c = ParseDaemonConfig(
      "[server]\ncontrol_endpoint = \"tcp://127.0.0.1:6001\"\n[worker]\ncoordinator = "
      "\"tcp://localhost:6001\"\n",
      "x.toml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->worker.coordinator, "tcp://localhost:6001");
  ASSERT_TRUE(ApplyOverrides(*c, {"server.control_endpoint=tcp://127.0.0.1:6003"}).ok());
  EXPECT_EQ(c->worker.coordinator, "tcp://localhost:6001");
  // Neither set: the default.
  c = ParseDaemonConfig("# nothing\n", "x.toml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->worker.coordinator, "tcp://127.0.0.1:5555");
}

// Dotted keys and inline tables are TOML too.
TEST(DaemonConfigDefaults, DottedKeysAndInlineTables) {
  StatusOr<DaemonConfig> c = ParseDaemonConfig(
      "scheduler.queue_limit = 7\nheartbeat = { interval_seconds = 2, timeout_seconds = 3 }\n",
      "x.toml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->scheduler.queue_limit, 7);
  EXPECT_EQ(c->heartbeat.interval_seconds, 2.0);  // an integer is accepted for a number
  EXPECT_EQ(c->heartbeat.timeout_seconds, 3.0);
}

// ---------------------------------------------------------------------------
// Unknown keys, wrong types, malformed TOML.

TEST(DaemonConfigParse, UnknownKeyListsTheValidKeys) {
  EXPECT_EQ(
      ParseError("[scheduler]\nmax_batch_token = 64\n"),
      "x.toml:2:1: scheduler.max_batch_token: unknown key; did you mean 'max_batch_tokens'?; valid "
      "keys of [scheduler]: max_batch_tokens, max_sequences, queue_limit, max_context, "
      "prefill_chunk_tokens, prefill_chunk_budget, max_prompt_tokens, max_completion_tokens, "
      "drain_timeout_seconds, runs_on");
  EXPECT_EQ(
      ParseError("[heartbeat]\n  jitter = 1\n"),
      "x.toml:2:3: heartbeat.jitter: unknown key; valid keys of [heartbeat]: interval_seconds, "
      "timeout_seconds, forget_failed_after_seconds, load_timeout_seconds, "
      "step_timeout_seconds");
  // A sub-table is an unknown key of its table.
  EXPECT_THAT(
      ParseError("[server.extra]\nx = 1\n"),
      StartsWith("x.toml:1:9: server.extra: unknown key; valid keys of [server]: host, port,"));
}

TEST(DaemonConfigParse, UnknownTable) {
  EXPECT_EQ(
      ParseError("[schedular]\n"),
      "x.toml:1:2: unknown table 'schedular'; did you mean 'scheduler'?; valid tables: model, "
      "parallel, server, heartbeat, kv_cache, scheduler, admin, control, store, logging, worker, "
      "structured_output");
  EXPECT_THAT(ParseError("port = 8000\n"),
              AllOf(StartsWith("x.toml:1:1: unknown table 'port'"),
                    HasSubstr("'port' is a key of [server], [admin]")));
}

TEST(DaemonConfigParse, WrongTypeNamesExpectedAndGot) {
  EXPECT_EQ(ParseError("[server]\nport = \"8000\"\n"),
            "x.toml:2:8: server.port: expected an integer, got string \"8000\"");
  EXPECT_EQ(ParseError("[scheduler]\nqueue_limit = 1.5\n"),
            "x.toml:2:15: scheduler.queue_limit: expected an integer, got float 1.5");
  EXPECT_EQ(ParseError("[model]\npath = 3\n"),
            "x.toml:2:8: model.path: expected a string, got integer 3");
  EXPECT_EQ(ParseError("[heartbeat]\ntimeout_seconds = true\n"),
            "x.toml:2:19: heartbeat.timeout_seconds: expected a number, got boolean true");
  EXPECT_EQ(
      ParseError("[parallel]\nlayers_per_stage = 15\n"),
      "x.toml:2:20: parallel.layers_per_stage: expected an array of integers, got integer 15");
  EXPECT_EQ(ParseError("[parallel]\npp = 2\nlayers_per_stage = [15, \"15\"]\n"),
            "x.toml:3:25: parallel.layers_per_stage[1]: expected an integer, got string \"15\"");
  EXPECT_EQ(ParseError("model = \"models/default\"\n"),
            "x.toml:1:9: model: expected a table, got string \"models/default\"");
  EXPECT_EQ(ParseError("[parallel]\ntp = 3000000000\n"),
            "x.toml:2:6: parallel.tp: must be between -2147483648 and 2147483647, got 3000000000");
}

TEST(DaemonConfigParse, InvalidChoiceListsTheChoices) {
  EXPECT_EQ(ParseError("[model]\ndtype = \"float64\"\n"),
            "x.toml:2:9: model.dtype: must be one of \"auto\", \"float32\", \"bfloat16\", "
            "\"float16\", got "
            "\"float64\"");
  EXPECT_EQ(ParseError("[logging]\nlevel = \"verbose\"\n"),
            "x.toml:2:9: logging.level: must be one of \"trace\", \"debug\", \"info\", \"warn\", "
            "\"error\", "
            "\"critical\", got \"verbose\"");
  EXPECT_EQ(
      ParseError("[logging]\nformat = 1\n"),
      "x.toml:2:10: logging.format: expected a string (one of \"text\", \"json\"), got integer 1");
  EXPECT_EQ(ParseError("[model]\nquantization = \"int4\"\n"),
            "x.toml:2:16: model.quantization: must be one of \"none\", \"fp8\", got \"int4\"");
  EXPECT_EQ(ParseError("[model]\nchat_template = \"vicuna\"\n"),
            "x.toml:2:17: model.chat_template: must be one of \"\", \"chatml\", \"llama3\", "
            "\"llama2\", got "
            "\"vicuna\"");
  EXPECT_EQ(ParseError("[parallel]\nmode = \"manual\"\n"),
            "x.toml:2:8: parallel.mode: must be one of \"auto\", \"explicit\", got \"manual\"");
  EXPECT_EQ(
      ParseError("[worker]\nbackend = \"rocm\"\n"),
      "x.toml:2:11: worker.backend: must be one of \"auto\", \"cpu\", \"cuda\", got \"rocm\"");
  EXPECT_EQ(ParseError("[kv_cache]\ndtype = \"int8\"\n"),
            "x.toml:2:9: kv_cache.dtype: must be one of \"auto\", \"fp8\", got \"int8\"");
  EXPECT_EQ(ParseError("[kv_cache]\nblock_size = 16\ndtype = \"float8_e4m3\"\n"),
            "x.toml:3:9: kv_cache.dtype: must be one of \"auto\", \"fp8\", got \"float8_e4m3\"");
  EXPECT_EQ(ParseError("[kv_cache]\ndtype = 8\n"),
            "x.toml:2:9: kv_cache.dtype: expected a string (one of \"auto\", \"fp8\"), got "
            "integer 8");
}

TEST(DaemonConfigParse, KvCacheDtypeIsAutoByDefaultOrFp8) {
  auto def = ParseDaemonConfig("", "x.toml");
  ASSERT_TRUE(def.ok());
  EXPECT_EQ(def->kv_cache.dtype, KvCacheDType::kAuto);
  auto fp8 = ParseDaemonConfig("[kv_cache]\ndtype = \"fp8\"\n", "x.toml");
  ASSERT_TRUE(fp8.ok()) << fp8.status().ToString();
  EXPECT_EQ(fp8->kv_cache.dtype, KvCacheDType::kFp8);
  auto back = ParseDaemonConfig("[kv_cache]\ndtype = \"auto\"\n", "x.toml");
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->kv_cache.dtype, KvCacheDType::kAuto);
  ASSERT_TRUE(ApplyOverride(*back, "kv_cache.dtype", "fp8").ok());
  EXPECT_EQ(back->kv_cache.dtype, KvCacheDType::kFp8);
  EXPECT_EQ(ApplyOverride(*back, "kv_cache.dtype", "fp16").code(), StatusCode::kInvalidArgument);
}

TEST(DaemonConfigParse, MalformedTomlGivesLineAndColumn) {
  EXPECT_THAT(ParseError("[scheduler]\nqueue_limit = 64\nmax_sequences = = 3\n"),
              StartsWith("x.toml:3:17: TOML syntax error: "));
  EXPECT_THAT(ParseError("[scheduler\n"), StartsWith("x.toml:1:"));
  EXPECT_THAT(ParseError("[model]\npath = \"a\"\npath = \"b\"\n"),
              AllOf(StartsWith("x.toml:3:"), HasSubstr("TOML syntax error")));
}

TEST(DaemonConfigLoad, MissingFileIsNotFound) {
  StatusOr<DaemonConfig> c = LoadDaemonConfig("/nonexistent/tessera.toml");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(c.status().message(), HasSubstr("/nonexistent/tessera.toml"));
}

TEST(DaemonConfigLoad, ErrorsNameTheLoadedFile) {
  std::string dir = testing::MakeTempDir("daemon-config");
  std::string path = WriteFile(dir, "bad.toml", "[kv_cache]\nblock_size = 0\n");
  StatusOr<DaemonConfig> c = LoadDaemonConfig(path);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().message(), path + ":2:14: kv_cache.block_size: must be >= 1, got 0");
}

TEST(DaemonConfigLoad, TokenFileIsRead) {
  std::string dir = testing::MakeTempDir("daemon-config");
  std::string token = WriteFile(dir, "token", "  abc-DEF_123==\n");
  OwnerOnly(token);
  StatusOr<DaemonConfig> c = ParseDaemonConfig(
      "[server]\nhost = \"0.0.0.0\"\n[admin]\nport = 0\ntoken_file = \"" + token + "\"\n",
      "x.toml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->admin.effective_token, "abc-DEF_123==");
  EXPECT_EQ(c->admin.token, "");

  std::string empty = WriteFile(dir, "empty", "\n \n");
  EXPECT_EQ(ParseError("[admin]\ntoken_file = \"" + empty + "\"\n"),
            "x.toml:2:14: admin.token_file: \"" + empty + "\" is empty");
  EXPECT_EQ(ParseError("[admin]\ntoken_file = \"" + dir + "/missing\"\n"),
            "x.toml:2:14: admin.token_file: cannot read \"" + dir +
                "/missing\": No such file or directory");
  EXPECT_EQ(ParseError("[admin]\ntoken_file = \"" + dir + "\"\n"),
            "x.toml:2:14: admin.token_file: \"" + dir + "\" is a directory");
  std::string spaced = WriteFile(dir, "spaced", "two words\n");
  EXPECT_THAT(ParseError("[admin]\ntoken_file = \"" + spaced + "\"\n"),
              HasSubstr("does not hold a bearer token"));
}

// Port 0 on every listener: the kernel picks the ports when the coordinator
// binds (tessera-coordinator --ports-file reports them), so two listeners at
// port 0 are not one listener, and no worker.coordinator is inferred.
TEST(DaemonConfigLoad, PortZeroListenersArePickedAtBind) {
  StatusOr<DaemonConfig> c = ParseDaemonConfig(
      "[server]\nport = 0\ncontrol_endpoint = \"tcp://127.0.0.1:0\"\n[admin]\npick_port = true\n",
      "x.toml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->server.port, 0);
  EXPECT_EQ(c->server.control_endpoint, "tcp://127.0.0.1:0");
  EXPECT_TRUE(c->admin.pick_port);
  EXPECT_EQ(c->worker.coordinator, "tcp://127.0.0.1:5555");  // the default, not port 0
  EXPECT_THAT(FormatDaemonConfig(*c, true), HasSubstr("pick_port = true\n"));
  // The admin API on a picked API port (admin.port = 0) and a wildcard
  // control endpoint at port 0.
  c = ParseDaemonConfig(
      "[server]\nport = 0\ncontrol_endpoint = \"tcp://*:0\"\n[admin]\nport = 0\n"
      "[control]\ncoordinator_secret_key_file = \"c.key\"\nworker_public_keys = "
      "[\"0123456789abcdefghijABCDEFGHIJ0123456789\"]\n",
      "x.toml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_FALSE(c->admin.pick_port);
  DaemonConfig d;
  ASSERT_TRUE(ApplyOverrides(d, {"server.port=0", "admin.pick_port=true"}).ok());
  EXPECT_TRUE(d.admin.pick_port);
  EXPECT_EQ(d.server.port, 0);
}

TEST(DaemonConfigLoad, TokenFileReadableByOthersIsRefused) {
  std::string dir = testing::MakeTempDir("daemon-config");
  std::string token = WriteFile(dir, "token", "abc\n");
  for (auto [mode, text] : {std::pair{0644, "0644"},
                            {0640, "0640"},
                            {0604, "0604"},
                            {0660, "0660"},
                            {0700 | 0020, "0720"}}) {
    std::filesystem::permissions(token, static_cast<std::filesystem::perms>(mode));
    EXPECT_EQ(ParseError("[admin]\ntoken_file = \"" + token + "\"\n"),
              "x.toml:2:14: admin.token_file: \"" + token +
                  "\" is accessible by group or others (mode " + text +
                  "); chmod 600 it (owner read/write only)");
  }
  for (int mode : {0600, 0400}) {
    std::filesystem::permissions(token, static_cast<std::filesystem::perms>(mode));
    StatusOr<DaemonConfig> c =
        ParseDaemonConfig("[admin]\ntoken_file = \"" + token + "\"\n", "x.toml");
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    EXPECT_EQ(c->admin.effective_token, "abc");
  }
  // An override is checked the same way.
  std::filesystem::permissions(token, static_cast<std::filesystem::perms>(0644));
  DaemonConfig c;
  Status s = ApplyOverrides(c, {"admin.token_file=" + token});
  EXPECT_EQ(s.message(), "--set admin.token_file=" + token + ": admin.token_file: \"" + token +
                             "\" is accessible by group or others (mode 0644); chmod 600 it "
                             "(owner read/write only)");
}

TEST(DaemonConfigLoad, TlsFilesMustBeReadable) {
  std::string dir = testing::MakeTempDir("daemon-config");
  std::string cert = WriteFile(dir, "cert.pem", "-----BEGIN CERTIFICATE-----\n");
  EXPECT_EQ(
      ParseError("[server]\ntls_cert = \"" + cert + "\"\ntls_key = \"" + dir + "/key.pem\"\n"),
      "x.toml:3:11: server.tls_key: cannot read \"" + dir +
          "/key.pem\": No such file or directory");
  std::string key = WriteFile(dir, "key.pem", "-----BEGIN PRIVATE KEY-----\n");
  EXPECT_EQ(ParseError("[server]\ntls_cert = \"" + cert + "\"\ntls_key = \"" + key + "\"\n"), "");
}

// ---------------------------------------------------------------------------
// Command-line overrides.

TEST(DaemonConfigOverride, SetsTypedValues) {
  StatusOr<DaemonConfig> c = LoadDaemonConfig(ConfigsDir() + "/local-cpu.toml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_TRUE(ApplyOverride(*c, "scheduler.queue_limit", "64").ok());
  EXPECT_EQ(c->scheduler.queue_limit, 64);
  EXPECT_EQ(c->sources.at("scheduler.queue_limit"), "--set scheduler.queue_limit=64");
  // Strings are taken verbatim, without TOML quotes.
  ASSERT_TRUE(ApplyOverride(*c, "model.path", "/data/my model").ok());
  EXPECT_EQ(c->model.path, "/data/my model");
  ASSERT_TRUE(ApplyOverride(*c, "logging.level", "debug").ok());
  EXPECT_EQ(c->logging.level, LogLevel::kDebug);
  ASSERT_TRUE(ApplyOverride(*c, "kv_cache.memory_fraction", "0.25").ok());
  EXPECT_EQ(c->kv_cache.memory_fraction, 0.25);
  ASSERT_TRUE(ApplyOverride(*c, "kv_cache.prefix_caching", "false").ok());
  EXPECT_FALSE(c->kv_cache.prefix_caching);
  ASSERT_TRUE(ApplyOverride(*c, "parallel.layers_per_stage", "[10, 20]").ok());
  EXPECT_THAT(c->parallel.layers_per_stage, ElementsAre(10, 20));
  ASSERT_TRUE(ApplyOverride(*c, "worker.device", "5").ok());
  EXPECT_EQ(c->worker.device, 5);
  ASSERT_TRUE(ApplyOverride(*c, "model.dtype", "auto").ok());
  EXPECT_EQ(c->model.dtype, std::nullopt);
}

TEST(DaemonConfigOverride, ErrorsNameTheFlagAndLeaveTheConfigUnchanged) {
  StatusOr<DaemonConfig> loaded = LoadDaemonConfig(ConfigsDir() + "/local-cpu.toml");
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  DaemonConfig c = *loaded;
  const std::string before = FormatDaemonConfig(c, false);
  struct Case {
    const char* key;
    const char* value;
    const char* message;
  };
  const Case cases[] = {
      {"scheduler.queue_limit", "0",
       "--set scheduler.queue_limit=0: scheduler.queue_limit: must be >= 1, got 0"},
      {"scheduler.queue_limit", "abc",
       "--set scheduler.queue_limit=abc: scheduler.queue_limit: expected an integer, got \"abc\""},
      {"scheduler.queue_limit", "1\nx = 2",
       "--set scheduler.queue_limit=1\nx = 2: scheduler.queue_limit: expected an integer, got "
       "\"1\\nx = 2\""},
      {"scheduler.queue_limit", "\"64\"",
       "--set scheduler.queue_limit=\"64\": scheduler.queue_limit: expected an integer, got string "
       "\"64\""},
      {"scheduler.queue_limt", "64",
       "--set scheduler.queue_limt=64: scheduler.queue_limt: unknown key; did you mean "
       "'queue_limit'?; "
       "valid keys of [scheduler]: max_batch_tokens, max_sequences, queue_limit, max_context, "
       "prefill_chunk_tokens, prefill_chunk_budget, max_prompt_tokens, max_completion_tokens, "
       "drain_timeout_seconds, runs_on"},
      {"sched.queue_limit", "64",
       "--set sched.queue_limit=64: unknown table 'sched'; did you mean 'scheduler'?; valid "
       "tables: model, "
       "parallel, server, heartbeat, kv_cache, scheduler, admin, control, store, logging, worker, "
       "structured_output"},
      {"logging.level", "loud",
       "--set logging.level=loud: logging.level: must be one of \"trace\", \"debug\", \"info\", "
       "\"warn\", "
       "\"error\", \"critical\", got \"loud\""},
      {"heartbeat.interval_seconds", "10",
       "--set heartbeat.interval_seconds=10: heartbeat.interval_seconds: must be < "
       "heartbeat.timeout_seconds (10.0), got 10.0"},
      {"parallel.pp", "0", "--set parallel.pp=0: parallel.pp: must be >= 1, got 0"},
      {"heartbeat.load_timeout_seconds", "0",
       "--set heartbeat.load_timeout_seconds=0: heartbeat.load_timeout_seconds: must be a finite "
       "number > 0, got 0.0"},
      {"heartbeat.step_timeout_seconds", "-1",
       "--set heartbeat.step_timeout_seconds=-1: heartbeat.step_timeout_seconds: must be a "
       "finite number > 0, got -1.0"},
      {"server.max_prompt_bytes", "0",
       "--set server.max_prompt_bytes=0: server.max_prompt_bytes: must be >= 1, got 0"},
      {"server.request_threads", "-1",
       "--set server.request_threads=-1: server.request_threads: must be >= 0 (0 = one per two "
       "hardware threads), got -1"},
  };
  for (const Case& cs : cases) {
    Status st = ApplyOverride(c, cs.key, cs.value);
    EXPECT_EQ(st.message(), cs.message);
    EXPECT_EQ(FormatDaemonConfig(c, false), before) << "changed by " << cs.key;
  }
  // A relation between an override and a file key names the flag and the other value.
  EXPECT_EQ(ApplyOverride(c, "scheduler.max_batch_tokens", "128").message(),
            "--set scheduler.max_batch_tokens=128: scheduler.max_batch_tokens: must be >= "
            "scheduler.prefill_chunk_tokens (256), got 128");
  EXPECT_FALSE(ApplyOverrides(c, {"scheduler.queue_limit"}).ok());
  EXPECT_EQ(ApplyOverrides(c, {"scheduler.queue_limit"}).message(),
            "--set scheduler.queue_limit: expected table.key=value");
}

// Overrides that are valid only together are applied, then validated once.
TEST(DaemonConfigOverride, SeveralAreValidatedTogether) {
  DaemonConfig c;
  EXPECT_FALSE(ApplyOverride(c, "heartbeat.interval_seconds", "20").ok());
  ASSERT_TRUE(
      ApplyOverrides(c, {"heartbeat.interval_seconds=20", "heartbeat.timeout_seconds=60"}).ok());
  EXPECT_EQ(c.heartbeat.interval_seconds, 20.0);
  EXPECT_EQ(c.heartbeat.timeout_seconds, 60.0);
}

TEST(DaemonConfigOverride, ParallelMode) {
  StatusOr<DaemonConfig> c = ParseDaemonConfig("[parallel]\nmode = \"auto\"\n", "x.toml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  // The file named "auto": tp conflicts with it.
  EXPECT_EQ(ApplyOverride(*c, "parallel.tp", "2").message(),
            "--set parallel.tp=2: parallel.tp: is set but parallel.mode = \"auto\" (at "
            "x.toml:2:8); remove "
            "it, or set parallel.mode = \"explicit\"");
  ASSERT_TRUE(ApplyOverrides(*c, {"parallel.mode=explicit", "parallel.tp=2"}).ok());
  EXPECT_EQ(c->parallel.tp, 2);

  // The file named no mode: setting tp selects explicit, as in a file.
  DaemonConfig d;
  ASSERT_TRUE(ApplyOverride(d, "parallel.tp", "4").ok());
  EXPECT_EQ(d.parallel.mode, ParallelMode::kExplicit);

  // mode = auto from the command line drops the file's explicit layout.
  StatusOr<DaemonConfig> local = LoadDaemonConfig(ConfigsDir() + "/local-cpu.toml");
  ASSERT_TRUE(local.ok()) << local.status().ToString();
  ASSERT_TRUE(ApplyOverride(*local, "parallel.mode", "auto").ok());
  EXPECT_EQ(local->parallel.mode, ParallelMode::kAuto);
  EXPECT_EQ(local->parallel.tp, 1);
  EXPECT_EQ(local->parallel.pp, 1);
}

TEST(DaemonConfigOverride, TokenFileIsReadOnOverride) {
  std::string dir = testing::MakeTempDir("daemon-config");
  std::string token = WriteFile(dir, "token", "tok\n");
  OwnerOnly(token);
  DaemonConfig c;
  ASSERT_TRUE(ApplyOverrides(c, {"admin.token_file=" + token, "admin.host=0.0.0.0"}).ok());
  EXPECT_EQ(c.admin.effective_token, "tok");
}

}  // namespace
}  // namespace tessera
