// HttpServer and a client that half-closes (shutdown(SHUT_WR)) after its
// request, over real loopback sockets: the response is still served, whole
// or streamed, because HTTP allows it (RFC 9112 section 9.6); while it is
// pending the server probes the client (an interim 100 response, an SSE
// comment inside a stream), and a client that closed entirely is still
// reported gone. HTTP/1.0 has no interim responses: its EOF means gone.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/net/http_server.h"
#include "support/raw_http_client.h"

namespace tessera {
namespace {

using Client = ::tessera::testing::RawHttpClient;
using Clock = std::chrono::steady_clock;

std::string Post(const std::string& target, const std::string& body, const char* version) {
  return std::string("POST ") + target + " " + version +
         "\r\nHost: test\r\nContent-Type: application/json\r\nContent-Length: " +
         std::to_string(body.size()) + "\r\n\r\n" + body;
}

template <class F>
bool WaitFor(F cond, double seconds = 10.0) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
  while (!cond()) {
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

// A server whose one route parks the Responder, as the scheduler's queue
// does, for the test to answer when it chooses.
class HalfClose : public ::testing::Test {
 protected:
  void SetUp() override {
    HttpServerOptions o;
    o.half_close_probe_seconds = 0.05;
    server_ = std::make_unique<HttpServer>(o);
    server_->Handle("POST", "/parked", [this](const HttpRequest&, std::shared_ptr<Responder> r) {
      r->OnClientGone([this] { gone_ = true; });
      std::lock_guard<std::mutex> lock(mu_);
      parked_ = std::move(r);
    });
    server_->Handle("GET", "/now", [](const HttpRequest& req, std::shared_ptr<Responder> r) {
      r->Send(200, "text/plain", req.target);
    });
    ASSERT_TRUE(server_->Start().ok());
  }
  void TearDown() override { server_->Stop(); }

  std::shared_ptr<Responder> Parked() {
    EXPECT_TRUE(WaitFor([&] {
      std::lock_guard<std::mutex> lock(mu_);
      return parked_ != nullptr;
    }));
    std::lock_guard<std::mutex> lock(mu_);
    return parked_;
  }

  std::unique_ptr<HttpServer> server_;
  std::mutex mu_;
  std::shared_ptr<Responder> parked_;
  std::atomic<bool> gone_{false};
};

TEST_F(HalfClose, AWholeResponseIsServedAfterTheClientShutsDownSending) {
  Client c(server_->port());
  ASSERT_TRUE(c.Send(Post("/parked", "{\"q\":1}", "HTTP/1.1")));
  std::shared_ptr<Responder> r = Parked();
  ASSERT_TRUE(r);
  ASSERT_TRUE(c.ShutdownWrite());
  // The server probes the half-closed client before it answers; the client
  // reads the probe, and only then is the answer sent.
  auto interim = c.ReadHead();
  ASSERT_TRUE(interim);
  EXPECT_EQ(interim->status, 100);
  EXPECT_FALSE(gone_.load());
  EXPECT_FALSE(r->client_gone());
  ASSERT_TRUE(r->SendJson(200, "{\"answer\":42}"));
  auto final = c.ReadFinalResponse();
  ASSERT_TRUE(final);
  EXPECT_EQ(final->status, 200);
  EXPECT_EQ(final->body, "{\"answer\":42}");
  EXPECT_TRUE(c.SeesClose());  // nothing more can come from this client
  EXPECT_FALSE(gone_.load());
}

TEST_F(HalfClose, AStreamIsServedAfterTheClientShutsDownSending) {
  Client c(server_->port());
  ASSERT_TRUE(c.Send(Post("/parked", "{}", "HTTP/1.1")));
  std::shared_ptr<Responder> r = Parked();
  ASSERT_TRUE(r);
  ASSERT_TRUE(r->StartStream());
  auto head = c.ReadHead();
  ASSERT_TRUE(head);
  EXPECT_EQ(head->status, 200);
  ASSERT_TRUE(c.ShutdownWrite());
  // Inside the stream the probe is an SSE comment, which clients ignore.
  auto probe = c.ReadChunk();
  ASSERT_TRUE(probe);
  EXPECT_EQ(*probe, ":\n\n");
  EXPECT_FALSE(gone_.load());
  ASSERT_TRUE(r->SendEvent("one"));
  ASSERT_TRUE(r->SendEvent("[DONE]"));
  ASSERT_TRUE(r->Finish());
  std::string events;
  while (true) {
    auto chunk = c.ReadChunk();
    ASSERT_TRUE(chunk);
    if (chunk->empty()) break;
    if (*chunk != ":\n\n") events += *chunk;
  }
  EXPECT_EQ(events, "data: one\n\ndata: [DONE]\n\n");
  EXPECT_TRUE(c.SeesClose());
  EXPECT_FALSE(gone_.load());
}

TEST_F(HalfClose, PipelinedRequestsBeforeTheHalfCloseAreAllServed) {
  Client c(server_->port());
  ASSERT_TRUE(
      c.Send("GET /now?1 HTTP/1.1\r\nHost: test\r\n\r\n"
             "GET /now?2 HTTP/1.1\r\nHost: test\r\n\r\n"));
  ASSERT_TRUE(c.ShutdownWrite());
  for (const char* want : {"/now?1", "/now?2"}) {
    auto r = c.ReadFinalResponse();
    ASSERT_TRUE(r) << want;
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(r->body, want);
  }
  EXPECT_TRUE(c.SeesClose());
}

TEST_F(HalfClose, AClientThatClosedEntirelyIsReportedGoneByTheProbes) {
  {
    Client c(server_->port());
    ASSERT_TRUE(c.Send(Post("/parked", "{}", "HTTP/1.1")));
    ASSERT_TRUE(Parked());
  }  // close(): the server sees the same EOF as for a half-close
  ASSERT_TRUE(WaitFor([&] { return gone_.load(); }));
  std::shared_ptr<Responder> r = Parked();
  EXPECT_TRUE(r->client_gone());
  EXPECT_FALSE(r->SendJson(200, "{}"));
}

TEST_F(HalfClose, AStreamWhoseClientClosedEntirelyIsReportedGone) {
  std::shared_ptr<Responder> r;
  {
    Client c(server_->port());
    ASSERT_TRUE(c.Send(Post("/parked", "{}", "HTTP/1.1")));
    r = Parked();
    ASSERT_TRUE(r);
    ASSERT_TRUE(r->StartStream());
    ASSERT_TRUE(c.ReadHead());
  }
  // No event is sent: the probes alone find the client gone.
  ASSERT_TRUE(WaitFor([&] { return gone_.load(); }));
  EXPECT_FALSE(r->SendEvent("late"));
}

TEST_F(HalfClose, AnHttp10ClientThatShutsDownSendingIsGone) {
  Client c(server_->port());
  ASSERT_TRUE(c.Send(Post("/parked", "{}", "HTTP/1.0")));
  std::shared_ptr<Responder> r = Parked();
  ASSERT_TRUE(r);
  ASSERT_TRUE(c.ShutdownWrite());
  // No interim response exists in HTTP/1.0, so EOF cannot be probed and
  // means the client left, as it always did.
  ASSERT_TRUE(WaitFor([&] { return gone_.load(); }));
  EXPECT_TRUE(c.SeesClose());
}

TEST(HalfCloseOptions, AProbeIntervalOutOfRangeIsRefused) {
  for (double bad : {0.0, -1.0, 3600.0}) {
    HttpServerOptions o;
    o.half_close_probe_seconds = bad;
    HttpServer server(o);
    Status st = server.Start();
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(st.message().find("half_close_probe_seconds"), std::string::npos) << st.ToString();
  }
}

}  // namespace
}  // namespace tessera
