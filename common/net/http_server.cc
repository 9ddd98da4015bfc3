#include "common/net/http_server.h"

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
#include "common/net/http_session.h"

namespace tessera {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace ssl = net::ssl;
using tcp = net::ip::tcp;

std::string ErrorJson(std::string_view message, std::string_view type,
                      const std::optional<std::string>& param,
                      const std::optional<std::string>& code) {
  nlohmann::json error = {{"message", message},
                          {"type", type},
                          {"param", param ? nlohmann::json(*param) : nlohmann::json(nullptr)},
                          {"code", code ? nlohmann::json(*code) : nlohmann::json(nullptr)}};
  return nlohmann::json{{"error", std::move(error)}}.dump(-1, ' ', false,
                                                          nlohmann::json::error_handler_t::replace);
}

const char* DefaultErrorType(int http_status) {
  return http_status >= 500 ? "server_error" : "invalid_request_error";
}

std::optional<std::string> HttpRequest::Header(std::string_view name) const {
  for (const auto& [key, value] : headers) {
    if (AsciiIEquals(key, name)) return value;
  }
  return std::nullopt;
}

namespace http_internal {

namespace {

void Accept(const std::shared_ptr<Core>& core);

// The reason OpenSSL gives for the last failure ("no start line", "key
// values mismatch"), or `fallback`.
std::string OpenSslReason(const std::string& fallback) {
  const unsigned long err = ERR_peek_last_error();
  ERR_clear_error();
  if (err == 0) return fallback;
  char text[256];
  ERR_error_string_n(err, text, sizeof text);
  return text;
}

// Builds core.tls from the certificate chain and key files: TLS 1.2 or
// later. Errors (kInvalidArgument) name the file and OpenSSL's reason.
Status LoadTlsContext(Core& core) {
  const HttpServerOptions& o = core.options;
  ssl::context ctx(ssl::context::tls_server);
  ctx.set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 |
                  ssl::context::no_sslv3 | ssl::context::no_tlsv1 | ssl::context::no_tlsv1_1 |
                  ssl::context::single_dh_use);
  SSL_CTX_set_min_proto_version(ctx.native_handle(), TLS1_2_VERSION);
  ERR_clear_error();
  if (SSL_CTX_use_certificate_chain_file(ctx.native_handle(), o.tls_cert_file.c_str()) != 1)
    return InvalidArgument(fmt::format("TLS certificate chain '{}' cannot be used: {}",
                                       o.tls_cert_file, OpenSslReason("unreadable")));
  if (SSL_CTX_use_PrivateKey_file(ctx.native_handle(), o.tls_key_file.c_str(), SSL_FILETYPE_PEM) !=
      1) {
    const bool mismatch = ERR_GET_REASON(ERR_peek_last_error()) == X509_R_KEY_VALUES_MISMATCH;
    return InvalidArgument(fmt::format(
        "TLS private key '{}' {}: {}", o.tls_key_file,
        mismatch ? "does not match the certificate '" + o.tls_cert_file + "'" : "cannot be used",
        OpenSslReason("unreadable")));
  }
  if (SSL_CTX_check_private_key(ctx.native_handle()) != 1)
    return InvalidArgument(
        fmt::format("TLS private key '{}' does not match the certificate '{}': {}", o.tls_key_file,
                    o.tls_cert_file, OpenSslReason("key values mismatch")));
  core.tls.emplace(std::move(ctx));
  return Status::Ok();
}

void OnAccept(const std::shared_ptr<Core>& core, beast::error_code ec, tcp::socket socket) {
  if (!core->acceptor || !core->acceptor->is_open()) return;
  if (ec) {
    if (ec == net::error::operation_aborted) return;
    // Out of descriptors or a transient failure: try again shortly rather
    // than spinning.
    core->accept_retry.emplace(core->acceptor->get_executor());
    core->accept_retry->expires_after(std::chrono::milliseconds(50));
    core->accept_retry->async_wait([core](beast::error_code wait_ec) {
      if (!wait_ec) Accept(core);
    });
    return;
  }
  std::shared_ptr<Session> session;
  bool counted = true;
  {
    std::lock_guard<std::mutex> lock(core->mu);
    if (core->stopping) return;  // `socket` closes as it goes out of scope
    if (core->open_connections >= core->options.max_connections) {
      counted = false;
      // Refusals are cheap but not free: beyond as many again, drop at once.
      if (core->rejecting_connections >= core->options.max_connections) {
        beast::error_code ignored;
        socket.close(ignored);
        Accept(core);
        return;
      }
      ++core->rejecting_connections;
    } else {
      ++core->open_connections;
    }
    const uint64_t id = core->next_session_id++;
    session = std::make_shared<Session>(core, std::move(socket), id, counted);
    core->sessions.emplace(id, session);
  }
  net::post(session->executor(), [session, counted] {
    try {
      if (counted) {
        session->Start();
      } else {
        session->Reject();
      }
    } catch (const std::exception& e) {
      std::fprintf(stderr, "tessera http: connection setup failed: %s\n", e.what());
      session->Close();
    }
  });
  Accept(core);
}

void Accept(const std::shared_ptr<Core>& core) {
  core->acceptor->async_accept(
      net::make_strand(core->ioc),
      [core](beast::error_code ec, tcp::socket socket) { OnAccept(core, ec, std::move(socket)); });
}

}  // namespace
}  // namespace http_internal

// ---- Responder ----

Responder::Responder(std::shared_ptr<http_internal::Session> session,
                     std::shared_ptr<http_internal::Exchange> exchange)
    : session_(std::move(session)), exchange_(std::move(exchange)) {}

Responder::~Responder() {
  State state;
  {
    std::lock_guard<std::mutex> lock(mu_);
    state = state_;
  }
  {
    // The producer let go: its callback may refer to state that is gone.
    std::lock_guard<std::mutex> lock(exchange_->mu);
    exchange_->on_gone = nullptr;
  }
  try {
    if (state == State::kNew) {
      SendError(500, "the server produced no response for this request");
    } else if (state == State::kStreaming) {
      Finish();
    }
  } catch (...) {
    // Destructors must not throw; the connection closes on its own.
  }
}

bool Responder::client_gone() const {
  std::lock_guard<std::mutex> lock(exchange_->mu);
  return exchange_->gone;
}

void Responder::OnClientGone(std::function<void()> callback) {
  {
    std::lock_guard<std::mutex> lock(exchange_->mu);
    if (!exchange_->gone) {
      exchange_->on_gone = std::move(callback);
      return;
    }
  }
  if (callback) callback();
}

bool Responder::Send(int status, std::string content_type, std::string body,
                     std::vector<std::pair<std::string, std::string>> headers) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (state_ != State::kNew) return false;
    state_ = State::kDone;
  }
  if (client_gone()) return false;
  return session_->PostFinal(
      exchange_, http_internal::SerializeResponse(status, content_type, std::move(body), headers,
                                                  exchange_->version, exchange_->keep_alive));
}

bool Responder::SendJson(int status, std::string json_text) {
  return Send(status, "application/json", std::move(json_text));
}

bool Responder::SendError(int status, std::string_view message,
                          const std::optional<std::string>& param,
                          const std::optional<std::string>& code) {
  return Send(status, "application/json",
              ErrorJson(message, DefaultErrorType(status), param, code));
}

bool Responder::StartStream(int status) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (state_ != State::kNew) return false;
    state_ = State::kStreaming;
  }
  if (client_gone()) return false;
  return session_->PostStreamStart(exchange_, http_internal::SerializeStreamHeader(
                                                  status, exchange_->version, exchange_->chunked,
                                                  exchange_->chunked && exchange_->keep_alive));
}

bool Responder::SendEvent(std::string_view data) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (state_ != State::kStreaming) return false;
    if (session_->queued_events() >= session_->options().max_queued_events) {
      state_ = State::kDone;
      session_->PostAbort(exchange_);
      return false;
    }
  }
  if (client_gone()) return false;
  const std::string event = http_internal::SseEvent(data);
  if (!exchange_->chunked) return session_->PostEvent(exchange_, event);
  return session_->PostEvent(exchange_, fmt::format("{:x}\r\n{}\r\n", event.size(), event));
}

Responder::EventHold Responder::HoldEvents() {
  session_->Hold(*exchange_);
  return EventHold(this);
}

void Responder::ReleaseHold() {
  bool done;
  {
    std::lock_guard<std::mutex> lock(mu_);
    done = state_ == State::kDone;
  }
  // After Finish (or an abort) the stream's end takes what is queued.
  session_->ReleaseHold(exchange_, !done);
}

bool Responder::Finish() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (state_ != State::kStreaming) return false;
    state_ = State::kDone;
  }
  if (client_gone()) return false;
  return session_->PostFinish(exchange_);
}

// ---- HttpServer ----

HttpServer::HttpServer(HttpServerOptions options)
    : core_(std::make_shared<http_internal::Core>(std::move(options))) {}

HttpServer::~HttpServer() { Stop(); }

void HttpServer::Handle(std::string method, std::string path, Handler handler) {
  core_->routes[std::move(path)][std::move(method)] = std::move(handler);
}

HttpServer::StreamStats HttpServer::stream_stats() const {
  return {core_->stream_writes.load(std::memory_order_relaxed),
          core_->stream_events.load(std::memory_order_relaxed),
          core_->stream_flushes.load(std::memory_order_relaxed)};
}

int HttpServer::open_connections() const {
  std::lock_guard<std::mutex> lock(core_->mu);
  return core_->open_connections;
}

Status HttpServer::Start() {
  if (started_) return FailedPrecondition("HttpServer::Start called twice");
  const HttpServerOptions& o = core_->options;
  if (o.num_threads < 1 || o.num_threads > 256)
    return InvalidArgument(
        fmt::format("http num_threads must be in [1, 256], got {}", o.num_threads));
  if (o.port < 0 || o.port > 65535)
    return InvalidArgument(fmt::format("http port must be in [0, 65535], got {}", o.port));
  if (!(o.read_timeout_seconds > 0) || !(o.write_timeout_seconds > 0))
    return InvalidArgument(fmt::format("http read/write timeouts must be > 0 seconds, got {} / {}",
                                       o.read_timeout_seconds, o.write_timeout_seconds));
  if (!(o.half_close_probe_seconds > 0) || !(o.half_close_probe_seconds < 3600))
    return InvalidArgument(fmt::format("http half_close_probe_seconds must be in (0, 3600), got {}",
                                       o.half_close_probe_seconds));
  if (o.max_connections < 1)
    return InvalidArgument(
        fmt::format("http max_connections must be >= 1, got {}", o.max_connections));
  if (o.max_header_bytes < 64 || o.max_header_count < 1 || o.max_queued_events < 1)
    return InvalidArgument(
        "http max_header_bytes must be >= 64, max_header_count and max_queued_events >= 1");

  if (o.tls_cert_file.empty() != o.tls_key_file.empty())
    return InvalidArgument("http: TLS needs both a certificate chain and a private key file");
  if (!o.tls_cert_file.empty()) TESSERA_RETURN_IF_ERROR(http_internal::LoadTlsContext(*core_));

  beast::error_code ec;
  tcp::resolver resolver(core_->ioc);
  auto endpoints = resolver.resolve(o.bind_address, std::to_string(o.port),
                                    tcp::resolver::passive | tcp::resolver::numeric_service, ec);
  if (ec || endpoints.empty())
    return InvalidArgument(
        fmt::format("http bind address '{}' does not resolve: {}", o.bind_address, ec.message()));
  const tcp::endpoint endpoint = endpoints.begin()->endpoint();
  const std::string where = fmt::format("{}:{}", o.bind_address, o.port);
  auto& acceptor = core_->acceptor.emplace(net::make_strand(core_->ioc));
  if (acceptor.open(endpoint.protocol(), ec); ec)
    return IoError(fmt::format("http: cannot open a socket for {}: {}", where, ec.message()));
  acceptor.set_option(net::socket_base::reuse_address(true), ec);
  if (acceptor.bind(endpoint, ec); ec)
    return IoError(fmt::format("http: cannot bind {}: {}", where, ec.message()));
  if (acceptor.listen(net::socket_base::max_listen_connections, ec); ec)
    return IoError(fmt::format("http: cannot listen on {}: {}", where, ec.message()));
  port_.store(acceptor.local_endpoint(ec).port());

  started_ = true;
  http_internal::Accept(core_);
  for (int i = 0; i < o.num_threads; ++i) {
    threads_.emplace_back([core = core_] {
      while (true) {
        try {
          core->ioc.run();
          return;
        } catch (const std::exception& e) {
          std::fprintf(stderr, "tessera http: io thread caught: %s\n", e.what());
        } catch (...) {
          std::fprintf(stderr, "tessera http: io thread caught an unknown exception\n");
        }
      }
    });
  }
  return Status::Ok();
}

void HttpServer::Stop() {
  if (!started_ || stopped_) return;
  stopped_ = true;
  auto core = core_;
  std::vector<std::shared_ptr<http_internal::Session>> sessions;
  {
    std::lock_guard<std::mutex> lock(core->mu);
    core->stopping = true;
    for (auto& [id, weak] : core->sessions) {
      if (auto session = weak.lock()) sessions.push_back(std::move(session));
    }
  }
  // (Posted outside the lock: dropping the last reference to a session
  // closes it, which takes the lock.)
  for (auto& session : sessions) {
    net::post(session->executor(), [session] { session->Close(); });
  }
  sessions.clear();
  net::post(core->acceptor->get_executor(), [core] {
    beast::error_code ec;
    core->acceptor->close(ec);
    if (core->accept_retry) core->accept_retry->cancel();
  });
  {
    std::unique_lock<std::mutex> lock(core->mu);
    core->cv.wait_for(lock, std::chrono::duration<double>(http_internal::kStopGraceSeconds), [&] {
      return core->open_connections == 0 && core->rejecting_connections == 0;
    });
    core->stopped = true;  // Responders post nothing from here on
  }
  core->work.reset();
  core->ioc.stop();
  for (auto& t : threads_) t.join();
  threads_.clear();
  // Run what was queued before the stop (closed sessions finish quickly), so
  // no handler keeps a session alive inside the io_context.
  core->ioc.restart();
  for (int i = 0; i < 1000 && core->ioc.poll() > 0; ++i) {
  }
}

// ---- Bearer tokens ----

bool ConstantTimeEquals(std::string_view given, std::string_view expected) {
  volatile unsigned char diff = given.size() == expected.size() ? 0 : 1;
  for (size_t i = 0; i < expected.size(); ++i) {
    const unsigned char g = i < given.size() ? static_cast<unsigned char>(given[i]) : 0;
    diff = diff | (g ^ static_cast<unsigned char>(expected[i]));
  }
  return diff == 0;
}

bool HasBearerToken(const HttpRequest& request, std::string_view expected) {
  if (expected.empty()) return false;
  auto header = request.Header("Authorization");
  if (!header) return false;
  std::string_view value = *header;
  constexpr std::string_view kScheme = "bearer ";
  if (value.size() < kScheme.size() || !AsciiIEquals(value.substr(0, kScheme.size()), kScheme))
    return false;
  value.remove_prefix(kScheme.size());
  while (!value.empty() && value.front() == ' ') value.remove_prefix(1);
  while (!value.empty() && (value.back() == ' ' || value.back() == '\t')) value.remove_suffix(1);
  return ConstantTimeEquals(value, expected);
}

HttpServer::Handler RequireBearerToken(std::string token, HttpServer::Handler inner) {
  return [token = std::move(token), inner = std::move(inner)](
             const HttpRequest& request, std::shared_ptr<Responder> responder) {
    if (!HasBearerToken(request, token)) {
      const bool sent = request.Header("Authorization").has_value();
      responder->Send(401, "application/json",
                      ErrorJson(sent ? "the bearer token is not valid for " + request.path
                                     : "missing bearer token: send 'Authorization: Bearer <admin "
                                       "token>' for " +
                                           request.path,
                                "invalid_request_error", std::nullopt, "invalid_api_key"),
                      {{"WWW-Authenticate", "Bearer"}});
      return;
    }
    inner(request, std::move(responder));
  };
}

}  // namespace tessera
