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
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cstdint>
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

void OverTheWire(std::string_view bytes) {
  Live& live = TheLive();
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) fuzz::Fail("socket");
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(live.server->port()));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0)
    fuzz::Fail("the http server stopped accepting connections");
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = send(fd, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
    if (n <= 0) break;  // the server answered early (413, 431) and closed
    done += static_cast<size_t>(n);
  }
  shutdown(fd, SHUT_WR);
  std::string answer;
  char buf[4096];
  while (true) {
    const ssize_t n = recv(fd, buf, sizeof buf, 0);
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
