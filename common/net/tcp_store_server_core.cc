#include "common/net/tcp_store_server_core.h"

#include <fmt/format.h>
#include <openssl/rand.h>

#include <algorithm>

#include "common/net/store_auth.h"
#include "common/net/tcp_store_wire.h"

namespace tessera {
namespace {

using namespace store_wire;

std::string RandomNonce() {
  std::string n(kStoreNonceBytes, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(n.data()), static_cast<int>(n.size())) != 1)
    return "";
  return n;
}

// A key as error messages show it: quoted, cut at 200 bytes.
std::string Shown(const std::string& key) {
  if (key.size() <= 200) return "'" + key + "'";
  return fmt::format("'{}...' ({} bytes)", key.substr(0, 200), key.size());
}

bool StartsWith(const std::string& s, const std::string& prefix) {
  return s.size() >= prefix.size() && s.compare(0, prefix.size(), prefix) == 0;
}

}  // namespace

StoreServerCore::StoreServerCore(std::string secret, TcpStoreLimits limits,
                                 std::string (*nonce_source)())
    : secret_(std::move(secret)),
      limits_(limits),
      nonce_source_(nonce_source ? nonce_source : &RandomNonce) {}

StoreServerCore::Conn* StoreServerCore::Accept(Clock::time_point now) {
  int open = 0;
  Conn* oldest_unauthenticated = nullptr;
  for (const auto& c : conns_) {
    if (c->closed) continue;
    ++open;
    if (!c->authenticated &&
        (!oldest_unauthenticated || c->opened < oldest_unauthenticated->opened))
      oldest_unauthenticated = c.get();
  }
  conns_.push_back(std::make_unique<Conn>());
  Conn* c = conns_.back().get();
  c->opened = now;
  if (open >= limits_.max_connections) {
    if (oldest_unauthenticated == nullptr) {
      ++refused_connections_;
      Refuse(c, StatusCode::kResourceExhausted,
             fmt::format("TcpStore server: store.max_connections ({}) reached; connection refused",
                         limits_.max_connections));
      return c;
    }
    // Authenticated clients keep their slots; a handshake yields its own.
    ++refused_connections_;
    Refuse(oldest_unauthenticated, StatusCode::kResourceExhausted,
           fmt::format("TcpStore server: store.max_connections ({}) reached; this connection "
                       "had not authenticated and was dropped for a newer one",
                       limits_.max_connections));
  }
  c->server_nonce = nonce_source_();
  if (c->server_nonce.size() != kStoreNonceBytes) {
    Refuse(c, StatusCode::kInternal, "TcpStore server: cannot make a nonce");
    return c;
  }
  std::string hello;
  PutU8(&hello, kResultOk);
  hello += c->server_nonce;
  c->out += Frame(hello);
  return c;
}

size_t StoreServerCore::ReadBudget(const Conn& c) const {
  if (c.closed) return 0;
  size_t cap = 4 + size_t{kMaxHandshakeFrameBytes};
  if (c.authenticated) {
    if (c.out.size() > static_cast<size_t>(limits_.max_frame_bytes)) return 0;  // not reading
    cap = 4 + static_cast<size_t>(limits_.max_frame_bytes);
  }
  return c.in.size() >= cap ? 0 : cap - c.in.size();
}

void StoreServerCore::OnInput(Conn* c, Clock::time_point now) {
  while (!c->pending && !c->closed) {
    if (c->authenticated && c->out.size() > static_cast<size_t>(limits_.max_frame_bytes))
      return;  // replies wait to be read; Tick resumes
    if (c->in.size() < 4) return;
    const uint32_t len = DecodeU32(c->in.data());
    if (!c->authenticated && len > kMaxHandshakeFrameBytes) {
      Refuse(c, StatusCode::kInvalidArgument,
             fmt::format("TcpStore server: a {}-byte frame before authentication (at most {}): "
                         "expected AUTH",
                         len, kMaxHandshakeFrameBytes));
      return;
    }
    if (c->authenticated && int64_t{len} > limits_.max_frame_bytes) {
      Refuse(c, StatusCode::kResourceExhausted,
             fmt::format("TcpStore server: a {}-byte request frame exceeds store.max_frame_bytes "
                         "({})",
                         len, limits_.max_frame_bytes));
      return;
    }
    if (c->in.size() < 4 + size_t{len}) return;
    std::string payload = c->in.substr(4, len);
    c->in.erase(0, 4 + size_t{len});
    if (!c->authenticated) {
      HandleHandshake(c, payload);
      continue;
    }
    if (payload.size() < kStoreTagBytes) {
      Refuse(c, StatusCode::kInvalidArgument, "TcpStore server: a request frame without its tag");
      return;
    }
    std::string body = payload.substr(0, payload.size() - kStoreTagBytes);
    const std::string tag = payload.substr(payload.size() - kStoreTagBytes);
    if (!ConstantTimeEquals(FrameTag(c->session_key, kClientToServer, c->recv_seq, body), tag)) {
      ++auth_failures_;
      Refuse(c, StatusCode::kFailedPrecondition,
             "TcpStore server: a request's tag does not verify (altered, replayed or out of "
             "order)");
      return;
    }
    ++c->recv_seq;
    HandleRequest(c, body, now);
    if (c->pending) TryComplete(c, now);
  }
}

void StoreServerCore::HandleHandshake(Conn* c, const std::string& payload) {
  Reader r(payload);
  uint8_t op = 0;
  std::string identity, client_nonce, mac;
  if (!r.U8(&op) || op != kOpAuth || !r.Str(&identity) ||
      !r.Bytes(kStoreNonceBytes, &client_nonce) || !r.Bytes(kStoreTagBytes, &mac) || !r.done() ||
      identity.size() > kMaxIdentityBytes) {
    ++auth_failures_;
    Refuse(c, StatusCode::kInvalidArgument,
           "TcpStore server: malformed handshake (expected AUTH: identity, nonce, HMAC)");
    return;
  }
  uint64_t plan = 0;
  int rank = 0;
  const bool admin = identity == kStoreAdminIdentity;
  if (!admin) {
    if (!ParseStoreRankIdentity(identity, &plan, &rank)) {
      ++auth_failures_;
      Refuse(c, StatusCode::kFailedPrecondition,
             fmt::format("TcpStore server: unknown identity {}", Shown(identity)));
      return;
    }
    auto it = plans_.find(plan);
    if (it == plans_.end() || rank >= it->second.world_size) {
      ++auth_failures_;
      Refuse(c, StatusCode::kFailedPrecondition,
             it == plans_.end()
                 ? fmt::format("TcpStore server: identity {}: plan {} is not the store's "
                               "current plan",
                               Shown(identity), plan)
                 : fmt::format("TcpStore server: identity {}: plan {} has {} ranks",
                               Shown(identity), plan, it->second.world_size));
      return;
    }
  }
  const std::string key = StoreKeyFor(secret_, identity);
  if (!ConstantTimeEquals(AuthMac(key, c->server_nonce, client_nonce, identity), mac)) {
    ++auth_failures_;
    Refuse(c, StatusCode::kFailedPrecondition,
           fmt::format("TcpStore server: authentication failed for identity {} (wrong store key)",
                       Shown(identity)));
    return;
  }
  std::string ok;
  PutU8(&ok, kResultOk);
  ok += ServerProof(key, c->server_nonce, client_nonce);
  c->out += Frame(ok);
  c->authenticated = true;
  c->identity = identity;
  c->admin = admin;
  c->plan_version = plan;
  c->session_key = SessionKey(key, c->server_nonce, client_nonce);
  if (!admin) joins_.emplace_back(plan, rank);
}

std::vector<std::pair<uint64_t, int>> StoreServerCore::TakeJoins() {
  std::vector<std::pair<uint64_t, int>> out;
  out.swap(joins_);
  return out;
}

void StoreServerCore::Reply(Conn* c, const std::string& body) {
  if (!c->authenticated) {
    c->out += Frame(body);
    return;
  }
  c->out += Frame(body + FrameTag(c->session_key, kServerToClient, c->send_seq++, body));
}

void StoreServerCore::ReplyError(Conn* c, StatusCode code, const std::string& message) {
  std::string r;
  PutU8(&r, kResultError);
  PutU8(&r, static_cast<uint8_t>(code));
  PutStr(&r, message);
  Reply(c, r);
}

void StoreServerCore::Refuse(Conn* c, StatusCode code, const std::string& message) {
  ReplyError(c, code, message);
  c->closed = true;
  c->pending.reset();
  c->in.clear();
  c->in.shrink_to_fit();
}

std::string StoreServerCore::CheckAccess(const Conn& c, const std::string& key) const {
  if (c.admin) return "";
  auto it = plans_.find(c.plan_version);
  if (it == plans_.end())
    return fmt::format("TcpStore server: identity '{}': its plan was replaced", c.identity);
  if (StartsWith(key, it->second.prefix)) return "";
  return fmt::format(
      "TcpStore server: identity '{}' may not use key {}: only keys under its "
      "plan's prefix '{}'",
      c.identity, Shown(key), it->second.prefix);
}

std::string StoreServerCore::CheckFits(const std::string& key, size_t value_size) const {
  auto it = data_.find(key);
  const int64_t grow = it == data_.end() ? static_cast<int64_t>(key.size() + value_size)
                                         : static_cast<int64_t>(value_size) -
                                               static_cast<int64_t>(it->second.size());
  if (it == data_.end() && static_cast<int64_t>(data_.size()) >= limits_.max_keys)
    return fmt::format("TcpStore server: key {} refused: the store holds store.max_keys ({}) keys",
                       Shown(key), limits_.max_keys);
  if (data_bytes_ + grow > limits_.max_bytes)
    return fmt::format(
        "TcpStore server: key {} refused: {} more bytes would exceed "
        "store.max_bytes ({}; {} in use)",
        Shown(key), grow, limits_.max_bytes, data_bytes_);
  return "";
}

void StoreServerCore::Put(const std::string& key, std::string value) {
  auto [it, inserted] = data_.try_emplace(key);
  if (inserted) data_bytes_ += static_cast<int64_t>(key.size());
  data_bytes_ += static_cast<int64_t>(value.size()) - static_cast<int64_t>(it->second.size());
  it->second = std::move(value);
}

void StoreServerCore::HandleRequest(Conn* c, const std::string& body, Clock::time_point now) {
  Reader r(body);
  uint8_t op = 0;
  std::string reply;
  if (!r.U8(&op)) op = 0;
  switch (op) {
    case kOpSet: {
      std::string key, value;
      if (!r.Str(&key) || !r.Str(&value) || !r.done()) break;
      std::string refused = CheckAccess(*c, key);
      if (!refused.empty()) return ReplyError(c, StatusCode::kFailedPrecondition, refused);
      refused = CheckFits(key, value.size());
      if (!refused.empty()) return ReplyError(c, StatusCode::kResourceExhausted, refused);
      Put(key, std::move(value));
      PutU8(&reply, kResultOk);
      return Reply(c, reply);
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
      for (const std::string& k : w.keys) {
        std::string refused = CheckAccess(*c, k);
        if (!refused.empty()) return ReplyError(c, StatusCode::kFailedPrecondition, refused);
      }
      // A day at most: a deadline past that is a client bug, not a wait.
      timeout_ms = std::min<uint64_t>(timeout_ms, 86400000);
      w.deadline = now + std::chrono::milliseconds(timeout_ms);
      c->pending = std::move(w);
      return;
    }
    case kOpAdd: {
      std::string key;
      uint64_t delta = 0;
      if (!r.Str(&key) || !r.U64(&delta) || !r.done()) break;
      std::string refused = CheckAccess(*c, key);
      if (!refused.empty()) return ReplyError(c, StatusCode::kFailedPrecondition, refused);
      int64_t current = 0;
      auto it = data_.find(key);
      if (it != data_.end()) {
        char* end = nullptr;
        errno = 0;
        long long v = std::strtoll(it->second.c_str(), &end, 10);
        if (it->second.empty() || *end != '\0' || errno != 0)
          return ReplyError(c, StatusCode::kInvalidArgument,
                            fmt::format("add({}): the key holds a non-integer value", Shown(key)));
        current = v;
      }
      // Wraps like the two's-complement sum instead of overflowing.
      const int64_t next =
          static_cast<int64_t>(static_cast<uint64_t>(current) + static_cast<uint64_t>(delta));
      std::string text = std::to_string(next);
      refused = CheckFits(key, text.size());
      if (!refused.empty()) return ReplyError(c, StatusCode::kResourceExhausted, refused);
      Put(key, std::move(text));
      PutU8(&reply, kResultOk);
      PutU64(&reply, static_cast<uint64_t>(next));
      return Reply(c, reply);
    }
    default:
      break;
  }
  ReplyError(c, StatusCode::kInvalidArgument,
             fmt::format("TcpStore server: malformed request (op {})", op));
}

void StoreServerCore::TryComplete(Conn* c, Clock::time_point now) {
  if (!c->pending) return;
  std::vector<std::string> missing;
  for (const auto& k : c->pending->keys)
    if (data_.find(k) == data_.end()) missing.push_back(k);
  std::string reply;
  if (missing.empty()) {
    PutU8(&reply, kResultOk);
    if (c->pending->op == kOpGet) PutStr(&reply, data_[c->pending->keys[0]]);
  } else if (now >= c->pending->deadline) {
    PutU8(&reply, kResultTimeout);
    PutU32(&reply, static_cast<uint32_t>(missing.size()));
    for (const auto& k : missing) PutStr(&reply, k);
  } else {
    return;
  }
  c->pending.reset();
  Reply(c, reply);
}

void StoreServerCore::Tick(Clock::time_point now) {
  const auto handshake = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(limits_.handshake_timeout_seconds));
  for (auto& c : conns_) {
    if (!c->closed && !c->authenticated && now - c->opened >= handshake) {
      ++auth_failures_;
      Refuse(c.get(), StatusCode::kDeadlineExceeded,
             fmt::format("TcpStore server: no authentication within {} s "
                         "(store.handshake_timeout_seconds)",
                         limits_.handshake_timeout_seconds));
    }
  }
  // A SET or ADD may complete other clients' waits; a completed client's
  // queued requests run next and may set keys in turn: repeat until nothing
  // moves.
  for (bool progress = true; progress;) {
    progress = false;
    for (size_t i = 0; i < conns_.size(); ++i) {
      Conn* c = conns_[i].get();
      if (c->closed) continue;
      if (c->pending) {
        TryComplete(c, now);
        if (c->pending) continue;
        progress = true;
      }
      if (c->in.size() >= 4) {
        const size_t before = c->in.size();
        OnInput(c, now);
        if (c->in.size() != before) progress = true;
      }
    }
  }
}

std::optional<StoreServerCore::Clock::time_point> StoreServerCore::NextDeadline() const {
  std::optional<Clock::time_point> next;
  const auto handshake = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(limits_.handshake_timeout_seconds));
  for (const auto& c : conns_) {
    if (c->closed) continue;
    std::optional<Clock::time_point> t;
    if (c->pending) t = c->pending->deadline;
    if (!c->authenticated) t = c->opened + handshake;
    if (t && (!next || *t < *next)) next = t;
  }
  return next;
}

void StoreServerCore::OpenPlan(uint64_t version, int world_size, const std::string& prefix,
                               int slot) {
  for (auto pit = plans_.begin(); pit != plans_.end();) {
    const uint64_t v = pit->first;
    const Plan& plan = pit->second;
    if (v == version || plan.slot != slot) {
      ++pit;
      continue;
    }
    for (auto it = data_.lower_bound(plan.prefix);
         it != data_.end() && StartsWith(it->first, plan.prefix);) {
      data_bytes_ -= static_cast<int64_t>(it->first.size() + it->second.size());
      it = data_.erase(it);
    }
    for (auto& c : conns_)
      if (!c->closed && c->authenticated && !c->admin && c->plan_version == v)
        Refuse(c.get(), StatusCode::kUnavailable,
               fmt::format("TcpStore server: plan {} was replaced by plan {}", v, version));
    pit = plans_.erase(pit);
  }
  plans_[version] = Plan{world_size, prefix, slot};
}

std::vector<int> StoreServerCore::Reap() {
  std::vector<int> fds;
  auto keep = conns_.begin();
  for (auto it = conns_.begin(); it != conns_.end(); ++it) {
    if ((*it)->closed) {
      fds.push_back((*it)->fd);
    } else {
      *keep++ = std::move(*it);
    }
  }
  conns_.erase(keep, conns_.end());
  return fds;
}

StoreServerCore::Stats StoreServerCore::stats() const {
  Stats s;
  for (const auto& c : conns_) {
    if (!c->closed) ++s.connections;
    s.buffered_bytes += static_cast<int64_t>(c->in.capacity() + c->out.capacity());
  }
  s.keys = static_cast<int64_t>(data_.size());
  s.bytes = data_bytes_;
  s.refused_connections = refused_connections_;
  s.auth_failures = auth_failures_;
  return s;
}

}  // namespace tessera
