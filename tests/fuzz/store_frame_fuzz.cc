// libFuzzer harness: the rendezvous store's protocol engine
// (common/net/tcp_store_server_core.h), the part of TcpStoreServer that reads
// what clients send, driven without sockets exactly as the server's loop
// drives it (ReadBudget, OnInput, Tick, Reap).
//
// Input: u8 mode, then frames as [u16 little-endian length][bytes]...
//   mode % 3 == 0: every frame is raw bytes from unauthenticated clients;
//   mode % 3 == 1: the harness authenticates two connections as "admin"
//                  and each frame is a request body it tags correctly;
//   mode % 3 == 2: the same as rank 0 and 1 of plan 1 (prefix "plan1/").
// In modes 1 and 2 a frame starting with 0xff goes in raw instead (a
// malformed or forged frame after the handshake); the frame's second byte
// picks the connection and how far the clock moves (handshake timeouts,
// wait deadlines).
//
// Invariants: no connection authenticates without the key (mode 0); a
// connection's input stays within its read budget; the store keeps within
// max_keys and max_bytes; a rank writes only under its plan's prefix; the
// engine never crashes or leaks.
#include <chrono>
#include <cstdint>
#include <string>

#include "common/net/store_auth.h"
#include "common/net/tcp_store_server_core.h"
#include "common/net/tcp_store_wire.h"
#include "fuzz_util.h"

namespace {

using namespace tessera;
using namespace tessera::store_wire;
using Clock = StoreServerCore::Clock;

const std::string kSecret(32, 's');

std::string CounterNonce() {
  static uint64_t n = 0;
  std::string out(kStoreNonceBytes, '\0');
  ++n;
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out;
}

TcpStoreLimits Limits() {
  TcpStoreLimits l;
  l.max_frame_bytes = 4096;
  l.max_connections = 4;
  l.max_keys = 64;
  l.max_bytes = 16384;
  l.handshake_timeout_seconds = 1.0;
  return l;
}

struct Session {
  StoreServerCore::Conn* conn = nullptr;
  std::string key;
  uint64_t seq = 0;
};

void CheckInvariants(StoreServerCore& core, int mode) {
  const TcpStoreLimits& l = core.limits();
  for (const auto& c : core.conns()) {
    const size_t cap = 4 + (c->authenticated ? static_cast<size_t>(l.max_frame_bytes)
                                             : size_t{kMaxHandshakeFrameBytes});
    if (!c->closed && c->in.size() > cap) fuzz::Fail("a connection buffered past its budget");
    if (mode == 0 && c->authenticated) fuzz::Fail("a connection authenticated without the key");
  }
  if (static_cast<int64_t>(core.data().size()) > l.max_keys) fuzz::Fail("more than max_keys");
  int64_t bytes = 0;
  for (const auto& [k, v] : core.data()) {
    bytes += static_cast<int64_t>(k.size() + v.size());
    if (mode == 2 && k.rfind("plan1/", 0) != 0) fuzz::Fail("a rank wrote outside its prefix");
  }
  if (bytes > l.max_bytes) fuzz::Fail("more than max_bytes");
  if (bytes != core.stats().bytes) fuzz::Fail("the byte count drifted");
}

// Feeds `bytes` to `c` as the socket loop would: at most ReadBudget at a time.
void Feed(StoreServerCore& core, StoreServerCore::Conn* c, const std::string& bytes,
          Clock::time_point now) {
  size_t done = 0;
  while (done < bytes.size() && !c->closed) {
    const size_t budget = core.ReadBudget(*c);
    if (budget == 0) break;  // the loop stops reading; the rest stays unread
    const size_t n = std::min(budget, bytes.size() - done);
    c->in.append(bytes, done, n);
    done += n;
    core.OnInput(c, now);
  }
}

// Runs the handshake for `identity` on a new connection.
Session Authenticate(StoreServerCore& core, const std::string& identity, Clock::time_point now) {
  Session s;
  s.conn = core.Accept(now);
  const std::string hello = s.conn->out.substr(4);
  s.conn->out.clear();
  if (hello.size() != 1 + kStoreNonceBytes) fuzz::Fail("no challenge");
  const std::string server_nonce = hello.substr(1);
  const std::string client_nonce(kStoreNonceBytes, 'c');
  const std::string key = StoreKeyFor(kSecret, identity);
  std::string auth;
  PutU8(&auth, kOpAuth);
  PutStr(&auth, identity);
  auth += client_nonce + AuthMac(key, server_nonce, client_nonce, identity);
  Feed(core, s.conn, Frame(auth), now);
  if (!s.conn->authenticated) fuzz::Fail("the right key did not authenticate");
  s.conn->out.clear();
  s.key = SessionKey(key, server_nonce, client_nonce);
  return s;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const int mode = data[0] % 3;
  StoreServerCore core(kSecret, Limits(), &CounterNonce);
  Clock::time_point now{};
  Session sessions[2];
  if (mode == 2) core.OpenPlan(1, 2, "plan1/");
  if (mode != 0) {
    for (int i = 0; i < 2; ++i)
      sessions[i] = Authenticate(
          core, mode == 1 ? std::string(kStoreAdminIdentity) : StoreRankIdentity(1, i), now);
  }
  StoreServerCore::Conn* raw[2] = {nullptr, nullptr};
  fuzz::ForEachFrame(data + 1, size - 1, [&](std::string_view frame) {
    const uint8_t pick = frame.size() > 1 ? static_cast<uint8_t>(frame[1]) : 0;
    now += std::chrono::milliseconds(pick & 0x70 ? (pick & 0x70) * 4 : 0);
    const int which = pick & 1;
    std::string bytes(frame);
    StoreServerCore::Conn* c = nullptr;
    if (mode == 0 || (!frame.empty() && static_cast<uint8_t>(frame[0]) == 0xff)) {
      if (mode == 0) {
        if (!raw[which] || raw[which]->closed) raw[which] = core.Accept(now);
        c = raw[which];
      } else {
        c = sessions[which].conn;
        if (!bytes.empty()) bytes.erase(0, 1);
      }
    } else {
      Session& s = sessions[which];
      c = s.conn;
      bytes = Frame(bytes + FrameTag(s.key, kClientToServer, s.seq++, bytes));
    }
    if (c && !c->closed) Feed(core, c, bytes, now);
    core.Tick(now);
    CheckInvariants(core, mode);
    for (auto& conn : core.conns()) conn->out.clear();  // the clients read everything
    // Reap, forgetting the pointers it frees.
    for (auto& r : raw)
      if (r && r->closed) r = nullptr;
    for (auto& s : sessions)
      if (s.conn && s.conn->closed) s.conn = nullptr;
    core.Reap();
  });
  core.Tick(now + std::chrono::seconds(100));
  CheckInvariants(core, mode);
  return 0;
}
