// The daemons across real network interfaces: the coordinator and two
// workers each in a network namespace of its own (ip netns), joined by veth
// pairs on a bridge in a fourth namespace, each with its own address. The
// control plane (ZeroMQ), the rendezvous store and the Gloo traffic between
// the workers all cross the veths; the test's HTTP client does too. Workers
// find their Gloo address themselves (worker.gloo_host = "": the address
// that routes to the coordinator) and use the coordinator's wildcard-bound
// store through the address they reach it at. The control plane crosses
// the network, so it runs with CURVE keys (made here, as `tessera keygen`
// makes them): the coordinator allows exactly the two workers' public keys.
//
// Needs root and iproute2 (scripts/setup installs it); without them the test
// fails and says so. The namespaces are removed in TearDown, and stale ones
// of dead test processes at the next start.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "common/net/curve_keys.h"
#include "common/net/http_client.h"
#include "common/tokenizer/tokenizer.h"
#include "support/model_harness.h"
#include "support/test_util.h"

namespace tessera {
namespace {

using nlohmann::json;

constexpr const char* kPrefix = "tsrnet";  // namespace names: tsrnet<pid>-<role>

// Runs `fn` on a thread that has entered network namespace `ns`: the
// sockets it opens live there.
void InNetns(const std::string& ns, const std::function<void()>& fn) {
  std::string error;
  std::thread t([&] {
    const int fd = open(("/var/run/netns/" + ns).c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0 || setns(fd, CLONE_NEWNET) != 0) {
      error = "cannot enter network namespace " + ns + ": " + std::strerror(errno);
      if (fd >= 0) close(fd);
      return;
    }
    close(fd);
    fn();
  });
  t.join();
  ASSERT_TRUE(error.empty()) << error;
}

// Starts `args` inside network namespace `ns`, output to `log`.
pid_t SpawnIn(const std::string& ns, const std::vector<std::string>& args, const std::string& log) {
  const pid_t pid = fork();
  if (pid == 0) {
    const int lfd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(lfd, 1);
    dup2(lfd, 2);
    const int fd = open(("/var/run/netns/" + ns).c_str(), O_RDONLY);
    if (fd < 0 || setns(fd, CLONE_NEWNET) != 0) {
      std::fprintf(stderr, "cannot enter network namespace %s: %s\n", ns.c_str(),
                   std::strerror(errno));
      _exit(126);
    }
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the test
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  return pid;
}

// Removes namespaces left by test processes that no longer run.
void SweepStale() {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/var/run/netns", ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(kPrefix, 0) != 0) continue;
    const std::string rest = name.substr(std::strlen(kPrefix));
    const pid_t pid = static_cast<pid_t>(std::atoi(rest.c_str()));
    if (pid > 0 && (kill(pid, 0) == 0 || errno == EPERM)) continue;  // still running
    ::tessera::testing::RunCommand("ip netns del " + name);
  }
}

class NetnsDaemons : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(::tessera::testing::RunCommand("ip -V").rc, 0)
        << "this test needs iproute2's `ip` (Debian package iproute2, installed by "
           "scripts/setup) to create network namespaces";
    ASSERT_EQ(geteuid(), 0u) << "this test creates network namespaces and needs root";
    SweepStale();
    const std::string p = kPrefix + std::to_string(getpid()) + "-";
    bridge_ = p + "br";
    coord_ = p + "c";
    worker_a_ = p + "a";
    worker_b_ = p + "b";
    // Every namespace is recorded before it is created, so TearDown removes
    // it whatever fails later.
    for (const std::string& ns : {bridge_, coord_, worker_a_, worker_b_}) {
      namespaces_.push_back(ns);
      Run("ip netns add " + ns);
    }
    Run("ip -n " + bridge_ + " link add br0 type bridge");
    Run("ip -n " + bridge_ + " link set br0 up");
    const std::vector<std::pair<std::string, std::string>> hosts = {
        {coord_, "10.213.0.1"}, {worker_a_, "10.213.0.2"}, {worker_b_, "10.213.0.3"}};
    int i = 0;
    for (const auto& [ns, addr] : hosts) {
      const std::string port = "p" + std::to_string(i++);
      Run("ip -n " + bridge_ + " link add " + port + " type veth peer name eth0 netns " + ns);
      Run("ip -n " + bridge_ + " link set " + port + " master br0 up");
      Run("ip -n " + ns + " addr add " + addr + "/24 dev eth0");
      Run("ip -n " + ns + " link set eth0 up");
      Run("ip -n " + ns + " link set lo up");
    }
    if (HasFatalFailure()) return;

    dir_ = ::tessera::testing::MakeTempDir("tessera-netns");
    model_ = ::tessera::testing::FixturePath("models/llama_gqa_f32");
    // CURVE key pairs: the coordinator's and one per worker.
    std::vector<CurveKeyPair> keys;
    for (const char* name : {"coordinator", "worker0", "worker1"}) {
      StatusOr<CurveKeyPair> pair = GenerateCurveKeyPair();
      ASSERT_TRUE(pair.ok()) << pair.status().ToString();
      ASSERT_TRUE(WriteCurveKeyPair(*pair, dir_ + "/" + std::string(name)).ok()) << name;
      keys.push_back(*pair);
    }
    // Wildcard listeners: the coordinator's namespace has one interface
    // besides lo; ports are fixed since the namespace is ours alone.
    std::ofstream(dir_ + "/c.toml")
        << "[model]\npath = \"" << model_ << "\"\nchat_template = \"chatml\"\n"
        << "[parallel]\ntp = 2\npp = 1\n"
        << "[server]\nhost = \"0.0.0.0\"\nport = 8000\ncontrol_endpoint = \"tcp://*:5555\"\n"
        << "[admin]\nport = 0\ntoken = \"netns-token\"\n"
        << "[heartbeat]\ninterval_seconds = 0.2\ntimeout_seconds = 3.0\n"
        << "[kv_cache]\nmax_blocks = 128\nblock_size = 4\n"
        << "[scheduler]\nmax_context = 128\n"
        << "[control]\ncoordinator_secret_key_file = \"" << dir_ << "/coordinator.key\"\n"
        << "worker_public_keys = [\"" << keys[1].public_key << "\", \"" << keys[2].public_key
        << "\"]\n";
    for (int w = 0; w < 2; ++w)
      std::ofstream(dir_ + "/w" + std::to_string(w) + ".toml")
          << "[worker]\ncoordinator = \"tcp://10.213.0.1:5555\"\n"
          << "[control]\nworker_secret_key_file = \"" << dir_ << "/worker" << w << ".key\"\n"
          << "coordinator_public_key = \"" << keys[0].public_key << "\"\n";
    const std::string bin = ::tessera::testing::BinaryDir();
    pids_.push_back(SpawnIn(coord_, {bin + "/tessera-coordinator", "--config", dir_ + "/c.toml"},
                            dir_ + "/coordinator.log"));
    int d = 0;
    for (const std::string& ns : {worker_a_, worker_b_}) {
      pids_.push_back(
          SpawnIn(ns,
                  {bin + "/tessera-worker", "--config", dir_ + "/w" + std::to_string(d) + ".toml",
                   "--coordinator", "tcp://10.213.0.1:5555", "--device", "0", "--timeout", "10",
                   "--set", "worker.host=host-" + std::to_string(d)},
                  dir_ + "/worker" + std::to_string(d) + ".log"));
      ++d;
    }
    bool ready = false, refused = false;
    for (int k = 0; k < 450 && !ready; ++k) {  // up to 45 s on a loaded 2-core machine
      InNetns(worker_a_, [&] {
        const HttpReply r = Call("GET", "/readyz");
        ready = r.status == 200;
        refused = r.status == 503 && r.body.find("waiting for workers") == std::string::npos;
      });
      if (ready || refused || waitpid(pids_[0], nullptr, WNOHANG) != 0) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    ASSERT_TRUE(ready) << "daemons not ready; coordinator log:\n"
                       << ::tessera::testing::ReadFileOrDie(dir_ + "/coordinator.log")
                       << "\nworker 0 log:\n"
                       << ::tessera::testing::ReadFileOrDie(dir_ + "/worker0.log");
  }

  void TearDown() override {
    ::tessera::testing::StopProcesses(pids_, 3.0);
    for (const std::string& ns : namespaces_) {
      const auto r = ::tessera::testing::RunCommand("ip netns del " + ns);
      EXPECT_EQ(r.rc, 0) << "ip netns del " << ns << ": " << r.output;
    }
  }

  void Run(const std::string& cmd) {
    const auto r = ::tessera::testing::RunCommand(cmd);
    ASSERT_EQ(r.rc, 0) << cmd << ":\n" << r.output;
  }

  // An HTTP call to the coordinator's address (10.213.0.1:8000); call it
  // from a namespace (InNetns).
  static HttpReply Call(const std::string& method, const std::string& target,
                        const std::string& body = "", const std::string& token = "") {
    return HttpCall(8000, method, target, body, token, "10.213.0.1");
  }

  std::string bridge_, coord_, worker_a_, worker_b_, dir_, model_;
  std::vector<std::string> namespaces_;
  std::vector<pid_t> pids_;
};

TEST_F(NetnsDaemons, ControlAndGlooCrossRealInterfacesAndGreedyMatchesOneProcess) {
  // Each worker registered from its own namespace with the address that
  // routes to the coordinator, and holds one tp rank.
  HttpReply cluster;
  InNetns(worker_b_, [&] { cluster = Call("GET", "/admin/cluster", "", "netns-token"); });
  ASSERT_EQ(cluster.status, 200) << cluster.body;
  const json c = json::parse(cluster.body);
  std::set<std::string> addresses, hosts;
  for (const json& w : c["workers"]) {
    addresses.insert(w["data_address"].get<std::string>());
    hosts.insert(w["host"].get<std::string>());
    EXPECT_EQ(w["state"], "alive");
    EXPECT_TRUE(w["rank"].is_object()) << w.dump();
  }
  EXPECT_EQ(addresses, (std::set<std::string>{"10.213.0.2", "10.213.0.3"})) << cluster.body;
  EXPECT_EQ(hosts, (std::set<std::string>{"host-0", "host-1"})) << cluster.body;

  // The single-process engine's greedy tokens, computed here.
  auto local = ::tessera::testing::LocalModel::Load(model_);
  ASSERT_TRUE(local.ok()) << local.status().ToString();
  auto tok = Tokenizer::Load(model_);
  ASSERT_TRUE(tok.ok());
  const json ref = json::parse(::tessera::testing::ReadFileOrDie(model_ + "/reference.json"));
  std::vector<std::vector<int32_t>> prompts;
  for (const json& p : ref["prompts"]) prompts.push_back(p["ids"].get<std::vector<int32_t>>());
  auto expected = (*local)->Greedy(prompts, 12);
  ASSERT_TRUE(expected.ok()) << expected.status().ToString();
  for (size_t i = 0; i < prompts.size(); ++i) {
    for (bool stream : {false, true}) {
      json req = {{"model", "llama_gqa_f32"}, {"prompt", prompts[i]}, {"max_tokens", 12},
                  {"temperature", 0},         {"ignore_eos", true},   {"stream", stream}};
      HttpReply r;
      InNetns(worker_a_, [&] { r = Call("POST", "/v1/completions", req.dump()); });
      ASSERT_EQ(r.status, 200) << r.body;
      std::string text;
      if (stream) {
        ASSERT_FALSE(r.events.empty());
        EXPECT_EQ(r.events.back(), "[DONE]");
        for (const std::string& e : r.events) {
          if (e == "[DONE]") break;
          const json chunk = json::parse(e);
          ASSERT_FALSE(chunk.contains("error")) << e;
          if (!chunk["choices"].empty()) text += chunk["choices"][0].value("text", "");
        }
      } else {
        text = json::parse(r.body)["choices"][0]["text"].get<std::string>();
      }
      EXPECT_EQ(text, (*tok)->Decode((*expected)[i], true))
          << "prompt " << i << " stream " << stream;
    }
  }
}

}  // namespace
}  // namespace tessera
