// The daemons across real network interfaces: the coordinator and two
// workers each in a network namespace of its own (ip netns), joined by veth
// pairs on a bridge in a fourth namespace, each with its own address. The
// control plane (ZeroMQ), the rendezvous store and the Gloo traffic between
// the workers all cross the veths; the test's HTTP client does too. Workers
// find their Gloo address themselves (worker.gloo_host = "": the address
// that routes to the coordinator) and use the coordinator's wildcard-bound
// store through the address they reach it at. The control plane crosses
// the network, so it runs with CURVE keys (DaemonCluster's, made as
// `tessera keygen` makes them): the coordinator allows exactly the two
// workers' public keys.
//
// Needs root and iproute2 (scripts/setup installs it); without them the test
// fails and says so. The namespaces are removed in TearDown, and stale ones
// of dead test processes at the next start.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "common/net/http_client.h"
#include "common/tokenizer/tokenizer.h"
#include "support/daemon_cluster.h"
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

// The command-line prefix that runs a daemon inside network namespace `ns`
// (the daemon keeps the pid: ip netns exec execs it), killed when the test
// process ends so it never outlives the test.
std::vector<std::string> InNetnsCommand(const std::string& ns) {
  return {"setpriv", "--pdeathsig", "KILL", "ip", "netns", "exec", ns};
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

    // Wildcard listeners: the coordinator's namespace has one interface
    // besides lo; ports are fixed since the namespace is ours alone.
    ::tessera::testing::DaemonClusterOptions o;
    o.temp_prefix = "tessera-netns";
    o.parallel_toml = "tp = 2\npp = 1\n";
    o.server_toml = "host = \"0.0.0.0\"\nport = 8000\ncontrol_endpoint = \"tcp://*:5555\"\n";
    o.admin_toml = "port = 0\ntoken = \"netns-token\"\n";
    o.heartbeat_toml = "interval_seconds = 0.2\ntimeout_seconds = 3.0\n";
    o.kv_cache_toml = "max_blocks = 128\nblock_size = 4\n";
    o.scheduler_toml = "max_context = 128\n";
    o.coordinator_wrapper = InNetnsCommand(coord_);
    o.worker_coordinator_endpoint = "tcp://10.213.0.1:5555";
    o.worker_timeout_seconds = 10;
    o.workers = 2;
    int d = 0;
    for (const std::string& ns : {worker_a_, worker_b_}) {
      ::tessera::testing::WorkerSpec w;
      w.wrapper = InNetnsCommand(ns);
      w.device = 0;
      w.args = {"--set", "worker.host=host-" + std::to_string(d++)};
      o.worker_specs.push_back(w);
    }
    // /readyz from a worker's namespace, through the veths.
    const std::string probe_from = worker_a_;
    o.ready_probe = [probe_from](const ::tessera::testing::DaemonCluster&) {
      HttpReply r;
      InNetns(probe_from, [&] { r = Call("GET", "/readyz"); });
      return r;
    };
    o.wait_ready = false;
    o.stop_grace_seconds = 3.0;
    cluster_ = std::make_unique<::tessera::testing::DaemonCluster>(std::move(o));
    dir_ = cluster_->dir();
    model_ = cluster_->model();
    const Status started = cluster_->Start();
    ASSERT_TRUE(started.ok()) << started.ToString();
    // Up to 45 s on a loaded 2-core machine; a 503 for another reason than
    // missing workers will not turn into readiness.
    const Status ready = cluster_->WaitReady(45, [](const HttpReply& r) {
      return r.status == 503 && r.body.find("waiting for workers") == std::string::npos;
    });
    ASSERT_TRUE(ready.ok()) << ready.ToString();
  }

  void TearDown() override {
    if (cluster_) cluster_->Stop();
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
  std::unique_ptr<::tessera::testing::DaemonCluster> cluster_;
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
