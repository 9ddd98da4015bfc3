// ValidateDaemonConfig through ParseDaemonConfig: every check's message
// names file:line:col (or where else the key was set) and the full key; the
// bounds themselves are accepted. (Split from daemon_config_test.cc.)
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "common/config/daemon_config.h"
#include "common/model/parallel_config.h"
#include "tests/unit/common/config/config_test_util.h"

namespace tessera {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::StartsWith;

// ---------------------------------------------------------------------------
// Validation: every error names file:line:col and the full key.

struct BadCase {
  const char* toml;
  const char* message;  // the exact message
};

TEST(DaemonConfigValidation, EachCheckNamesFileLineColAndKey) {
  const BadCase cases[] = {
      {"[model]\npath = \"\"\n", "x.toml:2:8: model.path: must name the model directory, got \"\""},
      {"[parallel]\nmode = \"auto\"\ntp = 2\n",
       "x.toml:3:6: parallel.tp: is set but parallel.mode = \"auto\" (at x.toml:2:8); remove it, "
       "or set "
       "parallel.mode = \"explicit\""},
      {"[parallel]\ntp = 0\n", "x.toml:2:6: parallel.tp: must be >= 1, got 0"},
      {"[scheduler]\nruns_on = \"worker\"\n",
       "x.toml:2:11: scheduler.runs_on: must be one of \"coordinator\", \"leader\", got "
       "\"worker\""},
      {"[scheduler]\nprefill_chunk_budget = \"time\"\n",
       "x.toml:2:24: scheduler.prefill_chunk_budget: must be one of \"cost\", \"tokens\", got "
       "\"time\""},

      {"[parallel]\ntp = 2\npp = -1\n", "x.toml:3:6: parallel.pp: must be >= 1, got -1"},
      {"[parallel]\npp = 2\nlayers_per_stage = [4, 4, 4]\n",
       "x.toml:3:20: parallel.layers_per_stage: must have one entry per stage (parallel.pp = 2), "
       "got 3 "
       "entries [4, 4, 4]"},
      {"[parallel]\npp = 2\nlayers_per_stage = [4, 0]\n",
       "x.toml:3:20: parallel.layers_per_stage: entry 1 (stage 1) must be >= 1, got 0"},
      {"[parallel]\npp = 3\ntp = [2, 1]\n",
       "x.toml:3:6: parallel.tp: must have one entry per stage (parallel.pp = 3), got 2 entries "
       "[2, 1]"},
      {"[parallel]\ntp = [2, 1]\n",
       "x.toml:2:6: parallel.tp: must have one entry per stage (parallel.pp = 1), got 2 entries "
       "[2, 1]"},
      {"[parallel]\npp = 2\ntp = [2, 0]\n",
       "x.toml:3:6: parallel.tp: entry 1 (stage 1) must be >= 1, got 0"},
      {"[parallel]\nmode = \"auto\"\ntp = [2, 1]\n",
       "x.toml:3:6: parallel.tp: is set but parallel.mode = \"auto\" (at x.toml:2:8); remove it, "
       "or set parallel.mode = \"explicit\""},
      {"[server]\nport = -1\n", "x.toml:2:8: server.port: must be in 0..65535, got -1"},
      {"[server]\nport = 70000\n", "x.toml:2:8: server.port: must be in 0..65535, got 70000"},
      {"[server]\ncontrol_endpoint = \"tcp://127.0.0.1:70000\"\n",
       "x.toml:2:20: server.control_endpoint: port must be in 0..65535, got 70000"},
      {"[admin]\npick_port = 1\n",
       "x.toml:2:13: admin.pick_port: expected true or false, got integer 1"},
      {"[admin]\nport = 9001\npick_port = true\n",
       "x.toml:3:13: admin.pick_port: admin.pick_port = true picks the admin listener's port and "
       "admin.port is set too; give one"},
      {"[server]\nhost = \"my host\"\n",
       "x.toml:2:8: server.host: must be a host name or IP address, got \"my host\""},
      {"[server]\ncontrol_endpoint = \"127.0.0.1:5555\"\n",
       "x.toml:2:20: server.control_endpoint: must be \"tcp://HOST:PORT\", got \"127.0.0.1:5555\""},
      {"[server]\ncontrol_endpoint = \"tcp://127.0.0.1:8000\"\n",
       "x.toml:2:20: server.control_endpoint: \"tcp://127.0.0.1:8000\" is on the API listener's "
       "port "
       "(127.0.0.1:8000)"},
      {"[server]\ntls_cert = \"c.pem\"\n",
       "x.toml:2:12: server.tls_cert: is set but server.tls_key is not; HTTPS needs both"},
      {"[server]\nread_timeout_seconds = 0\n",
       "x.toml:2:24: server.read_timeout_seconds: must be a finite number > 0, got 0.0"},
      {"[server]\nmax_body_bytes = 0\n", "x.toml:2:18: server.max_body_bytes: must be >= 1, got 0"},
      {"[server]\nmax_connections = -3\n",
       "x.toml:2:19: server.max_connections: must be >= 1, got -3"},
      {"[admin]\nport = 8000\n",
       "x.toml:2:8: admin.port: the admin listener (127.0.0.1:8000) and the API listener "
       "(127.0.0.1:8000) "
       "are on one port; use another port, or admin.port = 0 to serve the admin API on the API "
       "listener"},
      {"[admin]\ntoken = \"a\"\ntoken_file = \"t\"\n",
       "x.toml:3:14: admin.token_file: admin.token and admin.token_file are both set; give one"},
      {"[admin]\ntoken = \"has space\"\n",
       "x.toml:2:9: admin.token: must be a bearer token (letters, digits, - . _ ~ + / and trailing "
       "=), "
       "got 9 characters including invalid ones"},
      {"[server]\nhost = \"0.0.0.0\"\n[admin]\nport = 0\n",
       "x.toml:2:8: server.host: \"0.0.0.0\" exposes the admin API beyond loopback (admin.port = 0 "
       "serves "
       "it on the API listener) without a token; set admin.token or admin.token_file, or give the "
       "admin "
       "API a loopback address"},
      {"[admin]\nhost = \"10.1.2.3\"\n",
       "x.toml:2:8: admin.host: \"10.1.2.3\" exposes the admin API beyond loopback without a "
       "token; set "
       "admin.token or admin.token_file, or give the admin API a loopback address"},
      {"[heartbeat]\ninterval_seconds = -1\n",
       "x.toml:2:20: heartbeat.interval_seconds: must be a finite number > 0, got -1.0"},
      {"[heartbeat]\ntimeout_seconds = nan\n",
       "x.toml:2:19: heartbeat.timeout_seconds: must be a finite number > 0, got nan"},
      {"[heartbeat]\ninterval_seconds = 5\ntimeout_seconds = 5\n",
       "x.toml:3:19: heartbeat.timeout_seconds: must be > heartbeat.interval_seconds (5.0), got "
       "5.0"},
      {"[heartbeat]\ninterval_seconds = 12.5\n",
       "x.toml:2:20: heartbeat.interval_seconds: must be < heartbeat.timeout_seconds (10.0), got "
       "12.5"},
      {"[kv_cache]\nmemory_fraction = 0.0\n",
       "x.toml:2:19: kv_cache.memory_fraction: must be in (0, 1], got 0.0"},
      {"[kv_cache]\nmemory_fraction = 1.5\n",
       "x.toml:2:19: kv_cache.memory_fraction: must be in (0, 1], got 1.5"},
      {"[kv_cache]\nblock_size = 0\n", "x.toml:2:14: kv_cache.block_size: must be >= 1, got 0"},
      {"[kv_cache]\nmax_blocks = -1\n",
       "x.toml:2:14: kv_cache.max_blocks: must be >= 0 (0 = no bound), got -1"},
      {"[scheduler]\n\n  max_batch_tokens = 0\n",
       "x.toml:3:22: scheduler.max_batch_tokens: must be >= 1, got 0"},
      {"[scheduler]\nmax_sequences = 0\n",
       "x.toml:2:17: scheduler.max_sequences: must be >= 1, got 0"},
      {"[scheduler]\nqueue_limit = 0\n", "x.toml:2:15: scheduler.queue_limit: must be >= 1, got 0"},
      {"[scheduler]\nprefill_chunk_tokens = 0\n",
       "x.toml:2:24: scheduler.prefill_chunk_tokens: must be >= 1, got 0"},
      {"[scheduler]\ndrain_timeout_seconds = -1\n",
       "x.toml:2:25: scheduler.drain_timeout_seconds: must be a finite number >= 0, got -1.0"},
      {"[scheduler]\nmax_context = -5\n",
       "x.toml:2:15: scheduler.max_context: must be >= 0 (0 = the model's "
       "max_position_embeddings), got -5"},
      {"[scheduler]\nmax_sequences = 5000\n",
       "x.toml:2:17: scheduler.max_sequences: must be <= scheduler.max_batch_tokens (4096), got "
       "5000"},
      {"[scheduler]\nmax_batch_tokens = 256\n",
       "x.toml:2:20: scheduler.max_batch_tokens: must be >= scheduler.prefill_chunk_tokens (512), "
       "got 256"},
      {"[worker]\ncoordinator = \"tcp://*:5555\"\n",
       "x.toml:2:15: worker.coordinator: must name a host to connect to, got the wildcard "
       "\"tcp://*:5555\""},
      {"[worker]\ncoordinator = \"tcp://h:0\"\n",
       "x.toml:2:15: worker.coordinator: port must be in 1..65535, got 0"},
      {"[worker]\ndevice = -1\n", "x.toml:2:10: worker.device: must be >= 0, got -1"},
      {"[worker]\nmetrics_port = 65535\ndevice = 1\n",
       "x.toml:2:16: worker.metrics_port: the worker listens on metrics_port + device = 65535 + 1 "
       "= "
       "65536, above 65535"},
      {"[worker]\ngloo_host = \"no spaces\"\n",
       "x.toml:2:13: worker.gloo_host: must be a host name or IP address, got \"no spaces\""},
      {"[parallel]\nworkers = -1\n", "x.toml:2:11: parallel.workers: must be >= 0, got -1"},
      {"[parallel]\ntp = 2\npp = 2\nworkers = 3\n",
       "x.toml:4:11: parallel.workers: must be 0 or parallel.replicas x the layout's worker count "
       "1 x 4 = 4 in explicit mode, got 3"},
      {"[parallel]\ntp = 1\npp = 2\nreplicas = 3\nworkers = 4\n",
       "x.toml:5:11: parallel.workers: must be 0 or parallel.replicas x the layout's worker count "
       "3 x 2 = 6 in explicit mode, got 4"},
      {"[parallel]\nreplicas = -1\n",
       "x.toml:2:12: parallel.replicas: must be in [0, 1048576] (0 = as many as fit), got -1"},
      {"[parallel]\ntp = 1\npp = 2\nreplicas = 0\n",
       "x.toml:4:12: parallel.replicas: 0 (as many replicas as fit) needs parallel.workers in "
       "explicit mode: the coordinator places workers / (tp * pp) replicas"},
      {"[parallel]\ntp = 1\npp = 2\nreplicas = 0\nworkers = 1\n",
       "x.toml:5:11: parallel.workers: must be at least the layout's worker count 2 (tp * pp), got "
       "1"},
      {"[parallel]\nobjective = \"speed\"\n",
       "x.toml:2:13: parallel.objective: must be one of \"latency\", \"throughput\", got "
       "\"speed\""},
  };
  for (const BadCase& bc : cases) {
    EXPECT_EQ(ParseError(bc.toml), bc.message) << "for:\n" << bc.toml;
  }
}

// A check that involves a key left at its default names the file alone.
TEST(DaemonConfigValidation, DefaultKeyNamesTheFile) {
  EXPECT_EQ(
      ParseError("[scheduler]\nmax_batch_tokens = 100\nprefill_chunk_tokens = 100\n"),
      "x.toml:2:20: scheduler.max_batch_tokens: must be >= scheduler.max_sequences (128), got 100");
  DaemonConfig c;
  c.scheduler.queue_limit = 0;
  Status st = ValidateDaemonConfig(c);
  EXPECT_EQ(st.message(), "(defaults): scheduler.queue_limit: must be >= 1, got 0");
}

// The control plane's bounds and its off switch: each bad value names its key.
TEST(DaemonConfigValidation, ControlPlaneKeysNameTheirKey) {
  EXPECT_EQ(ParseError("[server]\nmax_workers = 0\n"),
            "x.toml:2:15: server.max_workers: must be >= 1, got 0");
  EXPECT_EQ(ParseError("[parallel]\ntp = 2\npp = 2\n[server]\nmax_workers = 3\n"),
            "x.toml:5:15: server.max_workers: must be >= the tp * pp workers the coordinator "
            "waits for (4), got 3");
  EXPECT_EQ(ParseError("[heartbeat]\nforget_failed_after_seconds = 0\n"),
            "x.toml:2:31: heartbeat.forget_failed_after_seconds: must be a finite number > 0, "
            "got 0.0");
  EXPECT_EQ(ParseError("[control]\nallow_unauthenticated = 1\n"),
            "x.toml:2:25: control.allow_unauthenticated: expected true or false, got integer 1");
  StatusOr<DaemonConfig> c = ParseDaemonConfig(
      "[server]\nmax_workers = 4\n[parallel]\ntp = 2\npp = 2\n[heartbeat]\n"
      "forget_failed_after_seconds = 0.5\n[control]\nallow_unauthenticated = true\n",
      "x.toml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->server.max_workers, 4);
  EXPECT_EQ(c->heartbeat.forget_failed_after_seconds, 0.5);
  EXPECT_TRUE(c->control.allow_unauthenticated);
  EXPECT_FALSE(DaemonConfig{}.control.allow_unauthenticated);
}

// A layout larger than the coordinator keeps records of names the layout key
// the operator wrote (pp = 99, not the server.max_workers default), and a
// layout whose rank count would overflow is refused before anything
// multiplies (tp = pp = 65536 once wrapped to 0 workers).
TEST(DaemonConfigValidation, OversizedLayoutsNameTheLayoutKey) {
  const std::string pp99 = ParseError("[parallel]\ntp = 3\npp = 99\n");
  EXPECT_EQ(pp99.rfind("x.toml:3:6: parallel.pp: the coordinator would wait for 297 workers", 0),
            0u)
      << pp99;
  EXPECT_NE(pp99.find("server.max_workers (256, its default)"), std::string::npos) << pp99;
  const std::string tp99 = ParseError("[parallel]\ntp = 300\npp = 1\n");
  EXPECT_EQ(tp99.rfind("x.toml:2:6: parallel.tp: ", 0), 0u) << tp99;
  EXPECT_EQ(ParseError("[parallel]\ntp = 65536\npp = 65536\n"),
            "x.toml:3:6: parallel.pp: the layout has 4294967296 ranks (the sum of every stage's "
            "tp); at most 1048576");
  EXPECT_EQ(ParseError("[parallel]\ntp = 65537\npp = 1\n"),
            "x.toml:2:6: parallel.tp: must be at most 65536, got 65537");
  EXPECT_EQ(ParseError("[parallel]\ntp = 1\npp = 1431655766\n"),
            "x.toml:3:6: parallel.pp: must be at most 65536, got 1431655766");
  // The layout rules of ParallelConfig bound the ranks too (POST /admin/plan,
  // tessera generate).
  ModelConfig m;
  m.num_attention_heads = m.num_key_value_heads = 1 << 16;
  m.num_hidden_layers = 1 << 16;
  m.intermediate_size = 1 << 16;
  auto big = ParallelConfig::Make(m, 1 << 16, 1 << 16);
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.status().message(),
            "tp=65536 over pp=65536 stages gives 4294967296 ranks; at most 1048576");
}

TEST(DaemonConfigValidation, ValuesAtTheirBoundsAreAccepted) {
  StatusOr<DaemonConfig> c = ParseDaemonConfig(
      "[kv_cache]\nmemory_fraction = 1.0\nblock_size = 1\n"
      "[scheduler]\nmax_batch_tokens = 1\nmax_sequences = 1\nqueue_limit = 1\nprefill_chunk_tokens "
      "= 1\n"
      "[heartbeat]\ninterval_seconds = 0.001\ntimeout_seconds = 0.002\n"
      "[server]\nport = 65535\nhost = \"::1\"\ncontrol_endpoint = \"tcp://[::1]:1\"\n"
      "[admin]\nport = 0\n",
      "x.toml");
  EXPECT_TRUE(c.ok()) << c.status().ToString();
}

// A replica's leader drives any layout: the planner's (parallel.mode = "auto", the default,
// whatever objective and replica count), and every explicit one (pp > 1, a tp per stage,
// replica overrides). Nothing about the layout is refused for runs_on = "leader".
TEST(DaemonConfigValidation, LeaderSchedulingTakesEveryLayout) {
  for (const char* parallel :
       {"", "mode = \"auto\"\n", "mode = \"auto\"\nobjective = \"throughput\"\nreplicas = 0\n",
        "mode = \"auto\"\nworkers = 3\nreplicas = 2\n", "tp = 1\npp = 2\n", "tp = 2\npp = 2\n",
        "tp = [2, 1]\npp = 2\n",
        "tp = 1\npp = 1\nreplicas = 2\n[[parallel.replica_override]]\nreplica = 1\ntp = 1\n"
        "pp = 2\n"}) {
    StatusOr<DaemonConfig> c = ParseDaemonConfig(
        std::string("[scheduler]\nruns_on = \"leader\"\n[parallel]\n") + parallel, "x.toml");
    ASSERT_TRUE(c.ok()) << parallel << c.status().ToString();
    EXPECT_EQ(c->scheduler.runs_on, SchedulerHost::kLeader) << parallel;
  }
}

}  // namespace
}  // namespace tessera
