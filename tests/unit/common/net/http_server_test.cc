// HttpServer over real loopback sockets: routing and error codes, limits,
// keep-alive, concurrency and the connection limit, timeouts, Server-Sent
// Events streamed incrementally, client disconnects seen by the producer,
// and survival after malformed input.
#include "common/net/http_server.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <future>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/net/http_client.h"
#include "support/raw_http_client.h"

namespace tessera {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Polls `cond` every 5 ms for up to `seconds`.
template <class F>
bool WaitFor(F cond, double seconds = 5.0) {
  const auto start = Clock::now();
  while (!cond()) {
    if (SecondsSince(start) > seconds) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

using Response = ::tessera::testing::RawResponse;
using Client = ::tessera::testing::RawHttpClient;

std::string Get(const std::string& target, const std::string& extra = "") {
  return "GET " + target + " HTTP/1.1\r\nHost: test\r\n" + extra + "\r\n";
}

std::string Post(const std::string& target, const std::string& body,
                 const std::string& extra = "") {
  return "POST " + target + " HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n" +
         "Content-Length: " + std::to_string(body.size()) + "\r\n" + extra + "\r\n" + body;
}

// The OpenAI error body, checked for shape; returns the error object.
json ExpectErrorBody(const Response& r, int status) {
  EXPECT_EQ(r.status, status);
  EXPECT_EQ(r.headers.count("content-type") ? r.headers.at("content-type") : "",
            "application/json");
  json j = json::parse(r.body, nullptr, false);
  EXPECT_TRUE(j.is_object()) << r.body;
  if (!j.is_object() || !j.contains("error")) return json::object();
  const json& e = j["error"];
  EXPECT_TRUE(e["message"].is_string());
  EXPECT_FALSE(e["message"].get<std::string>().empty());
  EXPECT_TRUE(e["type"].is_string());
  EXPECT_TRUE(e.contains("param"));
  EXPECT_TRUE(e.contains("code"));
  return e;
}

class HttpServerTest : public ::testing::Test {
 protected:
  void StartServer(HttpServerOptions options = {}) {
    options.bind_address = "127.0.0.1";
    options.port = 0;
    server_ = std::make_unique<HttpServer>(options);
    server_->Handle("GET", "/hello", [](const HttpRequest& req, std::shared_ptr<Responder> r) {
      json j = {{"method", req.method},
                {"path", req.path},
                {"target", req.target},
                {"query", req.query},
                {"x_test", req.Header("x-TEST").value_or("")},
                {"remote", req.remote_address}};
      r->SendJson(200, j.dump());
    });
    server_->Handle("POST", "/echo", [](const HttpRequest& req, std::shared_ptr<Responder> r) {
      r->Send(200, "text/plain", req.body);
    });
    server_->Handle("GET", "/echo", [](const HttpRequest&, std::shared_ptr<Responder> r) {
      r->Send(200, "text/plain", "use POST");
    });
    server_->Handle("GET", "/throws", [](const HttpRequest&, std::shared_ptr<Responder>) {
      throw std::runtime_error("boom");
    });
    server_->Handle("GET", "/silent", [](const HttpRequest&, std::shared_ptr<Responder>) {});
    for (auto& [method, path, handler] : extra_routes_) server_->Handle(method, path, handler);
    Status st = server_->Start();
    ASSERT_TRUE(st.ok()) << st.ToString();
    ASSERT_GT(server_->port(), 0);
  }

  void AddRoute(std::string method, std::string path, HttpServer::Handler h) {
    extra_routes_.push_back({std::move(method), std::move(path), std::move(h)});
  }

  // A fresh connection still gets a 200: the server survived what came before.
  void ExpectStillServing() {
    Client c(server_->port());
    ASSERT_TRUE(c.connected());
    ASSERT_TRUE(c.Send(Get("/hello?name=again")));
    auto r = c.ReadResponse();
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->status, 200);
  }

  void TearDown() override {
    if (server_) server_->Stop();
    for (auto& t : threads_) t.join();
  }

  struct Route {
    std::string method, path;
    HttpServer::Handler handler;
  };
  std::vector<Route> extra_routes_;
  std::unique_ptr<HttpServer> server_;
  std::vector<std::thread> threads_;  // producers started by handlers
};

TEST_F(HttpServerTest, RoutesRequestWithQueryAndHeaders) {
  StartServer();
  Client c(server_->port());
  ASSERT_TRUE(c.Send(Get("/hello?name=a%20b&x=1+2&flag", "X-Test: yes\r\n")));
  auto r = c.ReadResponse();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->headers["content-type"], "application/json");
  json j = json::parse(r->body);
  EXPECT_EQ(j["method"], "GET");
  EXPECT_EQ(j["path"], "/hello");
  EXPECT_EQ(j["target"], "/hello?name=a%20b&x=1+2&flag");
  EXPECT_EQ(j["query"]["name"], "a b");
  EXPECT_EQ(j["query"]["x"], "1 2");
  EXPECT_EQ(j["query"]["flag"], "");
  EXPECT_EQ(j["x_test"], "yes");
  EXPECT_EQ(j["remote"].get<std::string>().rfind("127.0.0.1:", 0), 0u);
}

TEST_F(HttpServerTest, UnknownPathIs404AndWrongMethodIs405) {
  StartServer();
  Client c(server_->port());
  ASSERT_TRUE(c.Send(Get("/nope")));
  auto r = c.ReadResponse();
  ASSERT_TRUE(r.has_value());
  json e = ExpectErrorBody(*r, 404);
  EXPECT_EQ(e["type"], "invalid_request_error");
  EXPECT_EQ(e["code"], "unknown_url");
  EXPECT_TRUE(e["param"].is_null());
  EXPECT_NE(e["message"].get<std::string>().find("/nope"), std::string::npos);

  // Same connection: errors from routing keep the connection alive.
  ASSERT_TRUE(c.Send("DELETE /echo HTTP/1.1\r\nHost: t\r\n\r\n"));
  r = c.ReadResponse();
  ASSERT_TRUE(r.has_value());
  e = ExpectErrorBody(*r, 405);
  EXPECT_EQ(e["code"], "method_not_allowed");
  EXPECT_EQ(r->headers["allow"], "GET, POST");
}

TEST_F(HttpServerTest, PatternRoutesMatchOneSegmentPerStar) {
  AddRoute("POST", "/admin/workers/*/drain",
           [](const HttpRequest& req, std::shared_ptr<Responder> r) {
             r->SendJson(200, json{{"params", req.path_params}}.dump());
           });
  StartServer();
  Client c(server_->port());
  ASSERT_TRUE(c.Send(Post("/admin/workers/worker-3/drain", "")));
  auto r = c.ReadResponse();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(json::parse(r->body)["params"], json::array({"worker-3"}));
  // An empty or extra segment does not match; a wrong method gets 405.
  for (const char* path :
       {"/admin/workers//drain", "/admin/workers/a/b/drain", "/admin/workers/a/undrain"}) {
    ASSERT_TRUE(c.Send(Post(path, "")));
    r = c.ReadResponse();
    ASSERT_TRUE(r.has_value());
    ExpectErrorBody(*r, 404);
  }
  ASSERT_TRUE(c.Send(Get("/admin/workers/a/drain")));
  r = c.ReadResponse();
  ASSERT_TRUE(r.has_value());
  ExpectErrorBody(*r, 405);
}

TEST_F(HttpServerTest, PostBodyAndChunkedRequestBody) {
  StartServer();
  Client c(server_->port());
  ASSERT_TRUE(c.Send(Post("/echo", "{\"a\": 1}")));
  auto r = c.ReadResponse();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->body, "{\"a\": 1}");
  ASSERT_TRUE(
      c.Send("POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
             "3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"));
  r = c.ReadResponse();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->body, "abcde");
}

TEST_F(HttpServerTest, ExpectContinueGetsInterimResponse) {
  StartServer();
  Client c(server_->port());
  ASSERT_TRUE(
      c.Send("POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n"
             "Expect: 100-continue\r\n\r\n"));
  auto interim = c.ReadHead();
  ASSERT_TRUE(interim.has_value());
  EXPECT_EQ(interim->status, 100);
  ASSERT_TRUE(c.Send("hello"));
  auto r = c.ReadResponse();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->body, "hello");
}

TEST_F(HttpServerTest, BodyOverLimitIs413) {
  HttpServerOptions o;
  o.max_body_bytes = 1000;
  StartServer(o);
  {
    // Declared length over the limit: refused before the body is read.
    Client c(server_->port());
    ASSERT_TRUE(c.Send("POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 5000\r\n\r\n" +
                       std::string(2000, 'x')));
    auto r = c.ReadResponse();
    ASSERT_TRUE(r.has_value());
    json e = ExpectErrorBody(*r, 413);
    EXPECT_EQ(e["code"], "request_too_large");
    EXPECT_NE(e["message"].get<std::string>().find("1000"), std::string::npos);
    EXPECT_EQ(r->headers["connection"], "close");
    EXPECT_TRUE(c.SeesClose());
  }
  {
    // Chunked body that grows past the limit.
    Client c(server_->port());
    std::string req = "POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n";
    for (int i = 0; i < 3; ++i) req += "1f4\r\n" + std::string(500, 'y') + "\r\n";
    req += "0\r\n\r\n";
    ASSERT_TRUE(c.Send(req));
    auto r = c.ReadResponse();
    ASSERT_TRUE(r.has_value());
    ExpectErrorBody(*r, 413);
  }
  {
    // Exactly at the limit is fine.
    Client c(server_->port());
    ASSERT_TRUE(c.Send(Post("/echo", std::string(1000, 'z'))));
    auto r = c.ReadResponse();
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(r->body.size(), 1000u);
  }
  ExpectStillServing();
}

TEST_F(HttpServerTest, HugeHeadersAndTooManyHeadersAre431) {
  HttpServerOptions o;
  o.max_header_bytes = 2048;
  o.max_header_count = 10;
  StartServer(o);
  {
    Client c(server_->port());
    ASSERT_TRUE(c.Send(Get("/hello", "X-Big: " + std::string(100000, 'h') + "\r\n")));
    auto r = c.ReadResponse();
    ASSERT_TRUE(r.has_value());
    json e = ExpectErrorBody(*r, 431);
    EXPECT_NE(e["message"].get<std::string>().find("2048"), std::string::npos);
  }
  {
    Client c(server_->port());
    std::string extra;
    for (int i = 0; i < 20; ++i) extra += "X-H" + std::to_string(i) + ": v\r\n";
    ASSERT_TRUE(c.Send(Get("/hello", extra)));
    auto r = c.ReadResponse();
    ASSERT_TRUE(r.has_value());
    json e = ExpectErrorBody(*r, 431);
    EXPECT_NE(e["message"].get<std::string>().find("limit is 10"), std::string::npos);
  }
  ExpectStillServing();
}

TEST_F(HttpServerTest, MalformedRequestsGet400AndServerKeepsServing) {
  StartServer();
  const std::vector<std::string> garbage = {
      std::string("\x00\x01\x02\xff\xfe garbage\r\n\r\n", 17),
      "GET /hello HTTX/1.1\r\n\r\n",
      "GET /hello HTTP/1.1\r\nBad Header Without Colon\r\n\r\n",
      "POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: abc\r\n\r\n",
      "POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
      "GET\r\n\r\n",
  };
  for (const std::string& g : garbage) {
    Client c(server_->port());
    ASSERT_TRUE(c.Send(g));
    auto r = c.ReadResponse();
    ASSERT_TRUE(r.has_value()) << "no response to "
                               << json(g).dump(-1, ' ', true, json::error_handler_t::replace);
    json e = ExpectErrorBody(*r, 400);
    EXPECT_EQ(e["code"], "bad_request");
    EXPECT_TRUE(c.SeesClose());
  }
  {
    // A client that connects and leaves at once, or sends half a request.
    Client c1(server_->port());
    c1.Close();
    Client c2(server_->port());
    ASSERT_TRUE(c2.Send("POST /echo HTTP/1.1\r\nContent-Length: 100\r\n\r\nabc"));
    c2.Close();
  }
  ExpectStillServing();
  EXPECT_TRUE(WaitFor([&] { return server_->open_connections() == 0; }));
}

TEST_F(HttpServerTest, HandlerThatThrowsOrDropsTheResponderGets500) {
  StartServer();
  Client c(server_->port());
  ASSERT_TRUE(c.Send(Get("/throws")));
  auto r = c.ReadResponse();
  ASSERT_TRUE(r.has_value());
  json e = ExpectErrorBody(*r, 500);
  EXPECT_EQ(e["type"], "server_error");
  EXPECT_NE(e["message"].get<std::string>().find("boom"), std::string::npos);
  ASSERT_TRUE(c.Send(Get("/silent")));
  r = c.ReadResponse();
  ASSERT_TRUE(r.has_value());
  ExpectErrorBody(*r, 500);
  ASSERT_TRUE(c.Send(Get("/hello")));
  r = c.ReadResponse();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 200);
}

TEST_F(HttpServerTest, BearerTokenGuardsAdminRoutes) {
  AddRoute("GET", "/admin/cluster",
           RequireBearerToken("s3cret-token", [](const HttpRequest&, std::shared_ptr<Responder> r) {
             r->SendJson(200, "{\"ok\":true}");
           }));
  StartServer();
  Client c(server_->port());
  ASSERT_TRUE(c.Send(Get("/admin/cluster")));
  auto r = c.ReadResponse();
  ASSERT_TRUE(r.has_value());
  json e = ExpectErrorBody(*r, 401);
  EXPECT_EQ(e["code"], "invalid_api_key");
  EXPECT_EQ(r->headers["www-authenticate"], "Bearer");
  for (std::string wrong : {"Bearer s3cret-tokeN", "Bearer s3cret-token-and-more", "Bearer s3cret",
                            "Basic s3cret-token", "s3cret-token", "Bearer "}) {
    ASSERT_TRUE(c.Send(Get("/admin/cluster", "Authorization: " + wrong + "\r\n")));
    r = c.ReadResponse();
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->status, 401) << wrong;
  }
  ASSERT_TRUE(c.Send(Get("/admin/cluster", "Authorization: bearer s3cret-token\r\n")));
  r = c.ReadResponse();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->body, "{\"ok\":true}");

  EXPECT_TRUE(ConstantTimeEquals("abc", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("abd", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("ab", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("abcd", "abc"));
  EXPECT_TRUE(ConstantTimeEquals("", ""));
  HttpRequest req;
  req.headers = {{"authorization", "Bearer x"}};
  EXPECT_FALSE(HasBearerToken(req, ""));  // an empty configured token matches nothing
  EXPECT_TRUE(HasBearerToken(req, "x"));
}

TEST_F(HttpServerTest, KeepAlivePipeliningAndConnectionClose) {
  StartServer();
  Client c(server_->port());
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(c.Send(Post("/echo", "req" + std::to_string(i))));
    auto r = c.ReadResponse();
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->body, "req" + std::to_string(i));
    EXPECT_EQ(r->headers.count("connection"), 0u);  // HTTP/1.1 default: keep-alive
  }
  EXPECT_EQ(server_->open_connections(), 1);
  // Three requests in one write: answered in order.
  ASSERT_TRUE(c.Send(Post("/echo", "p1") + Post("/echo", "p2") + Get("/hello?name=p3")));
  for (const char* want : {"p1", "p2"}) {
    auto r = c.ReadResponse();
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->body, want);
  }
  auto r = c.ReadResponse();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(json::parse(r->body)["query"]["name"], "p3");
  // Connection: close is honoured.
  ASSERT_TRUE(c.Send(Get("/hello", "Connection: close\r\n")));
  r = c.ReadResponse();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->headers["connection"], "close");
  EXPECT_TRUE(c.SeesClose());
  // HTTP/1.0 without keep-alive: one response, then close.
  Client old(server_->port());
  ASSERT_TRUE(old.Send("GET /hello HTTP/1.0\r\n\r\n"));
  r = old.ReadResponse();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 200);
  EXPECT_TRUE(old.SeesClose());
}

TEST_F(HttpServerTest, ManyConcurrentClientsAllServed) {
  HttpServerOptions o;
  o.num_threads = 2;
  o.max_connections = 64;
  StartServer(o);
  constexpr int kClients = 32, kRequests = 5;
  std::atomic<int> ok{0};
  std::vector<std::thread> clients;
  for (int i = 0; i < kClients; ++i) {
    clients.emplace_back([&, i] {
      Client c(server_->port());
      for (int k = 0; k < kRequests; ++k) {
        const std::string body = fmt::format("client {} request {}", i, k);
        if (!c.Send(Post("/echo", body))) return;
        auto r = c.ReadResponse();
        if (r && r->status == 200 && r->body == body) ok.fetch_add(1);
      }
    });
  }
  for (auto& t : clients) t.join();
  EXPECT_EQ(ok.load(), kClients * kRequests);
}

TEST_F(HttpServerTest, ConnectionsBeyondTheLimitGet503) {
  HttpServerOptions o;
  o.max_connections = 4;
  StartServer(o);
  std::vector<std::unique_ptr<Client>> held;
  for (int i = 0; i < 4; ++i) held.push_back(std::make_unique<Client>(server_->port()));
  ASSERT_TRUE(WaitFor([&] { return server_->open_connections() == 4; }));
  {
    Client extra(server_->port());
    ASSERT_TRUE(extra.Send(Get("/hello")));
    auto r = extra.ReadResponse();
    ASSERT_TRUE(r.has_value());
    json e = ExpectErrorBody(*r, 503);
    EXPECT_EQ(e["type"], "server_error");
    EXPECT_EQ(e["code"], "server_overloaded");
    EXPECT_TRUE(extra.SeesClose());
  }
  // The held connections are served normally.
  ASSERT_TRUE(held[0]->Send(Get("/hello")));
  auto r = held[0]->ReadResponse();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 200);
  // Freeing a slot admits a new connection.
  held[1]->Close();
  ASSERT_TRUE(WaitFor([&] { return server_->open_connections() == 3; }));
  ExpectStillServing();
}

TEST_F(HttpServerTest, SlowClientTimesOut) {
  HttpServerOptions o;
  o.read_timeout_seconds = 0.3;
  StartServer(o);
  {
    // Half a request, then nothing: 408 and close.
    Client c(server_->port());
    const auto start = Clock::now();
    ASSERT_TRUE(c.Send("GET /hello HTTP/1.1\r\nHost: t\r\n"));
    auto r = c.ReadResponse();
    ASSERT_TRUE(r.has_value());
    json e = ExpectErrorBody(*r, 408);
    EXPECT_EQ(e["code"], "request_timeout");
    EXPECT_TRUE(c.SeesClose());
    EXPECT_GE(SecondsSince(start), 0.25);
    EXPECT_LT(SecondsSince(start), 3.0);
  }
  {
    // A body that trickles in slower than the timeout allows.
    Client c(server_->port());
    ASSERT_TRUE(c.Send("POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n\r\nab"));
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    c.Send("cd");
    auto r = c.ReadResponse();
    ASSERT_TRUE(r.has_value());
    ExpectErrorBody(*r, 408);
  }
  {
    // An idle keep-alive connection is closed without a response.
    Client c(server_->port());
    ASSERT_TRUE(c.Send(Get("/hello")));
    auto r = c.ReadResponse();
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->status, 200);
    const auto start = Clock::now();
    EXPECT_TRUE(c.SeesClose());
    EXPECT_LT(SecondsSince(start), 3.0);
    EXPECT_TRUE(c.buffer().empty());
  }
  EXPECT_TRUE(WaitFor([&] { return server_->open_connections() == 0; }));
  ExpectStillServing();
}

// HttpCall hands each SSE event to on_event as it arrives: the server sends
// the second event only after the client's callback has seen the first.
TEST_F(HttpServerTest, HttpCallHandsOutEventsAsTheyArrive) {
  std::mutex mu;
  std::condition_variable cv;
  bool client_saw_first = false;
  AddRoute("POST", "/stream", [&](const HttpRequest&, std::shared_ptr<Responder> r) {
    threads_.emplace_back([&, r] {
      EXPECT_TRUE(r->StartStream());
      EXPECT_TRUE(r->SendEvent("{\"n\":1}"));
      bool seen;
      {
        std::unique_lock<std::mutex> lock(mu);
        seen = cv.wait_for(lock, std::chrono::seconds(5), [&] { return client_saw_first; });
      }
      EXPECT_TRUE(seen) << "the client's on_event did not get the first event before the end";
      EXPECT_TRUE(r->SendEvent("{\"n\":2}"));
      EXPECT_TRUE(r->SendEvent("[DONE]"));
      EXPECT_TRUE(r->Finish());
    });
  });
  StartServer();
  std::vector<std::string> seen;
  HttpReply reply =
      HttpCall(server_->port(), "POST", "/stream", "x", "", "127.0.0.1", [&](const std::string& e) {
        seen.push_back(e);
        std::lock_guard<std::mutex> lock(mu);
        client_saw_first = true;
        cv.notify_all();
      });
  EXPECT_EQ(reply.status, 200) << reply.body;
  EXPECT_EQ(seen, (std::vector<std::string>{"{\"n\":1}", "{\"n\":2}", "[DONE]"}));
  EXPECT_EQ(reply.events, seen);
}

TEST_F(HttpServerTest, SseStreamArrivesIncrementallyAndConnectionIsReused) {
  std::mutex mu;
  std::condition_variable cv;
  bool client_saw_first = false;
  std::atomic<bool> sent_all{false};
  AddRoute("POST", "/stream", [&](const HttpRequest& req, std::shared_ptr<Responder> r) {
    std::string prompt = req.body;
    threads_.emplace_back([&, r, prompt] {
      EXPECT_TRUE(r->StartStream());
      EXPECT_TRUE(r->SendEvent("{\"n\":1,\"prompt\":\"" + prompt + "\"}"));
      {
        // The second event waits until the client has read the first: the
        // stream is not buffered until the end.
        std::unique_lock<std::mutex> lock(mu);
        EXPECT_TRUE(cv.wait_for(lock, std::chrono::seconds(5), [&] { return client_saw_first; }));
      }
      EXPECT_TRUE(r->SendEvent("line one\nline two"));
      EXPECT_TRUE(r->SendEvent("[DONE]"));
      EXPECT_TRUE(r->Finish());
      EXPECT_FALSE(r->SendEvent("after finish"));
      EXPECT_FALSE(r->client_gone());
      sent_all = true;
    });
  });
  StartServer();
  Client c(server_->port());
  ASSERT_TRUE(c.Send(Post("/stream", "hi")));
  auto head = c.ReadHead();
  ASSERT_TRUE(head.has_value());
  EXPECT_EQ(head->status, 200);
  EXPECT_EQ(head->headers["content-type"], "text/event-stream");
  EXPECT_EQ(head->headers["cache-control"], "no-cache");
  EXPECT_EQ(head->headers["transfer-encoding"], "chunked");
  auto chunk = c.ReadChunk();
  ASSERT_TRUE(chunk.has_value());
  EXPECT_EQ(*chunk, "data: {\"n\":1,\"prompt\":\"hi\"}\n\n");
  EXPECT_FALSE(sent_all.load());
  {
    std::lock_guard<std::mutex> lock(mu);
    client_saw_first = true;
  }
  cv.notify_all();
  std::string rest;
  while (true) {
    auto next = c.ReadChunk();
    ASSERT_TRUE(next.has_value());
    if (next->empty()) break;
    rest += *next;
  }
  EXPECT_EQ(rest, "data: line one\ndata: line two\n\ndata: [DONE]\n\n");
  // The same connection serves the next request.
  ASSERT_TRUE(c.Send(Get("/hello")));
  auto r = c.ReadResponse();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 200);
}

TEST_F(HttpServerTest, ClientDisconnectMidStreamIsReportedToTheProducer) {
  std::atomic<bool> callback_fired{false};
  std::promise<int> events_sent;
  AddRoute("GET", "/stream", [&](const HttpRequest&, std::shared_ptr<Responder> r) {
    r->OnClientGone([&] { callback_fired = true; });
    threads_.emplace_back([&, r] {
      ASSERT_TRUE(r->StartStream());
      int n = 0;
      const auto start = Clock::now();
      while (SecondsSince(start) < 5.0) {
        if (!r->SendEvent("token " + std::to_string(n))) break;
        ++n;
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      events_sent.set_value(n);
    });
  });
  StartServer();
  auto result = events_sent.get_future();
  {
    Client c(server_->port());
    ASSERT_TRUE(c.Send(Get("/stream")));
    ASSERT_TRUE(c.ReadHead().has_value());
    auto chunk = c.ReadChunk();
    ASSERT_TRUE(chunk.has_value());
    EXPECT_EQ(*chunk, "data: token 0\n\n");
  }  // the client goes away mid-stream
  ASSERT_EQ(result.wait_for(std::chrono::seconds(4)), std::future_status::ready)
      << "the producer never saw the disconnect";
  EXPECT_GE(result.get(), 1);
  EXPECT_TRUE(WaitFor([&] { return callback_fired.load(); }));
  ExpectStillServing();
}

TEST_F(HttpServerTest, ClientDisconnectBeforeAnyResponseIsReported) {
  std::mutex mu;
  std::shared_ptr<Responder> parked;
  std::atomic<bool> callback_fired{false};
  AddRoute("POST", "/queued", [&](const HttpRequest&, std::shared_ptr<Responder> r) {
    // Like a request waiting in the scheduler's queue.
    r->OnClientGone([&] { callback_fired = true; });
    std::lock_guard<std::mutex> lock(mu);
    parked = std::move(r);
  });
  StartServer();
  {
    Client c(server_->port());
    ASSERT_TRUE(c.Send(Post("/queued", "{}")));
    ASSERT_TRUE(WaitFor([&] {
      std::lock_guard<std::mutex> lock(mu);
      return parked != nullptr;
    }));
  }
  ASSERT_TRUE(WaitFor([&] { return callback_fired.load(); }));
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_TRUE(parked->client_gone());
  EXPECT_FALSE(parked->StartStream());
  EXPECT_FALSE(parked->SendJson(200, "{}"));
  // A callback registered after the fact runs at once.
  bool late = false;
  parked->OnClientGone([&] { late = true; });
  EXPECT_TRUE(late);
}

TEST_F(HttpServerTest, ProducerOutrunningAReaderlessClientIsCutOff) {
  HttpServerOptions o;
  o.max_queued_events = 8;
  std::promise<int> outcome;
  AddRoute("GET", "/flood", [&](const HttpRequest&, std::shared_ptr<Responder> r) {
    threads_.emplace_back([&, r] {
      ASSERT_TRUE(r->StartStream());
      const std::string payload(64 * 1024, 'x');
      int n = 0;
      while (n < 5000 && r->SendEvent(payload)) ++n;
      outcome.set_value(n);
    });
  });
  StartServer(o);
  Client c(server_->port(), 5.0, /*rcvbuf=*/4096);
  ASSERT_TRUE(c.Send(Get("/flood")));
  auto f = outcome.get_future();
  ASSERT_EQ(f.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_LT(f.get(), 5000);  // SendEvent said no before the producer finished
  c.Close();
  ExpectStillServing();
}

TEST_F(HttpServerTest, StopEndsOpenStreamsAndReleasesThePort) {
  std::promise<void> streaming;
  std::promise<bool> after_stop;
  std::promise<void> stopped;
  AddRoute("GET", "/stream", [&](const HttpRequest&, std::shared_ptr<Responder> r) {
    threads_.emplace_back([&, r] {
      r->StartStream();
      r->SendEvent("first");
      streaming.set_value();
      stopped.get_future().wait();
      after_stop.set_value(r->SendEvent("second"));
    });
  });
  StartServer();
  const int port = server_->port();
  Client c(port);
  ASSERT_TRUE(c.Send(Get("/stream")));
  streaming.get_future().wait();
  const auto start = Clock::now();
  server_->Stop();
  EXPECT_LT(SecondsSince(start), 3.0);
  stopped.set_value();
  EXPECT_FALSE(after_stop.get_future().get());
  // The listener is closed and the port can be bound again.
  Client refused(port);
  EXPECT_FALSE(refused.connected());
  HttpServerOptions o;
  o.port = port;
  HttpServer again(o);
  Status st = again.Start();
  EXPECT_TRUE(st.ok()) << st.ToString();
}

TEST_F(HttpServerTest, StartErrors) {
  StartServer();
  HttpServerOptions o;
  o.port = server_->port();  // taken
  HttpServer clash(o);
  Status st = clash.Start();
  EXPECT_EQ(st.code(), StatusCode::kIoError) << st.ToString();
  EXPECT_NE(st.message().find(std::to_string(o.port)), std::string::npos);

  HttpServerOptions bad;
  bad.num_threads = 0;
  HttpServer zero(bad);
  st = zero.Start();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("num_threads"), std::string::npos);
}

}  // namespace
}  // namespace tessera
