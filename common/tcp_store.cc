#include "common/tcp_store.h"

#include <errno.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <optional>

namespace tessera {
namespace {

using Clock = std::chrono::steady_clock;

enum Op : uint8_t { kOpSet = 1, kOpGet = 2, kOpWait = 3, kOpAdd = 4 };
enum Result : uint8_t { kResultOk = 0, kResultTimeout = 1, kResultError = 2 };

// Largest frame either side accepts; rendezvous values are a few KiB.
constexpr uint32_t kMaxFrameBytes = 64u << 20;
// Extra time a client waits for the server's TIMEOUT answer beyond the
// timeout it asked for, before it gives up on the connection itself.
constexpr double kReplyGraceSeconds = 2.0;

// ---- Encoding -------------------------------------------------------------

void PutU8(std::string* out, uint8_t v) { out->push_back(static_cast<char>(v)); }
void PutU32(std::string* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void PutU64(std::string* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void PutStr(std::string* out, const std::string& s) {
  PutU32(out, static_cast<uint32_t>(s.size()));
  out->append(s);
}
std::string Frame(const std::string& payload) {
  std::string out;
  PutU32(&out, static_cast<uint32_t>(payload.size()));
  out.append(payload);
  return out;
}

// Reads fields from a payload; every getter returns false past the end.
class Reader {
 public:
  explicit Reader(const std::string& data) : data_(data) {}
  bool U8(uint8_t* v) {
    if (pos_ + 1 > data_.size()) return false;
    *v = static_cast<uint8_t>(data_[pos_++]);
    return true;
  }
  bool U32(uint32_t* v) {
    if (pos_ + 4 > data_.size()) return false;
    *v = 0;
    for (int i = 0; i < 4; ++i) *v |= uint32_t{static_cast<uint8_t>(data_[pos_ + i])} << (8 * i);
    pos_ += 4;
    return true;
  }
  bool U64(uint64_t* v) {
    if (pos_ + 8 > data_.size()) return false;
    *v = 0;
    for (int i = 0; i < 8; ++i) *v |= uint64_t{static_cast<uint8_t>(data_[pos_ + i])} << (8 * i);
    pos_ += 8;
    return true;
  }
  bool Str(std::string* s) {
    uint32_t n;
    if (!U32(&n) || pos_ + n > data_.size()) return false;
    s->assign(data_, pos_, n);
    pos_ += n;
    return true;
  }
  bool done() const { return pos_ == data_.size(); }

 private:
  const std::string& data_;
  size_t pos_ = 0;
};

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

std::string HostPort(const std::string& host, int port) {
  if (host.find(':') != std::string::npos) return fmt::format("[{}]:{}", host, port);
  return fmt::format("{}:{}", host, port);
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

// ---- Server state ---------------------------------------------------------

struct PendingWait {
  uint8_t op;  // kOpGet or kOpWait
  std::vector<std::string> keys;
  Clock::time_point deadline;
};

struct Client {
  int fd;
  std::string in;
  std::string out;
  std::optional<PendingWait> pending;  // a GET/WAIT the keys of which are missing
  bool closed = false;
};

std::string ErrorReply(StatusCode code, const std::string& message) {
  std::string r;
  PutU8(&r, kResultError);
  PutU8(&r, static_cast<uint8_t>(code));
  PutStr(&r, message);
  return r;
}

class ServerState {
 public:
  // Handles complete frames in client->in until one becomes pending.
  void ProcessInput(Client* c) {
    while (!c->pending && !c->closed) {
      if (c->in.size() < 4) return;
      uint32_t len = 0;
      for (int i = 0; i < 4; ++i) len |= uint32_t{static_cast<uint8_t>(c->in[i])} << (8 * i);
      if (len > kMaxFrameBytes) {
        c->closed = true;  // not a TcpStore client, or a corrupt stream
        return;
      }
      if (c->in.size() < 4 + size_t{len}) return;
      std::string payload = c->in.substr(4, len);
      c->in.erase(0, 4 + size_t{len});
      Handle(c, payload);
    }
  }

  // Answers `c`'s pending wait if its keys now exist or its deadline passed.
  void TryComplete(Client* c, Clock::time_point now) {
    if (!c->pending) return;
    std::vector<std::string> missing;
    for (const auto& k : c->pending->keys) {
      if (!data_.count(k)) missing.push_back(k);
    }
    std::string reply;
    if (missing.empty()) {
      PutU8(&reply, kResultOk);
      if (c->pending->op == kOpGet) PutStr(&reply, data_.at(c->pending->keys[0]));
    } else if (now >= c->pending->deadline) {
      PutU8(&reply, kResultTimeout);
      PutU32(&reply, static_cast<uint32_t>(missing.size()));
      for (const auto& k : missing) PutStr(&reply, k);
    } else {
      return;
    }
    c->out += Frame(reply);
    c->pending.reset();
  }

 private:
  void Handle(Client* c, const std::string& payload) {
    Reader r(payload);
    uint8_t op = 0;
    std::string reply;
    if (!r.U8(&op)) {
      c->closed = true;
      return;
    }
    switch (op) {
      case kOpSet: {
        std::string key, value;
        if (!r.Str(&key) || !r.Str(&value) || !r.done()) break;
        data_[key] = std::move(value);
        PutU8(&reply, kResultOk);
        c->out += Frame(reply);
        return;
      }
      case kOpGet:
      case kOpWait: {
        uint64_t timeout_ms = 0;
        PendingWait w;
        w.op = op;
        if (!r.U64(&timeout_ms)) break;
        if (op == kOpGet) {
          std::string key;
          if (!r.Str(&key)) break;
          w.keys.push_back(std::move(key));
        } else {
          uint32_t n = 0;
          if (!r.U32(&n)) break;
          bool ok = true;
          for (uint32_t i = 0; i < n && ok; ++i) {
            std::string key;
            ok = r.Str(&key);
            w.keys.push_back(std::move(key));
          }
          if (!ok) break;
        }
        if (!r.done()) break;
        auto now = Clock::now();
        w.deadline = now + std::chrono::milliseconds(timeout_ms);
        c->pending = std::move(w);
        TryComplete(c, now);
        return;
      }
      case kOpAdd: {
        std::string key;
        uint64_t delta = 0;
        if (!r.Str(&key) || !r.U64(&delta) || !r.done()) break;
        int64_t current = 0;
        auto it = data_.find(key);
        if (it != data_.end()) {
          char* end = nullptr;
          errno = 0;
          long long v = std::strtoll(it->second.c_str(), &end, 10);
          if (it->second.empty() || *end != '\0' || errno != 0) {
            c->out +=
                Frame(ErrorReply(StatusCode::kInvalidArgument,
                                 fmt::format("add('{}'): the key holds a non-integer value", key)));
            return;
          }
          current = v;
        }
        int64_t next = current + static_cast<int64_t>(delta);
        data_[key] = std::to_string(next);
        PutU8(&reply, kResultOk);
        PutU64(&reply, static_cast<uint64_t>(next));
        c->out += Frame(reply);
        return;
      }
      default:
        break;
    }
    c->out += Frame(ErrorReply(StatusCode::kInvalidArgument,
                               fmt::format("TcpStore server: malformed request (op {})", op)));
  }

  std::map<std::string, std::string> data_;
};

}  // namespace

// ---- TcpStoreServer -------------------------------------------------------

StatusOr<std::unique_ptr<TcpStoreServer>> TcpStoreServer::Start(const std::string& host, int port) {
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
    return IoError(fmt::format("TcpStore server: cannot listen on {}: {}", HostPort(host, port),
                               std::strerror(err)));
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
      new TcpStoreServer(host, bound_port, fd, wake[0], wake[1]));
  server->thread_ = std::thread([s = server.get()] { s->Run(); });
  return server;
}

TcpStoreServer::TcpStoreServer(std::string host, int port, int listen_fd, int wake_read_fd,
                               int wake_write_fd)
    : host_(std::move(host)),
      port_(port),
      listen_fd_(listen_fd),
      wake_read_fd_(wake_read_fd),
      wake_write_fd_(wake_write_fd) {}

TcpStoreServer::~TcpStoreServer() {
  char b = 1;
  while (write(wake_write_fd_, &b, 1) < 0 && errno == EINTR) {
  }
  if (thread_.joinable()) thread_.join();
  close(listen_fd_);
  close(wake_read_fd_);
  close(wake_write_fd_);
}

void TcpStoreServer::Run() {
  ServerState state;
  std::vector<std::unique_ptr<Client>> clients;
  std::vector<pollfd> fds;
  for (;;) {
    // Poll timeout: the nearest pending deadline.
    int timeout_ms = -1;
    for (const auto& c : clients) {
      if (c->pending) {
        int ms = MsUntil(c->pending->deadline);
        timeout_ms = timeout_ms < 0 ? ms : std::min(timeout_ms, ms);
      }
    }
    fds.clear();
    fds.push_back({wake_read_fd_, POLLIN, 0});
    fds.push_back({listen_fd_, POLLIN, 0});
    for (const auto& c : clients) {
      short events = POLLIN;
      if (!c->out.empty()) events |= POLLOUT;
      fds.push_back({c->fd, events, 0});
    }
    int rc = poll(fds.data(), fds.size(), timeout_ms);
    if (rc < 0 && errno != EINTR) break;
    if (rc > 0 && fds[0].revents) break;  // woken by the destructor

    if (rc > 0 && (fds[1].revents & POLLIN)) {
      for (;;) {
        int cfd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (cfd < 0) break;
        SetNoDelay(cfd);
        auto c = std::make_unique<Client>();
        c->fd = cfd;
        clients.push_back(std::move(c));
      }
    }

    for (size_t i = 0; rc > 0 && i + 2 < fds.size(); ++i) {
      Client* c = clients[i].get();
      short re = fds[i + 2].revents;
      if (re & (POLLIN | POLLHUP | POLLERR)) {
        char buf[64 * 1024];
        for (;;) {
          ssize_t n = recv(c->fd, buf, sizeof(buf), 0);
          if (n > 0) {
            c->in.append(buf, static_cast<size_t>(n));
            continue;
          }
          if (n < 0 && errno == EINTR) continue;
          if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) c->closed = true;
          break;
        }
        state.ProcessInput(c);
      }
    }

    // A SET or ADD above may have completed other clients' waits, and
    // deadlines may have passed. A completed client's queued requests run
    // next and may set keys in turn, so repeat until nothing moves.
    auto now = Clock::now();
    for (bool progress = true; progress;) {
      progress = false;
      for (auto& c : clients) {
        if (!c->pending) continue;
        state.TryComplete(c.get(), now);
        if (!c->pending) {
          state.ProcessInput(c.get());
          progress = true;
        }
      }
    }

    for (auto& c : clients) {
      while (!c->out.empty() && !c->closed) {
        ssize_t n = send(c->fd, c->out.data(), c->out.size(), MSG_NOSIGNAL);
        if (n > 0) {
          c->out.erase(0, static_cast<size_t>(n));
          continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
        c->closed = true;
      }
    }
    clients.erase(std::remove_if(clients.begin(), clients.end(),
                                 [](const std::unique_ptr<Client>& c) {
                                   if (c->closed) close(c->fd);
                                   return c->closed;
                                 }),
                  clients.end());
  }
  for (auto& c : clients) close(c->fd);
}

// ---- TcpStore (client) ----------------------------------------------------

StatusOr<std::unique_ptr<TcpStore>> TcpStore::Connect(const std::string& host, int port,
                                                      double timeout_seconds) {
  TESSERA_ASSIGN_OR_RETURN(AddrInfoPtr addrs, Resolve(host, port, /*passive=*/false));
  auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                     std::chrono::duration<double>(std::max(0.0, timeout_seconds)));
  int err = 0;
  for (;;) {
    int fd = ConnectOnce(addrs.get(), deadline, &err);
    if (fd >= 0) {
      return std::unique_ptr<TcpStore>(new TcpStore(host, port, timeout_seconds, fd));
    }
    if (Clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return Unavailable(fmt::format("TcpStore at {}: cannot connect: {} (retried for {:.1f} s)",
                                 HostPort(host, port), std::strerror(err), timeout_seconds));
}

TcpStore::TcpStore(std::string host, int port, double timeout_seconds, int fd)
    : host_(std::move(host)), port_(port), timeout_seconds_(timeout_seconds), fd_(fd) {}

TcpStore::~TcpStore() {
  std::lock_guard<std::mutex> lock(mu_);
  CloseLocked();
}

std::string TcpStore::address() const { return HostPort(host_, port_); }

void TcpStore::CloseLocked() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

StatusOr<std::string> TcpStore::RoundTripLocked(const std::string& request, double reply_timeout,
                                                const std::string& what) {
  if (fd_ < 0) {
    // An earlier call lost the connection: try once more, without retrying.
    TESSERA_ASSIGN_OR_RETURN(AddrInfoPtr addrs, Resolve(host_, port_, /*passive=*/false));
    int err = 0;
    fd_ = ConnectOnce(addrs.get(),
                      Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                         std::chrono::duration<double>(timeout_seconds_)),
                      &err);
    if (fd_ < 0) {
      return Unavailable(fmt::format("TcpStore at {}: {}: server unreachable: {}", address(), what,
                                     std::strerror(err)));
    }
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
  IoResult r = WriteAll(fd_, Frame(request), deadline, &err);
  if (r != IoResult::kOk) return fail(r, err);
  char header[4];
  r = ReadExact(fd_, header, 4, deadline, &err);
  if (r != IoResult::kOk) return fail(r, err);
  uint32_t len = 0;
  for (int i = 0; i < 4; ++i) len |= uint32_t{static_cast<uint8_t>(header[i])} << (8 * i);
  if (len > kMaxFrameBytes || len == 0) {
    CloseLocked();
    return Internal(
        fmt::format("TcpStore at {}: {}: malformed reply (length {})", address(), what, len));
  }
  std::string payload(len, '\0');
  r = ReadExact(fd_, payload.data(), len, deadline, &err);
  if (r != IoResult::kOk) return fail(r, err);
  return payload;
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
