// TcpStore: the Store (common/net/store.h) over plain TCP sockets. One process (a
// rank or the launcher) runs a TcpStoreServer; every rank connects a TcpStore
// client to it and uses it for rendezvous.
//
// Wire protocol (all integers little-endian; common/net/tcp_store_wire.h): every
// message is a frame
//   u32 payload_length, payload
// A string is u32 length + bytes.
//
// Handshake (common/net/store_auth.h describes identities and keys):
//   server: u8 OK(0), 32-byte server nonce            (or an ERROR reply, closed)
//   client: u8 AUTH(16), str identity, 32-byte client nonce,
//           HMAC(key, "tessera-store-v1 auth" | server nonce | client nonce | identity)
//   server: u8 OK, HMAC(key, "tessera-store-v1 server" | nonces)   (or ERROR, closed)
// Both sides then derive the session key
//   S = HMAC(key, "tessera-store-v1 session" | server nonce | client nonce)
// and every later payload is body + HMAC(S, direction | u64 seq | body), with
// direction 'C' (client to server) or 'S' and seq counting that direction's
// frames from 0: a request cannot be altered, replayed or moved to another
// connection. The server closes a connection that has not authenticated
// within store.handshake_timeout_seconds.
//
// A request body is u8 op followed by its fields:
//   SET  (1): str key, str value
//   GET  (2): u64 timeout_ms, str key
//   WAIT (3): u64 timeout_ms, u32 n, n x str key
//   ADD  (4): str key, i64 delta
// A reply body is u8 result followed by:
//   OK      (0): GET: str value; ADD: i64 new_value; SET/WAIT: nothing
//   TIMEOUT (1): u32 n, n x str missing_key
//   ERROR   (2): u8 StatusCode, str message
// The server answers GET/WAIT when the keys exist or, at the deadline, with
// TIMEOUT naming the missing keys, so a client never waits longer than its
// timeout plus a short grace for the reply to arrive.
//
// Limits (TcpStoreLimits, the coordinator's [store] table): frame size,
// connections, keys and bytes stored; an over-limit request gets an ERROR
// naming the config key (e.g. "store.max_keys").
//
// Thread-safety: TcpStoreServer runs one thread that owns the listening
// socket and every client connection (poll-based); its public methods are
// safe from any thread. A TcpStore client may be shared by threads, but its
// calls run one at a time (a blocking Get holds the client), so a thread must
// not Get a key that another thread sets through the same client: give each
// such thread its own TcpStore.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/base/status.h"
#include "common/net/store.h"
#include "common/net/store_auth.h"
#include "common/net/tcp_store_server_core.h"

namespace tessera {

struct TcpStoreServerOptions {
  // The deployment secret (NewStoreSecret, at least 16 bytes): clients
  // authenticate with it or with keys derived from it (common/net/store_auth.h).
  std::string secret;
  TcpStoreLimits limits;
};

class TcpStoreServer {
 public:
  // Listens on `host`:`port` ("127.0.0.1" for loopback, "0.0.0.0" or "::" for
  // every interface; port 0 picks a free port, see port()) and starts the
  // server thread.
  // Errors: kInvalidArgument (host does not resolve, secret shorter than 16
  // bytes, a limit not positive), kIoError (bind/listen failed, e.g. the
  // port is taken).
  static StatusOr<std::unique_ptr<TcpStoreServer>> Start(const std::string& host, int port,
                                                         TcpStoreServerOptions options);

  // Stops the thread and closes every connection; blocked clients see
  // kUnavailable.
  ~TcpStoreServer();

  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  const std::string& host() const { return host_; }
  // The port actually bound (useful after Start(host, 0)).
  int port() const { return port_; }

  // Makes plan `version` the current plan of `slot` (a coordinator replica;
  // the plans of different slots are open side by side): ranks
  // 0..world_size-1 of it may authenticate with StoreCredentials::Rank and
  // use keys under `key_prefix` only; the slot's earlier plan's keys are
  // erased and its ranks' connections closed. Takes effect before any
  // connection accepted after it returns authenticates.
  void OpenPlan(uint64_t version, int world_size, const std::string& key_prefix, int slot = 0);

  // The counters as of the server thread's last turn (it updates them every
  // time it wakes).
  StoreServerCore::Stats stats() const;

  // The world ranks of plan `version` that authenticated at least once (so
  // started joining their groups), ascending; empty once the plan was
  // replaced. As of the server thread's last turn.
  std::vector<int> JoinedRanks(uint64_t version) const;

 private:
  struct PlanCommand {
    uint64_t version;
    int world_size;
    std::string prefix;
    int slot;
  };

  TcpStoreServer(std::string host, int port, int listen_fd, int wake_read_fd, int wake_write_fd,
                 TcpStoreServerOptions options);
  void Run();
  void Wake();

  const std::string host_;
  const int port_;
  const int listen_fd_;
  const int wake_read_fd_;   // Wake() writes a byte to wake_write_fd_ to
  const int wake_write_fd_;  // make poll() return
  const TcpStoreServerOptions options_;
  mutable std::mutex mu_;
  bool stopping_ = false;                     // guarded by mu_
  std::vector<PlanCommand> plan_queue_;       // guarded by mu_; the thread applies them
  StoreServerCore::Stats stats_;              // guarded by mu_
  std::map<uint64_t, std::set<int>> joined_;  // guarded by mu_: see JoinedRanks
  std::thread thread_;
};

class TcpStore : public Store {
 public:
  // Connects to a TcpStoreServer at `host`:`port`, retrying refused
  // connections (the server may start after this rank) until
  // `timeout_seconds` pass, and authenticates with `credentials`.
  // `timeout_seconds` also bounds the handshake and how long Set and Add
  // wait for the server's answer.
  // Errors: kUnavailable (nothing accepted the connection in time),
  // kInvalidArgument (host does not resolve), the server's refusal
  // (kFailedPrecondition: wrong key or identity; kResourceExhausted:
  // store.max_connections, retried until the timeout), kInternal (the
  // server's proof does not verify).
  static StatusOr<std::unique_ptr<TcpStore>> Connect(const std::string& host, int port,
                                                     double timeout_seconds,
                                                     StoreCredentials credentials);

  ~TcpStore() override;

  Status Set(const std::string& key, const std::string& value) override;
  StatusOr<std::string> Get(const std::string& key, double timeout_seconds) override;
  Status Wait(const std::vector<std::string>& keys, double timeout_seconds) override;
  StatusOr<int64_t> Add(const std::string& key, int64_t delta) override;

  // "127.0.0.1:29500", for messages.
  std::string address() const;

 private:
  TcpStore(std::string host, int port, double timeout_seconds, StoreCredentials credentials);

  // Connects once (retrying refused connections until `deadline` when
  // `retry`) and authenticates. Requires mu_.
  Status ConnectLocked(std::chrono::steady_clock::time_point deadline, bool retry);

  // Sends `request` and returns the reply payload, reconnecting first (one
  // attempt) if an earlier call left the connection closed. `reply_timeout`
  // bounds the wait for the reply (seconds). `what` ("get('k')") names the
  // call in errors. Requires mu_.
  StatusOr<std::string> RoundTripLocked(const std::string& request, double reply_timeout,
                                        const std::string& what);
  void CloseLocked();

  const std::string host_;
  const int port_;
  const double timeout_seconds_;
  const StoreCredentials credentials_;
  std::mutex mu_;
  int fd_ = -1;              // guarded by mu_; -1 after a failure until the next reconnect
  std::string session_key_;  // guarded by mu_: this connection's
  uint64_t send_seq_ = 0;    // guarded by mu_
  uint64_t recv_seq_ = 0;    // guarded by mu_
};

}  // namespace tessera
