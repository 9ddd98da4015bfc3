// Internals of HttpServer (common/net/http_server.h), not a public API:
// the state the server, its connections and their responders share (Core),
// one request/response exchange (Exchange), and one accepted connection's
// state machine (Session: TLS handshake, deadlines, reading and routing a
// request, writing responses and streams, serving a half-closed client,
// lingering close); the bytes on the wire are in http_wire.h. Included by
// http_server.cc only.
//
// Thread-safety: as documented on each member; a Session runs on its
// connection's strand except its Post* methods.
#pragma once

#include <fmt/format.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <algorithm>
#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cctype>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <exception>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/net/http_request_checks.h"
#include "common/net/http_server.h"
#include "common/net/http_wire.h"

namespace tessera::http_internal {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace ssl = net::ssl;
using tcp = net::ip::tcp;

// A refused or finished connection is shut down for sending, then its unread
// input is drained for at most this long (and this many bytes) before the
// socket closes, so the client reads the response instead of a reset.
inline constexpr double kLingerSeconds = 1.0;
inline constexpr size_t kLingerMaxBytes = 1 << 20;
// A body refused as too large (413) is still read and discarded, up to this
// many bytes and for at most server.read_timeout_seconds (the time a whole
// request may take): a client sends its body before it reads a response
// (Python's urllib and http.client, curl without Expect), and one that is
// reset mid-body reports a broken pipe instead of the 413. A larger body is
// cut off with a reset after this much.
inline constexpr size_t kMaxDiscardedBodyBytes = size_t{64} << 20;
// Bytes read per call while discarding.
inline constexpr size_t kDiscardReadBytes = 64 * 1024;
static_assert(kDiscardReadBytes <= kHttpReadSlackBytes, "a discarding read fits the read buffer");
// How long Stop() waits for connections to close before stopping the loop.
inline constexpr double kStopGraceSeconds = 2.0;
// Bytes read per call while watching a connection for a disconnect.
inline constexpr size_t kWatchReadBytes = 4096;

// State shared by the server, its sessions and their responders. Owned
// through shared_ptr so that a Responder kept by a producer thread after the
// server is gone still refers to a live (stopped) io_context.
struct Core {
  explicit Core(HttpServerOptions opts)
      : options(std::move(opts)),
        ioc(std::max(1, options.num_threads)),
        work(net::make_work_guard(ioc)) {}

  // Runs `fn` on `executor` unless the server stopped; false if it did.
  template <class Executor, class Fn>
  bool Post(const Executor& executor, Fn&& fn) {
    std::lock_guard<std::mutex> lock(mu);
    if (stopped) return false;
    net::post(executor, std::forward<Fn>(fn));
    return true;
  }

  const HttpServerOptions options;
  std::optional<ssl::context> tls;  // set by Start when options.tls_cert_file is given
  net::io_context ioc;
  net::executor_work_guard<net::io_context::executor_type> work;
  std::map<std::string, std::map<std::string, HttpServer::Handler>> routes;  // path -> method
  std::optional<tcp::acceptor> acceptor;          // touched on its own strand
  std::optional<net::steady_timer> accept_retry;  // after a failed accept (e.g. EMFILE)

  std::mutex mu;
  std::condition_variable cv;                           // signalled when a connection closes
  bool stopping = false;                                // guarded by mu: accept nothing more
  bool stopped = false;                                 // guarded by mu: post nothing more
  int open_connections = 0;                             // guarded by mu
  int rejecting_connections = 0;                        // guarded by mu
  uint64_t next_session_id = 0;                         // guarded by mu
  std::map<uint64_t, std::weak_ptr<Session>> sessions;  // guarded by mu

  // HttpServer::stream_stats: writes that carried stream events, those
  // events, and the flushes that handed pending events to a strand.
  std::atomic<uint64_t> stream_writes{0};
  std::atomic<uint64_t> stream_events{0};
  std::atomic<uint64_t> stream_flushes{0};
};

// One request/response exchange on a connection.
struct Exchange {
  unsigned version = 11;   // the request's HTTP version (11 = 1.1); const once shared
  bool keep_alive = true;  // the request allows another on this connection; const once shared
  bool chunked = true;     // streams use chunked encoding (HTTP/1.1); const once shared

  std::mutex mu;
  bool gone = false;              // guarded by mu: client left before the response completed
  bool complete = false;          // guarded by mu: the final bytes are queued
  std::function<void()> on_gone;  // guarded by mu

  // Stream events the Responder queued and the connection's strand has not
  // taken yet, framed, in order: the events that are ready together go out
  // in one write (Session::PostEvent).
  std::string pending_events;  // guarded by mu
  size_t pending_count = 0;    // guarded by mu: events in pending_events
  // Guarded by mu. The strand will look at pending_events again: a flush is
  // posted, or a write it started is in flight (its completion takes what
  // came meanwhile). While set, a new event is only appended, never posted.
  bool flush_owned = false;
  int holds = 0;  // guarded by mu: Responder::EventHold's alive; no flush is posted meanwhile
};

// One accepted connection. Everything except the Post* methods runs on the
// connection's strand (`executor_`).
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(std::shared_ptr<Core> core, tcp::socket socket, uint64_t id, bool counted)
      : core_(std::move(core)),
        executor_(socket.get_executor()),
        socket_(std::move(socket)),
        deadline_(executor_),
        probe_(executor_),
        id_(id),
        counted_(counted),
        buffer_(core_->options.max_header_bytes + kHttpReadSlackBytes) {
    beast::error_code ec;
    auto remote = socket_.remote_endpoint(ec);
    if (!ec) remote_ = fmt::format("{}:{}", remote.address().to_string(), remote.port());
    socket_.set_option(tcp::no_delay(true), ec);
  }

  // A session dropped without Close() (the server stopped before it ran)
  // still gives back its connection slot.
  ~Session() { Close(); }

  // Entry points, called once on the strand after construction. Over TLS
  // the handshake comes first (under the read timeout), so that even a
  // refusal reaches the client encrypted.
  void Start() {
    if (!core_->tls) return BeginRequest();
    Handshake([self = shared_from_this()] { self->BeginRequest(); });
  }
  void Reject() {
    if (!core_->tls) return RejectNow();
    Handshake([self = shared_from_this()] { self->RejectNow(); });
  }

  // ---- Called by Responder from any thread ----
  bool PostFinal(std::shared_ptr<Exchange> ex, std::string bytes) {
    return core_->Post(executor_, [self = shared_from_this(), ex = std::move(ex),
                                   bytes = std::move(bytes)]() mutable {
      self->OnFinal(ex, std::move(bytes), ex->keep_alive);
    });
  }
  bool PostStreamStart(std::shared_ptr<Exchange> ex, std::string bytes) {
    return core_->Post(executor_, [self = shared_from_this(), ex = std::move(ex),
                                   bytes = std::move(bytes)]() mutable {
      if (self->closed_ || ex != self->current_) return;
      self->stream_started_ = true;
      self->Enqueue(std::move(bytes), 0);
    });
  }
  // Appends one framed event to the exchange's pending events. Only the
  // first event after the strand took the last ones posts a flush; the
  // others ride along, so a burst costs one post and, while a write is in
  // flight, one write when it completes. A lone event is posted at once:
  // nothing waits for company.
  bool PostEvent(const std::shared_ptr<Exchange>& ex, std::string_view bytes) {
    {
      std::lock_guard<std::mutex> lock(ex->mu);
      // The stream's end is queued (Finish raced this call): it stays the end.
      if (ex->complete) return false;
      queued_events_.fetch_add(1);
      ex->pending_events.append(bytes);
      ++ex->pending_count;
      if (ex->flush_owned || ex->holds > 0) return true;
      ex->flush_owned = true;
    }
    return PostFlush(ex);
  }
  // Responder::HoldEvents and the end of its hold; `flush` (the stream goes
  // on) posts what the hold kept back.
  void Hold(Exchange& ex) {
    std::lock_guard<std::mutex> lock(ex.mu);
    ++ex.holds;
  }
  void ReleaseHold(const std::shared_ptr<Exchange>& ex, bool flush) {
    {
      std::lock_guard<std::mutex> lock(ex->mu);
      if (--ex->holds > 0 || !flush || ex->complete || ex->flush_owned ||
          ex->pending_events.empty())
        return;
      ex->flush_owned = true;
    }
    PostFlush(ex);
  }
  // Hands the exchange's pending events to the strand (flush_owned is set).
  bool PostFlush(const std::shared_ptr<Exchange>& ex) {
    core_->stream_flushes.fetch_add(1, std::memory_order_relaxed);
    const bool posted = core_->Post(executor_, [self = shared_from_this(), ex]() {
      if (self->closed_ || ex != self->current_) return self->DropPending(*ex);
      self->DoWrite();
    });
    if (!posted) DropPending(*ex);
    return posted;
  }
  bool PostFinish(std::shared_ptr<Exchange> ex) {
    return core_->Post(executor_, [self = shared_from_this(), ex = std::move(ex)]() mutable {
      const bool chunked = ex->chunked;
      self->OnFinal(ex, chunked ? std::string("0\r\n\r\n") : std::string(),
                    chunked && ex->keep_alive);
    });
  }
  // The producer outran the client: drop the connection.
  void PostAbort(std::shared_ptr<Exchange> ex) {
    core_->Post(executor_, [self = shared_from_this(), ex = std::move(ex)] {
      if (ex == self->current_) self->Close();
    });
  }
  size_t queued_events() const { return queued_events_.load(); }
  const HttpServerOptions& options() const { return core_->options; }

  // Closes the socket now (on the strand). Idempotent.
  void Close() {
    if (closed_) return;
    closed_ = true;
    ClientGone();
    CancelDeadline();
    probe_.cancel();
    beast::error_code ec;
    socket_.shutdown(tcp::socket::shutdown_both, ec);
    socket_.close(ec);
    out_.clear();
    std::lock_guard<std::mutex> lock(core_->mu);
    if (counted_) {
      --core_->open_connections;
    } else {
      --core_->rejecting_connections;
    }
    core_->sessions.erase(id_);
    core_->cv.notify_all();
  }

  const net::any_io_executor& executor() const { return executor_; }

 private:
  enum class Phase { kReading, kResponding, kClosing };
  enum class AfterDrain { kNothing, kNextRequest, kClose };
  enum class DeadlineKind { kRead, kWrite, kLinger };

  void RejectNow() {
    FailRequest(503,
                fmt::format("the server has {} open connections, its limit; retry later",
                            core_->options.max_connections),
                "server_overloaded");
  }

  // ---- TLS ----
  // Calls fn(stream) with the connection's byte stream: the TLS stream over
  // the socket, or the socket itself.
  template <class Fn>
  void WithStream(Fn&& fn) {
    if (tls_) {
      fn(*tls_);
    } else {
      fn(socket_);
    }
  }

  template <class Next>
  void Handshake(Next next) {
    tls_.emplace(socket_, *core_->tls);
    ArmDeadline(core_->options.read_timeout_seconds, DeadlineKind::kRead);
    tls_->async_handshake(ssl::stream_base::server,
                          [self = shared_from_this(), next](beast::error_code ec) {
                            if (self->closed_) return;
                            self->CancelDeadline();
                            if (!ec) return next();
                            self->OnHandshakeError(ec);
                          });
  }

  void OnHandshakeError(beast::error_code ec) {
    if (&ec.category() == &net::error::get_ssl_category() &&
        ERR_GET_LIB(static_cast<unsigned long>(ec.value())) == ERR_LIB_SSL &&
        ERR_GET_REASON(static_cast<unsigned long>(ec.value())) == SSL_R_HTTP_REQUEST) {
      // Plain HTTP sent to the HTTPS port: say so in plain HTTP, then close.
      tls_.reset();
      return FailRequest(400,
                         "this port serves HTTPS; the request was sent as plain HTTP (use "
                         "https://)",
                         "https_required");
    }
    // Not TLS at all, an untrusted certificate on the client's side, a
    // timeout: nothing can be answered; close.
    Close();
  }

  // ---- Deadlines ----
  void ArmDeadline(double seconds, DeadlineKind kind) {
    const uint64_t gen = ++deadline_gen_;
    deadline_kind_ = kind;
    deadline_.expires_after(std::chrono::duration_cast<std::chrono::steady_clock::duration>(
        std::chrono::duration<double>(seconds)));
    deadline_.async_wait([self = shared_from_this(), gen](beast::error_code ec) {
      if (ec || gen != self->deadline_gen_ || self->closed_) return;
      self->OnDeadline();
    });
  }
  void CancelDeadline() {
    ++deadline_gen_;
    deadline_.cancel();
  }
  void OnDeadline() {
    switch (deadline_kind_) {
      case DeadlineKind::kRead: {
        // Abort the pending read; its handler answers 408 or closes.
        timed_out_ = true;
        beast::error_code ec;
        socket_.cancel(ec);
        return;
      }
      case DeadlineKind::kWrite:
      case DeadlineKind::kLinger:
        Close();
        return;
    }
  }

  // ---- Reading a request ----
  void BeginRequest() {
    phase_ = Phase::kReading;
    current_.reset();
    timed_out_ = false;
    ArmDeadline(core_->options.read_timeout_seconds, DeadlineKind::kRead);
    if (watching_) {
      // The watch read may wait for bytes that are already buffered (a
      // pipelined request): cancel it, and let its handler resume us. No
      // write is pending here, so the cancel touches only that read.
      resume_after_watch_ = true;
      beast::error_code ec;
      socket_.cancel(ec);
      return;
    }
    ReadHeader();
  }

  void ReadHeader() {
    parser_.emplace();
    parser_->header_limit(
        static_cast<uint32_t>(std::min<size_t>(core_->options.max_header_bytes, UINT32_MAX)));
    parser_->body_limit(core_->options.max_body_bytes);
    auto done = [self = shared_from_this()](beast::error_code ec, size_t) { self->OnHeader(ec); };
    WithStream([&](auto& stream) { http::async_read_header(stream, buffer_, *parser_, done); });
  }

  void OnHeader(beast::error_code ec) {
    if (closed_) return;
    if (ec) return OnReadError(ec);
    const auto& req = parser_->get();
    const size_t fields = static_cast<size_t>(std::distance(req.begin(), req.end()));
    if (fields > core_->options.max_header_count) {
      return FailRequest(431,
                         fmt::format("the request has {} header fields; the limit is {}", fields,
                                     core_->options.max_header_count),
                         "request_header_fields_too_large");
    }
    {
      // Framing a proxy could read differently, ambiguous repeated fields:
      // refused, and the connection closes unread (http_request_checks.h).
      std::vector<std::pair<std::string_view, std::string_view>> named;
      named.reserve(fields);
      for (const auto& field : req)
        named.emplace_back(View(field.name_string()), View(field.value()));
      if (auto refusal = CheckRequestHeader(req.version(), named))
        return FailRequest(refusal->status, refusal->message, refusal->code);
    }
    if (auto length = parser_->content_length();
        length && *length > core_->options.max_body_bytes) {
      DiscardBodyOnClose(*length);
      return FailRequest(413,
                         fmt::format("the request body has {} bytes; the limit is {} bytes",
                                     *length, core_->options.max_body_bytes),
                         "request_too_large");
    }
    auto expect = req.find(http::field::expect);
    if (expect != req.end() && AsciiIEquals(View(expect->value()), "100-continue") &&
        req.version() >= 11) {
      static const std::string kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
      auto done = [self = shared_from_this()](beast::error_code ec, size_t) {
        if (self->closed_) return;
        if (ec) return self->Close();
        self->ReadBody();
      };
      WithStream([&](auto& stream) { net::async_write(stream, net::buffer(kContinue), done); });
      return;
    }
    ReadBody();
  }

  void ReadBody() {
    auto done = [self = shared_from_this()](beast::error_code ec, size_t) { self->OnBody(ec); };
    WithStream([&](auto& stream) { http::async_read(stream, buffer_, *parser_, done); });
  }

  void OnBody(beast::error_code ec) {
    if (closed_) return;
    if (ec) return OnReadError(ec);
    CancelDeadline();
    Dispatch();
  }

  bool RequestStarted() const { return buffer_.size() > 0 || (parser_ && parser_->got_some()); }

  void OnReadError(beast::error_code ec) {
    if (timed_out_) {
      if (!RequestStarted()) return Close();  // idle keep-alive connection
      return FailRequest(408,
                         fmt::format("the request did not arrive within {} seconds",
                                     core_->options.read_timeout_seconds),
                         "request_timeout");
    }
    if (ec == http::error::end_of_stream || ec == net::error::eof ||
        ec == net::error::operation_aborted || ec == net::error::connection_reset) {
      return Close();
    }
    if (ec == http::error::header_limit) {
      return FailRequest(
          431, fmt::format("the request header exceeds {} bytes", core_->options.max_header_bytes),
          "request_header_fields_too_large");
    }
    if (ec == http::error::buffer_overflow) {
      return FailRequest(
          400,
          fmt::format("a chunk-size line, chunk extension or trailer exceeds {} bytes",
                      core_->options.max_header_bytes + kHttpReadSlackBytes),
          "bad_request");
    }
    if (ec == http::error::body_limit) {
      DiscardBodyOnClose(kMaxDiscardedBodyBytes);  // chunked: its length is unknown
      return FailRequest(
          413, fmt::format("the request body exceeds {} bytes", core_->options.max_body_bytes),
          "request_too_large");
    }
    if (IsHttpCategory(ec)) {
      return FailRequest(400, "malformed HTTP request: " + ec.message(), "bad_request");
    }
    Close();
  }

  // The refused body of `bytes` (at most kMaxDiscardedBodyBytes of it) is
  // read and discarded after the response, before the connection closes.
  void DiscardBodyOnClose(uint64_t bytes) {
    linger_max_bytes_ =
        kLingerMaxBytes + static_cast<size_t>(std::min<uint64_t>(bytes, kMaxDiscardedBodyBytes));
    linger_seconds_ = std::max(kLingerSeconds, core_->options.read_timeout_seconds);
  }

  // Answers an error the server found itself, then closes the connection
  // (the rest of the request is read only as Linger and DiscardBodyOnClose
  // say: never parsed).
  void FailRequest(int status, const std::string& message, const std::string& code) {
    if (closed_) return;
    CancelDeadline();
    current_.reset();
    phase_ = Phase::kResponding;
    const unsigned version = parser_ && parser_->is_header_done() ? parser_->get().version() : 11;
    after_drain_ = AfterDrain::kClose;
    Enqueue(SerializeResponse(status, "application/json",
                              ErrorJson(message, DefaultErrorType(status), std::nullopt, code), {},
                              version == 10 ? 10 : 11, false),
            0);
  }

  // ---- Handling a request ----
  using RouteMap = std::map<std::string, std::map<std::string, HttpServer::Handler>>;

  // The first route with "*" segments that matches request.path segment by
  // segment; the segments under the stars go to request.path_params.
  RouteMap::iterator MatchPattern(HttpRequest& request) {
    auto split = [](std::string_view p) {
      std::vector<std::string_view> out;
      size_t start = 0;
      while (start <= p.size()) {
        const size_t slash = p.find('/', start);
        const size_t end = slash == std::string_view::npos ? p.size() : slash;
        out.push_back(p.substr(start, end - start));
        start = end + 1;
      }
      return out;
    };
    const auto want = split(request.path);
    for (auto it = core_->routes.begin(); it != core_->routes.end(); ++it) {
      if (it->first.find('*') == std::string::npos) continue;
      const auto have = split(it->first);
      if (have.size() != want.size()) continue;
      std::vector<std::string> params;
      bool ok = true;
      for (size_t i = 0; i < have.size() && ok; ++i) {
        if (have[i] == "*" && !want[i].empty())
          params.emplace_back(want[i]);
        else
          ok = have[i] == want[i];
      }
      if (!ok) continue;
      request.path_params = std::move(params);
      return it;
    }
    return core_->routes.end();
  }

  void Dispatch() {
    auto msg = parser_->release();
    parser_.reset();
    HttpRequest request;
    request.method = std::string(View(msg.method_string()));
    request.target = std::string(View(msg.target()));
    const size_t q = request.target.find('?');
    request.path = request.target.substr(0, q);
    if (q != std::string::npos)
      request.query = ParseQuery(std::string_view(request.target).substr(q + 1));
    for (const auto& field : msg) {
      request.headers.emplace_back(View(field.name_string()), View(field.value()));
    }
    request.body = std::move(msg.body());
    request.remote_address = remote_;

    auto ex = std::make_shared<Exchange>();
    ex->version = msg.version() == 10 ? 10 : 11;
    ex->keep_alive = msg.keep_alive();
    ex->chunked = ex->version >= 11;
    current_ = ex;
    phase_ = Phase::kResponding;
    stream_started_ = false;
    if (half_closed_) {
      ArmProbe();  // a pipelined request after the client's half-close
    } else {
      StartWatch();
    }

    std::shared_ptr<Responder> responder(new Responder(shared_from_this(), ex));
    auto route = core_->routes.find(request.path);
    if (route == core_->routes.end()) route = MatchPattern(request);
    if (route == core_->routes.end()) {
      responder->SendError(404, fmt::format("no route for {} {}", request.method, request.path),
                           std::nullopt, "unknown_url");
      return;
    }
    auto method = route->second.find(request.method);
    if (method == route->second.end()) {
      std::string allow;
      for (const auto& [name, unused] : route->second) allow += (allow.empty() ? "" : ", ") + name;
      responder->Send(405, "application/json",
                      ErrorJson(fmt::format("{} is not allowed on {}; use {}", request.method,
                                            request.path, allow),
                                "invalid_request_error", std::nullopt, "method_not_allowed"),
                      {{"Allow", allow}});
      return;
    }
    try {
      method->second(request, responder);
    } catch (const std::exception& e) {
      responder->SendError(500, fmt::format("internal error while handling {} {}: {}",
                                            request.method, request.path, e.what()));
    } catch (...) {
      responder->SendError(
          500, fmt::format("internal error while handling {} {}", request.method, request.path));
    }
  }

  // While a response is pending, a read stays posted on the socket so that a
  // disconnect is noticed. Bytes that arrive (a pipelined next request) stay
  // in buffer_ for the next parse.
  void StartWatch() {
    if (watching_ || closed_) return;
    size_t read_bytes = kWatchReadBytes;
    if (phase_ == Phase::kClosing) {
      buffer_.consume(buffer_.size());
      read_bytes = kDiscardReadBytes;  // buffer_ holds max_header_bytes + kHttpReadSlackBytes
    } else if (buffer_.size() + kWatchReadBytes > buffer_.max_size()) {
      return;  // enough buffered; stop watching until the next request is read
    }
    watching_ = true;
    auto done = [self = shared_from_this()](beast::error_code ec, size_t n) {
      self->OnWatch(ec, n);
    };
    WithStream([&](auto& stream) { stream.async_read_some(buffer_.prepare(read_bytes), done); });
  }

  void OnWatch(beast::error_code ec, size_t n) {
    watching_ = false;
    if (closed_) return;
    if (ec && resume_after_watch_) {
      resume_after_watch_ = false;
      if (ec == net::error::operation_aborted && !timed_out_) return ReadHeader();
      return OnReadError(ec);  // idle timeout or the client left between requests
    }
    if (ec && IsEndOfInput(ec) && phase_ == Phase::kResponding && current_ &&
        current_->version >= 11) {
      // The client shut down its sending side after the request, as HTTP
      // allows (RFC 9112 section 9.6), or closed entirely: the probes tell
      // which, and the response (and any request already buffered after
      // it) is served to a client still reading.
      half_closed_ = true;
      if (AwaitingResponse()) ArmProbe();
      return;
    }
    if (ec) return Close();  // a reset, or EOF between requests: Close() reports a client gone
    buffer_.commit(n);
    if (resume_after_watch_) {
      resume_after_watch_ = false;
      return ReadHeader();
    }
    if (phase_ == Phase::kClosing) {
      lingered_bytes_ += n;
      if (lingered_bytes_ > linger_max_bytes_) return Close();
    }
    if (phase_ != Phase::kReading) StartWatch();
  }

  static bool IsEndOfInput(const beast::error_code& ec) {
    return ec == net::error::eof || ec == ssl::error::stream_truncated;
  }

  // An HTTP/1.1 response is still to be completed (an HTTP/1.0 client gets
  // no interim response, so its EOF means gone, as before).
  bool AwaitingResponse() {
    if (phase_ != Phase::kResponding || !current_ || current_->version < 11) return false;
    std::lock_guard<std::mutex> lock(current_->mu);
    return !current_->complete && !current_->gone;
  }

  // While a half-closed client's response is pending, probes it every
  // half_close_probe_seconds (http_wire.h, kInterimProbe): the second probe
  // after a full close fails, and the write error reports the client gone.
  void ArmProbe() {
    probe_.expires_after(std::chrono::duration_cast<std::chrono::steady_clock::duration>(
        std::chrono::duration<double>(core_->options.half_close_probe_seconds)));
    probe_.async_wait([self = shared_from_this()](beast::error_code ec) {
      if (ec || self->closed_ || !self->AwaitingResponse()) return;
      if (self->stream_started_) {
        self->Enqueue(StreamProbe(self->current_->chunked), 0);
      } else {
        self->Enqueue(std::string(kInterimProbe), 0);
      }
      self->ArmProbe();
    });
  }

  void ClientGone() {
    auto ex = current_;
    if (!ex) return;
    std::function<void()> callback;
    {
      std::lock_guard<std::mutex> lock(ex->mu);
      if (ex->complete || ex->gone) return;
      ex->gone = true;
      callback = std::move(ex->on_gone);
    }
    if (callback) {
      try {
        callback();
      } catch (...) {
        // A producer's callback must not take the connection loop down.
      }
    }
  }

  // ---- Writing ----
  void OnFinal(const std::shared_ptr<Exchange>& ex, std::string bytes, bool keep_alive) {
    if (closed_ || ex != current_) return;
    {
      std::lock_guard<std::mutex> lock(ex->mu);
      ex->complete = true;
    }
    after_drain_ = keep_alive ? AfterDrain::kNextRequest : AfterDrain::kClose;
    // A stream's events were all queued before its end: they go first.
    TakePending();
    Enqueue(std::move(bytes), 0);
  }

  // Moves the current stream's pending events behind out_. Not before the
  // stream's header is queued (it is posted before any event, but a probe
  // may write first). With none left the strand stops owning them, and the
  // next event posts a flush again.
  void TakePending() {
    if (!current_ || !stream_started_) return;
    std::lock_guard<std::mutex> lock(current_->mu);
    if (current_->pending_events.empty()) {
      current_->flush_owned = false;
      return;
    }
    out_.push_back(std::move(current_->pending_events));
    current_->pending_events.clear();
    out_events_ += current_->pending_count;
    current_->pending_count = 0;
  }

  // Drops the events of an exchange that is no longer written (closed, or
  // superseded).
  void DropPending(Exchange& ex) {
    std::lock_guard<std::mutex> lock(ex.mu);
    queued_events_.fetch_sub(ex.pending_count);
    ex.pending_events.clear();
    ex.pending_count = 0;
    ex.flush_owned = false;
  }

  void Enqueue(std::string bytes, size_t events) {
    out_.push_back(std::move(bytes));
    out_events_ += events;
    DoWrite();
  }

  // Starts one write of everything queued (out_, then the stream's pending
  // events); false when there is nothing to write or a write is in flight.
  bool DoWrite() {
    if (writing_ || closed_) return false;
    TakePending();
    if (out_.empty()) return false;
    write_buf_.clear();
    for (auto& piece : out_) write_buf_ += piece;
    out_.clear();
    writing_events_ = out_events_;
    out_events_ = 0;
    writing_ = true;
    if (writing_events_ > 0) {
      core_->stream_writes.fetch_add(1, std::memory_order_relaxed);
      core_->stream_events.fetch_add(writing_events_, std::memory_order_relaxed);
    }
    ArmDeadline(core_->options.write_timeout_seconds, DeadlineKind::kWrite);
    auto done = [self = shared_from_this()](beast::error_code ec, size_t) { self->OnWrite(ec); };
    WithStream([&](auto& stream) { net::async_write(stream, net::buffer(write_buf_), done); });
    return true;
  }

  void OnWrite(beast::error_code ec) {
    writing_ = false;
    queued_events_.fetch_sub(writing_events_);
    writing_events_ = 0;
    if (closed_) return;
    CancelDeadline();
    if (ec) {
      ClientGone();
      return Close();
    }
    if (DoWrite()) return;
    const AfterDrain next = after_drain_;
    after_drain_ = AfterDrain::kNothing;
    if (next == AfterDrain::kNextRequest) {
      // After a half-close only a request already buffered can follow (and
      // a read after the end of input would wait for the read timeout).
      if (half_closed_ && buffer_.size() == 0) return Close();
      BeginRequest();
    } else if (next == AfterDrain::kClose) {
      Linger();
    }
  }

  // Half-closes and drains the client's remaining bytes briefly, so that it
  // reads our last response rather than a connection reset. Over TLS the
  // half-close is the TCP one (no close_notify: a read is usually pending,
  // and responses are framed by Content-Length or chunks, so a client
  // cannot mistake a truncated one for a complete one).
  void Linger() {
    phase_ = Phase::kClosing;
    current_.reset();
    beast::error_code ec;
    socket_.shutdown(tcp::socket::shutdown_send, ec);
    if (ec || half_closed_) return Close();  // a half-closed client sends nothing more
    ArmDeadline(linger_seconds_, DeadlineKind::kLinger);
    StartWatch();
  }

  const std::shared_ptr<Core> core_;
  const net::any_io_executor executor_;
  tcp::socket socket_;
  std::optional<ssl::stream<tcp::socket&>> tls_;  // over socket_, when the server speaks TLS
  net::steady_timer deadline_;
  net::steady_timer probe_;  // probes a half-closed client (ArmProbe)
  const uint64_t id_;
  const bool counted_;  // counts against max_connections (false: being refused)
  std::string remote_;
  std::atomic<size_t> queued_events_{0};  // events posted by a Responder, not yet written

  // Strand-only state.
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  Phase phase_ = Phase::kReading;
  std::shared_ptr<Exchange> current_;
  bool closed_ = false;
  bool timed_out_ = false;
  bool watching_ = false;
  bool resume_after_watch_ = false;
  bool half_closed_ = false;     // the client sent EOF after a request; read no more
  bool stream_started_ = false;  // the current exchange's stream header is queued
  size_t lingered_bytes_ = 0;
  // Linger's bounds: raised to read a refused body (DiscardBodyOnClose).
  size_t linger_max_bytes_ = kLingerMaxBytes;
  double linger_seconds_ = kLingerSeconds;
  uint64_t deadline_gen_ = 0;
  DeadlineKind deadline_kind_ = DeadlineKind::kRead;
  std::deque<std::string> out_;
  size_t out_events_ = 0;
  std::string write_buf_;
  size_t writing_events_ = 0;
  bool writing_ = false;
  AfterDrain after_drain_ = AfterDrain::kNothing;
};

}  // namespace tessera::http_internal
