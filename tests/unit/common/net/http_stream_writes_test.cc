// HttpServer's stream writes over real loopback sockets: the events of a
// stream that become ready while a write is blocked (a client that does not
// read) go out together in one write, in order and framed one event per
// chunk, and are handed to the connection's strand in one flush (the server
// before coalescing posted every event on its own); a lone event is written
// at once, so events that wait for the client's reads each take their own
// write. Events made under a Responder::EventHold leave together when it
// ends or with Finish. HttpServer::stream_stats counts the writes, events
// and flushes.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
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

std::string PostRequest(const std::string& target) {
  return "POST " + target + " HTTP/1.1\r\nHost: test\r\nContent-Length: 1\r\n\r\nx";
}

class HttpStreamWritesTest : public ::testing::Test {
 protected:
  void StartServer(const std::string& path, HttpServer::Handler handler) {
    HttpServerOptions options;
    options.bind_address = "127.0.0.1";
    options.port = 0;
    server_ = std::make_unique<HttpServer>(options);
    server_->Handle("POST", path, std::move(handler));
    ASSERT_TRUE(server_->Start().ok());
  }
  void TearDown() override {
    if (server_) server_->Stop();
    for (std::thread& t : threads_) t.join();
  }

  std::unique_ptr<HttpServer> server_;
  std::vector<std::thread> threads_;  // producers, joined after the server stops
};

// A 16 MiB first event fills the socket buffers of a client that reads
// nothing (its receive window is 64 KiB, the kernel's send buffer at most a
// few MiB), so its write stays in flight while the producer queues 200 more
// events and the end. They must leave in at most one more write.
TEST_F(HttpStreamWritesTest, EventsQueuedBehindABlockedWriteShareOneWrite) {
  constexpr int kSmall = 200;
  const std::string big(16 << 20, 'x');
  std::vector<std::string> payloads = {big};
  for (int i = 0; i < kSmall; ++i) payloads.push_back("{\"n\":" + std::to_string(i) + "}");
  payloads.push_back("{\"error\":{\"message\":\"stopped\"}}");
  payloads.push_back("[DONE]");
  std::promise<void> queued;
  StartServer("/stream", [&](const HttpRequest&, std::shared_ptr<Responder> r) {
    threads_.emplace_back([&, r] {
      EXPECT_TRUE(r->StartStream());
      for (const std::string& p : payloads) EXPECT_TRUE(r->SendEvent(p));
      EXPECT_TRUE(r->Finish());
      queued.set_value();
    });
  });
  const HttpServer::StreamStats before = server_->stream_stats();
  Client c(server_->port(), 30.0, 64 * 1024);
  ASSERT_TRUE(c.connected());
  ASSERT_TRUE(c.Send(PostRequest("/stream")));
  // Everything is queued before the client reads a byte.
  ASSERT_EQ(queued.get_future().wait_for(std::chrono::seconds(30)), std::future_status::ready);
  auto head = c.ReadHead();
  ASSERT_TRUE(head.has_value());
  EXPECT_EQ(head->status, 200);
  EXPECT_EQ(head->headers["transfer-encoding"], "chunked");
  // One event per chunk, in order, each framed "data: <payload>\n\n".
  for (size_t i = 0; i < payloads.size(); ++i) {
    auto chunk = c.ReadChunk();
    ASSERT_TRUE(chunk.has_value()) << "event " << i;
    ASSERT_EQ(*chunk, "data: " + payloads[i] + "\n\n") << "event " << i;
  }
  auto last = c.ReadChunk();
  ASSERT_TRUE(last.has_value());
  EXPECT_EQ(*last, "") << "the stream's terminating chunk";
  const HttpServer::StreamStats after = server_->stream_stats();
  EXPECT_EQ(after.events - before.events, payloads.size());
  // The big event's write (with whatever was queued when it started), then
  // one write of everything queued behind it.
  EXPECT_GE(after.writes - before.writes, 1u);
  EXPECT_LE(after.writes - before.writes, 2u);
  // Likewise the hand-offs to the strand: the first event's, and at most
  // one for those that came before its write started.
  EXPECT_GE(after.flushes - before.flushes, 1u);
  EXPECT_LE(after.flushes - before.flushes, 2u);
  // The connection serves the next request.
  ASSERT_TRUE(c.Send(PostRequest("/missing")));
  auto next = c.ReadResponse();
  ASSERT_TRUE(next.has_value());
  EXPECT_EQ(next->status, 404);
}

// The producer sends each event only after the client has read the one
// before: no event waits for company, each takes its own write.
TEST_F(HttpStreamWritesTest, ALoneEventIsWrittenAtOnce) {
  constexpr int kEvents = 5;
  std::mutex mu;
  std::condition_variable cv;
  int read = 0;  // guarded by mu: events the client has read
  StartServer("/stream", [&](const HttpRequest&, std::shared_ptr<Responder> r) {
    threads_.emplace_back([&, r] {
      EXPECT_TRUE(r->StartStream());
      for (int i = 0; i < kEvents; ++i) {
        EXPECT_TRUE(r->SendEvent("{\"n\":" + std::to_string(i) + "}"));
        std::unique_lock<std::mutex> lock(mu);
        EXPECT_TRUE(cv.wait_for(lock, std::chrono::seconds(10), [&] { return read > i; }))
            << "event " << i << " was not delivered on its own";
      }
      EXPECT_TRUE(r->Finish());
    });
  });
  const HttpServer::StreamStats before = server_->stream_stats();
  Client c(server_->port(), 10.0);
  ASSERT_TRUE(c.Send(PostRequest("/stream")));
  auto head = c.ReadHead();
  ASSERT_TRUE(head.has_value());
  for (int i = 0; i < kEvents; ++i) {
    auto chunk = c.ReadChunk();
    ASSERT_TRUE(chunk.has_value()) << "event " << i;
    EXPECT_EQ(*chunk, "data: {\"n\":" + std::to_string(i) + "}\n\n");
    std::lock_guard<std::mutex> lock(mu);
    read = i + 1;
    cv.notify_all();
  }
  auto last = c.ReadChunk();
  ASSERT_TRUE(last.has_value());
  EXPECT_EQ(*last, "");
  const HttpServer::StreamStats after = server_->stream_stats();
  EXPECT_EQ(after.events - before.events, static_cast<uint64_t>(kEvents));
  EXPECT_EQ(after.writes - before.writes, static_cast<uint64_t>(kEvents));
  EXPECT_LE(after.flushes - before.flushes, static_cast<uint64_t>(kEvents));
}

// Events under a hold post no flush of their own: a hold that ends with the
// stream open posts them in one flush, and a stream's end under a hold (as
// the frontend sends a choice's finish chunk, the usage chunk and [DONE])
// leaves with Finish, no flush at all. (The strand may still take them
// early, in the completion of the write before: hence "at most".)
TEST_F(HttpStreamWritesTest, EventsUnderAHoldLeaveInOneWrite) {
  std::promise<void> header_read, middle_read;
  StartServer("/stream", [&](const HttpRequest&, std::shared_ptr<Responder> r) {
    threads_.emplace_back([&, r, header_read = header_read.get_future(),
                           middle_read = middle_read.get_future()]() mutable {
      EXPECT_TRUE(r->StartStream());
      header_read.wait();
      {
        Responder::EventHold hold = r->HoldEvents();
        for (const char* e : {"a", "b", "c"}) EXPECT_TRUE(r->SendEvent(e));
      }
      middle_read.wait();
      Responder::EventHold hold = r->HoldEvents();
      for (const char* e : {"finish", "usage", "[DONE]"}) EXPECT_TRUE(r->SendEvent(e));
      EXPECT_TRUE(r->Finish());
    });
  });
  Client c(server_->port(), 10.0);
  ASSERT_TRUE(c.Send(PostRequest("/stream")));
  ASSERT_TRUE(c.ReadHead().has_value());
  const HttpServer::StreamStats s0 = server_->stream_stats();
  header_read.set_value();
  for (const char* e : {"a", "b", "c"}) {
    auto chunk = c.ReadChunk();
    ASSERT_TRUE(chunk.has_value()) << e;
    EXPECT_EQ(*chunk, std::string("data: ") + e + "\n\n");
  }
  const HttpServer::StreamStats s1 = server_->stream_stats();
  EXPECT_EQ(s1.events - s0.events, 3u);
  EXPECT_GE(s1.writes - s0.writes, 1u);
  EXPECT_LE(s1.writes - s0.writes, 2u);
  EXPECT_LE(s1.flushes - s0.flushes, 1u);  // the hold's end
  middle_read.set_value();
  for (const char* e : {"finish", "usage", "[DONE]"}) {
    auto chunk = c.ReadChunk();
    ASSERT_TRUE(chunk.has_value()) << e;
    EXPECT_EQ(*chunk, std::string("data: ") + e + "\n\n");
  }
  auto last = c.ReadChunk();
  ASSERT_TRUE(last.has_value());
  EXPECT_EQ(*last, "");
  const HttpServer::StreamStats s2 = server_->stream_stats();
  EXPECT_EQ(s2.events - s1.events, 3u);
  EXPECT_GE(s2.writes - s1.writes, 1u);
  EXPECT_LE(s2.writes - s1.writes, 2u);
  EXPECT_EQ(s2.flushes - s1.flushes, 0u);  // Finish took them
}

}  // namespace
}  // namespace tessera
