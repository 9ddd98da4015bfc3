// HttpServer: the coordinator's HTTP/1.1 front door (OpenAI-compatible API,
// health and admin endpoints), built on Boost.Beast over Boost.Asio, plain or
// over TLS (Asio's OpenSSL stream; see HttpServerOptions::tls_cert_file).
//
// One io_context is run by a small thread pool; every connection owns a
// strand, so the handlers of one connection never run concurrently while
// different connections proceed in parallel. A request is read under a read
// timeout (the whole header and body must arrive within it; an idle
// keep-alive connection is closed after it), a header byte limit, a header
// count limit and a body size limit. Beyond `max_connections` open
// connections new ones are answered 503 and closed. Every error the server
// produces itself (400 malformed request, 404 unknown path, 405 wrong method,
// 408 request timeout, 413 body too large, 431 headers too large, 500 a
// handler failed, 501 a Transfer-Encoding other than chunked, 503
// overloaded) carries OpenAI's JSON error body:
//   {"error":{"message":...,"type":"invalid_request_error","param":null,"code":...}}
// Requests whose framing or identity is ambiguous (Transfer-Encoding with
// Content-Length, repeated Host / Authorization / Content-Length, HTTP/1.1
// without Host: common/net/http_request_checks.h) are refused and the
// connection closed unread, so nothing a proxy forwards as one request is
// run here as two.
// No input from a client can crash the process: every exception is caught at
// the connection boundary and turned into a 500 or a closed connection.
//
// A route's handler runs on the connection's strand (an io thread) and gets a
// read-only HttpRequest and a shared Responder. It may answer at once, or
// hand the Responder to another thread (e.g. the scheduler) that answers
// later: either one complete response (Send/SendJson/SendError) or a
// Server-Sent Events stream (StartStream, SendEvent ..., Finish). While a
// request is unanswered or streaming, the server watches the socket, so a
// client that disconnects is noticed: SendEvent returns false from then on
// and the OnClientGone callback fires, which lets the producer cancel the
// generation. A client that half-closes after its request (HTTP/1.1) is
// served: EOF alone cannot tell a half-close from a close, so the server
// probes it (an interim 100 response, or an SSE comment inside a stream)
// every half_close_probe_seconds, and a client that closed entirely is
// noticed when a probe's write fails (within two probes).
//
// Thread-safety: Handle() must be called before Start(). Start(), Stop() and
// the destructor are called from one controlling thread, never from a
// handler. port() and open_connections() are safe from any thread. Every
// Responder method is safe from any thread.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "common/base/status.h"
#include "common/net/net_defaults.h"

namespace tessera {

namespace http_internal {
class Session;
struct Exchange;
struct Core;
}  // namespace http_internal

// What a connection's read buffer holds beyond max_header_bytes. The parser
// takes body bytes out as they arrive, so this bounds a chunk-size line with
// its extensions, a trailer field, or a pipelined request: longer ones are a
// 400 and the connection closes (an unbounded buffer let one connection hold
// 64 MiB). Per connection, at most max_header_bytes + this is buffered.
inline constexpr size_t kHttpReadSlackBytes = 64 * 1024;

struct HttpServerOptions {
  std::string bind_address = "127.0.0.1";  // host name or IP; "0.0.0.0" / "::" for all interfaces
  int port = 0;                            // 0 picks a free port; see HttpServer::port()
  int num_threads = 2;                     // io threads running the io_context
  double read_timeout_seconds = kDefaultHttpReadTimeoutSeconds;  // one whole request, or idle
  double write_timeout_seconds = 30.0;                           // for one socket write to complete
  size_t max_header_bytes = 16 * 1024;  // request line + header fields (431 beyond)
  size_t max_header_count = kDefaultHttpMaxHeaderCount;  // header fields (431 beyond)
  size_t max_body_bytes = kDefaultHttpMaxBodyBytes;      // request body (413 beyond)
  int max_connections = kDefaultHttpMaxConnections;      // open connections (503 beyond)
  size_t max_queued_events = 4096;  // SSE events queued per stream, not yet written
  // A client that shuts down its sending side after a request is still
  // served; while its response is pending it is probed this often (seconds),
  // and one that closed entirely is reported gone within two probes.
  double half_close_probe_seconds = 0.25;
  // HTTPS (TLS 1.2 or later, OpenSSL): PEM certificate chain (leaf first) and
  // private key files, loaded by Start. Both empty = plain HTTP. A plain HTTP
  // request to an HTTPS listener gets a plain-text 400 and the connection
  // closes; other handshake failures just close it.
  std::string tls_cert_file;
  std::string tls_key_file;
};

// One parsed request, as the handler sees it. Owned by the server for the
// duration of the handler call; copy what must outlive it.
struct HttpRequest {
  std::string method;                                        // "GET", "POST", ...
  std::string target;                                        // as sent: "/v1/models?x=1"
  std::string path;                                          // target before '?': "/v1/models"
  std::map<std::string, std::string> query;                  // percent-decoded; '+' is a space
  std::vector<std::pair<std::string, std::string>> headers;  // in order, names as sent
  std::string body;
  std::string remote_address;  // "127.0.0.1:53422"
  // The path segments matched by the "*" segments of a pattern route, in
  // order ("/admin/workers/*/drain" on "/admin/workers/w-1/drain": {"w-1"}).
  std::vector<std::string> path_params;

  // The value of the first header named `name` (case-insensitive), if any.
  std::optional<std::string> Header(std::string_view name) const;
};

// OpenAI's error body. `type` "invalid_request_error" for 4xx and
// "server_error" for 5xx (see DefaultErrorType); `param` and `code` are JSON
// null when absent.
std::string ErrorJson(std::string_view message, std::string_view type,
                      const std::optional<std::string>& param = std::nullopt,
                      const std::optional<std::string>& code = std::nullopt);
const char* DefaultErrorType(int http_status);

// The answer to one request. Held through a shared_ptr; every method may be
// called from any thread and returns false when the call had no effect: the
// response was already sent (or, for SendEvent/Finish, no stream is open),
// the client disconnected, or the server stopped. A true return means the
// bytes were queued on the connection, not that the client read them.
// Dropping the last reference without answering sends a 500; dropping it
// with a stream open finishes the stream.
class Responder {
 public:
  ~Responder();
  Responder(const Responder&) = delete;
  Responder& operator=(const Responder&) = delete;

  // A complete response with Content-Length. `headers` are extra fields.
  bool Send(int status, std::string content_type, std::string body,
            std::vector<std::pair<std::string, std::string>> headers = {});
  // Send(status, "application/json", json_text).
  bool SendJson(int status, std::string json_text);
  // Send(status, "application/json", ErrorJson(message, DefaultErrorType(status), param, code)).
  bool SendError(int status, std::string_view message,
                 const std::optional<std::string>& param = std::nullopt,
                 const std::optional<std::string>& code = std::nullopt);

  // Starts a Server-Sent Events response: `status`, Content-Type
  // text/event-stream, Cache-Control no-cache, chunked transfer encoding
  // (HTTP/1.1; an HTTP/1.0 client gets raw bytes and the connection closes at
  // Finish).
  bool StartStream(int status = 200);
  // Queues one event "data: <data>\n\n" (a multi-line `data` becomes one
  // "data:" line per line). Events queued while the connection writes go
  // out together in its next write, in order (no timer: a lone event is
  // written at once). When more than max_queued_events events are
  // waiting for the socket, the client is too slow: the connection is closed
  // and false returned.
  bool SendEvent(std::string_view data);
  // Ends the stream; the connection then serves the next request
  // (keep-alive) or closes.
  bool Finish();

  // Holds back the hand-off of this stream's events while it lives: the
  // events a producer makes together (a choice's finish chunk, the usage
  // chunk, [DONE] and Finish, in one callback) are queued and go to the
  // connection in one flush and one write, when the hold ends or with
  // Finish, whichever comes first. It adds no wait of its own: the events
  // leave when the producer is done with them. Holds nest. The Responder
  // must outlive its holds.
  class EventHold {
   public:
    explicit EventHold(Responder* responder) : responder_(responder) {}
    EventHold(EventHold&& other) noexcept : responder_(other.responder_) {
      other.responder_ = nullptr;
    }
    EventHold(const EventHold&) = delete;
    EventHold& operator=(const EventHold&) = delete;
    EventHold& operator=(EventHold&&) = delete;
    ~EventHold() {
      if (responder_) responder_->ReleaseHold();
    }

   private:
    Responder* responder_;
  };
  [[nodiscard]] EventHold HoldEvents();

  // True once the client disconnected (or the server stopped) before the
  // response was complete.
  bool client_gone() const;
  // Calls `callback` once when the client disconnects before the response is
  // complete: on the connection's strand, or at once on the calling thread if
  // it already has. Replaces an earlier callback. Must not block.
  void OnClientGone(std::function<void()> callback);

 private:
  friend class http_internal::Session;
  enum class State { kNew, kStreaming, kDone };
  void ReleaseHold();
  Responder(std::shared_ptr<http_internal::Session> session,
            std::shared_ptr<http_internal::Exchange> exchange);

  std::shared_ptr<http_internal::Session> session_;
  std::shared_ptr<http_internal::Exchange> exchange_;
  mutable std::mutex mu_;
  State state_ = State::kNew;  // guarded by mu_
};

class HttpServer {
 public:
  using Handler = std::function<void(const HttpRequest&, std::shared_ptr<Responder>)>;

  explicit HttpServer(HttpServerOptions options = {});
  ~HttpServer();  // Stop()
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Routes `method` ("GET") requests for exactly `path` ("/v1/models", no
  // query) to `handler`. A segment "*" in `path` ("/admin/workers/*/drain")
  // matches any one non-empty segment (see HttpRequest::path_params); exact
  // paths are tried first. A known path with another method gets 405 with an
  // Allow header; an unknown path 404. Call before Start().
  void Handle(std::string method, std::string path, Handler handler);

  // Loads the TLS files (when given), binds, listens and starts the io
  // threads.
  // Errors: kInvalidArgument (an option out of range, bind_address does not
  // resolve, a TLS file that cannot be read or parsed or a key that does not
  // match the certificate: the message names the file), kIoError (bind/listen failed, e.g. the port
  // is taken), kFailedPrecondition (already started).
  Status Start();

  // Stops accepting, closes every connection (open streams see their client
  // gone; a pending request's Responder returns false from then on), and
  // joins the io threads. Idempotent.
  void Stop();

  // The port actually bound (after Start; useful with port 0).
  int port() const { return port_.load(); }
  // Connections currently open (accepted and not yet closed, excluding
  // those being refused with 503).
  int open_connections() const;

  // Server-Sent Events written so far, the socket writes that carried them,
  // and the flushes that handed queued events to a connection's strand (a
  // post each): the events of a stream that are ready together (queued
  // while a write is in flight, or in one burst) share one flush and one
  // write, so flushes and writes <= events. Counted since Start; safe from
  // any thread.
  struct StreamStats {
    uint64_t writes = 0;
    uint64_t events = 0;
    uint64_t flushes = 0;
  };
  StreamStats stream_stats() const;

 private:
  std::shared_ptr<http_internal::Core> core_;
  std::vector<std::thread> threads_;
  std::atomic<int> port_{0};
  bool started_ = false;
  bool stopped_ = false;
};

// Constant-time comparison (in the length of `expected`): the time taken does
// not depend on where `given` first differs.
bool ConstantTimeEquals(std::string_view given, std::string_view expected);
// True when the request carries "Authorization: Bearer <token>" (scheme
// case-insensitive) with token equal to `expected`. An empty `expected`
// matches nothing.
bool HasBearerToken(const HttpRequest& request, std::string_view expected);
// Wraps `inner` so that requests without the bearer token get 401 (with
// WWW-Authenticate: Bearer and an OpenAI error body, code "invalid_api_key").
HttpServer::Handler RequireBearerToken(std::string token, HttpServer::Handler inner);

}  // namespace tessera
