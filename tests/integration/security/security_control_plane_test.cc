// The control plane against a local attacker: real tessera-coordinator and
// tessera-worker processes on loopback, and a raw ZeroMQ DEALER (cppzmq) in
// this test playing the attacker. Each attack of issue #14 item 3 is
// replayed and the safe outcome asserted; after each one the daemons are
// still running and a greedy request still returns the reference tokens.
//
//  - CurveCluster (the default: CURVE keys for every daemon): a plain
//    DEALER fails the handshake; a second connection under a live worker's
//    key is refused; a spare worker with an allowed key cannot fail a step,
//    force a re-plan, or replace a client's tokens; a worker without keys
//    ends with an error naming the keys it lacks.
//  - CurveLeaderCluster (a replica that schedules itself, runs_on =
//    "leader"): a spare worker's forged RequestUpdates are dropped (only the
//    replica's leader reports its requests) and the client's tokens hold.
//  - OpenCluster (control.allow_unauthenticated = true, the explicit off
//    switch): it warns at start and serves; a registration flood stops at
//    server.max_workers and the failed records expire; an unregistered
//    peer's messages are counted and logged once; a worker that registers
//    again replaces its lost record.
//  - RemoteExecutorChecks: the StepResult checks one by one, on a real
//    ControlServer.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <thread>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "common/net/curve_keys.h"
#include "common/net/http_client.h"
#include "common/tokenizer/tokenizer.h"
#include "common/wire/control_codec.h"
#include "coordinator/control/control_server.h"
#include "coordinator/control/remote_executor.h"
#include "support/daemon_cluster.h"
#include "support/test_util.h"
#include "worker/daemon/control_client.h"

namespace tessera {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;
using ::tessera::testing::Spawn;

constexpr const char* kToken = "s3cret";

bool WaitFor(const std::function<bool()>& done, milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    if (done()) return true;
    std::this_thread::sleep_for(milliseconds(20));
  }
  return done();
}

std::string Contents(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

size_t Occurrences(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// The value of one sample on a /metrics page ("name{labels}" or "name");
// 0 when absent (a counter not incremented yet has no sample).
double Sample(const std::string& page, const std::string& series) {
  std::istringstream in(page);
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(series + " ", 0) == 0) return std::stod(line.substr(series.size() + 1));
  return 0;
}

// Waits (bounded) for `pid` (not a daemon of a cluster: `tessera up`) to
// exit; its exit code, or -1 if it did not (then it is stopped).
int ExitStatus(pid_t pid, milliseconds timeout) {
  int status = 0;
  const bool exited = WaitFor([&] { return waitpid(pid, &status, WNOHANG) == pid; }, timeout);
  if (!exited) {
    ::tessera::testing::StopProcesses({pid});
    return -1;
  }
  return ::tessera::testing::ExitCodeOf(status);
}

control::Envelope Stamped(control::Envelope e, const std::string& worker_id) {
  e.set_protocol_version(kControlProtocolVersion);
  e.set_worker_id(worker_id);
  e.set_seq(1);
  return e;
}

control::Envelope RegisterAs(const std::string& worker_id) {
  control::Envelope e;
  control::Register* r = e.mutable_register_worker();
  r->set_host("intruder");
  r->set_pid(31337);
  r->set_build_version("0.1.0");
  r->set_data_address("127.0.0.1");
  control::Device* d = r->add_devices();
  d->set_index(0);
  d->set_name("cpu");
  d->set_kind(control::DEVICE_KIND_CPU);
  d->set_total_memory_bytes(uint64_t{1} << 30);
  d->set_free_memory_bytes(uint64_t{1} << 30);
  return Stamped(e, worker_id);
}

// A raw DEALER, as any process on this host can open one; a CURVE client
// when given a key pair and the coordinator's public key.
class RawPeer {
 public:
  RawPeer(const std::string& endpoint, const std::string& routing_id,
          const CurveKeyPair* key = nullptr, const std::string& server_key = "") {
    dealer_.set(zmq::sockopt::routing_id, routing_id);
    dealer_.set(zmq::sockopt::linger, 0);
    // A DEALER whose handshake has failed has no pipe left, and a send then blocks until one
    // comes, which is never: a bounded send instead (Send, SendUnlessRefused).
    dealer_.set(zmq::sockopt::sndtimeo, 2000);
    if (key) {
      dealer_.set(zmq::sockopt::curve_serverkey, server_key);
      dealer_.set(zmq::sockopt::curve_publickey, key->public_key);
      dealer_.set(zmq::sockopt::curve_secretkey, key->secret_key);
    }
    const std::string monitor = "inproc://raw-peer-monitor-" + routing_id;
    if (zmq_socket_monitor(dealer_.handle(), monitor.c_str(),
                           ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL) != 0)
      throw zmq::error_t();
    monitor_.set(zmq::sockopt::linger, 0);
    monitor_.connect(monitor);
    dealer_.connect(endpoint);
  }
  ~RawPeer() {
    zmq_socket_monitor(dealer_.handle(), nullptr, 0);
    monitor_.close();
    dealer_.close();
  }

  // Queues `e` on an accepted connection (fails the test when it cannot within 2 s).
  void Send(const control::Envelope& e) { ASSERT_TRUE(SendUnlessRefused(e)); }
  // Queues `e`; false when the connection is gone within 2 s. For a peer the coordinator
  // refuses: its handshake may fail before the send (then nothing is queued) or after it.
  bool SendUnlessRefused(const control::Envelope& e) {
    StatusOr<std::string> bytes = EncodeEnvelope(e);
    EXPECT_TRUE(bytes.ok()) << bytes.status().ToString();
    return bytes.ok() && dealer_.send(zmq::buffer(*bytes), zmq::send_flags::none).has_value();
  }
  std::optional<control::Envelope> Receive(milliseconds timeout) {
    zmq_pollitem_t item{dealer_.handle(), 0, ZMQ_POLLIN, 0};
    if (zmq::poll(&item, 1, timeout) <= 0) return std::nullopt;
    zmq::message_t m;
    if (!dealer_.recv(m, zmq::recv_flags::dontwait)) return std::nullopt;
    StatusOr<control::Envelope> e = DecodeEnvelope(m.to_string_view());
    if (!e.ok()) return std::nullopt;
    return *e;
  }
  // Registers and returns the RegisterAck (nullopt: none within 10 s).
  std::optional<control::RegisterAck> Register(const std::string& worker_id) {
    Send(RegisterAs(worker_id));
    std::optional<control::Envelope> e = Receive(milliseconds(10000));
    if (!e || !e->has_register_ack()) return std::nullopt;
    return e->register_ack();
  }
  // True once the handshake failed with a mechanism mismatch.
  bool HandshakeFailedOnMechanism(milliseconds timeout) {
    zmq_pollitem_t item{monitor_.handle(), 0, ZMQ_POLLIN, 0};
    const auto deadline = Clock::now() + timeout;
    while (Clock::now() < deadline) {
      if (zmq::poll(&item, 1, milliseconds(100)) <= 0) continue;
      std::vector<zmq::message_t> ev;
      if (!zmq::recv_multipart(monitor_, std::back_inserter(ev))) continue;
      if (ev.empty() || ev[0].size() < 6) continue;
      uint16_t id = 0;
      uint32_t value = 0;
      std::memcpy(&id, ev[0].data(), 2);
      std::memcpy(&value, static_cast<const char*>(ev[0].data()) + 2, 4);
      if (id == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL &&
          value == ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH)
        return true;
    }
    return false;
  }

 private:
  zmq::context_t context_{1};
  zmq::socket_t dealer_{context_, zmq::socket_type::dealer};
  zmq::socket_t monitor_{context_, zmq::socket_type::pair};
};

// Daemons of one suite, started once for all its tests (each test also
// checks that the previous attacks left them serving).
struct Deployment {
  std::unique_ptr<::tessera::testing::DaemonCluster> cluster;
  std::string dir, model, endpoint;
  int port = 0;

  std::string CoordinatorLog() const { return cluster->CoordinatorLog(); }
  const ::tessera::testing::ControlKeys& keys() const { return cluster->keys(); }
  HttpReply Get(const std::string& target) const {
    return HttpCall(port, "GET", target, "", kToken);
  }
  std::string Metrics() const { return Get("/metrics").body; }
  json Cluster() const { return json::parse(Get("/admin/cluster").body); }
  uint64_t PlanVersion() const {
    return json::parse(Get("/admin/plan").body)["plan_version"].get<uint64_t>();
  }
  // Every daemon still runs, and greedy completions of the model's reference
  // prompts are the reference tokens.
  void ExpectServingCorrectly() const {
    for (pid_t p : cluster->pids())
      EXPECT_EQ(waitpid(p, nullptr, WNOHANG), 0) << "pid " << p << " exited";
    const json ref = json::parse(::tessera::testing::ReadFileOrDie(model + "/reference.json"));
    auto tok = Tokenizer::Load(model);
    ASSERT_TRUE(tok.ok());
    const json& p = ref["prompts"][0];
    const json req = {{"model", "llama_gqa_f32"},
                      {"prompt", p["ids"]},
                      {"max_tokens", 16},
                      {"temperature", 0},
                      {"ignore_eos", true}};
    HttpReply r = HttpCall(port, "POST", "/v1/completions", req.dump());
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(json::parse(r.body)["choices"][0]["text"].get<std::string>(),
              (*tok)->Decode(p["greedy"].get<std::vector<int32_t>>(), true));
  }

  // The options of both suites: `parallel`, `heartbeat` and `workers`
  // workers; at most 10 worker records.
  static ::tessera::testing::DaemonClusterOptions Options(const std::string& prefix,
                                                          const std::string& parallel,
                                                          const std::string& heartbeat,
                                                          int workers) {
    ::tessera::testing::DaemonClusterOptions o;
    o.temp_prefix = prefix;
    o.model_toml = "";
    o.parallel_toml = parallel;
    o.server_toml += "max_workers = 10\n";
    o.admin_toml = std::string("port = 0\ntoken = \"") + kToken + "\"\n";
    o.heartbeat_toml = heartbeat;
    o.scheduler_toml = "max_context = 128\n";
    o.workers = workers;
    return o;
  }
  // Starts the daemons; false (logs printed) if not ready.
  bool Start(::tessera::testing::DaemonClusterOptions o) {
    cluster = std::make_unique<::tessera::testing::DaemonCluster>(std::move(o));
    const Status started = cluster->Start();
    dir = cluster->dir();
    model = cluster->model();
    port = cluster->api_port();
    endpoint = cluster->control_endpoint();
    if (!started.ok()) std::fprintf(stderr, "%s\n", started.ToString().c_str());
    return started.ok();
  }
  void Stop() { cluster->Stop(); }
};

// --------------------------------------------------------------------------
// The default: CURVE on every daemon. tp = 1, pp = 2: worker 0 runs stage 0,
// worker 1 the last stage and samples. Keys 2 and 3 are allowed but unused:
// spare workers an attacker might have taken over.

class CurveCluster : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    d_ = new Deployment();
    auto o = Deployment::Options("tessera-sec-curve", "tp = 1\npp = 2\n",
                                 "interval_seconds = 0.2\ntimeout_seconds = 5.0\n", 2);
    o.spare_worker_keys = 2;  // keys 2 and 3: the attackers' spares
    ready_ = d_->Start(std::move(o));
  }
  static void TearDownTestSuite() {
    d_->Stop();
    delete d_;
  }
  void SetUp() override { ASSERT_TRUE(ready_) << "the daemons did not start"; }

  static CurveKeyPair Key(int i) {
    StatusOr<CurveKeyPair> k = LoadCurveSecretKeyFile(d_->keys().worker_secret_files[i]);
    EXPECT_TRUE(k.ok()) << k.status().ToString();
    return k.ok() ? *k : CurveKeyPair{};
  }
  static double Dropped(const std::string& reason) {
    return Sample(d_->Metrics(),
                  "tessera_control_messages_dropped_total{reason=\"" + reason + "\"}");
  }

  static Deployment* d_;
  static bool ready_;
};
Deployment* CurveCluster::d_ = nullptr;
bool CurveCluster::ready_ = false;

// Attack: a raw DEALER without CURVE sends Register. It never gets past the
// handshake: no RegisterAck, not listed.
TEST_F(CurveCluster, PlainDealerFailsTheHandshakeAndIsNeverRegistered) {
  RawPeer plain(d_->endpoint, "plain-intruder");
  plain.SendUnlessRefused(RegisterAs("intruder"));
  EXPECT_TRUE(plain.HandshakeFailedOnMechanism(milliseconds(10000)));
  EXPECT_FALSE(plain.Receive(milliseconds(300)).has_value());
  const json cluster = d_->Cluster();
  for (const json& w : cluster["workers"]) EXPECT_NE(w["id"], "intruder");
  EXPECT_EQ(cluster["workers"].size(), 2u);
  d_->ExpectServingCorrectly();
}

// Attack: a flood of handshakes under unknown keys. Each is refused; the
// log takes at most ten lines a minute of them and then says the rest are
// counted, so a flood cannot fill the disk. The daemons serve on.
TEST_F(CurveCluster, AFloodOfUnknownKeysIsRefusedAndItsLogIsBounded) {
  const std::string line = "refused a control-plane connection from";
  const size_t before = Occurrences(d_->CoordinatorLog(), line);
  constexpr int kAttempts = 25;
  for (int i = 0; i < kAttempts; ++i) {
    StatusOr<CurveKeyPair> k = GenerateCurveKeyPair();
    ASSERT_TRUE(k.ok());
    RawPeer stranger(d_->endpoint, "flood-" + std::to_string(i), &*k,
                     d_->keys().coordinator_public_key);
    stranger.SendUnlessRefused(RegisterAs("flood-" + std::to_string(i)));
    EXPECT_FALSE(stranger.Receive(milliseconds(200)).has_value());
  }
  // 25 refusals in well under a minute: at least one minute's window saw
  // ten of them and marked the rest as counted.
  EXPECT_TRUE(WaitFor(
      [] {
        return d_->CoordinatorLog().find("further refusals this minute are counted, not logged") !=
               std::string::npos;
      },
      milliseconds(10000)))
      << d_->CoordinatorLog();
  EXPECT_LT(Occurrences(d_->CoordinatorLog(), line) - before, static_cast<size_t>(kAttempts));
  const json cluster = d_->Cluster();  // (a range-for over a temporary's member dangles)
  for (const json& w : cluster["workers"])
    EXPECT_EQ(w["id"].get<std::string>().rfind("flood-", 0), std::string::npos);
  d_->ExpectServingCorrectly();
}

// Attack: a second connection under a live worker's key (a copied key
// file). Refused and logged; the worker it imitates keeps serving.
TEST_F(CurveCluster, SecondConnectionUnderALiveWorkersKeyIsRefusedAndLogged) {
  const CurveKeyPair stolen = Key(1);
  RawPeer twin(d_->endpoint, "twin", &stolen, d_->keys().coordinator_public_key);
  std::optional<control::RegisterAck> ack = twin.Register("twin");
  ASSERT_TRUE(ack.has_value());
  EXPECT_FALSE(ack->accepted());
  EXPECT_NE(ack->reason().find("is in use by live worker"), std::string::npos) << ack->reason();
  EXPECT_TRUE(WaitFor(
      [] {
        return d_->CoordinatorLog().find("CURVE key " + d_->keys().worker_public_keys[1] +
                                         " is in use by live worker") != std::string::npos;
      },
      milliseconds(5000)))
      << d_->CoordinatorLog();
  const json workers = d_->Cluster()["workers"];
  EXPECT_EQ(workers.size(), 2u);
  for (const json& w : workers) EXPECT_NE(w["id"], "twin");
  d_->ExpectServingCorrectly();
}

// Attack: a flood of registrations under a live worker's key (a copied key
// file retried in a loop: 3,000 attempts once gave 3,000 log lines). Each is
// refused; the log takes at most ten of them a minute and says the rest are
// counted. The worker it imitates keeps serving.
TEST_F(CurveCluster, AFloodOfRegistrationsUnderALiveKeyIsRefusedAndItsLogIsBounded) {
  const std::string line = " is in use by live worker";
  const size_t before = Occurrences(d_->CoordinatorLog(), line);
  const CurveKeyPair stolen = Key(1);
  constexpr int kAttempts = 25;
  for (int i = 0; i < kAttempts; ++i) {
    RawPeer twin(d_->endpoint, "twin-flood-" + std::to_string(i), &stolen,
                 d_->keys().coordinator_public_key);
    std::optional<control::RegisterAck> ack = twin.Register("twin-flood-" + std::to_string(i));
    ASSERT_TRUE(ack.has_value()) << i;
    EXPECT_FALSE(ack->accepted()) << i;
  }
  EXPECT_TRUE(WaitFor(
      [] {
        return d_->CoordinatorLog().find(
                   "further registrations refused for a CURVE key in use "
                   "this minute are counted, not logged") != std::string::npos;
      },
      milliseconds(10000)))
      << d_->CoordinatorLog();
  EXPECT_LT(Occurrences(d_->CoordinatorLog(), line) - before, static_cast<size_t>(kAttempts));
  const json workers = d_->Cluster()["workers"];
  for (const json& w : workers)
    EXPECT_EQ(w["id"].get<std::string>().rfind("twin-flood-", 0), std::string::npos);
  d_->ExpectServingCorrectly();
}

// Attack: a registered spare worker sends error results for the current
// plan (its version read from the open /metrics) and an Error. Nothing
// fails, no re-plan; each is counted, the peer logged once.
TEST_F(CurveCluster, InjectedErrorResultsNeitherFailAStepNorForceAReplan) {
  const uint64_t plan = static_cast<uint64_t>(Sample(d_->Metrics(), "tessera_plan_version"));
  ASSERT_GE(plan, 1u);
  const double replans = Sample(d_->Metrics(), "tessera_reconfigurations_total");
  const double wrong_rank = Dropped("wrong_rank"), not_in_plan = Dropped("not_in_plan");
  const CurveKeyPair spare = Key(2);
  RawPeer peer(d_->endpoint, "spare-2", &spare, d_->keys().coordinator_public_key);
  std::optional<control::RegisterAck> ack = peer.Register("spare-2");
  ASSERT_TRUE(ack.has_value() && ack->accepted()) << (ack ? ack->reason() : "no ack");
  for (uint64_t mb = 0; mb < 4; ++mb) {
    control::Envelope e;
    e.mutable_step_result()->set_plan_version(plan);
    e.mutable_step_result()->set_micro_batch_id(mb);
    e.mutable_step_result()->mutable_error()->set_code(control::ERROR_CODE_INTERNAL);
    e.mutable_step_result()->mutable_error()->set_message("injected");
    peer.Send(Stamped(e, "spare-2"));
  }
  control::Envelope error;
  error.mutable_error()->set_code(control::ERROR_CODE_INTERNAL);
  error.mutable_error()->set_message("injected collective failure");
  error.mutable_error()->set_plan_version(plan);
  peer.Send(Stamped(error, "spare-2"));
  ASSERT_TRUE(WaitFor(
      [&] {
        return Dropped("wrong_rank") >= wrong_rank + 4 && Dropped("not_in_plan") >= not_in_plan + 1;
      },
      milliseconds(10000)))
      << d_->Metrics();
  d_->ExpectServingCorrectly();
  EXPECT_EQ(d_->PlanVersion(), plan);
  EXPECT_EQ(Sample(d_->Metrics(), "tessera_reconfigurations_total"), replans);
  EXPECT_EQ(Occurrences(d_->CoordinatorLog(), "dropped a control message from worker 'spare-2'"),
            1u)
      << d_->CoordinatorLog();
}

// Attack: token results for every likely micro-batch id, sent while a greedy
// request runs (before the checks, one landed in place of the sampler's and
// the client got its token). The client's tokens are the reference ones.
TEST_F(CurveCluster, InjectedTokenResultsDoNotReachTheClient) {
  const uint64_t plan = static_cast<uint64_t>(Sample(d_->Metrics(), "tessera_plan_version"));
  const double before = Dropped("wrong_rank");
  const CurveKeyPair spare = Key(3);
  RawPeer peer(d_->endpoint, "spare-3", &spare, d_->keys().coordinator_public_key);
  std::optional<control::RegisterAck> ack = peer.Register("spare-3");
  ASSERT_TRUE(ack.has_value() && ack->accepted()) << (ack ? ack->reason() : "no ack");
  std::atomic<bool> done{false};
  int sent = 0;
  std::thread flood([&] {
    // Bounded: at most 3000 results, stopping when the request is done.
    for (; sent < 3000 && !done.load(); ++sent) {
      control::Envelope e;
      control::StepResult* r = e.mutable_step_result();
      r->set_plan_version(plan);
      // One token, as the one request's micro-batches sample one sequence.
      r->set_micro_batch_id(static_cast<uint64_t>(sent % 512));
      control::SampledToken* t = r->add_tokens();
      t->set_seq_id(sent % 8);
      t->set_token_id(62);
      peer.Send(Stamped(e, "spare-3"));
      if (sent % 16 == 15) std::this_thread::sleep_for(milliseconds(1));
    }
  });
  d_->ExpectServingCorrectly();
  done = true;
  flood.join();
  EXPECT_TRUE(WaitFor([&] { return Dropped("wrong_rank") >= before + sent; }, milliseconds(10000)))
      << sent << " sent; " << d_->Metrics();
  EXPECT_EQ(d_->PlanVersion(), plan);
}

// A worker without keys pointed at this (CURVE) coordinator ends with an
// error that says so, instead of retrying forever.
TEST_F(CurveCluster, WorkerWithoutCurveExitsWithAnErrorThatSaysSo) {
  ::tessera::testing::WorkerSpec plain;
  plain.device = 7;
  plain.key = ::tessera::testing::WorkerSpec::kNoKey;
  plain.args = {"--set", "control.allow_unauthenticated=true"};
  const pid_t w = d_->cluster->StartWorker(plain);
  const std::optional<int> status = d_->cluster->WaitForExit(w, 60);
  const int rc = status ? ::tessera::testing::ExitCodeOf(*status) : -1;
  const std::string log = d_->cluster->WorkerLog(d_->cluster->workers_started() - 1);
  EXPECT_NE(rc, 0) << log;
  EXPECT_NE(rc, -1) << "still running: " << log;
  EXPECT_NE(log.find("the coordinator requires CURVE but this worker has no key"),
            std::string::npos)
      << log;
  EXPECT_EQ(log.find("queue to the coordinator is full"), std::string::npos) << log;
  d_->ExpectServingCorrectly();
}

// Without keys and without the off switch, neither daemon starts.
TEST(ControlPlaneDefaults, DaemonsWithoutKeysRefuseToStart) {
  const std::string dir = ::tessera::testing::MakeTempDir("tessera-sec-nokeys");
  const std::string model = ::tessera::testing::FixturePath("models/llama_gqa_f32");
  std::ofstream(dir + "/c.toml")
      << "[model]\npath = \"" << model
      << "\"\n[server]\nport = 0\ncontrol_endpoint = \"tcp://127.0.0.1:0\"\n";
  EXPECT_NE(::tessera::testing::RunDaemonUntilExit(
                "tessera-coordinator", {"--config", dir + "/c.toml"}, dir + "/coordinator.log", 30),
            0);
  const std::string clog = Contents(dir + "/coordinator.log");
  EXPECT_NE(clog.find("the control plane has no CURVE key"), std::string::npos) << clog;
  EXPECT_NE(clog.find("control.allow_unauthenticated"), std::string::npos) << clog;
  EXPECT_EQ(::tessera::testing::RunDaemonUntilExit("tessera-worker", {"--config", dir + "/c.toml"},
                                                   dir + "/worker.log", 30),
            2);
  const std::string wlog = Contents(dir + "/worker.log");
  EXPECT_NE(wlog.find("control.worker_secret_key_file"), std::string::npos) << wlog;
}

// `tessera up` makes CURVE keys for its deployment in a private run
// directory (0700, secret keys 0600), its workers register with them, and
// the directory is gone once it exits.
TEST(ControlPlaneDefaults, TesseraUpMakesItsOwnKeysAndRemovesThem) {
  const std::string dir = ::tessera::testing::MakeTempDir("tessera-sec-up");
  std::ofstream(dir + "/up.toml")
      << "[model]\npath = \"" << ::tessera::testing::FixturePath("models/llama_gqa_f32")
      << "\"\n[parallel]\ntp = 1\npp = 2\n[server]\nport = 0"
      << "\ncontrol_endpoint = \"tcp://127.0.0.1:0\"\n[admin]\nport = 0\n"
      << "[kv_cache]\nmax_blocks = 64\n[scheduler]\nmax_context = 128\n";
  const pid_t up =
      Spawn({"/usr/bin/env", "TMPDIR=" + dir, ::tessera::testing::BinaryDir() + "/tessera", "up",
             "--config", dir + "/up.toml", "--ready-timeout", "120"},
            dir + "/up.log");
  // The coordinator's ports file lies in the run directory `tessera up` made.
  std::string run_dir;
  ASSERT_TRUE(WaitFor(
                  [&] {
                    for (const auto& e : std::filesystem::directory_iterator(dir))
                      if (e.path().filename().string().rfind("tessera-up-", 0) == 0)
                        run_dir = e.path().string();
                    return !run_dir.empty() || waitpid(up, nullptr, WNOHANG) != 0;
                  },
                  milliseconds(60000)) &&
              !run_dir.empty())
      << "no run directory under " << dir << ": " << Contents(dir + "/up.log");
  const auto ports = ::tessera::testing::WaitForPortsFile(run_dir + "/ports.json", up);
  ASSERT_TRUE(ports) << Contents(dir + "/up.log");
  const int port = ports->api;
  const bool ready = WaitFor(
      [&] {
        return HttpCall(port, "GET", "/readyz").status == 200 || waitpid(up, nullptr, WNOHANG);
      },
      milliseconds(120000));
  ASSERT_TRUE(ready && HttpCall(port, "GET", "/readyz").status == 200) << Contents(dir + "/up.log");
  auto mode = [](const std::string& path) {
    struct stat st {};
    return stat(path.c_str(), &st) == 0 ? static_cast<int>(st.st_mode & 0777) : -1;
  };
  EXPECT_EQ(mode(run_dir), 0700);
  for (const char* key : {"coordinator.key", "worker0.key", "worker1.key"})
    EXPECT_EQ(mode(run_dir + "/" + key), 0600) << key;
  StatusOr<CurveKeyPair> w0 = LoadCurveSecretKeyFile(run_dir + "/worker0.key");
  StatusOr<CurveKeyPair> w1 = LoadCurveSecretKeyFile(run_dir + "/worker1.key");
  ASSERT_TRUE(w0.ok() && w1.ok());
  const json cluster = json::parse(HttpCall(port, "GET", "/admin/cluster").body);
  std::set<std::string> keys;
  for (const json& w : cluster["workers"]) keys.insert(w["curve_public_key"].get<std::string>());
  EXPECT_EQ(keys, (std::set<std::string>{w0->public_key, w1->public_key}));
  kill(up, SIGTERM);
  EXPECT_EQ(ExitStatus(up, milliseconds(60000)), 0) << Contents(dir + "/up.log");
  EXPECT_FALSE(std::filesystem::exists(run_dir));
}

// --------------------------------------------------------------------------
// A replica that schedules itself (scheduler.runs_on = "leader", issue #33):
// tp = 1, pp = 1, worker 0 leads. Key 1 is allowed but unused: a spare an
// attacker took over. Only the replica's leader may report its requests'
// progress; the spare's forged RequestUpdates (tokens and a finish for every
// request id the coordinator has handed out) are dropped and counted
// (reason not_leader), and the client gets the model's tokens.

class CurveLeaderCluster : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    d_ = new Deployment();
    auto o = Deployment::Options("tessera-sec-leader", "mode = \"explicit\"\ntp = 1\npp = 1\n",
                                 "interval_seconds = 0.2\ntimeout_seconds = 5.0\n", 1);
    o.scheduler_toml += "runs_on = \"leader\"\n";
    o.spare_worker_keys = 1;  // key 1: the attacker's spare
    ready_ = d_->Start(std::move(o));
  }
  static void TearDownTestSuite() {
    d_->Stop();
    delete d_;
  }
  void SetUp() override { ASSERT_TRUE(ready_) << "the daemons did not start"; }

  static Deployment* d_;
  static bool ready_;
};
Deployment* CurveLeaderCluster::d_ = nullptr;
bool CurveLeaderCluster::ready_ = false;

TEST_F(CurveLeaderCluster, ForgedRequestUpdatesFromANonLeaderAreDropped) {
  const uint64_t plan = d_->PlanVersion();
  const auto dropped = [] {
    return Sample(d_->Metrics(), "tessera_control_messages_dropped_total{reason=\"not_leader\"}");
  };
  const double before = dropped();
  StatusOr<CurveKeyPair> key = LoadCurveSecretKeyFile(d_->keys().worker_secret_files[1]);
  ASSERT_TRUE(key.ok()) << key.status().ToString();
  RawPeer peer(d_->endpoint, "spare-1", &*key, d_->keys().coordinator_public_key);
  std::optional<control::RegisterAck> ack = peer.Register("spare-1");
  ASSERT_TRUE(ack.has_value() && ack->accepted()) << (ack ? ack->reason() : "no ack");
  std::atomic<bool> done{false};
  int sent = 0;
  std::thread flood([&] {
    // Bounded: at most 2000 messages, stopping when the request is done.
    for (; sent < 2000 && !done.load(); ++sent) {
      control::Envelope e;
      control::RequestUpdates* u = e.mutable_request_updates();
      u->set_plan_version(plan);
      for (int64_t id = 1; id <= 8; ++id) {  // ids start at 1
        control::RequestUpdate* r = u->add_updates();
        r->set_request_id(id);
        control::TokenUpdate* t = r->add_tokens();
        t->set_token_id(62);
        t->set_text("forged");
        if (sent % 2 == 1) {
          r->set_finished(true);
          r->set_finish_reason("stop");
        }
      }
      peer.Send(Stamped(e, "spare-1"));
      if (sent % 16 == 15) std::this_thread::sleep_for(milliseconds(1));
    }
  });
  d_->ExpectServingCorrectly();
  done = true;
  flood.join();
  EXPECT_TRUE(WaitFor([&] { return dropped() >= before + sent; }, milliseconds(10000)))
      << sent << " sent; " << d_->Metrics();
  EXPECT_EQ(d_->PlanVersion(), plan);
  // The leader still serves after the flood.
  d_->ExpectServingCorrectly();
}

// --------------------------------------------------------------------------
// The explicit off switch: no CURVE. tp = pp = 1, one worker; at most 10
// worker records; a lost worker is declared after 2 s and forgotten 6 s
// later.

class OpenCluster : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    d_ = new Deployment();
    auto o = Deployment::Options(
        "tessera-sec-open", "tp = 1\npp = 1\n",
        "interval_seconds = 0.2\ntimeout_seconds = 2.0\nforget_failed_after_seconds = 6.0\n", 1);
    o.curve = false;  // control.allow_unauthenticated = true on both daemons
    ready_ = d_->Start(std::move(o));
  }
  static void TearDownTestSuite() {
    d_->Stop();
    delete d_;
  }
  void SetUp() override { ASSERT_TRUE(ready_) << "the daemons did not start"; }

  static Deployment* d_;
  static bool ready_;
};
Deployment* OpenCluster::d_ = nullptr;
bool OpenCluster::ready_ = false;

TEST_F(OpenCluster, OffSwitchIsLoggedAsAWarningAndServes) {
  const std::string clog = d_->CoordinatorLog();
  EXPECT_NE(clog.find("control.allow_unauthenticated = true: the control plane"), std::string::npos)
      << clog;
  const std::string wlog = Contents(d_->dir + "/worker0.log");
  EXPECT_NE(wlog.find("control.allow_unauthenticated = true"), std::string::npos) << wlog;
  d_->ExpectServingCorrectly();
}

// Attack: a flood of registrations from raw DEALERs. At most
// server.max_workers records exist; the refusal is logged once, not once
// per peer; the fakes (they never heartbeat) are declared failed, then
// forgotten, and room for new workers comes back.
TEST_F(OpenCluster, RegistrationFloodStopsAtTheCapAndFailedRecordsExpire) {
  constexpr int kFakes = 300;
  int accepted = 0, refused = 0, capped = 0;
  for (int i = 0; i < kFakes; ++i) {
    RawPeer fake(d_->endpoint, "fake-" + std::to_string(i));
    std::optional<control::RegisterAck> ack = fake.Register("");
    ASSERT_TRUE(ack.has_value()) << "no ack for fake " << i;
    if (ack->accepted()) {
      ++accepted;
    } else {
      ++refused;
      capped += ack->reason().find("server.max_workers") != std::string::npos;
    }
  }
  std::printf("flood: %d accepted, %d refused\n", accepted, refused);
  EXPECT_GE(accepted, 1);
  EXPECT_LE(accepted, 9 + 9);  // room for 9 besides the real worker, once more after expiry
  EXPECT_EQ(capped, refused);
  EXPECT_GE(refused, kFakes / 2);
  EXPECT_LE(d_->Cluster()["workers"].size(), 10u);
  const size_t logged = Occurrences(d_->CoordinatorLog(), "server.max_workers = 10");
  EXPECT_GE(logged, 1u);
  EXPECT_LE(logged, 3u) << "the refusal is logged once per time the cap is reached";
  d_->ExpectServingCorrectly();
  // The fakes expire: only the real worker is left, and nothing counts as failed.
  ASSERT_TRUE(WaitFor(
      [] {
        return d_->Cluster()["workers"].size() == 1u &&
               Sample(d_->Metrics(), "tessera_workers{state=\"failed\"}") == 0;
      },
      milliseconds(60000)))
      << d_->Get("/admin/cluster").body;
  RawPeer late(d_->endpoint, "late");
  std::optional<control::RegisterAck> ack = late.Register("late");
  ASSERT_TRUE(ack.has_value());
  EXPECT_TRUE(ack->accepted()) << ack->reason();
  d_->ExpectServingCorrectly();
}

// Attack: results from a peer that never registered (a flood under one
// routing id). Each is dropped and counted; the log names the peer once.
TEST_F(OpenCluster, UnregisteredPeerIsCountedAndLoggedOnce) {
  const std::string series = "tessera_control_messages_dropped_total{reason=\"unregistered\"}";
  const double before = Sample(d_->Metrics(), series);
  RawPeer stranger(d_->endpoint, "stranger");
  for (uint64_t mb = 0; mb < 50; ++mb) {
    control::Envelope e;
    e.mutable_step_result()->set_plan_version(1);
    e.mutable_step_result()->set_micro_batch_id(mb);
    stranger.Send(Stamped(e, "worker-0"));
  }
  ASSERT_TRUE(
      WaitFor([&] { return Sample(d_->Metrics(), series) >= before + 50; }, milliseconds(10000)))
      << d_->Metrics();
  EXPECT_EQ(Occurrences(d_->CoordinatorLog(), "dropped message from peer stranger"), 1u)
      << d_->CoordinatorLog();
  d_->ExpectServingCorrectly();
}

// A worker that registers again after its loss replaces its record instead
// of being listed twice.
TEST_F(OpenCluster, ReRegistrationReplacesTheLostRecord) {
  auto entries = [](const std::string& id, const char* state) {
    int n = 0;
    const json cluster = d_->Cluster();
    for (const json& w : cluster["workers"])
      n += w["id"] == id && (state == nullptr || w["state"] == state);
    return n;
  };
  {
    RawPeer first(d_->endpoint, "returning");
    std::optional<control::RegisterAck> ack = first.Register("returning");
    ASSERT_TRUE(ack.has_value() && ack->accepted());
  }
  // Silent: declared failed after the heartbeat timeout.
  ASSERT_TRUE(WaitFor([&] { return entries("returning", "failed") == 1; }, milliseconds(20000)))
      << d_->Get("/admin/cluster").body << "\n"
      << d_->CoordinatorLog();
  RawPeer again(d_->endpoint, "returning");
  std::optional<control::RegisterAck> ack = again.Register("returning");
  ASSERT_TRUE(ack.has_value());
  EXPECT_TRUE(ack->accepted()) << ack->reason();
  EXPECT_EQ(entries("returning", nullptr), 1) << d_->Get("/admin/cluster").body;
  EXPECT_EQ(entries("returning", "alive"), 1) << d_->Get("/admin/cluster").body;
  d_->ExpectServingCorrectly();
}

// --------------------------------------------------------------------------
// RemoteExecutor's StepResult checks, one by one: a real ControlServer with a
// real ControlClient as the stage-0 worker, so Submit sends its Step.

TEST(RemoteExecutorChecks, StepResultsAreTakenOnlyFromTheSamplerForTheirMicroBatch) {
  ControlServerOptions so;
  ControlServer server(so);
  StatusOr<std::string> endpoint = server.Start("tcp://127.0.0.1:*");
  ASSERT_TRUE(endpoint.ok()) << endpoint.status().ToString();
  ControlClient first{ControlClientOptions{}};
  ASSERT_TRUE(first.Connect(*endpoint).ok());
  control::Register reg = RegisterAs("first").register_worker();
  ASSERT_TRUE(first.Register(reg, "first").ok());
  ASSERT_TRUE(first.WaitRegistered(milliseconds(10000)).ok());

  RemoteExecutor ex(&server, 7, {"first"}, {"first", "last"}, "last", 2, 100, 10.0);
  StepBatch batch;
  for (int64_t id : {11, 12, 13}) {
    SeqStep s;
    s.seq_id = id;
    s.num_tokens = 1;
    s.block_table = {0};
    s.want_logits = id != 12;  // 12 is mid-prefill: no token
    batch.seqs.push_back(s);
    batch.token_ids.push_back(1);
  }
  ASSERT_TRUE(ex.Submit(batch).ok());
  auto result = [](uint64_t plan, uint64_t mb, std::vector<int64_t> seqs) {
    control::StepResult r;
    r.set_plan_version(plan);
    r.set_micro_batch_id(mb);
    for (int64_t s : seqs) {
      control::SampledToken* t = r.add_tokens();
      t->set_seq_id(s);
      t->set_token_id(5);
    }
    return r;
  };
  auto reason = [](const StepResultVerdict& v) {
    return std::string(v.reason ? v.reason : "accepted");
  };
  EXPECT_EQ(reason(ex.OnStepResult("first", result(7, 0, {11, 13}))), "wrong_rank");
  EXPECT_EQ(reason(ex.OnStepResult("intruder", result(7, 0, {11, 13}))), "wrong_rank");
  EXPECT_EQ(reason(ex.OnStepResult("last", result(6, 0, {11, 13}))), "wrong_plan_version");
  EXPECT_EQ(reason(ex.OnStepResult("last", result(7, 1, {11, 13}))), "unknown_micro_batch");
  EXPECT_EQ(reason(ex.OnStepResult("last", result(7, 0, {13, 11}))), "wrong_seq_ids");
  EXPECT_EQ(reason(ex.OnStepResult("last", result(7, 0, {11, 12, 13}))), "wrong_seq_ids");
  control::StepResult failed;
  failed.set_plan_version(7);
  failed.set_micro_batch_id(0);
  failed.mutable_error()->set_code(control::ERROR_CODE_INTERNAL);
  failed.mutable_error()->set_message("injected");
  EXPECT_EQ(reason(ex.OnStepResult("first", failed)), "wrong_rank");
  EXPECT_TRUE(ex.health().ok()) << ex.health().ToString();
  const StepResultVerdict taken = ex.OnStepResult("last", result(7, 0, {11, 13}));
  EXPECT_TRUE(taken.accepted()) << taken.detail;
  EXPECT_EQ(reason(ex.OnStepResult("last", result(7, 0, {11, 13}))), "unknown_micro_batch");
  StatusOr<std::vector<SampledToken>> tokens = ex.Collect();
  ASSERT_TRUE(tokens.ok()) << tokens.status().ToString();
  ASSERT_EQ(tokens->size(), 2u);
  EXPECT_EQ((*tokens)[0].token_id, 5);
  // Collected: a late copy is refused too.
  EXPECT_EQ(reason(ex.OnStepResult("last", result(7, 0, {11, 13}))), "unknown_micro_batch");
  first.Stop();
  server.Stop();
}

// One key, one worker, on the ControlServer itself: the key of a live worker
// cannot register a second one; once that worker is lost, a worker with its
// key replaces its record.
TEST(ControlServerBounds, OneKeyRegistersOneWorkerAndTheCapHolds) {
  StatusOr<CurveKeyPair> server_key = GenerateCurveKeyPair();
  StatusOr<CurveKeyPair> worker_key = GenerateCurveKeyPair();
  ASSERT_TRUE(server_key.ok() && worker_key.ok());
  ControlServerOptions so;
  so.curve_secret_key = server_key->secret_key;
  so.curve_allowed_public_keys = {worker_key->public_key};
  so.heartbeat_interval = milliseconds(50);
  so.heartbeat_miss_limit = 4;
  std::atomic<int> forgotten{0};
  so.on_worker_forgotten = [&](const std::string&) { ++forgotten; };
  ControlServer server(so);
  StatusOr<std::string> endpoint = server.Start("tcp://127.0.0.1:*");
  ASSERT_TRUE(endpoint.ok()) << endpoint.status().ToString();
  {
    RawPeer a(*endpoint, "peer-a", &*worker_key, server_key->public_key);
    std::optional<control::RegisterAck> ack = a.Register("a");
    ASSERT_TRUE(ack.has_value() && ack->accepted());
    RawPeer b(*endpoint, "peer-b", &*worker_key, server_key->public_key);
    ack = b.Register("b");
    ASSERT_TRUE(ack.has_value());
    EXPECT_FALSE(ack->accepted());
    EXPECT_NE(ack->reason().find("one key registers one worker"), std::string::npos);
    EXPECT_EQ(server.stats().registrations_refused_key_in_use, 1u);
  }
  // "a" goes silent and is lost; a worker with its key takes over.
  ASSERT_TRUE(WaitFor([&] { return server.stats().workers_lost == 1; }, milliseconds(5000)));
  RawPeer c(*endpoint, "peer-c", &*worker_key, server_key->public_key);
  std::optional<control::RegisterAck> ack = c.Register("c");
  ASSERT_TRUE(ack.has_value());
  EXPECT_TRUE(ack->accepted()) << ack->reason();
  std::vector<ControlWorkerInfo> workers = server.Workers();
  ASSERT_EQ(workers.size(), 1u);
  EXPECT_EQ(workers[0].worker_id, "c");
  EXPECT_EQ(forgotten.load(), 1);  // "a", replaced
  server.Stop();
}

}  // namespace
}  // namespace tessera
