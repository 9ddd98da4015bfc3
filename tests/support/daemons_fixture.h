// Daemons: a test fixture that starts tessera-coordinator and four
// tessera-worker processes (tp=2 x pp=2 by default) on loopback with the
// fixture model llama_gqa_f32 (ModelName()), waits for /readyz, and stops them all in
// TearDown. Variants override the virtual *Toml() and Workers() methods.
// Shared by the daemon tests and the security suite.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "common/net/http_client.h"
#include "support/test_util.h"

namespace tessera {

using ::tessera::testing::Spawn;

class Daemons : public ::testing::Test {
 protected:
  // The [parallel] keys and the worker count of the deployment.
  virtual std::string ParallelToml() const { return "tp = 2\npp = 2\n"; }
  virtual int Workers() const { return 4; }
  // The fixture model (tests/fixtures/models/<name>) the daemons serve.
  virtual std::string ModelName() const { return "llama_gqa_f32"; }
  // The model directory the daemons serve: the fixture ModelName() unless a
  // variant serves a model it made (called in SetUp, after dir_ is set).
  virtual std::string ModelPath() const {
    return ::tessera::testing::FixturePath("models/" + ModelName());
  }
  // The [scheduler] table and the chat template override; variants of the
  // fixture change them.
  virtual std::string SchedulerToml() const {
    return "[scheduler]\nmax_context = 128\nqueue_limit = 40\nmax_sequences = 40\n";
  }
  virtual std::string ChatTemplateToml() const { return "chat_template = \"chatml\"\n"; }

  void SetUp() override {
    dir_ = ::tessera::testing::MakeTempDir("tessera-daemons");
    model_ = ModelPath();
    const auto keys = ::tessera::testing::MakeControlKeys(dir_, Workers());
    std::ofstream(dir_ + "/c.toml")
        << "[model]\npath = \"" << model_ << "\"\n"
        << ChatTemplateToml() << "[parallel]\n"
        << ParallelToml() << "[server]\nport = 0\ncontrol_endpoint = \"tcp://127.0.0.1:0\"\n"
        << "[admin]\nport = 0\ntoken = \"s3cret\"\n"
        << "[heartbeat]\ninterval_seconds = 0.2\ntimeout_seconds = 1.0\n"
        << "[kv_cache]\nmax_blocks = 256\nblock_size = 4\n"
        << SchedulerToml() << keys.CoordinatorToml();
    const std::string bin = ::tessera::testing::BinaryDir();
    pids_.push_back(Spawn({bin + "/tessera-coordinator", "--config", dir_ + "/c.toml",
                           "--ports-file", dir_ + "/ports.json"},
                          dir_ + "/coordinator.log"));
    const auto ports = ::tessera::testing::WaitForPortsFile(dir_ + "/ports.json", pids_[0]);
    ASSERT_TRUE(ports) << "no ports file: "
                       << ::tessera::testing::ReadFileOrDie(dir_ + "/coordinator.log");
    port_ = ports->api;
    for (int i = 0; i < Workers(); ++i)
      pids_.push_back(
          Spawn(::tessera::testing::Concat({bin + "/tessera-worker", "--coordinator",
                                            ::tessera::testing::LoopbackEndpoint(ports->control),
                                            "--device", std::to_string(i), "--timeout", "5"},
                                           keys.WorkerArgs(i)),
                dir_ + "/worker" + std::to_string(i) + ".log"));
    for (int i = 0; i < 1200; ++i) {  // up to 2 minutes on a loaded 2-core machine
      if (HttpCall(port_, "GET", "/readyz").status == 200) return;
      if (waitpid(pids_[0], nullptr, WNOHANG) != 0) break;  // the coordinator died
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    FAIL() << "daemons not ready: " << ::tessera::testing::ReadFileOrDie(dir_ + "/coordinator.log");
  }
  void TearDown() override { ::tessera::testing::StopProcesses(pids_); }
  std::string Completion(const nlohmann::json& body) { return body.dump(); }

  std::string dir_, model_;
  int port_ = 0;
  std::vector<pid_t> pids_;
};

}  // namespace tessera
