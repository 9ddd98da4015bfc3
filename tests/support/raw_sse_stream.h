// RawSseStream: one streamed POST /v1/completions read as it arrives, over
// a raw socket (HTTP/1.0, so the body is the raw event stream, closed at
// the end): the text, the finish reason, the [DONE] markers and any error
// event. For tests that disturb a cluster while streams run.
//
// Thread-safety: `events` may be read from any thread while Run runs on
// `thread`; the rest after joining it.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

namespace tessera::testing {

struct RawSseStream {
  std::atomic<int> events{0};
  std::string text;
  std::string error;
  int done_markers = 0;
  std::string finish_reason;
  std::thread thread;

  void Run(int port, const std::string& body) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    timeval tv{60, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
      error = "connect failed";
      close(fd);
      return;
    }
    const std::string req =
        "POST /v1/completions HTTP/1.0\r\nHost: 127.0.0.1\r\n"
        "Content-Type: application/json\r\nContent-Length: " +
        std::to_string(body.size()) + "\r\n\r\n" + body;
    if (write(fd, req.data(), req.size()) != static_cast<ssize_t>(req.size())) {
      error = "write failed";
      close(fd);
      return;
    }
    std::string buf;
    size_t pos = std::string::npos;  // start of the body once the headers are in
    char chunk[4096];
    while (true) {
      // A read interrupted by the SIGCHLD of a SIGSTOPped or killed worker
      // (EINTR, not restarted on a socket with a receive timeout) reads again.
      const ssize_t n = read(fd, chunk, sizeof chunk);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      buf.append(chunk, static_cast<size_t>(n));
      if (pos == std::string::npos) {
        const size_t h = buf.find("\r\n\r\n");
        if (h == std::string::npos) continue;
        if (buf.compare(0, 12, "HTTP/1.1 200") != 0 && buf.compare(0, 12, "HTTP/1.0 200") != 0)
          error = "status line: " + buf.substr(0, buf.find("\r\n"));
        pos = h + 4;
      }
      size_t end;
      while ((end = buf.find("\n\n", pos)) != std::string::npos) {
        std::string ev = buf.substr(pos, end - pos);
        pos = end + 2;
        if (ev.rfind("data: ", 0) != 0) continue;
        ev = ev.substr(6);
        if (ev == "[DONE]") {
          ++done_markers;
          continue;
        }
        const nlohmann::json j = nlohmann::json::parse(ev, nullptr, false);
        if (j.is_discarded() || j.contains("error")) {
          error = ev;
          continue;
        }
        for (const nlohmann::json& c : j["choices"]) {
          if (c.contains("text") && c["text"].is_string()) text += c["text"].get<std::string>();
          if (c.contains("finish_reason") && c["finish_reason"].is_string())
            finish_reason = c["finish_reason"].get<std::string>();
        }
        ++events;
      }
    }
    close(fd);
  }
};

}  // namespace tessera::testing
