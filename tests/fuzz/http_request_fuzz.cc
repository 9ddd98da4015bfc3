// libFuzzer harness: HTTP request parsing and OpenAI request validation.
//
// Input: a mode byte, then
//   0 mod 3: a /v1/completions JSON body (ParseCompletionRequest);
//   1 mod 3: a /v1/chat/completions JSON body (ParseChatCompletionRequest),
//            rendered with each chat template when accepted;
//   2 mod 3: raw bytes sent to a running HttpServer (Beast's parser, the
//            limits, routing, the bearer-token guard, the same JSON handlers)
//            over a loopback TCP connection; the client half-closes, reads
//            until the server closes, and every answer must be HTTP.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include "common/net/http_server.h"
#include "common/tokenizer/chat_template.h"
#include "coordinator/api/openai_api.h"
#include "fuzz_util.h"

namespace {

using namespace tessera;

void Completion(std::string_view body, Responder* res) {
  auto r = ParseCompletionRequest(body);
  if (!r.ok()) {
    if (r.error().http_status < 400 || r.error().http_status > 499)
      fuzz::Fail("a request error that is not 4xx: " + r.error().ToJson());
    if (res) res->Send(r.error().http_status, "application/json", r.error().ToJson());
    return;
  }
  if (r->prompts.empty() || r->max_tokens < 1) fuzz::Fail("accepted an empty completion request");
  if (res) res->Send(200, "application/json", "{}");
}

void Chat(std::string_view body, Responder* res) {
  auto r = ParseChatCompletionRequest(body);
  if (!r.ok()) {
    if (r.error().http_status < 400 || r.error().http_status > 499)
      fuzz::Fail("a request error that is not 4xx: " + r.error().ToJson());
    if (res) res->Send(r.error().http_status, "application/json", r.error().ToJson());
    return;
  }
  if (r->messages.empty()) fuzz::Fail("accepted a chat request without messages");
  for (const char* name : {"chatml", "llama3", "llama2"}) {
    auto t = ChatTemplate::FromName(name);
    if (!t.ok()) fuzz::Fail(std::string("no chat template ") + name);
    (void)t->Render(r->messages);
  }
  if (res) res->Send(200, "application/json", "{}");
}

struct Live {
  std::unique_ptr<HttpServer> server;
  Live() {
    HttpServerOptions o;
    o.read_timeout_seconds = 2;
    o.write_timeout_seconds = 2;
    o.max_body_bytes = 64 * 1024;
    o.max_header_count = 32;
    server = std::make_unique<HttpServer>(o);
    server->Handle("POST", "/v1/completions",
                   [](const HttpRequest& r, std::shared_ptr<Responder> res) {
                     Completion(r.body, res.get());
                   });
    server->Handle(
        "POST", "/v1/chat/completions",
        [](const HttpRequest& r, std::shared_ptr<Responder> res) { Chat(r.body, res.get()); });
    server->Handle(
        "GET", "/admin/plan",
        RequireBearerToken("fuzz-token", [](const HttpRequest& r, std::shared_ptr<Responder> res) {
          res->Send(200, "application/json", "{\"query\":" + std::to_string(r.query.size()) + "}");
        }));
    server->Handle("GET", "/stream", [](const HttpRequest&, std::shared_ptr<Responder> res) {
      res->StartStream();
      res->SendEvent("a\nb");
      res->Finish();
    });
    Status s = server->Start();
    if (!s.ok()) fuzz::Fail("http server: " + s.ToString());
  }
};

Live& TheLive() {
  static Live* live = new Live();  // lives for the whole process
  return *live;
}

// connect() that survives a signal: libFuzzer's -timeout timer (SIGALRM)
// interrupts a blocking call on a socket with a send timeout, and connect()
// then returns EINTR while the handshake goes on (connect(2)). Waits for it
// to finish (the socket's send timeout, 5 s, bounds the wait). False with
// errno set when the connection failed.
bool Connect(int fd, const sockaddr_in& addr) {
  if (connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0) return true;
  if (errno != EINTR) return false;
  pollfd p{fd, POLLOUT, 0};
  int ready;
  do {
    ready = poll(&p, 1, 5000);
  } while (ready < 0 && errno == EINTR);
  if (ready == 0) errno = ETIMEDOUT;
  if (ready <= 0) return false;
  int error = 0;
  socklen_t len = sizeof error;
  if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &len) != 0) return false;
  errno = error;
  return error == 0;
}

void OverTheWire(std::string_view bytes) {
  Live& live = TheLive();
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) fuzz::Fail("socket");
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  // Each connection comes from the next of 65,536 loopback source addresses
  // (127.1.0.0 to 127.1.255.255, all on lo). The client half-closes first, so
  // each run leaves its port in TIME_WAIT for a minute: from one address,
  // a thousand runs a second would use up the machine's ephemeral ports
  // (shared with whatever else runs there) and connect() would fail for want
  // of a port, not because of the server.
  static uint32_t connections = 0;
  sockaddr_in source{};
  source.sin_family = AF_INET;
  source.sin_addr.s_addr = htonl((127u << 24) | (1u << 16) | (connections++ & 0xFFFFu));
  if (bind(fd, reinterpret_cast<sockaddr*>(&source), sizeof source) != 0)
    fuzz::Fail(std::string("bind to a loopback source address: ") + std::strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(live.server->port()));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (!Connect(fd, addr))
    fuzz::Fail(std::string("the http server stopped accepting connections: connect: ") +
               std::strerror(errno));
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = send(fd, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // the server answered early (413, 431) and closed
    done += static_cast<size_t>(n);
  }
  shutdown(fd, SHUT_WR);
  std::string answer;
  char buf[4096];
  while (true) {
    const ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
        fuzz::Fail("the http server neither answered nor closed within 5 s");
      break;
    }
    answer.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  if (!answer.empty() && answer.rfind("HTTP/1.", 0) != 0)
    fuzz::Fail("the server answered something that is not HTTP: " + answer.substr(0, 64));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 3) {
    case 0:
      Completion(rest, nullptr);
      break;
    case 1:
      Chat(rest, nullptr);
      break;
    default:
      OverTheWire(rest);
      break;
  }
  return 0;
}
