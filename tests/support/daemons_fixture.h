// Daemons: the gtest fixture of the daemon tests. SetUp starts a
// DaemonCluster (daemon_cluster.h): tessera-coordinator and four
// tessera-worker processes (tp=2 x pp=2 by default) on loopback serving the
// fixture model llama_gqa_f32, ready on /readyz; TearDown stops them all.
// A variant overrides Options() (starting from Daemons::Options()) and, when
// it serves a model it made, ModelPath().
// Shared by the daemon tests and the security suite.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "common/net/http_client.h"
#include "support/daemon_cluster.h"
#include "support/test_util.h"

namespace tessera {

class Daemons : public ::testing::Test {
 protected:
  // The cluster's options; dir and model_path are filled in from dir_ and
  // ModelPath().
  // (The defaults: admin token "s3cret", heartbeats every 0.2 s, lost
  // after 1 s, 256 KV blocks of 4, max_context 128.)
  virtual ::tessera::testing::DaemonClusterOptions Options() const { return {}; }
  // The fixture model (tests/fixtures/models/<name>) the daemons serve.
  virtual std::string ModelName() const { return "llama_gqa_f32"; }
  // The model directory the daemons serve: the fixture ModelName() unless a
  // variant serves a model it made (called in SetUp, after dir_ is set).
  virtual std::string ModelPath() const {
    return ::tessera::testing::FixturePath("models/" + ModelName());
  }

  void SetUp() override {
    dir_ = ::tessera::testing::MakeTempDir("tessera-daemons");
    ::tessera::testing::DaemonClusterOptions o = Options();
    o.dir = dir_;
    o.model_path = ModelPath();
    cluster_ = std::make_unique<::tessera::testing::DaemonCluster>(std::move(o));
    model_ = cluster_->model();
    const Status started = cluster_->Start();
    port_ = cluster_->api_port();
    ASSERT_TRUE(started.ok()) << started.ToString();
  }
  void TearDown() override { cluster_->Stop(); }
  std::string Completion(const nlohmann::json& body) { return body.dump(); }

  std::unique_ptr<::tessera::testing::DaemonCluster> cluster_;
  std::string dir_, model_;
  int port_ = 0;
};

}  // namespace tessera
