// HTTP framing and header holes (common/net/http_request_checks.h), over raw
// loopback sockets: against an HttpServer in this process, and against a real
// tessera-coordinator (started with port 0 and --ports-file). Each refused
// request must get its status, then the connection must close without a
// second response: the bytes a proxy would have forwarded as this request's
// body never run as a request of their own. A normal request still works
// afterwards.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "common/net/http_request_checks.h"
#include "common/net/http_server.h"
#include "support/daemon_cluster.h"
#include "support/raw_http_client.h"
#include "support/test_util.h"

namespace tessera {
namespace {

using json = nlohmann::json;
using ::tessera::testing::RawHttpClient;
using ::tessera::testing::RawResponse;

// A request that would be answered 200 on its own: smuggled after a refused
// header, it must never be.
constexpr const char* kSmuggledPath = "/smuggled";
std::string SmuggledRequest(const std::string& path = kSmuggledPath) {
  return "GET " + path + " HTTP/1.1\r\nHost: t\r\n\r\n";
}

// One request whose header ends at "\r\n\r\n", then `body`.
std::string Request(const std::string& request_line, const std::string& fields,
                    const std::string& body = "") {
  return request_line + "\r\n" + fields + "\r\n" + body;
}

// Sends `bytes` on a fresh connection to `port`; expects exactly one
// response with `status` (and `code` in its OpenAI error body), marked
// Connection: close, and then the connection closed with nothing more.
void ExpectRefusedAndClosed(int port, const std::string& bytes, int status, const std::string& code,
                            const std::string& what) {
  SCOPED_TRACE(what);
  RawHttpClient c(port);
  ASSERT_TRUE(c.connected());
  ASSERT_TRUE(c.Send(bytes));
  std::optional<RawResponse> r = c.ReadResponse();
  ASSERT_TRUE(r.has_value()) << "no response";
  EXPECT_EQ(r->status, status) << r->body;
  // (An HTTP/1.0 response closes by default and says nothing.)
  const bool http10 = bytes.substr(0, bytes.find("\r\n")).find("HTTP/1.0") != std::string::npos;
  if (!http10) {
    EXPECT_EQ(r->headers["connection"], "close");
  }
  const json body = json::parse(r->body, nullptr, false);
  ASSERT_TRUE(body.is_object() && body.contains("error")) << r->body;
  EXPECT_EQ(body["error"]["code"], code) << r->body;
  EXPECT_FALSE(body["error"]["message"].get<std::string>().empty());
  // Nothing after the refusal: no second response, the connection closes.
  EXPECT_TRUE(c.buffer().empty()) << "bytes after the refusal: " << c.buffer();
  EXPECT_TRUE(c.SeesClose()) << "the connection stayed open";
}

// The refused requests shared by both servers: `path` is a GET route that
// answers 200, `smuggled` a complete request that would be answered too.
struct Case {
  std::string what, bytes;
  int status;
  std::string code;
};
std::vector<Case> RefusedRequests(const std::string& smuggled) {
  const std::string len = std::to_string(smuggled.size());
  const std::string chunked_smuggle = "0\r\n\r\n" + smuggled;  // CL.TE desync
  return {
      {"Transfer-Encoding gzip: the body would be read as a second request",
       Request("POST /echo HTTP/1.1", "Host: t\r\nTransfer-Encoding: gzip\r\n", smuggled), 501,
       "unsupported_transfer_encoding"},
      {"Transfer-Encoding identity",
       Request("POST /echo HTTP/1.1", "Host: t\r\nTransfer-Encoding: identity\r\n", smuggled), 501,
       "unsupported_transfer_encoding"},
      {"chunked not the only coding (chunked, gzip)",
       Request("POST /echo HTTP/1.1", "Host: t\r\nTransfer-Encoding: chunked, gzip\r\n", smuggled),
       501, "unsupported_transfer_encoding"},
      {"chunked not the only coding (gzip, chunked)",
       Request("POST /echo HTTP/1.1", "Host: t\r\nTransfer-Encoding: gzip, chunked\r\n",
               chunked_smuggle),
       501, "unsupported_transfer_encoding"},
      {"Transfer-Encoding gzip then Content-Length",
       Request("POST /echo HTTP/1.1",
               "Host: t\r\nTransfer-Encoding: gzip\r\nContent-Length: " + len + "\r\n", smuggled),
       400, "bad_request"},
      {"Content-Length then Transfer-Encoding chunked (CL.TE)",
       Request("POST /echo HTTP/1.1",
               "Host: t\r\nContent-Length: " + std::to_string(chunked_smuggle.size()) +
                   "\r\nTransfer-Encoding: chunked\r\n",
               chunked_smuggle),
       400, "bad_request"},
      {"Transfer-Encoding chunked then Content-Length (TE.CL)",
       Request("POST /echo HTTP/1.1",
               "Host: t\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n", chunked_smuggle),
       400, "bad_request"},
      {"two Transfer-Encoding fields (gzip, then chunked)",
       Request("POST /echo HTTP/1.1",
               "Host: t\r\nTransfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n",
               chunked_smuggle),
       400, "bad_request"},
      {"two Transfer-Encoding: chunked fields",
       Request("POST /echo HTTP/1.1",
               "Host: t\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n",
               chunked_smuggle),
       400, "bad_request"},
      {"Transfer-Encoding in HTTP/1.0",
       Request("POST /echo HTTP/1.0", "Host: t\r\nTransfer-Encoding: chunked\r\n", chunked_smuggle),
       400, "bad_request"},
      {"two Content-Length fields with different values",
       Request("POST /echo HTTP/1.1",
               "Host: t\r\nContent-Length: 0\r\nContent-Length: " + len + "\r\n", smuggled),
       400, "bad_request"},
      {"two Content-Length fields with one value",
       Request("POST /echo HTTP/1.1",
               "Host: t\r\nContent-Length: " + len + "\r\nContent-Length: " + len + "\r\n",
               smuggled),
       400, "bad_request"},
      {"HTTP/1.1 without Host", Request("GET /healthz HTTP/1.1", "", smuggled), 400, "bad_request"},
      {"two Host fields", Request("GET /healthz HTTP/1.1", "Host: a\r\nHost: b\r\n", smuggled), 400,
       "bad_request"},
  };
}

class SecurityHttpServer : public ::testing::Test {
 protected:
  void SetUp() override {
    HttpServerOptions o;
    o.bind_address = "127.0.0.1";
    o.port = 0;
    server_ = std::make_unique<HttpServer>(o);
    server_->Handle("POST", "/echo", [this](const HttpRequest& req, std::shared_ptr<Responder> r) {
      ++echoes_;
      r->Send(200, "text/plain", req.body);
    });
    server_->Handle("GET", "/healthz", [this](const HttpRequest&, std::shared_ptr<Responder> r) {
      ++healthz_;
      r->Send(200, "text/plain", "ok");
    });
    server_->Handle("GET", kSmuggledPath, [this](const HttpRequest&, std::shared_ptr<Responder> r) {
      ++smuggled_;
      r->Send(200, "text/plain", "smuggled");
    });
    server_->Handle(
        "GET", "/admin/thing",
        RequireBearerToken("right-token", [this](const HttpRequest&, std::shared_ptr<Responder> r) {
          ++admin_;
          r->Send(200, "text/plain", "admin");
        }));
    ASSERT_TRUE(server_->Start().ok());
  }
  void TearDown() override { server_->Stop(); }

  // A plain request on a fresh connection gets `status` with `body`.
  void ExpectServed(const std::string& bytes, int status, const std::string& body) {
    RawHttpClient c(server_->port());
    ASSERT_TRUE(c.Send(bytes));
    auto r = c.ReadResponse();
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->status, status) << r->body;
    EXPECT_EQ(r->body, body);
  }

  std::unique_ptr<HttpServer> server_;
  std::atomic<int> echoes_{0}, healthz_{0}, smuggled_{0}, admin_{0};
};

TEST_F(SecurityHttpServer, TheSmuggledRequestIsAnsweredOnItsOwn) {
  // The control: the bytes the refused requests carry are a request this
  // server answers, so not seeing its answer below means it never ran.
  ExpectServed(SmuggledRequest(), 200, "smuggled");
  EXPECT_EQ(smuggled_.load(), 1);
  // A well-formed chunked body and a Content-Length body are read whole.
  ExpectServed(Request("POST /echo HTTP/1.1", "Host: t\r\nTransfer-Encoding:  Chunked \r\n",
                       "5\r\nhello\r\n0\r\n\r\n"),
               200, "hello");
  ExpectServed(Request("POST /echo HTTP/1.1", "Host: t\r\nContent-Length: 5\r\n", "hello"), 200,
               "hello");
  // HTTP/1.0 needs no Host.
  ExpectServed("GET /healthz HTTP/1.0\r\n\r\n", 200, "ok");
}

TEST_F(SecurityHttpServer, AmbiguousFramingAndRepeatedFieldsAreRefusedAndTheConnectionCloses) {
  for (const Case& c : RefusedRequests(SmuggledRequest()))
    ExpectRefusedAndClosed(server_->port(), c.bytes, c.status, c.code, c.what);
  EXPECT_EQ(smuggled_.load(), 0) << "a smuggled request ran";
  EXPECT_EQ(echoes_.load(), 0) << "a refused request reached its handler";
  EXPECT_EQ(healthz_.load(), 0) << "a refused request reached its handler";
  // The server goes on serving.
  ExpectServed(Request("POST /echo HTTP/1.1", "Host: t\r\nContent-Length: 2\r\n", "ok"), 200, "ok");
  ExpectServed(SmuggledRequest(), 200, "smuggled");
}

// A chunk-size line with endless extensions, or an endless trailer field,
// once made one connection hold as much memory as the client sent (64 MiB
// held 105 MB). The read buffer stops at max_header_bytes +
// kHttpReadSlackBytes: the request is a 400 and the connection closes. The
// parser has taken the header out of the buffer, so a line of `limit` bytes
// after the header overflows it (by the few bytes of `start`).
TEST_F(SecurityHttpServer, EndlessChunkExtensionsAndTrailersAreRefusedAtTheBufferBound) {
  const size_t limit = HttpServerOptions{}.max_header_bytes + kHttpReadSlackBytes;
  const std::string head = "POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n";
  for (const auto& [what, start] :
       {std::pair<std::string, std::string>{"extension", "5;"}, {"trailer", "0\r\nX-Trailer: "}}) {
    std::string bytes = head + start;
    bytes.append(limit, 'x');
    ExpectRefusedAndClosed(server_->port(), bytes, 400, "bad_request", "an endless " + what);
  }
  EXPECT_EQ(echoes_.load(), 0);
  // A long body in many chunks is still read whole: only lines are bounded.
  std::string chunked;
  std::string want;
  for (int i = 0; i < 64; ++i) {
    const std::string part(32 * 1024, static_cast<char>('a' + i % 26));
    chunked += fmt::format("{:x}\r\n{}\r\n", part.size(), part);
    want += part;
  }
  ExpectServed(Request("POST /echo HTTP/1.1", "Host: t\r\nTransfer-Encoding: chunked\r\n",
                       chunked + "0\r\n\r\n"),
               200, want);
}

TEST_F(SecurityHttpServer, TwoAuthorizationFieldsAreRefusedWhicheverComesFirst) {
  for (const auto& [first, second] :
       {std::pair<std::string, std::string>{"Bearer right-token", "Bearer wrong"},
        {"Bearer wrong", "Bearer right-token"},
        {"Bearer right-token", "Bearer right-token"}}) {
    ExpectRefusedAndClosed(
        server_->port(),
        Request("GET /admin/thing HTTP/1.1",
                "Host: t\r\nAuthorization: " + first + "\r\nAuthorization: " + second + "\r\n"),
        400, "bad_request", first + " / " + second);
  }
  EXPECT_EQ(admin_.load(), 0) << "a request with two Authorization fields reached the handler";
  // One field: the token decides.
  ExpectServed(
      Request("GET /admin/thing HTTP/1.1", "Host: t\r\nAuthorization: Bearer right-token\r\n"), 200,
      "admin");
  RawHttpClient c(server_->port());
  ASSERT_TRUE(
      c.Send(Request("GET /admin/thing HTTP/1.1", "Host: t\r\nAuthorization: Bearer wrong\r\n")));
  auto r = c.ReadResponse();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 401);
  EXPECT_EQ(admin_.load(), 1);
}

TEST_F(SecurityHttpServer, ARefusalAfterAKeptAliveRequestClosesTheConnection) {
  // A first, valid request keeps the connection; the second is refused, and
  // the smuggled bytes after it never become a third.
  RawHttpClient c(server_->port());
  ASSERT_TRUE(c.Send(
      Request("POST /echo HTTP/1.1", "Host: t\r\nContent-Length: 3\r\n", "one") +
      Request("POST /echo HTTP/1.1", "Host: t\r\nTransfer-Encoding: gzip\r\n", SmuggledRequest())));
  auto first = c.ReadResponse();
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->status, 200);
  EXPECT_EQ(first->body, "one");
  auto second = c.ReadResponse();
  ASSERT_TRUE(second.has_value());
  EXPECT_EQ(second->status, 501) << second->body;
  EXPECT_TRUE(c.buffer().empty()) << c.buffer();
  EXPECT_TRUE(c.SeesClose());
  EXPECT_EQ(smuggled_.load(), 0);
}

// The checks on their own, for what a socket cannot show: the message names
// the field.
TEST(CheckRequestHeader, NamesTheFieldAtFault) {
  using Fields = std::vector<std::pair<std::string_view, std::string_view>>;
  EXPECT_FALSE(CheckRequestHeader(11, Fields{{"Host", "h"}, {"transfer-encoding", "chunked"}}));
  EXPECT_FALSE(CheckRequestHeader(10, Fields{}));
  auto r = CheckRequestHeader(11, Fields{{"Host", "h"}, {"Transfer-Encoding", "gzip"}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 501);
  EXPECT_EQ(r->message,
            "Transfer-Encoding \"gzip\" is not supported; the only transfer coding accepted is "
            "\"chunked\"");
  r = CheckRequestHeader(11, Fields{{"Host", "h"}, {"AUTHORIZATION", "a"}, {"authorization", "b"}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->message, "the request has 2 Authorization fields; send one");
  r = CheckRequestHeader(11, Fields{{"Content-Length", "1"}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->message, "an HTTP/1.1 request needs a Host field");
  r = CheckRequestHeader(
      11, Fields{{"Host", "h"}, {"Content-Length", "1"}, {"Transfer-Encoding", "chunked"}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->message,
            "the request has both Transfer-Encoding and Content-Length; send one of them");
}

// ---- Against a real coordinator ----

class SecurityHttpDaemon : public ::testing::Test {
 protected:
  // A bare coordinator: no worker ever starts, so it never becomes ready;
  // the HTTP checks come before any routing to a worker.
  static void SetUpTestSuite() {
    ::tessera::testing::DaemonClusterOptions o;
    o.temp_prefix = "tessera-security-http";
    o.parallel_toml = "tp = 1\npp = 1\n";
    o.admin_toml = std::string("port = 0\ntoken = \"") + kToken + "\"\n";
    o.heartbeat_toml = o.kv_cache_toml = o.scheduler_toml = "";
    o.server_toml += "max_body_bytes = " + std::to_string(kMaxBodyBytes) + "\n";
    o.workers = 0;
    o.spare_worker_keys = 1;  // the one worker the plan wants, never started
    o.wait_ready = false;
    cluster_ = new ::tessera::testing::DaemonCluster(std::move(o));
    dir_ = &cluster_->dir();
    const Status started = cluster_->Start();
    if (started.ok()) {
      ports_ = cluster_->ports();
      pid_ = cluster_->coordinator_pid();
    } else {
      start_error_ = new std::string(started.ToString());
    }
  }
  static void TearDownTestSuite() {
    delete cluster_;  // stops the coordinator
    cluster_ = nullptr;
  }
  void SetUp() override { ASSERT_TRUE(ports_) << *start_error_; }

  // One request on a fresh connection; its response.
  static std::optional<RawResponse> Call(const std::string& bytes) {
    RawHttpClient c(ports_->api);
    if (!c.Send(bytes)) return std::nullopt;
    return c.ReadResponse();
  }

  static constexpr const char* kToken = "sec-http-token";
  static constexpr int64_t kMaxBodyBytes = 1 << 20;  // server.max_body_bytes
  static inline ::tessera::testing::DaemonCluster* cluster_ = nullptr;
  static inline const std::string* dir_ = nullptr;  // the cluster's
  static inline std::string* start_error_ = nullptr;
  static inline pid_t pid_ = -1;
  static inline std::optional<::tessera::testing::CoordinatorPorts> ports_;
};

TEST_F(SecurityHttpDaemon, TheCoordinatorReportsThePortsItBound) {
  // Port 0 everywhere: the kernel's picks, one listener each (the admin API
  // shares the API listener with admin.port = 0).
  EXPECT_EQ(ports_->admin, ports_->api);
  EXPECT_NE(ports_->control, ports_->api);
  EXPECT_NE(ports_->store, ports_->api);
  EXPECT_NE(ports_->store, ports_->control);
  const std::string log = ::tessera::testing::ReadFileOrDie(*dir_ + "/coordinator.log");
  EXPECT_NE(log.find("listening: api 127.0.0.1:" + std::to_string(ports_->api)), std::string::npos)
      << log;
  EXPECT_NE(log.find("control tcp://127.0.0.1:" + std::to_string(ports_->control)),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("store " + std::to_string(ports_->store)), std::string::npos) << log;
  // Workers could reach the control port: something listens there.
  RawHttpClient control(ports_->control);
  EXPECT_TRUE(control.connected());
}

TEST_F(SecurityHttpDaemon, SmuggledRequestsNeverRunAndTheCoordinatorGoesOn) {
  const std::string smuggled = SmuggledRequest("/v1/models");
  // The control: on its own, the smuggled request is answered.
  auto alone = Call(smuggled);
  ASSERT_TRUE(alone.has_value());
  ASSERT_EQ(alone->status, 200) << alone->body;
  EXPECT_NE(alone->body.find("llama_gqa_f32"), std::string::npos) << alone->body;

  for (const Case& c : RefusedRequests(smuggled)) {
    // The daemon has no /echo: the refusal comes before routing, from the
    // header alone.
    ExpectRefusedAndClosed(ports_->api, c.bytes, c.status, c.code, c.what);
  }
  // Two Authorization fields on an admin route: refused before the token
  // check, whichever comes first.
  const std::string right = std::string("Authorization: Bearer ") + kToken + "\r\n";
  const std::string wrong = "Authorization: Bearer not-the-token\r\n";
  ExpectRefusedAndClosed(ports_->api,
                         Request("GET /admin/cluster HTTP/1.1", "Host: t\r\n" + right + wrong), 400,
                         "bad_request", "right token first");
  ExpectRefusedAndClosed(ports_->api,
                         Request("GET /admin/cluster HTTP/1.1", "Host: t\r\n" + wrong + right), 400,
                         "bad_request", "wrong token first");

  // Still serving: the API, and the admin API with one token.
  auto models = Call(smuggled);
  ASSERT_TRUE(models.has_value());
  EXPECT_EQ(models->status, 200);
  auto cluster = Call(Request("GET /admin/cluster HTTP/1.1", "Host: t\r\n" + right));
  ASSERT_TRUE(cluster.has_value());
  EXPECT_EQ(cluster->status, 200) << cluster->body;
  auto refused = Call(Request("GET /admin/cluster HTTP/1.1", "Host: t\r\n" + wrong));
  ASSERT_TRUE(refused.has_value());
  EXPECT_EQ(refused->status, 401);
  EXPECT_EQ(waitpid(pid_, nullptr, WNOHANG), 0) << "the coordinator exited";
}

// A body over server.max_body_bytes, sent by clients that write the whole
// body before they read (Python's urllib and http.client, with
// Content-Length and chunked): each reads its 413, because the coordinator
// reads and discards the refused body before it closes. (They saw a broken
// pipe when it closed after reading 1 MiB of it.)
TEST_F(SecurityHttpDaemon, ABodyOverTheLimitGetsItsStatusNotAResetWithPythonClients) {
  const char* python = std::getenv("TESSERA_PYTHON");
  ASSERT_NE(python, nullptr) << "TESSERA_PYTHON is not set: run the tests through scripts/test";
  auto [rc, out] = ::tessera::testing::RunCommand(
      std::string(python) + " " +
      ::tessera::testing::FixturePath("../support/body_limit_client_check.py") + " " +
      std::to_string(ports_->api) + " " + std::to_string(kMaxBodyBytes));
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("body limit client checks passed"), std::string::npos) << out;
  EXPECT_EQ(waitpid(pid_, nullptr, WNOHANG), 0) << "the coordinator exited";
}

}  // namespace
}  // namespace tessera
