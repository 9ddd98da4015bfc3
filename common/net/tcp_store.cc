#include "common/net/tcp_store.h"

#include <errno.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/rand.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <optional>

#include "common/net/endpoint.h"
#include "common/net/tcp_store_wire.h"

namespace tessera {
namespace {

using Clock = std::chrono::steady_clock;

using namespace store_wire;

// Largest reply frame a client accepts once the server proved it holds the
// key: a value of at most the largest store.max_frame_bytes, plus framing.
constexpr uint32_t kMaxReplyFrameBytes = (1u << 30) + 1024;
// Extra time a client waits for the server's TIMEOUT answer beyond the
// timeout it asked for, before it gives up on the connection itself.
constexpr double kReplyGraceSeconds = 2.0;

uint64_t TimeoutMs(double seconds) {
  if (!(seconds > 0)) return 0;
  return static_cast<uint64_t>(std::ceil(std::min(seconds, 1e9) * 1000.0));
}

std::string JoinKeys(const std::vector<std::string>& keys) {
  std::string out;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (i) out += ", ";
    out += "'" + keys[i] + "'";
  }
  return out;
}

// ---- Sockets --------------------------------------------------------------

struct AddrInfoDeleter {
  void operator()(addrinfo* a) const { freeaddrinfo(a); }
};
using AddrInfoPtr = std::unique_ptr<addrinfo, AddrInfoDeleter>;

StatusOr<AddrInfoPtr> Resolve(const std::string& host, int port, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  addrinfo* res = nullptr;
  std::string service = std::to_string(port);
  int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &res);
  if (rc != 0) {
    return InvalidArgument(
        fmt::format("TcpStore: cannot resolve host '{}': {}", host, gai_strerror(rc)));
  }
  return AddrInfoPtr(res);
}

void SetNoDelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

// Milliseconds from now until `deadline`, rounded up, at least 0.
int MsUntil(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  auto ms = left.count() + 1;
  if (ms < 0) return 0;
  return static_cast<int>(std::min<int64_t>(ms, 1 << 30));
}

// Result of blocking socket I/O against a deadline.
enum class IoResult { kOk, kTimeout, kClosed, kError };

IoResult WriteAll(int fd, const std::string& data, Clock::time_point deadline, int* err) {
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = send(fd, data.data() + done, data.size() - done, MSG_NOSIGNAL);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p{fd, POLLOUT, 0};
      int rc = poll(&p, 1, MsUntil(deadline));
      if (rc == 0 && Clock::now() >= deadline) return IoResult::kTimeout;
      continue;
    }
    *err = errno;
    if (errno == EPIPE || errno == ECONNRESET) return IoResult::kClosed;
    return IoResult::kError;
  }
  return IoResult::kOk;
}

IoResult ReadExact(int fd, char* buf, size_t len, Clock::time_point deadline, int* err) {
  size_t done = 0;
  while (done < len) {
    pollfd p{fd, POLLIN, 0};
    int rc = poll(&p, 1, MsUntil(deadline));
    if (rc < 0) {
      if (errno == EINTR) continue;
      *err = errno;
      return IoResult::kError;
    }
    if (rc == 0) {
      if (Clock::now() >= deadline) return IoResult::kTimeout;
      continue;
    }
    ssize_t n = recv(fd, buf + done, len - done, 0);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n == 0) return IoResult::kClosed;
    if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
    *err = errno;
    if (errno == ECONNRESET) return IoResult::kClosed;
    return IoResult::kError;
  }
  return IoResult::kOk;
}

// Connects once to any address of host:port, waiting at most until
// `deadline` for the handshake. Returns the fd (non-blocking) or -1 with *err
// set (ETIMEDOUT when the deadline passed).
int ConnectOnce(const addrinfo* addrs, Clock::time_point deadline, int* err) {
  *err = ECONNREFUSED;
  for (const addrinfo* a = addrs; a != nullptr; a = a->ai_next) {
    int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) {
      *err = errno;
      continue;
    }
    int rc = connect(fd, a->ai_addr, a->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      do {
        rc = poll(&p, 1, MsUntil(deadline));
      } while (rc < 0 && errno == EINTR);
      if (rc == 0) {
        errno = ETIMEDOUT;
        rc = -1;
      } else if (rc > 0) {
        int so_error = 0;
        socklen_t len = sizeof(so_error);
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &so_error, &len);
        errno = so_error;
        rc = so_error == 0 ? 0 : -1;
      }
    }
    if (rc == 0) {
      SetNoDelay(fd);
      return fd;
    }
    *err = errno;
    close(fd);
  }
  return -1;
}

}  // namespace

// ---- TcpStoreServer -------------------------------------------------------

StatusOr<std::unique_ptr<TcpStoreServer>> TcpStoreServer::Start(const std::string& host, int port,
                                                                TcpStoreServerOptions options) {
  if (options.secret.size() < 16)
    return InvalidArgument(fmt::format("TcpStore server: the secret has {} bytes, at least 16",
                                       options.secret.size()));
  const TcpStoreLimits& l = options.limits;
  if (l.max_frame_bytes < 64 || l.max_frame_bytes > (int64_t{1} << 31) || l.max_connections < 1 ||
      l.max_keys < 1 || l.max_bytes < 1 || !(l.handshake_timeout_seconds > 0))
    return InvalidArgument(
        "TcpStore server: a limit is out of range (max_frame_bytes 64..2^31, the others > 0)");
  TESSERA_ASSIGN_OR_RETURN(AddrInfoPtr addrs, Resolve(host, port, /*passive=*/true));
  int fd = -1;
  int err = 0;
  for (const addrinfo* a = addrs.get(); a != nullptr; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) {
      err = errno;
      continue;
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, 512) == 0) break;
    err = errno;
    close(fd);
    fd = -1;
  }
  if (fd < 0) {
    return IoError(fmt::format("TcpStore server: cannot listen on {}: {}",
                               FormatHostPort(host, port), std::strerror(err)));
  }
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
  int bound_port = ss.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port)
                                            : ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  int wake[2];
  if (pipe2(wake, O_CLOEXEC | O_NONBLOCK) != 0) {
    err = errno;
    close(fd);
    return IoError(fmt::format("TcpStore server: pipe: {}", std::strerror(err)));
  }
  std::unique_ptr<TcpStoreServer> server(
      new TcpStoreServer(host, bound_port, fd, wake[0], wake[1], std::move(options)));
  server->thread_ = std::thread([s = server.get()] { s->Run(); });
  return server;
}

TcpStoreServer::TcpStoreServer(std::string host, int port, int listen_fd, int wake_read_fd,
                               int wake_write_fd, TcpStoreServerOptions options)
    : host_(std::move(host)),
      port_(port),
      listen_fd_(listen_fd),
      wake_read_fd_(wake_read_fd),
      wake_write_fd_(wake_write_fd),
      options_(std::move(options)) {}

void TcpStoreServer::Wake() {
  char b = 1;
  while (write(wake_write_fd_, &b, 1) < 0 && errno == EINTR) {
  }
}

TcpStoreServer::~TcpStoreServer() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  Wake();
  if (thread_.joinable()) thread_.join();
  close(listen_fd_);
  close(wake_read_fd_);
  close(wake_write_fd_);
}

void TcpStoreServer::OpenPlan(uint64_t version, int world_size, const std::string& key_prefix,
                              int slot) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    plan_queue_.push_back({version, world_size, key_prefix, slot});
  }
  Wake();
}

StoreServerCore::Stats TcpStoreServer::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

std::vector<int> TcpStoreServer::JoinedRanks(uint64_t version) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = joined_.find(version);
  if (it == joined_.end()) return {};
  return std::vector<int>(it->second.begin(), it->second.end());
}

void TcpStoreServer::Run() {
  using Conn = StoreServerCore::Conn;
  StoreServerCore core(options_.secret, options_.limits);
  std::vector<pollfd> fds;
  std::vector<Conn*> polled;
  // Applies queued OpenPlan calls; returns false once the destructor asked
  // the thread to stop.
  auto apply_commands = [&] {
    std::vector<PlanCommand> q;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return false;
      q.swap(plan_queue_);
    }
    for (const PlanCommand& p : q) core.OpenPlan(p.version, p.world_size, p.prefix, p.slot);
    return true;
  };
  for (;;) {
    if (!apply_commands()) break;
    int timeout_ms = -1;
    if (auto next = core.NextDeadline()) timeout_ms = MsUntil(*next);
    fds.clear();
    polled.clear();
    fds.push_back({wake_read_fd_, POLLIN, 0});
    fds.push_back({listen_fd_, POLLIN, 0});
    for (const auto& c : core.conns()) {
      short events = 0;
      if (core.ReadBudget(*c) > 0) events |= POLLIN;
      if (!c->out.empty()) events |= POLLOUT;
      fds.push_back({c->fd, events, 0});
      polled.push_back(c.get());
    }
    int rc = poll(fds.data(), fds.size(), timeout_ms);
    if (rc < 0 && errno != EINTR) break;
    if (rc > 0 && fds[0].revents) {
      char drain[64];
      while (read(wake_read_fd_, drain, sizeof drain) > 0) {
      }
    }
    auto now = Clock::now();
    if (rc > 0 && (fds[1].revents & POLLIN)) {
      for (;;) {
        int cfd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (cfd < 0) break;
        SetNoDelay(cfd);
        core.Accept(now)->fd = cfd;
      }
    }
    // Read everything first, then apply OpenPlan calls made meanwhile: an
    // AUTH read now was sent after any OpenPlan that preceded its rank's
    // assignment.
    std::vector<Conn*> readable;
    for (size_t i = 0; rc > 0 && i < polled.size(); ++i) {
      Conn* c = polled[i];
      if (!(fds[i + 2].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      char buf[64 * 1024];
      for (;;) {
        const size_t budget = core.ReadBudget(*c);
        if (budget == 0) break;
        ssize_t n = recv(c->fd, buf, std::min(sizeof(buf), budget), 0);
        if (n > 0) {
          c->in.append(buf, static_cast<size_t>(n));
          continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) c->closed = true;
        break;
      }
      if ((fds[i + 2].revents & (POLLHUP | POLLERR)) && !(fds[i + 2].revents & POLLIN))
        c->closed = true;
      readable.push_back(c);
    }
    if (!apply_commands()) break;
    for (Conn* c : readable) core.OnInput(c, now);
    core.Tick(now);
    for (auto& c : core.conns()) {
      while (!c->out.empty()) {
        ssize_t n = send(c->fd, c->out.data(), c->out.size(), MSG_NOSIGNAL);
        if (n > 0) {
          c->out.erase(0, static_cast<size_t>(n));
          continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
        c->closed = true;
        c->out.clear();
        break;
      }
      if (c->out.empty() && c->out.capacity() > 64 * 1024) c->out.shrink_to_fit();
      if (c->in.empty() && c->in.capacity() > 64 * 1024) c->in.shrink_to_fit();
    }
    for (int fd : core.Reap()) close(fd);
    {
      std::lock_guard<std::mutex> lock(mu_);
      stats_ = core.stats();
      for (const auto& [version, rank] : core.TakeJoins()) joined_[version].insert(rank);
      for (auto it = joined_.begin(); it != joined_.end();)
        it = core.HasPlan(it->first) ? std::next(it) : joined_.erase(it);
    }
  }
  for (auto& c : core.conns()) close(c->fd);
}

// ---- TcpStore (client) ----------------------------------------------------

namespace {

// Reads one frame of at most `max_len` bytes.
IoResult ReadFrame(int fd, uint32_t max_len, Clock::time_point deadline, std::string* payload,
                   uint32_t* len, int* err) {
  char header[4];
  IoResult r = ReadExact(fd, header, 4, deadline, err);
  if (r != IoResult::kOk) return r;
  *len = DecodeU32(header);
  if (*len > max_len || *len == 0) return IoResult::kError;
  payload->assign(*len, '\0');
  return ReadExact(fd, payload->data(), *len, deadline, err);
}

// An ERROR reply body as a Status; kInternal for anything else.
Status ErrorFromReply(const std::string& body, const std::string& context) {
  Reader r(body);
  uint8_t result = 0, code = 0;
  std::string message;
  if (r.U8(&result) && result == kResultError && r.U8(&code) && r.Str(&message) &&
      code <= static_cast<uint8_t>(StatusCode::kInternal) && code != 0)
    return Status(static_cast<StatusCode>(code), context + ": " + message);
  return Internal(context + ": malformed reply");
}

}  // namespace

StatusOr<std::unique_ptr<TcpStore>> TcpStore::Connect(const std::string& host, int port,
                                                      double timeout_seconds,
                                                      StoreCredentials credentials) {
  std::unique_ptr<TcpStore> store(
      new TcpStore(host, port, timeout_seconds, std::move(credentials)));
  auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                     std::chrono::duration<double>(std::max(0.0, timeout_seconds)));
  std::lock_guard<std::mutex> lock(store->mu_);
  Status full = Status::Ok();
  for (;;) {
    Status s = store->ConnectLocked(deadline, /*retry=*/true);
    if (s.ok()) return store;
    // A full store (store.max_connections) may free a slot before the
    // deadline; every other refusal is final. Running out of time while
    // retrying reports the full store.
    if (s.code() == StatusCode::kResourceExhausted) {
      full = s;
    } else {
      const bool out_of_time =
          s.code() == StatusCode::kDeadlineExceeded || s.code() == StatusCode::kUnavailable;
      return full.ok() || !out_of_time ? s : full;
    }
    if (deadline - Clock::now() < std::chrono::milliseconds(100)) return full;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

Status TcpStore::ConnectLocked(Clock::time_point deadline, bool retry) {
  TESSERA_ASSIGN_OR_RETURN(AddrInfoPtr addrs, Resolve(host_, port_, /*passive=*/false));
  int err = 0;
  int fd = -1;
  for (;;) {
    fd = ConnectOnce(addrs.get(), deadline, &err);
    if (fd >= 0 || !retry || Clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (fd < 0) {
    if (!retry)
      return Unavailable(
          fmt::format("TcpStore at {}: server unreachable: {}", address(), std::strerror(err)));
    return Unavailable(fmt::format("TcpStore at {}: cannot connect: {} (retried for {:.1f} s)",
                                   address(), std::strerror(err), timeout_seconds_));
  }
  err = 0;
  const std::string context =
      fmt::format("TcpStore at {}: authenticating as '{}'", address(), credentials_.identity);
  auto fail = [&](IoResult r, int e) -> Status {
    close(fd);
    if (r == IoResult::kTimeout) return DeadlineExceeded(context + ": no answer from the server");
    if (r == IoResult::kClosed) return Unavailable(context + ": the server closed the connection");
    if (r == IoResult::kError && e == 0) return Internal(context + ": malformed handshake frame");
    return Unavailable(context + ": socket error: " + std::strerror(e));
  };
  std::string hello;
  uint32_t len = 0;
  IoResult r = ReadFrame(fd, kMaxHandshakeFrameBytes, deadline, &hello, &len, &err);
  if (r != IoResult::kOk) return fail(r, err);
  if (hello.size() != 1 + kStoreNonceBytes || hello[0] != kResultOk) {
    close(fd);
    return ErrorFromReply(hello, context);
  }
  const std::string server_nonce = hello.substr(1);
  std::string client_nonce(kStoreNonceBytes, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(client_nonce.data()),
                 static_cast<int>(client_nonce.size())) != 1) {
    close(fd);
    return Internal(context + ": RAND_bytes failed");
  }
  std::string auth;
  PutU8(&auth, kOpAuth);
  PutStr(&auth, credentials_.identity);
  auth += client_nonce;
  auth += AuthMac(credentials_.key, server_nonce, client_nonce, credentials_.identity);
  r = WriteAll(fd, Frame(auth), deadline, &err);
  if (r != IoResult::kOk) return fail(r, err);
  std::string answer;
  r = ReadFrame(fd, kMaxHandshakeFrameBytes, deadline, &answer, &len, &err);
  if (r != IoResult::kOk) return fail(r, err);
  if (answer.size() != 1 + kStoreTagBytes || answer[0] != kResultOk) {
    close(fd);
    return ErrorFromReply(answer, context);
  }
  if (!ConstantTimeEquals(answer.substr(1),
                          ServerProof(credentials_.key, server_nonce, client_nonce))) {
    close(fd);
    return Internal(context + ": the server's proof does not verify (not this deployment's store)");
  }
  fd_ = fd;
  session_key_ = SessionKey(credentials_.key, server_nonce, client_nonce);
  send_seq_ = 0;
  recv_seq_ = 0;
  return Status::Ok();
}

TcpStore::TcpStore(std::string host, int port, double timeout_seconds, StoreCredentials credentials)
    : host_(std::move(host)),
      port_(port),
      timeout_seconds_(timeout_seconds),
      credentials_(std::move(credentials)) {}

TcpStore::~TcpStore() {
  std::lock_guard<std::mutex> lock(mu_);
  CloseLocked();
}

std::string TcpStore::address() const { return FormatHostPort(host_, port_); }

void TcpStore::CloseLocked() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

StatusOr<std::string> TcpStore::RoundTripLocked(const std::string& request, double reply_timeout,
                                                const std::string& what) {
  if (fd_ < 0) {
    // An earlier call lost the connection: try once more, without retrying.
    Status s = ConnectLocked(Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                std::chrono::duration<double>(timeout_seconds_)),
                             /*retry=*/false);
    if (!s.ok()) return s.WithContext(what);
  }
  auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                     std::chrono::duration<double>(reply_timeout));
  auto fail = [&](IoResult r, int err) -> Status {
    CloseLocked();
    if (r == IoResult::kTimeout) {
      return DeadlineExceeded(
          fmt::format("TcpStore at {}: {}: no answer from the server after "
                      "{:.1f} s",
                      address(), what, reply_timeout));
    }
    if (r == IoResult::kClosed) {
      return Unavailable(
          fmt::format("TcpStore at {}: {}: the server closed the connection", address(), what));
    }
    return Unavailable(
        fmt::format("TcpStore at {}: {}: socket error: {}", address(), what, std::strerror(err)));
  };
  int err = 0;
  IoResult r =
      WriteAll(fd_, Frame(request + FrameTag(session_key_, kClientToServer, send_seq_++, request)),
               deadline, &err);
  if (r != IoResult::kOk) return fail(r, err);
  std::string payload;
  uint32_t len = 0;
  r = ReadFrame(fd_, kMaxReplyFrameBytes, deadline, &payload, &len, &err);
  if (r == IoResult::kError && err == 0) {
    CloseLocked();
    return Internal(
        fmt::format("TcpStore at {}: {}: malformed reply (length {})", address(), what, len));
  }
  if (r != IoResult::kOk) return fail(r, err);
  if (payload.size() < kStoreTagBytes) {
    CloseLocked();
    return Internal(fmt::format("TcpStore at {}: {}: a reply without its tag", address(), what));
  }
  std::string body = payload.substr(0, payload.size() - kStoreTagBytes);
  if (!ConstantTimeEquals(payload.substr(payload.size() - kStoreTagBytes),
                          FrameTag(session_key_, kServerToClient, recv_seq_++, body))) {
    CloseLocked();
    return Internal(
        fmt::format("TcpStore at {}: {}: the reply's tag does not verify", address(), what));
  }
  return body;
}

namespace {

// Decodes the common part of a reply: OK leaves `r` at the body, TIMEOUT and
// ERROR become a Status.
Status CheckReply(Reader& r, const std::string& what, const std::string& address,
                  double timeout_seconds) {
  uint8_t result = 0;
  if (!r.U8(&result))
    return Internal(fmt::format("TcpStore at {}: {}: empty reply", address, what));
  if (result == kResultOk) return Status::Ok();
  if (result == kResultTimeout) {
    uint32_t n = 0;
    std::vector<std::string> missing;
    if (r.U32(&n)) {
      for (uint32_t i = 0; i < n; ++i) {
        std::string k;
        if (!r.Str(&k)) break;
        missing.push_back(std::move(k));
      }
    }
    return DeadlineExceeded(fmt::format(
        "TcpStore at {}: {}: timed out after {:.1f} s waiting for "
        "key{} {}",
        address, what, timeout_seconds, missing.size() == 1 ? "" : "s", JoinKeys(missing)));
  }
  uint8_t code = 0;
  std::string message;
  if (result != kResultError || !r.U8(&code) || !r.Str(&message)) {
    return Internal(fmt::format("TcpStore at {}: {}: malformed reply", address, what));
  }
  return Status(static_cast<StatusCode>(code), message);
}

}  // namespace

Status TcpStore::Set(const std::string& key, const std::string& value) {
  std::string req;
  PutU8(&req, kOpSet);
  PutStr(&req, key);
  PutStr(&req, value);
  std::string what = fmt::format("set('{}')", key);
  std::lock_guard<std::mutex> lock(mu_);
  TESSERA_ASSIGN_OR_RETURN(std::string reply, RoundTripLocked(req, timeout_seconds_, what));
  Reader r(reply);
  return CheckReply(r, what, address(), 0);
}

StatusOr<std::string> TcpStore::Get(const std::string& key, double timeout_seconds) {
  std::string req;
  PutU8(&req, kOpGet);
  PutU64(&req, TimeoutMs(timeout_seconds));
  PutStr(&req, key);
  std::string what = fmt::format("get('{}')", key);
  std::lock_guard<std::mutex> lock(mu_);
  TESSERA_ASSIGN_OR_RETURN(
      std::string reply,
      RoundTripLocked(req, std::max(0.0, timeout_seconds) + kReplyGraceSeconds, what));
  Reader r(reply);
  TESSERA_RETURN_IF_ERROR(CheckReply(r, what, address(), std::max(0.0, timeout_seconds)));
  std::string value;
  if (!r.Str(&value))
    return Internal(fmt::format("TcpStore at {}: {}: malformed reply", address(), what));
  return value;
}

Status TcpStore::Wait(const std::vector<std::string>& keys, double timeout_seconds) {
  std::string req;
  PutU8(&req, kOpWait);
  PutU64(&req, TimeoutMs(timeout_seconds));
  PutU32(&req, static_cast<uint32_t>(keys.size()));
  for (const auto& k : keys) PutStr(&req, k);
  std::string what = fmt::format("wait({})", JoinKeys(keys));
  std::lock_guard<std::mutex> lock(mu_);
  TESSERA_ASSIGN_OR_RETURN(
      std::string reply,
      RoundTripLocked(req, std::max(0.0, timeout_seconds) + kReplyGraceSeconds, what));
  Reader r(reply);
  return CheckReply(r, what, address(), std::max(0.0, timeout_seconds));
}

StatusOr<int64_t> TcpStore::Add(const std::string& key, int64_t delta) {
  std::string req;
  PutU8(&req, kOpAdd);
  PutStr(&req, key);
  PutU64(&req, static_cast<uint64_t>(delta));
  std::string what = fmt::format("add('{}')", key);
  std::lock_guard<std::mutex> lock(mu_);
  TESSERA_ASSIGN_OR_RETURN(std::string reply, RoundTripLocked(req, timeout_seconds_, what));
  Reader r(reply);
  TESSERA_RETURN_IF_ERROR(CheckReply(r, what, address(), 0));
  uint64_t v = 0;
  if (!r.U64(&v))
    return Internal(fmt::format("TcpStore at {}: {}: malformed reply", address(), what));
  return static_cast<int64_t>(v);
}

}  // namespace tessera
