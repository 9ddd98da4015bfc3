// The TcpStore server's protocol engine, without sockets: handshake,
// per-frame tags, limits, plan prefixes and the key-value data. The socket
// loop (TcpStoreServer, common/net/tcp_store.cc) and the store-frame fuzzer
// (tests/fuzz/store_frame_fuzz.cc) drive it: they append received bytes to a
// connection's `in` (at most ReadBudget() of them), call OnInput and Tick,
// send `out`, then Reap the connections marked `closed`.
//
// Memory: a connection before authentication buffers at most
// kMaxHandshakeFrameBytes; after, at most max_frame_bytes of input and
// about max_frame_bytes of output (it is not read while its replies wait).
// The data holds at most max_keys keys and max_bytes of keys plus values.
//
// Thread-safety: none; one thread (the server's) owns an engine.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/base/status.h"
#include "common/net/net_defaults.h"

namespace tessera {

// The store's bounds; the coordinator takes them from its [store] table
// (common/config/daemon_config.h documents each). Defaults: net_defaults.h,
// shared with [store].
struct TcpStoreLimits {
  int64_t max_frame_bytes = kDefaultStoreMaxFrameBytes;
  int max_connections = kDefaultStoreMaxConnections;
  int64_t max_keys = kDefaultStoreMaxKeys;
  int64_t max_bytes = kDefaultStoreMaxBytes;
  double handshake_timeout_seconds = kDefaultStoreHandshakeTimeoutSeconds;
};

class StoreServerCore {
 public:
  using Clock = std::chrono::steady_clock;

  struct PendingWait {
    uint8_t op;  // kOpGet or kOpWait
    std::vector<std::string> keys;
    Clock::time_point deadline;
  };

  struct Conn {
    int fd = -1;  // the socket loop's; the engine never touches it
    std::string in;
    std::string out;
    bool closed = false;  // drop once `out` is sent
    Clock::time_point opened;
    // Handshake.
    std::string server_nonce;
    bool authenticated = false;
    std::string identity;
    bool admin = false;
    uint64_t plan_version = 0;  // a rank identity's plan
    std::string session_key;
    uint64_t recv_seq = 0;
    uint64_t send_seq = 0;
    std::optional<PendingWait> pending;
  };

  // Counters, for tests and logs.
  struct Stats {
    int connections = 0;
    int64_t keys = 0;
    int64_t bytes = 0;           // keys plus values
    int64_t buffered_bytes = 0;  // every connection's in + out
    int64_t refused_connections = 0;
    int64_t auth_failures = 0;
  };

  // `secret`: kStoreSecretBytes or more; `nonce_source` fills nonces (the
  // server uses RAND_bytes; the fuzzer a counter, to stay deterministic).
  StoreServerCore(std::string secret, TcpStoreLimits limits,
                  std::string (*nonce_source)() = nullptr);

  // A new connection. The challenge (or, when every slot is taken by an
  // authenticated client, an error naming store.max_connections, and
  // closed) is in its `out`. To make room it may close the oldest connection
  // still in its handshake.
  Conn* Accept(Clock::time_point now);

  // How many more bytes `c->in` may take now (0: do not read it).
  size_t ReadBudget(const Conn& c) const;

  // Handles complete frames in `c->in` until one waits.
  void OnInput(Conn* c, Clock::time_point now);

  // Completes waits whose keys arrived or whose deadline passed, closes
  // handshakes that took too long, and runs the input queued behind them.
  void Tick(Clock::time_point now);

  // The nearest time Tick has work (a wait's or handshake's deadline).
  std::optional<Clock::time_point> NextDeadline() const;

  // Makes plan `version` (with `world_size` ranks, keys under `prefix`) the
  // current plan of `slot`: its ranks may authenticate; the slot's earlier
  // plan's keys are erased and its connections closed. Slots are the
  // coordinator's replicas: their plans are open side by side (slot 0 alone
  // with one replica).
  void OpenPlan(uint64_t version, int world_size, const std::string& prefix, int slot = 0);

  // Removes the closed connections, returning their fds for the caller to
  // close (after it sent what their `out` holds).
  std::vector<int> Reap();

  std::vector<std::unique_ptr<Conn>>& conns() { return conns_; }
  const std::map<std::string, std::string>& data() const { return data_; }
  const TcpStoreLimits& limits() const { return limits_; }
  Stats stats() const;

  // The (plan version, world rank) pairs that authenticated since the last
  // call, oldest first: a rank that did has started joining its plan's
  // groups (the coordinator tells a worker that never did from the peers
  // it keeps waiting).
  std::vector<std::pair<uint64_t, int>> TakeJoins();
  // Whether plan `version` is open (some slot's current plan).
  bool HasPlan(uint64_t version) const { return plans_.count(version) > 0; }

 private:
  struct Plan {
    int world_size = 0;
    std::string prefix;
    int slot = 0;
  };

  void HandleHandshake(Conn* c, const std::string& payload);
  void HandleRequest(Conn* c, const std::string& body, Clock::time_point now);
  // Queues `body` on `c` (tagged once authenticated).
  void Reply(Conn* c, const std::string& body);
  void ReplyError(Conn* c, StatusCode code, const std::string& message);
  void Refuse(Conn* c, StatusCode code, const std::string& message);  // error, then close
  void TryComplete(Conn* c, Clock::time_point now);
  // Empty when `c` may use `key`, else the refusal.
  std::string CheckAccess(const Conn& c, const std::string& key) const;
  // Empty when storing `value` under `key` fits the limits, else the refusal.
  std::string CheckFits(const std::string& key, size_t value_size) const;
  void Put(const std::string& key, std::string value);

  const std::string secret_;
  const TcpStoreLimits limits_;
  std::string (*const nonce_source_)();
  std::vector<std::unique_ptr<Conn>> conns_;
  std::map<std::string, std::string> data_;
  int64_t data_bytes_ = 0;
  std::map<uint64_t, Plan> plans_;  // the current plan of each slot
  int64_t refused_connections_ = 0;
  int64_t auth_failures_ = 0;
  std::vector<std::pair<uint64_t, int>> joins_;  // see TakeJoins
};

}  // namespace tessera
