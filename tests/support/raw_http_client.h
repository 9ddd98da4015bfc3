// A raw HTTP/1.1 client for tests that send exactly the bytes they mean
// (malformed, smuggled or pipelined requests) and read exactly what comes
// back, including whether the server closed the connection.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <string_view>

namespace tessera::testing {

struct RawResponse {
  int status = 0;
  std::map<std::string, std::string> headers;  // lower-case names
  std::string body;                            // de-chunked
};

// A blocking HTTP/1.1 client on a raw socket to 127.0.0.1:port, with a
// receive timeout so that a broken server fails the test instead of hanging
// it.
class RawHttpClient {
 public:
  explicit RawHttpClient(int port, double recv_timeout_seconds = 5.0, int rcvbuf = 0) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    if (rcvbuf > 0) setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf));
    timeval tv{};
    tv.tv_sec = static_cast<long>(recv_timeout_seconds);
    tv.tv_usec = static_cast<long>((recv_timeout_seconds - tv.tv_sec) * 1e6);
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  }
  ~RawHttpClient() { Close(); }
  void Close() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }
  bool connected() const { return connected_; }
  // Shuts down the sending side (a TCP half-close: FIN), as a client may
  // after its last request; reading goes on.
  bool ShutdownWrite() { return shutdown(fd_, SHUT_WR) == 0; }

  bool Send(std::string_view data) {
    while (!data.empty()) {
      const ssize_t n = send(fd_, data.data(), data.size(), MSG_NOSIGNAL);
      if (n <= 0) return false;
      data.remove_prefix(static_cast<size_t>(n));
    }
    return true;
  }

  // One recv into buf_; false on EOF, error or timeout. A recv interrupted
  // by a signal (EINTR: a test that SIGSTOPs a child gets SIGCHLD, and a
  // socket with SO_RCVTIMEO is not restarted, signal(7)) reads again.
  bool ReadMore() {
    char tmp[65536];
    ssize_t n;
    do {
      n = recv(fd_, tmp, sizeof(tmp), 0);
    } while (n < 0 && errno == EINTR);
    if (n <= 0) return false;
    buf_.append(tmp, static_cast<size_t>(n));
    return true;
  }

  // Reads until buf_ holds `needle`.
  bool ReadUntil(std::string_view needle) {
    while (buf_.find(needle) == std::string::npos) {
      if (!ReadMore()) return false;
    }
    return true;
  }

  // Reads and removes from buf_ the status line and header fields.
  std::optional<RawResponse> ReadHead() {
    if (!ReadUntil("\r\n\r\n")) return std::nullopt;
    const size_t end = buf_.find("\r\n\r\n");
    std::string head = buf_.substr(0, end);
    buf_.erase(0, end + 4);
    RawResponse r;
    const size_t sp = head.find(' ');
    if (sp == std::string::npos) return std::nullopt;
    r.status = std::atoi(head.c_str() + sp + 1);
    size_t pos = head.find("\r\n");
    while (pos != std::string::npos) {
      const size_t next = head.find("\r\n", pos + 2);
      std::string line = head.substr(pos + 2, next == std::string::npos ? next : next - pos - 2);
      const size_t colon = line.find(':');
      if (colon != std::string::npos) {
        std::string name = line.substr(0, colon);
        for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
        std::string value = line.substr(colon + 1);
        while (!value.empty() && value.front() == ' ') value.erase(0, 1);
        r.headers[name] = value;
      }
      pos = next;
    }
    return r;
  }

  // Reads one chunk of a chunked body; the empty string at the last chunk.
  std::optional<std::string> ReadChunk() {
    if (!ReadUntil("\r\n")) return std::nullopt;
    const size_t eol = buf_.find("\r\n");
    const size_t size = std::stoul(buf_.substr(0, eol), nullptr, 16);
    buf_.erase(0, eol + 2);
    while (buf_.size() < size + 2) {
      if (!ReadMore()) return std::nullopt;
    }
    std::string data = buf_.substr(0, size);
    if (buf_.compare(size, 2, "\r\n") != 0) return std::nullopt;
    buf_.erase(0, size + 2);
    return data;
  }

  // A whole response: Content-Length, chunked, or up to EOF.
  std::optional<RawResponse> ReadResponse() {
    auto r = ReadHead();
    if (!r) return std::nullopt;
    if (r->headers.count("transfer-encoding") && r->headers["transfer-encoding"] == "chunked") {
      while (true) {
        auto chunk = ReadChunk();
        if (!chunk) return std::nullopt;
        if (chunk->empty()) break;
        r->body += *chunk;
      }
    } else if (r->headers.count("content-length")) {
      const size_t n = std::stoul(r->headers["content-length"]);
      while (buf_.size() < n) {
        if (!ReadMore()) return std::nullopt;
      }
      r->body = buf_.substr(0, n);
      buf_.erase(0, n);
    } else if (r->status >= 200) {
      while (ReadMore()) {
      }
      r->body = std::move(buf_);
      buf_.clear();
    }
    return r;
  }

  // The final response, after any interim 1xx responses (RFC 9110 section
  // 15.2: a client must accept them even unasked); `interim` counts them.
  std::optional<RawResponse> ReadFinalResponse(int* interim = nullptr) {
    while (true) {
      auto r = ReadResponse();
      if (!r || r->status >= 200) return r;
      if (interim) ++*interim;
    }
  }

  // True when the server closed the connection (EOF or reset) with no
  // further bytes.
  bool SeesClose() {
    char c;
    ssize_t n;
    do {
      n = recv(fd_, &c, 1, 0);
    } while (n < 0 && errno == EINTR);
    return n == 0 || (n < 0 && errno == ECONNRESET);
  }

  std::string& buffer() { return buf_; }

 private:
  int fd_ = -1;
  bool connected_ = false;
  std::string buf_;
};

}  // namespace tessera::testing
