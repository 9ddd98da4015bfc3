// A clean shutdown (SIGTERM) of the coordinator while requests are open:
// every open stream gets an error event naming the shutdown and then
// [DONE], a waiting non-streamed request gets a 503, and the coordinator
// exits 0 (it once freed the OpenAI frontend before the scheduler's last
// callbacks ran). Real daemons on loopback; a worker is SIGSTOPped first so
// the requests are certainly still open when SIGTERM arrives.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>

#include "common/net/http_client.h"
#include "support/daemons_fixture.h"
#include "support/test_util.h"

namespace tessera {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

// One HTTP/1.0 request read to the end (the server closes the connection).
struct RawRequest {
  std::atomic<size_t> bytes{0};
  std::string response;
  void Run(int port, const std::string& body) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    timeval tv{30, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      close(fd);
      return;
    }
    const std::string req =
        "POST /v1/completions HTTP/1.0\r\nContent-Type: application/json\r\n"
        "Content-Length: " +
        std::to_string(body.size()) + "\r\n\r\n" + body;
    for (size_t sent = 0; sent < req.size();) {
      const ssize_t n = send(fd, req.data() + sent, req.size() - sent, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        close(fd);
        return;
      }
      sent += static_cast<size_t>(n);
    }
    // The test SIGSTOPs a worker, a child of this process: the kernel sends
    // this process a SIGCHLD (CLD_STOPPED), and the thread it lands on may be
    // this one. A recv on a socket with SO_RCVTIMEO is never restarted after
    // a signal (signal(7)), even an ignored one: it fails with EINTR, which
    // is not the end of the response (reading on keeps the connection open,
    // as the client the server expects would).
    char buf[4096];
    while (true) {
      const ssize_t n = recv(fd, buf, sizeof buf, 0);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;  // the server closed the connection (or 30 s passed)
      response.append(buf, static_cast<size_t>(n));
      bytes.store(response.size());
    }
    close(fd);
  }
};

json Body(bool stream) {
  return {{"model", "llama_gqa_f32"}, {"prompt", std::vector<int>{5, 17, 42}},
          {"max_tokens", 100},        {"temperature", 0},
          {"ignore_eos", true},       {"stream", stream}};
}

TEST_F(Daemons, SigtermEndsEveryOpenStreamWithAnErrorEventAndDone) {
  RawRequest stream, plain;
  std::thread s([&] { stream.Run(port_, Body(true).dump()); });
  // The stream is open once its headers arrived.
  const auto t0 = Clock::now();
  while (stream.bytes.load() == 0 && std::chrono::duration<double>(Clock::now() - t0).count() < 60)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_GT(stream.bytes.load(), 0u) << "no stream headers within 60 s";
  // Freeze the pipeline (well inside the 1 s heartbeat timeout, so no
  // re-plan starts), then queue a non-streamed request behind it.
  const pid_t coordinator = cluster_->coordinator_pid(), worker = cluster_->worker_pid(0);
  ASSERT_EQ(kill(worker, SIGSTOP), 0);
  std::thread p([&] { plain.Run(port_, Body(false).dump()); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ASSERT_EQ(kill(coordinator, SIGTERM), 0);
  s.join();
  p.join();
  kill(worker, SIGCONT);
  // Reaped here (TearDown stops the workers).
  const std::optional<int> status = cluster_->WaitForExit(coordinator, 20);
  ASSERT_TRUE(status.has_value()) << "the coordinator did not exit within 20 s";
  const std::string log = cluster_->CoordinatorLog();
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0)
      << "coordinator status " << *status << "\n"
      << log;

  // The stream: an error event naming the shutdown, then [DONE], then the end.
  const std::string& r = stream.response;
  EXPECT_EQ(r.rfind("HTTP/1.0 200", 0), 0u) << r.substr(0, 300);
  EXPECT_NE(r.find("text/event-stream"), std::string::npos) << r.substr(0, 300);
  const size_t error = r.find("data: {\"error\":{\"code\":\"shutting_down\"");
  ASSERT_NE(error, std::string::npos) << r.substr(r.size() > 600 ? r.size() - 600 : 0);
  EXPECT_NE(r.find("the coordinator is shutting down", error), std::string::npos);
  const size_t done = r.find("data: [DONE]", error);
  EXPECT_NE(done, std::string::npos) << r.substr(error);
  EXPECT_EQ(r.find("data: ", done + 1), std::string::npos) << "events after [DONE]";
  // The waiting non-streamed request: a 503 that says why.
  EXPECT_EQ(plain.response.rfind("HTTP/1.0 503", 0), 0u) << plain.response;
  EXPECT_NE(plain.response.find("shutting_down"), std::string::npos) << plain.response;
}

}  // namespace
}  // namespace tessera
