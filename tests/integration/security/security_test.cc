// Security: CURVE keys and the authenticated control plane, TLS on the HTTP
// listeners, the config keys for limits and keys, and the daemons end to end
// with all of it on (TLS API, admin on its own listener behind a token, CURVE
// between coordinator and workers, request limits).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <openssl/ssl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "common/config/daemon_config.h"
#include "common/net/curve_keys.h"
#include "common/net/http_client.h"
#include "common/net/http_server.h"
#include "coordinator/control/control_server.h"
#include "support/daemon_cluster.h"
#include "support/https_client.h"
#include "support/test_util.h"
#include "worker/daemon/control_client.h"

namespace tessera {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace ssl = net::ssl;
using tcp = net::ip::tcp;
using nlohmann::json;
using std::chrono::milliseconds;
using ::tessera::testing::HttpsCall;
using Reply = ::tessera::testing::HttpsReply;

std::string Contents(const std::string& path) { return ::tessera::testing::ReadFileOrDie(path); }

bool WaitFor(const std::function<bool()>& pred, milliseconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    if (pred()) return true;
    std::this_thread::sleep_for(milliseconds(20));
  }
  return pred();
}

// A self-signed P-256 certificate for localhost / 127.0.0.1 (openssl CLI),
// as <dir>/cert.pem and <dir>/key.pem.
void MakeSelfSignedCert(const std::string& dir) {
  auto [rc, out] = ::tessera::testing::RunCommand(
      "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 "
      "-subj /CN=localhost -addext subjectAltName=DNS:localhost,IP:127.0.0.1 -keyout " +
      dir + "/key.pem -out " + dir + "/cert.pem");
  ASSERT_EQ(rc, 0) << out;
}

// A streaming HTTPS request whose response is read in two steps: the header
// (the server has accepted the stream), then the rest.
class HttpsStream {
 public:
  HttpsStream(int port, const std::string& ca_file, const std::string& target,
              const std::string& body)
      : ctx_(ssl::context::tls_client), stream_(ioc_, ctx_) {
    ctx_.load_verify_file(ca_file);
    ctx_.set_verify_mode(ssl::verify_peer);
    SSL_set_tlsext_host_name(stream_.native_handle(), "localhost");
    beast::get_lowest_layer(stream_).expires_after(std::chrono::seconds(60));
    beast::get_lowest_layer(stream_).connect(
        tcp::endpoint(net::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port)));
    stream_.handshake(ssl::stream_base::client);
    http::request<http::string_body> req{http::verb::post, target, 11};
    req.set(http::field::host, "localhost");
    req.set(http::field::content_type, "application/json");
    req.body() = body;
    req.prepare_payload();
    http::write(stream_, req);
  }
  int ReadHeader() {
    http::read_header(stream_, buf_, parser_);
    return static_cast<int>(parser_.get().result_int());
  }
  std::string ReadBody() {
    http::read(stream_, buf_, parser_);
    return parser_.get().body();
  }

 private:
  net::io_context ioc_;
  ssl::context ctx_;
  beast::ssl_stream<beast::tcp_stream> stream_;
  beast::flat_buffer buf_;
  http::response_parser<http::string_body> parser_;
};

// ---- CURVE keys ----

TEST(CurveKeys, GeneratedPairsWriteAndLoadBack) {
  const std::string dir = ::tessera::testing::MakeTempDir("tessera-keys");
  StatusOr<CurveKeyPair> pair = GenerateCurveKeyPair();
  ASSERT_TRUE(pair.ok()) << pair.status().ToString();
  EXPECT_TRUE(IsZ85Key(pair->public_key));
  EXPECT_TRUE(IsZ85Key(pair->secret_key));
  EXPECT_NE(pair->public_key, pair->secret_key);
  ASSERT_TRUE(WriteCurveKeyPair(*pair, dir + "/w0").ok());
  struct stat st;
  ASSERT_EQ(stat((dir + "/w0.key").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  StatusOr<CurveKeyPair> loaded = LoadCurveSecretKeyFile(dir + "/w0.key");
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_EQ(loaded->secret_key, pair->secret_key);
  EXPECT_EQ(loaded->public_key, pair->public_key);  // derived from the secret
  EXPECT_NE(Contents(dir + "/w0.pub").find(pair->public_key), std::string::npos);
  // Never overwritten.
  Status again = WriteCurveKeyPair(*GenerateCurveKeyPair(), dir + "/w0");
  EXPECT_FALSE(again.ok());
  EXPECT_NE(again.message().find(dir + "/w0.key"), std::string::npos) << again.ToString();
  EXPECT_EQ(LoadCurveSecretKeyFile(dir + "/w0.key")->secret_key, pair->secret_key);
}

TEST(CurveKeys, BadKeyFilesAreRefusedNamingTheFile) {
  const std::string dir = ::tessera::testing::MakeTempDir("tessera-keys");
  StatusOr<CurveKeyPair> missing = LoadCurveSecretKeyFile(dir + "/none.key");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find(dir + "/none.key"), std::string::npos);

  auto write = [&](const std::string& name, const std::string& text, mode_t mode) {
    const std::string path = dir + "/" + name;
    std::ofstream(path) << text;
    chmod(path.c_str(), mode);
    return path;
  };
  const std::string secret = GenerateCurveKeyPair()->secret_key;
  const std::string open = write("open.key", secret + "\n", 0644);
  StatusOr<CurveKeyPair> r = LoadCurveSecretKeyFile(open);
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find(open), std::string::npos) << r.status().ToString();
  EXPECT_NE(r.status().message().find("chmod 600"), std::string::npos);

  const std::string garbage = write("garbage.key", "# comment\nnot-a-key\n", 0600);
  r = LoadCurveSecretKeyFile(garbage);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find(garbage + ":2"), std::string::npos) << r.status().ToString();

  const std::string two = write("two.key", secret + "\n" + secret + "\n", 0600);
  r = LoadCurveSecretKeyFile(two);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("found 2"), std::string::npos) << r.status().ToString();

  const std::string good = write("good.key", "\n# tessera\n  " + secret + "  \n", 0600);
  EXPECT_TRUE(LoadCurveSecretKeyFile(good).ok());
}

TEST(CurveKeys, KeygenCommandWritesAPairAndRefusesToOverwrite) {
  const std::string dir = ::tessera::testing::MakeTempDir("tessera-keygen");
  const std::string tessera = ::tessera::testing::BinaryDir() + "/tessera";
  auto [rc, out] = ::tessera::testing::RunCommand(tessera + " keygen --out " + dir + "/worker0");
  ASSERT_EQ(rc, 0) << out;
  StatusOr<CurveKeyPair> loaded = LoadCurveSecretKeyFile(dir + "/worker0.key");
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_NE(out.find(loaded->public_key), std::string::npos) << out;
  EXPECT_NE(Contents(dir + "/worker0.pub").find(loaded->public_key), std::string::npos);
  auto [rc2, out2] = ::tessera::testing::RunCommand(tessera + " keygen --out " + dir + "/worker0");
  EXPECT_NE(rc2, 0);
  EXPECT_NE(out2.find("worker0.key: exists"), std::string::npos) << out2;
}

// ---- The control plane under CURVE ----

control::Register RegisterBody() {
  control::Register r;
  r.set_host("host-a");
  r.set_pid(4242);
  r.set_build_version("0.1.0");
  r.set_data_address("127.0.0.1");
  control::Device* d = r.add_devices();
  d->set_index(0);
  d->set_name("cpu");
  d->set_uuid("CPU-0");
  d->set_total_memory_bytes(uint64_t{8} << 30);
  d->set_free_memory_bytes(uint64_t{8} << 30);
  d->set_kind(control::DEVICE_KIND_CPU);
  return r;
}

TEST(ControlPlaneCurve, AllowedKeyRegistersUnknownKeyAndPlainPeersAreRefused) {
  const CurveKeyPair server_keys = *GenerateCurveKeyPair();
  const CurveKeyPair good = *GenerateCurveKeyPair();
  const CurveKeyPair rogue = *GenerateCurveKeyPair();
  ControlServerOptions so;
  so.heartbeat_interval = milliseconds(100);
  so.heartbeat_miss_limit = 50;
  so.curve_secret_key = server_keys.secret_key;
  so.curve_allowed_public_keys = {good.public_key};
  std::atomic<int> heartbeats{0};
  so.on_message = [&](const ControlPeer&, const control::Envelope& e) {
    if (e.has_heartbeat()) ++heartbeats;
  };
  ControlServer server(so);
  StatusOr<std::string> endpoint = server.Start("tcp://127.0.0.1:*");
  ASSERT_TRUE(endpoint.ok()) << endpoint.status().ToString();

  ControlClientOptions go;
  go.curve_secret_key = good.secret_key;
  go.curve_server_key = server_keys.public_key;
  ControlClient worker(go);
  ASSERT_TRUE(worker.Connect(*endpoint).ok());
  ASSERT_TRUE(worker.Register(RegisterBody(), "good").ok());
  StatusOr<std::string> id = worker.WaitRegistered(milliseconds(10000));
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  EXPECT_EQ(*id, "good");

  // An unknown key: refused in the handshake, and the worker learns why.
  ControlClientOptions ro = go;
  ro.curve_secret_key = rogue.secret_key;
  ControlClient intruder(ro);
  ASSERT_TRUE(intruder.Connect(*endpoint).ok());
  ASSERT_TRUE(intruder.Register(RegisterBody(), "rogue").ok());
  StatusOr<std::string> refused = intruder.WaitRegistered(milliseconds(10000));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(
      refused.status().message().find("refused this worker's CURVE public key " + rogue.public_key),
      std::string::npos)
      << refused.status().ToString();
  EXPECT_GE(server.stats().handshakes_refused, 1u);

  // A plain (no CURVE) peer never gets through either, and is told why
  // (the handshake's mechanism mismatch) instead of retrying forever.
  ControlClient plain(ControlClientOptions{});
  ASSERT_TRUE(plain.Connect(*endpoint).ok());
  ASSERT_TRUE(plain.Register(RegisterBody(), "plain").ok());
  StatusOr<std::string> plain_refused = plain.WaitRegistered(milliseconds(10000));
  EXPECT_EQ(plain_refused.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(plain_refused.status().message().find("the coordinator requires CURVE"),
            std::string::npos)
      << plain_refused.status().ToString();

  // Only the allowed worker is known, bound to its key, and still heard.
  std::vector<ControlWorkerInfo> workers = server.Workers();
  ASSERT_EQ(workers.size(), 1u);
  EXPECT_EQ(workers[0].worker_id, "good");
  EXPECT_EQ(workers[0].curve_public_key, good.public_key);
  const int before = heartbeats.load();
  EXPECT_TRUE(WaitFor([&] { return heartbeats.load() > before + 2; }, milliseconds(5000)));
  control::Envelope shutdown;
  shutdown.mutable_shutdown()->set_reason("test");
  EXPECT_TRUE(server.Send("good", shutdown).ok());
  EXPECT_EQ(server.stats().registrations_accepted, 1u);
}

TEST(ControlPlaneCurve, BadKeyOptionsAreRefusedAtStart) {
  const CurveKeyPair keys = *GenerateCurveKeyPair();
  ControlServerOptions so;
  so.curve_secret_key = keys.secret_key;
  ControlServer none(so);  // CURVE without any allowed key
  EXPECT_EQ(none.Start("tcp://127.0.0.1:*").status().code(), StatusCode::kInvalidArgument);
  so.curve_allowed_public_keys = {"short"};
  ControlServer bad(so);
  StatusOr<std::string> r = bad.Start("tcp://127.0.0.1:*");
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("'short'"), std::string::npos) << r.status().ToString();

  ControlClientOptions co;
  co.curve_secret_key = keys.secret_key;  // no server key
  ControlClient half(co);
  EXPECT_EQ(half.Connect("tcp://127.0.0.1:1").code(), StatusCode::kInvalidArgument);
}

// ---- TLS on the HTTP server ----

class TlsServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::tessera::testing::MakeTempDir("tessera-tls");
    MakeSelfSignedCert(dir_);
  }
  HttpServerOptions Options() const {
    HttpServerOptions o;
    o.tls_cert_file = dir_ + "/cert.pem";
    o.tls_key_file = dir_ + "/key.pem";
    o.read_timeout_seconds = 5;
    return o;
  }
  std::string dir_;
};

TEST_F(TlsServerTest, ServesHttpsAndAnswersPlainHttpWith400) {
  HttpServer server(Options());
  server.Handle("POST", "/echo", [](const HttpRequest& r, std::shared_ptr<Responder> res) {
    res->Send(200, "text/plain", "echo:" + r.body);
  });
  server.Handle("GET", "/stream", [](const HttpRequest&, std::shared_ptr<Responder> res) {
    res->StartStream();
    for (int i = 0; i < 3; ++i) res->SendEvent("event " + std::to_string(i));
    res->Finish();
  });
  ASSERT_TRUE(server.Start().ok());
  const std::string ca = dir_ + "/cert.pem";
  Reply r = HttpsCall(server.port(), ca, http::verb::post, "/echo", "hello");
  ASSERT_EQ(r.status, 200) << r.error;
  EXPECT_EQ(r.body, "echo:hello");
  Reply s = HttpsCall(server.port(), ca, http::verb::get, "/stream");
  ASSERT_EQ(s.status, 200) << s.error;
  EXPECT_EQ(s.body, "data: event 0\n\ndata: event 1\n\ndata: event 2\n\n");

  // Plain HTTP to the HTTPS port: a plain 400 saying so, then the close.
  HttpReply plain = HttpCall(server.port(), "GET", "/stream");
  EXPECT_EQ(plain.status, 400) << plain.body;
  EXPECT_NE(plain.body.find("https_required"), std::string::npos) << plain.body;
  // Bytes that are neither TLS nor HTTP, then a client that gives up
  // mid-handshake: closed, nothing else.
  for (const std::string& junk : {std::string("\x16\x03\x01\x00\x05hello", 10),
                                  std::string("\x00\x01\x02garbage\r\n\r\n", 14)}) {
    net::io_context ioc;
    tcp::socket sock(ioc);
    sock.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"),
                               static_cast<unsigned short>(server.port())));
    net::write(sock, net::buffer(junk));
    sock.shutdown(tcp::socket::shutdown_send);
    beast::error_code ec;
    char buf[256];
    while (!ec) sock.read_some(net::buffer(buf), ec);  // until the server closes
  }
  // A client that does not trust the certificate fails its handshake.
  const std::string other = ::tessera::testing::MakeTempDir("tessera-tls-other");
  MakeSelfSignedCert(other);
  Reply untrusted = HttpsCall(server.port(), other + "/cert.pem", http::verb::post, "/echo", "x");
  EXPECT_EQ(untrusted.status, 0);
  EXPECT_FALSE(untrusted.error.empty());
  // Still serving.
  r = HttpsCall(server.port(), ca, http::verb::post, "/echo", "again");
  EXPECT_EQ(r.status, 200) << r.error;
  EXPECT_EQ(r.body, "echo:again");
}

TEST_F(TlsServerTest, BadCertificateOrKeyFilesFailStartNamingTheFile) {
  auto start_error = [](HttpServerOptions o) {
    HttpServer server(o);
    Status s = server.Start();
    return s.ok() ? std::string("started") : s.ToString();
  };
  HttpServerOptions o = Options();
  o.tls_cert_file = dir_ + "/missing.pem";
  EXPECT_NE(start_error(o).find(dir_ + "/missing.pem"), std::string::npos) << start_error(o);

  std::ofstream(dir_ + "/junk.pem") << "not a certificate\n";
  o = Options();
  o.tls_cert_file = dir_ + "/junk.pem";
  EXPECT_NE(start_error(o).find("certificate chain '" + dir_ + "/junk.pem'"), std::string::npos)
      << start_error(o);

  o = Options();
  o.tls_key_file = dir_ + "/junk.pem";
  EXPECT_NE(start_error(o).find("private key '" + dir_ + "/junk.pem'"), std::string::npos)
      << start_error(o);

  const std::string other = ::tessera::testing::MakeTempDir("tessera-tls-other");
  MakeSelfSignedCert(other);
  o = Options();
  o.tls_key_file = other + "/key.pem";
  EXPECT_NE(start_error(o).find("does not match the certificate"), std::string::npos)
      << start_error(o);

  o = Options();
  o.tls_key_file.clear();
  EXPECT_NE(start_error(o).find("needs both"), std::string::npos) << start_error(o);
}

// ---- Config keys ----

StatusOr<DaemonConfig> Parse(const std::string& text) { return ParseDaemonConfig(text, "x.toml"); }

TEST(SecurityConfig, LimitAndKeyKeysParseAndAreValidated) {
  const CurveKeyPair keys = *GenerateCurveKeyPair();
  StatusOr<DaemonConfig> c = Parse(
      "[server]\nmax_header_count = 20\nmax_streams = 3\ncontrol_endpoint = \"tcp://*:5555\"\n"
      "[scheduler]\nmax_prompt_tokens = 100\nmax_completion_tokens = 50\n"
      "[control]\ncoordinator_secret_key_file = \"keys/c.key\"\nworker_public_keys = [\"" +
      keys.public_key +
      "\"]\nworker_secret_key_file = \"keys/w.key\"\ncoordinator_public_key = \"" +
      keys.public_key + "\"\n");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->server.max_header_count, 20);
  EXPECT_EQ(c->server.max_streams, 3);
  EXPECT_EQ(c->scheduler.max_prompt_tokens, 100);
  EXPECT_EQ(c->scheduler.max_completion_tokens, 50);
  EXPECT_EQ(c->control.worker_public_keys, std::vector<std::string>{keys.public_key});
  // The formatted config parses back to the same keys.
  StatusOr<DaemonConfig> again = Parse(FormatDaemonConfig(*c, true));
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->control.worker_public_keys, c->control.worker_public_keys);
  EXPECT_EQ(again->scheduler.max_completion_tokens, 50);

  std::vector<std::pair<std::string, std::string>> bad = {
      {"[server]\nmax_header_count = 0\n", "x.toml:2:20: server.max_header_count: must be >= 1"},
      {"[server]\nmax_streams = -1\n", "x.toml:2:15: server.max_streams: must be >= 1, got -1"},
      {"[scheduler]\nmax_prompt_tokens = -5\n", "scheduler.max_prompt_tokens: must be >= 0"},
      {"[scheduler]\nmax_completion_tokens = -1\n",
       "scheduler.max_completion_tokens: must be >= 0"},
      {"[control]\nworker_public_keys = [\"abc\"]\n",
       "control.worker_public_keys: entry 0 must be a 40-character Z85"},
      {"[control]\nworker_public_keys = [1]\n", "control.worker_public_keys[0]: expected a string"},
      {"[control]\ncoordinator_secret_key_file = \"c.key\"\n",
       "control.coordinator_secret_key_file: is set but control.worker_public_keys is empty"},
      {"[control]\nworker_secret_key_file = \"w.key\"\n",
       "control.worker_secret_key_file: is set but control.coordinator_public_key is not"},
      {"[server]\ncontrol_endpoint = \"tcp://0.0.0.0:5555\"\n",
       "server.control_endpoint: \"tcp://0.0.0.0:5555\" exposes the control plane beyond "
       "loopback without CURVE"},
      {"[worker]\ncoordinator = \"tcp://10.0.0.1:5555\"\n",
       "worker.coordinator: \"tcp://10.0.0.1:5555\" is beyond loopback: the control plane needs "
       "CURVE"},
      {"[admin]\nhost = \"0.0.0.0\"\n",
       "admin.host: \"0.0.0.0\" exposes the admin API beyond loopback"},
      {"[server]\nhost = \"0.0.0.0\"\n[admin]\nport = 0\n",
       "server.host: \"0.0.0.0\" exposes the admin API beyond loopback (admin.port = 0"},
  };
  // A token file that never ends is refused, not read.
  const std::vector<std::pair<std::string, std::string>> files = {
      {"[admin]\ntoken_file = \"/dev/zero\"\n",
       "admin.token_file: \"/dev/zero\" is not a regular file"},
      {"[server]\ntls_cert = \"/dev/urandom\"\ntls_key = \"/dev/urandom\"\n",
       "\"/dev/urandom\" is not a regular file"},
  };
  bad.insert(bad.end(), files.begin(), files.end());
  for (const auto& [text, want] : bad) {
    StatusOr<DaemonConfig> r = Parse(text);
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_NE(r.status().message().find(want), std::string::npos)
        << text << "\n  got: " << r.status().message() << "\n  want: " << want;
  }
}

// ---- The daemons with everything on ----

// Coordinator and one worker (tp = pp = 1): HTTPS API, admin on its own HTTPS
// listener behind a token file, CURVE between them, tight request limits.
class SecureDaemons : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::tessera::testing::MakeTempDir("tessera-secure");
    MakeSelfSignedCert(dir_);
    ca_ = dir_ + "/cert.pem";
    std::ofstream(dir_ + "/admin.token") << "adm1n-t0ken\n";
    ASSERT_EQ(chmod((dir_ + "/admin.token").c_str(), 0600), 0);  // a secret: owner only
    ::tessera::testing::DaemonClusterOptions o;
    o.dir = dir_;
    o.parallel_toml = "tp = 1\npp = 1\n";
    o.server_toml += "max_body_bytes = 4096\nmax_header_count = 20\nmax_streams = 1\n";
    o.tls_cert = ca_;
    o.tls_key = dir_ + "/key.pem";
    o.admin_toml = "pick_port = true\ntoken_file = \"" + dir_ + "/admin.token\"\n";
    o.heartbeat_toml = "interval_seconds = 0.2\ntimeout_seconds = 10.0\n";
    o.scheduler_toml = "max_context = 128\nmax_prompt_tokens = 48\nmax_completion_tokens = 64\n";
    o.workers = 1;
    o.unlisted_keys = 1;  // the rogue worker's
    o.workers_read_config = true;
    cluster_ = std::make_unique<::tessera::testing::DaemonCluster>(std::move(o));
    const Status started = cluster_->Start();
    port_ = cluster_->api_port();
    admin_port_ = cluster_->admin_port();
    ASSERT_TRUE(started.ok()) << started.ToString();
  }
  void TearDown() override { cluster_->Stop(); }

  Reply Post(const std::string& target, const json& body,
             const std::vector<std::pair<std::string, std::string>>& headers = {}) {
    json with_model = body;
    if (!with_model.contains("model")) with_model["model"] = "llama_gqa_f32";
    return HttpsCall(port_, ca_, http::verb::post, target, with_model.dump(), headers);
  }

  std::unique_ptr<::tessera::testing::DaemonCluster> cluster_;
  std::string dir_, ca_;
  int port_ = 0, admin_port_ = 0;
};

TEST_F(SecureDaemons, ServeARealTlsClientAndRefusePlainHttp) {
  // Python's ssl/urllib, verifying the certificate.
  const char* python = std::getenv("TESSERA_PYTHON");
  const std::string py = python ? python : "python3";
  auto [rc, out] = ::tessera::testing::RunCommand(
      py + " " + ::tessera::testing::FixturePath("../support/tls_client_check.py") + " " +
      std::to_string(port_) + " " + ca_ + " llama_gqa_f32");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("tls client checks passed"), std::string::npos) << out;

  HttpReply plain = HttpCall(port_, "POST", "/v1/completions",
                             R"({"model":"llama_gqa_f32","prompt":[1,2],"max_tokens":2})");
  EXPECT_EQ(plain.status, 400);
  EXPECT_NE(plain.body.find("https_required"), std::string::npos) << plain.body;
  // ignore_eos: at the default temperature of 1 the sampler may draw EOS early.
  Reply r =
      Post("/v1/completions", {{"prompt", {1, 2, 3}}, {"max_tokens", 4}, {"ignore_eos", true}});
  ASSERT_EQ(r.status, 200) << r.error << r.body;
  EXPECT_EQ(json::parse(r.body)["usage"]["completion_tokens"].get<int>(), 4);
}

TEST_F(SecureDaemons, AdminEndpointsNeedTheTokenOnTheirOwnListener) {
  Reply none = HttpsCall(admin_port_, ca_, http::verb::get, "/admin/cluster");
  ASSERT_EQ(none.status, 401) << none.error;
  EXPECT_EQ(none.headers["www-authenticate"], "Bearer");
  const json e = json::parse(none.body);
  EXPECT_EQ(e["error"]["code"], "invalid_api_key");
  EXPECT_EQ(e["error"]["type"], "invalid_request_error");
  for (const std::string wrong :
       {"Bearer adm1n-t0keN", "Bearer adm1n-t0ken2", "Basic adm1n-t0ken", "Bearer "}) {
    Reply w =
        HttpsCall(admin_port_, ca_, http::verb::get, "/admin/plan", "", {{"Authorization", wrong}});
    EXPECT_EQ(w.status, 401) << wrong;
    EXPECT_EQ(w.headers["www-authenticate"], "Bearer");
  }
  Reply ok = HttpsCall(admin_port_, ca_, http::verb::get, "/admin/cluster", "",
                       {{"Authorization", "Bearer adm1n-t0ken"}});
  ASSERT_EQ(ok.status, 200) << ok.body;
  const json cluster = json::parse(ok.body);
  ASSERT_EQ(cluster["workers"].size(), 1u);
  EXPECT_EQ(cluster["workers"][0]["state"], "alive");
  // The API listener does not serve the admin endpoints at all.
  EXPECT_EQ(HttpsCall(port_, ca_, http::verb::get, "/admin/cluster", "",
                      {{"Authorization", "Bearer adm1n-t0ken"}})
                .status,
            404);
}

TEST_F(SecureDaemons, RequestLimitsNameTheFieldAndTheLimit) {
  Reply r = Post("/v1/completions", {{"prompt", std::vector<int>(60, 3)}, {"max_tokens", 4}});
  ASSERT_EQ(r.status, 400) << r.body;
  json e = json::parse(r.body)["error"];
  EXPECT_EQ(e["param"], "prompt");
  EXPECT_EQ(e["code"], "prompt_too_long");
  EXPECT_NE(e["message"].get<std::string>().find("scheduler.max_prompt_tokens"), std::string::npos);
  EXPECT_NE(e["message"].get<std::string>().find("60 tokens"), std::string::npos) << e;

  r = Post("/v1/chat/completions",
           {{"messages", {{{"role", "user"}, {"content", [] {
                                                std::string text;
                                                for (int i = 0; i < 40; ++i)
                                                  text += "hello world " + std::to_string(i) + " ";
                                                return text;
                                              }()}}}}});
  ASSERT_EQ(r.status, 400) << r.body;
  EXPECT_EQ(json::parse(r.body)["error"]["param"], "messages");

  r = Post("/v1/completions", {{"prompt", {1, 2}}, {"max_tokens", 65}});
  ASSERT_EQ(r.status, 400) << r.body;
  e = json::parse(r.body)["error"];
  EXPECT_EQ(e["param"], "max_tokens");
  EXPECT_NE(e["message"].get<std::string>().find("scheduler.max_completion_tokens"),
            std::string::npos);
  r = Post("/v1/chat/completions",
           {{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"max_tokens", 100}});
  EXPECT_EQ(r.status, 400) << r.body;
  // Without max_tokens a chat generates at most max_completion_tokens.
  r = Post("/v1/chat/completions",
           {{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"ignore_eos", true}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(json::parse(r.body)["usage"]["completion_tokens"].get<int>(), 64);

  std::vector<std::pair<std::string, std::string>> many;
  for (int i = 0; i < 25; ++i) many.emplace_back("X-Filler-" + std::to_string(i), "1");
  r = Post("/v1/completions", {{"prompt", {1}}}, many);
  EXPECT_EQ(r.status, 431) << r.error << r.body;
  r = Post("/v1/completions", {{"prompt", std::string(5000, 'a')}});
  EXPECT_EQ(r.status, 413) << r.error << r.body;

  // One stream open (the worker is stopped, so it waits for tokens): a second
  // is 429 while it lasts.
  const json stream_req = {
      {"model", "llama_gqa_f32"}, {"prompt", {5, 17}}, {"max_tokens", 8}, {"stream", true}};
  kill(cluster_->worker_pid(0), SIGSTOP);
  HttpsStream first(port_, ca_, "/v1/completions", stream_req.dump());
  EXPECT_EQ(first.ReadHeader(), 200);  // its slot is taken
  Reply second = Post("/v1/completions", stream_req);
  EXPECT_EQ(second.status, 429) << second.error << second.body;
  e = json::parse(second.body)["error"];
  EXPECT_EQ(e["code"], "too_many_streams");
  EXPECT_NE(e["message"].get<std::string>().find("server.max_streams"), std::string::npos);
  // The worker runs again: the first stream completes.
  kill(cluster_->worker_pid(0), SIGCONT);
  const std::string first_body = first.ReadBody();
  EXPECT_NE(first_body.find("data: [DONE]"), std::string::npos) << first_body;
  // The slot is given back when the stream ends.
  ASSERT_TRUE(WaitFor(
      [&] {
        second = Post("/v1/completions", stream_req);
        return second.status == 200;
      },
      milliseconds(10000)))
      << second.status << second.body;
  EXPECT_NE(second.body.find("data: [DONE]"), std::string::npos);
}

TEST_F(SecureDaemons, UnknownWorkerKeyIsRefusedAndLoggedAndServingGoesOn) {
  // The second worker, with a key pair the coordinator does not allow.
  ::tessera::testing::WorkerSpec spec;
  spec.key = ::tessera::testing::WorkerSpec::kUnlistedKey;
  const std::string rogue_key = cluster_->unlisted_public_keys()[0];
  const pid_t rogue = cluster_->StartWorker(spec);
  const std::optional<int> status = cluster_->WaitForExit(rogue, 30);
  const std::string rogue_log = cluster_->WorkerLog(1);
  ASSERT_TRUE(status.has_value()) << rogue_log;
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) != 0);
  EXPECT_NE(rogue_log.find("refused this worker's CURVE public key " + rogue_key),
            std::string::npos)
      << rogue_log;
  const std::string coordinator_log = Contents(dir_ + "/coordinator.log");
  EXPECT_NE(coordinator_log.find("refused a control-plane connection"), std::string::npos)
      << coordinator_log;
  EXPECT_NE(coordinator_log.find(rogue_key), std::string::npos) << coordinator_log;
  EXPECT_NE(coordinator_log.find("CURVE key " + cluster_->keys().worker_public_keys[0]),
            std::string::npos)
      << coordinator_log;
  // Still serving with the allowed worker; the rogue never joined.
  Reply r = Post("/v1/completions", {{"prompt", {1, 2, 3}}, {"max_tokens", 3}});
  EXPECT_EQ(r.status, 200) << r.error << r.body;
  Reply cluster = HttpsCall(admin_port_, ca_, http::verb::get, "/admin/cluster", "",
                            {{"Authorization", "Bearer adm1n-t0ken"}});
  ASSERT_EQ(cluster.status, 200);
  EXPECT_EQ(json::parse(cluster.body)["workers"].size(), 1u);
}

}  // namespace
}  // namespace tessera
