// The `tessera` binary as a user runs it: generate on one process and as a
// tp x pp launch of real rank processes (same text), and the usage errors.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <regex>
#include <string>
#include <thread>

#include "support/test_util.h"

namespace tessera {
namespace {

struct CliRun {
  int exit_code = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};

CliRun Tessera(const std::string& args) {
  const std::string dir = ::tessera::testing::MakeTempDir("tessera-cli");
  const std::string cmd =
      ::tessera::testing::BinaryDir() + "/tessera " + args + " >" + dir + "/out 2>" + dir + "/err";
  CliRun r;
  const int status = std::system(cmd.c_str());
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = ::tessera::testing::ReadFileOrDie(dir + "/out");
  r.err = ::tessera::testing::ReadFileOrDie(dir + "/err");
  return r;
}

// --logprobs 2: one stderr line per generated token, greedy token first
// among its alternatives; the text on stdout is unchanged.
TEST(Cli, LogprobsPrintOneLinePerToken) {
  const std::string common = "generate --model " +
                             ::tessera::testing::FixturePath("models/llama_gqa_f32") +
                             " --prompt 'the quick brown fox' --raw --max-tokens 3";
  CliRun plain = Tessera(common);
  CliRun lp = Tessera(common + " --logprobs 2");
  ASSERT_EQ(lp.exit_code, 0) << lp.err;
  EXPECT_EQ(lp.out, plain.out);
  int lines = 0;
  for (size_t at = lp.err.find("tessera: token "); at != std::string::npos;
       at = lp.err.find("tessera: token ", at + 1)) {
    const std::string line = lp.err.substr(at, lp.err.find('\n', at) - at);
    SCOPED_TRACE(line);
    // tessera: token N ID:"TEXT" logprob V | top ID:"TEXT" V, ...
    const std::string head = "tessera: token " + std::to_string(lines) + " ";
    ASSERT_EQ(line.rfind(head, 0), 0u);
    const size_t q = line.find("\" logprob ");
    ASSERT_NE(q, std::string::npos);
    const std::string token = line.substr(head.size(), q + 1 - head.size());  // ID:"TEXT"
    EXPECT_NE(token.find(":\""), std::string::npos);
    const double value = std::stod(line.substr(q + 10));
    EXPECT_LE(value, 0.0);
    // Greedy: the token is the first alternative, with the same value.
    const size_t top = line.find(" | top ");
    ASSERT_NE(top, std::string::npos);
    EXPECT_EQ(line.substr(top + 7, token.size() + 1), token + " ");
    EXPECT_EQ(std::stod(line.substr(top + 7 + token.size() + 1)), value);
    ++lines;
  }
  EXPECT_EQ(lines, 3) << lp.err;
  EXPECT_EQ(plain.err.find("tessera: token "), std::string::npos) << plain.err;
  CliRun bad = Tessera(common + " --logprobs 21");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("--logprobs"), std::string::npos) << bad.err;
}

TEST(Cli, TpPpLaunchPrintsTheSameTextAsOneProcess) {
  const std::string model = ::tessera::testing::FixturePath("models/llama_gqa_f32");
  const std::string common =
      "generate --model " + model + " --prompt 'the quick brown fox' --raw --max-tokens 12";
  CliRun one = Tessera(common);
  ASSERT_EQ(one.exit_code, 0) << one.err;
  EXPECT_FALSE(one.out.empty());
  EXPECT_NE(one.err.find("decode"), std::string::npos) << one.err;
  EXPECT_NE(one.err.find("tokens/s"), std::string::npos) << one.err;
  CliRun sharded = Tessera(common + " --tp 2 --pp 2 --timeout 20");
  ASSERT_EQ(sharded.exit_code, 0) << sharded.err;
  EXPECT_EQ(sharded.out, one.out);
  EXPECT_NE(sharded.err.find("tp=2 pp=2"), std::string::npos) << sharded.err;
  // Sampling with a seed is reproducible across layouts too.
  const std::string sampled = common + " --temperature 0.8 --top-p 0.9 --top-k 50 --seed 7";
  CliRun s1 = Tessera(sampled);
  CliRun s2 = Tessera(sampled + " --tp 2 --pp 2");
  ASSERT_EQ(s1.exit_code, 0) << s1.err;
  ASSERT_EQ(s2.exit_code, 0) << s2.err;
  EXPECT_EQ(s1.out, s2.out);
  // A different tp per stage: stage 0 at tp=2 feeds stage 1 at tp=1, and the
  // reverse; the same text as one process.
  CliRun mixed = Tessera(common + " --tp 2,1 --pp 2 --timeout 20");
  ASSERT_EQ(mixed.exit_code, 0) << mixed.err;
  EXPECT_EQ(mixed.out, one.out);
  EXPECT_NE(mixed.err.find("tp=[2, 1] pp=2"), std::string::npos) << mixed.err;
  CliRun grow = Tessera(common + " --tp 1,2 --timeout 20");  // --pp implied by the list
  ASSERT_EQ(grow.exit_code, 0) << grow.err;
  EXPECT_EQ(grow.out, one.out);
  EXPECT_NE(grow.err.find("tp=[1, 2] pp=2"), std::string::npos) << grow.err;
}

TEST(Cli, HelpVersionAndUsageErrors) {
  CliRun help = Tessera("generate --help");
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_NE(help.out.find("--max-tokens"), std::string::npos);
  CliRun version = Tessera("--version");
  EXPECT_EQ(version.exit_code, 0);
  EXPECT_NE(version.out.find("tessera 0."), std::string::npos) << version.out;
  CliRun unknown = Tessera("generate --model /tmp --prompt hi --bogus 3");
  EXPECT_NE(unknown.exit_code, 0);
  EXPECT_NE((unknown.out + unknown.err).find("--bogus"), std::string::npos);
  CliRun bad_top_p =
      Tessera("generate --model " + ::tessera::testing::FixturePath("models/llama_gqa_f32") +
              " --prompt hi --top-p 1.5");
  EXPECT_NE(bad_top_p.exit_code, 0);
  EXPECT_NE((bad_top_p.out + bad_top_p.err).find("--top-p"), std::string::npos);
  CliRun no_model = Tessera("generate --model /nonexistent/model --prompt hi");
  EXPECT_NE(no_model.exit_code, 0);
  EXPECT_NE((no_model.out + no_model.err).find("/nonexistent/model"), std::string::npos);
  CliRun bad_layout =
      Tessera("generate --model " + ::tessera::testing::FixturePath("models/qwen2_bias_f16") +
              " --prompt hi --raw --tp 4");
  EXPECT_EQ(bad_layout.exit_code, 1);
  EXPECT_NE(bad_layout.err.find("tp=4"), std::string::npos) << bad_layout.err;
  // qwen2_bias_f16 has 6 heads: stage 1's tp=4 does not divide them.
  CliRun bad_stage =
      Tessera("generate --model " + ::tessera::testing::FixturePath("models/qwen2_bias_f16") +
              " --prompt hi --raw --tp 2,4");
  EXPECT_EQ(bad_stage.exit_code, 1);
  EXPECT_NE(bad_stage.err.find("stage 1: tp=4 does not divide num_attention_heads=6"),
            std::string::npos)
      << bad_stage.err;
  CliRun bad_count =
      Tessera("generate --model " + ::tessera::testing::FixturePath("models/llama_gqa_f32") +
              " --prompt hi --raw --tp 2,1 --pp 3");
  EXPECT_EQ(bad_count.exit_code, 1);
  EXPECT_NE(bad_count.err.find("--tp lists 2 stages but --pp is 3"), std::string::npos)
      << bad_count.err;
  // `plan --cluster` prints the running plan: dry-run options beside it are refused, named,
  // before any call (port 1 would refuse the connection), not silently ignored.
  CliRun cluster_and_dry_run =
      Tessera("plan --cluster 127.0.0.1:1 --kv-cache-dtype fp8 --max-batch 8");
  EXPECT_EQ(cluster_and_dry_run.exit_code, 1);
  EXPECT_NE(cluster_and_dry_run.err.find("--cluster prints the running coordinator's plan, which "
                                         "--kv-cache-dtype, --max-batch would not change"),
            std::string::npos)
      << cluster_and_dry_run.err;
  CliRun cluster_and_model = Tessera("plan --cluster 127.0.0.1:1 --model /tmp");
  EXPECT_EQ(cluster_and_model.exit_code, 1);
  EXPECT_NE(cluster_and_model.err.find("which --model would not change"), std::string::npos)
      << cluster_and_model.err;
}

TEST(Cli, ModelErrorsNameTheFile) {
  const std::string dir = ::tessera::testing::MakeTempDir("tessera-badmodel");
  std::string cmd = "cp " + ::tessera::testing::FixturePath("models/llama_gqa_f32") + "/* " + dir +
                    " && truncate -s 1000 " + dir + "/model.safetensors";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  CliRun r = Tessera("generate --model " + dir + " --prompt hi --raw --max-tokens 4");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("model.safetensors"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace tessera

namespace tessera {
namespace {

TEST(Cli, UpStartsTheDaemonsAnswersAPromptAndStops) {
  const std::string dir = ::tessera::testing::MakeTempDir("tessera-up");
  {
    // Port 1 is never what the coordinator binds below: --set moves the API
    // to a port picked when it binds (port 0), and the control plane picks
    // its port too; `tessera up` reads both from the coordinator.
    std::ofstream cfg(dir + "/up.toml");
    cfg << "[model]\npath = \"" << ::tessera::testing::FixturePath("models/llama_gqa_f32")
        << "\"\nchat_template = \"chatml\"\n[parallel]\ntp = 2\npp = 2\n[server]\nport = 1"
        << "\ncontrol_endpoint = \"tcp://127.0.0.1:0\"\n[admin]\npick_port = true\n"
        << "[kv_cache]\nmax_blocks = 64\n[scheduler]\nmax_context = 128\n";
  }
  // --set reaches `tessera up` and every daemon: the API moves to another port.
  CliRun r =
      Tessera("up --config " + dir +
              "/up.toml --set server.port=0 --prompt hello --max-tokens 6 --ready-timeout 120");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("placement: tp=2 pp=2"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("API: http://127.0.0.1:"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("API: http://127.0.0.1:1/"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Admin: http://127.0.0.1:"), std::string::npos) << r.out;
  CliRun bad_set = Tessera("up --config " + dir + "/up.toml --set scheduler.max_sequencez=4");
  EXPECT_EQ(bad_set.exit_code, 2);
  EXPECT_NE(bad_set.err.find("scheduler.max_sequencez"), std::string::npos) << bad_set.err;
  // Every child process is gone afterwards.
  EXPECT_NE(std::system(("pgrep -f '[t]essera-worker.*" + dir + "' >/dev/null").c_str()), 0);
  CliRun bad =
      Tessera("up --config " + ::tessera::testing::FixturePath("models/llama_gqa_f32/config.json"));
  EXPECT_NE(bad.exit_code, 0);
}

// A port of the deployment held by another process (another deployment,
// most often): `tessera up` starts nothing and names the config key, rather
// than letting its workers register with someone else's coordinator.
TEST(Cli, UpRefusesPortsAnotherProcessHolds) {
  const std::string dir = ::tessera::testing::MakeTempDir("tessera-up-busy");
  for (const std::string key : {"server.port", "server.control_endpoint"}) {
    // Listen as a server would, on a port the kernel picks; the config names
    // it for `key` and lets the coordinator pick the other port.
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = 0;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    ASSERT_EQ(listen(fd, 4), 0);
    socklen_t len = sizeof addr;
    ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
    const int held = ntohs(addr.sin_port);
    {
      std::ofstream cfg(dir + "/up.toml");
      cfg << "[model]\npath = \"" << ::tessera::testing::FixturePath("models/llama_gqa_f32")
          << "\"\n[parallel]\ntp = 1\npp = 2\n[server]\nport = "
          << (key == "server.port" ? held : 0)
          << "\ncontrol_endpoint = \"tcp://127.0.0.1:" << (key == "server.port" ? 0 : held)
          << "\"\n[admin]\nport = 0\n";
    }
    CliRun r = Tessera("up --config " + dir + "/up.toml --prompt hi --ready-timeout 30");
    close(fd);
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_NE(r.err.find(key + ": 127.0.0.1:" + std::to_string(held) + " is already in use"),
              std::string::npos)
        << r.err;
    // The hint is a value the key takes.
    EXPECT_NE(r.err.find(key == "server.port"
                             ? "--set server.port=<another port>"
                             : "--set server.control_endpoint=tcp://127.0.0.1:<another port>"),
              std::string::npos)
        << r.err;
    EXPECT_EQ(r.out, "") << "nothing may be served: " << r.out;
  }
}

// A coordinator that exits during start-up (here: a scheduler.max_context the
// model cannot take) ends `tessera up` at once with the reason, instead of
// leaving it and the workers waiting for the ready timeout.
TEST(Cli, UpExitsWhenTheCoordinatorDiesDuringStartup) {
  const std::string dir = ::tessera::testing::MakeTempDir("tessera-up-bad");
  const int port = 0, control = 0;  // picked by the coordinator, were it to start
  {
    std::ofstream cfg(dir + "/up.toml");
    cfg << "[model]\npath = \"" << ::tessera::testing::FixturePath("models/llama_gqa_f32")
        << "\"\n[parallel]\ntp = 1\npp = 2\n[server]\nport = " << port
        << "\ncontrol_endpoint = \"tcp://127.0.0.1:" << control << "\"\n[admin]\nport = 0\n"
        << "[scheduler]\nmax_context = 100000\n";
  }
  const auto start = std::chrono::steady_clock::now();
  CliRun r = Tessera("up --config " + dir + "/up.toml --ready-timeout 120");
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(r.exit_code, 0);
  EXPECT_LT(seconds, 30.0) << r.err;
  // The error names the key and where it was set.
  EXPECT_NE(r.err.find(dir + "/up.toml:12:15: scheduler.max_context: 100000 exceeds"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("coordinator exited with status"), std::string::npos) << r.err;
  EXPECT_NE(std::system(("pgrep -f '[t]essera-worker.*" + dir + "' >/dev/null").c_str()), 0);

  // A model.path without a model, and a layout the model cannot take.
  for (const auto& [line, expect] :
       {std::pair<std::string, std::string>{"[model]\npath = \"" + dir + "/nomodel\"\n",
                                            "up.toml:3:8: model.path: " + dir + "/nomodel"},
        {"[model]\npath = \"" + ::tessera::testing::FixturePath("models/llama_gqa_f32") +
             "\"\n[parallel]\ntp = 3\n",
         "up.toml:5:6: parallel.tp (model.path "},
        // pp over the model's 2 layers names parallel.pp, not parallel.tp.
        {"[model]\npath = \"" + ::tessera::testing::FixturePath("models/llama_gqa_f32") +
             "\"\n[parallel]\ntp = 1\npp = 3\n",
         "up.toml:6:6: parallel.pp (model.path "}}) {
    {
      std::ofstream cfg(dir + "/up.toml");
      cfg << "# a deployment\n"
          << line << "[server]\nport = " << port
          << "\ncontrol_endpoint = \"tcp://127.0.0.1:" << control << "\"\n[admin]\nport = 0\n";
    }
    CliRun bad = Tessera("up --config " + dir + "/up.toml --ready-timeout 60");
    EXPECT_NE(bad.exit_code, 0);
    EXPECT_NE(bad.err.find(expect), std::string::npos) << bad.err;
  }
  // The same layout given with --set names the flag.
  CliRun flagged =
      Tessera("up --config " + dir + "/up.toml --ready-timeout 60 --set parallel.pp=3");
  EXPECT_NE(flagged.exit_code, 0);
  EXPECT_NE(flagged.err.find("--set parallel.pp=3: parallel.pp (model.path "), std::string::npos)
      << flagged.err;
}

// Auto placement through `tessera up`: the planner's explanation and the
// placement table are printed; a Ctrl-C stops the coordinator, which shuts
// every worker down, and `tessera up` exits 0, whether serving or still
// starting.
TEST(Cli, UpInAutoModeExplainsAndStopsCleanlyOnCtrlC) {
  const std::string dir = ::tessera::testing::MakeTempDir("tessera-up-auto");
  {
    // Every port is picked when the coordinator binds; `tessera up` prints
    // the API and admin URLs.
    std::ofstream cfg(dir + "/up.toml");
    cfg << "[model]\npath = \"" << ::tessera::testing::FixturePath("models/llama_gqa_f32")
        << "\"\n[parallel]\nmode = \"auto\"\nworkers = 2\n[server]\nport = 0"
        << "\ncontrol_endpoint = \"tcp://127.0.0.1:0\"\n[admin]\npick_port = true"
        << "\ntoken = \"up-t0ken\"\n"
        << "[kv_cache]\nmax_blocks = 64\n[scheduler]\nmax_context = 128\n";
  }
  // `tessera up` in a process group of its own, as a shell starts a
  // foreground job.
  auto start_up = [&]() {
    const pid_t child = fork();
    if (child == 0) {
      setpgid(0, 0);
      const int fd = open((dir + "/out").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(fd, 1);
      dup2(fd, 2);
      const std::string bin = ::tessera::testing::BinaryDir() + "/tessera";
      execl(bin.c_str(), bin.c_str(), "up", "--config", (dir + "/up.toml").c_str(),
            "--ready-timeout", "120", static_cast<char*>(nullptr));
      _exit(127);
    }
    setpgid(child, child);
    return child;
  };
  // Ctrl-C at a terminal: SIGINT to the foreground process group. Returns
  // the exit status, or -1 when it did not stop within 30 s.
  auto ctrl_c = [&](pid_t child) {
    kill(-child, SIGINT);
    int status = 0;
    for (int i = 0; i < 300; ++i) {
      if (waitpid(child, &status, WNOHANG) == child)
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    kill(child, SIGKILL);
    waitpid(child, &status, 0);
    return -1;
  };
  auto leftovers = [&] {
    return std::system(
               ("pgrep -f '[t]essera-(worker|coordinator).*" + dir + "' >/dev/null").c_str()) == 0;
  };
  const pid_t pid = start_up();
  std::string out;
  for (int i = 0; i < 1200 && out.find("Ctrl-C stops") == std::string::npos; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    out = ::tessera::testing::ReadFileOrDie(dir + "/out");
    if (waitpid(pid, nullptr, WNOHANG) != 0) break;
  }
  EXPECT_NE(out.find("Ctrl-C stops"), std::string::npos) << out;
  EXPECT_NE(out.find("Plan (objective: latency)"), std::string::npos) << out;
  EXPECT_NE(out.find("Why:"), std::string::npos) << out;
  EXPECT_NE(out.find("placement: tp="), std::string::npos) << out;
  std::smatch urls;
  ASSERT_TRUE(std::regex_search(out, urls,
                                std::regex("API: http://127\\.0\\.0\\.1:(\\d+)/v1[^\\n]*\\nAdmin: "
                                           "http://127\\.0\\.0\\.1:(\\d+)/admin")))
      << out;
  const int port = std::stoi(urls[1]);
  // `tessera status` and `plan --cluster` against a separate admin listener
  // with a token: each failure says what to do about it.
  const std::string admin_port = urls[2];
  CliRun on_api = Tessera("status --port " + std::to_string(port));
  EXPECT_EQ(on_api.exit_code, 1);
  EXPECT_NE(on_api.err.find("does not serve the admin API"), std::string::npos) << on_api.err;
  CliRun no_token = Tessera("status --port " + admin_port);
  EXPECT_EQ(no_token.exit_code, 1);
  EXPECT_NE(no_token.err.find("401"), std::string::npos) << no_token.err;
  EXPECT_NE(no_token.err.find("pass --token"), std::string::npos) << no_token.err;
  CliRun wrong = Tessera("plan --cluster 127.0.0.1:" + admin_port + " --token nope");
  EXPECT_EQ(wrong.exit_code, 1);
  EXPECT_NE(wrong.err.find("refused this --token"), std::string::npos) << wrong.err;
  CliRun nobody = Tessera("status --port 1");  // nothing listens on port 1
  EXPECT_EQ(nobody.exit_code, 1);
  EXPECT_NE(nobody.err.find("is the coordinator running"), std::string::npos) << nobody.err;
  CliRun status = Tessera("status --port " + admin_port + " --token up-t0ken");
  EXPECT_EQ(status.exit_code, 0) << status.err;
  EXPECT_NE(status.out.find("ready: yes"), std::string::npos) << status.out;
  EXPECT_EQ(ctrl_c(pid), 0) << ::tessera::testing::ReadFileOrDie(dir + "/out");
  EXPECT_FALSE(leftovers());
  // Ctrl-C while the deployment is still starting: a clean stop as well.
  const pid_t early = start_up();
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  EXPECT_EQ(ctrl_c(early), 0) << ::tessera::testing::ReadFileOrDie(dir + "/out");
  EXPECT_FALSE(leftovers());
}

}  // namespace
}  // namespace tessera
