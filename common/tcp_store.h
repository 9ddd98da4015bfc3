// TcpStore: the Store (common/store.h) over plain TCP sockets. One process (a
// rank or the launcher) runs a TcpStoreServer; every rank connects a TcpStore
// client to it and uses it for rendezvous.
//
// Wire protocol (all integers little-endian): every message is a frame
//   u32 payload_length, payload
// A request payload is u8 op followed by its fields; a string is u32 length +
// bytes:
//   SET  (1): str key, str value
//   GET  (2): u64 timeout_ms, str key
//   WAIT (3): u64 timeout_ms, u32 n, n x str key
//   ADD  (4): str key, i64 delta
// A reply payload is u8 result followed by:
//   OK      (0): GET: str value; ADD: i64 new_value; SET/WAIT: nothing
//   TIMEOUT (1): u32 n, n x str missing_key
//   ERROR   (2): u8 StatusCode, str message
// The server answers GET/WAIT when the keys exist or, at the deadline, with
// TIMEOUT naming the missing keys, so a client never waits longer than its
// timeout plus a short grace for the reply to arrive.
//
// Thread-safety: TcpStoreServer runs one thread that owns the listening
// socket and every client connection (poll-based); its public methods are
// safe from any thread. A TcpStore client may be shared by threads, but its
// calls run one at a time (a blocking Get holds the client), so a thread must
// not Get a key that another thread sets through the same client: give each
// such thread its own TcpStore.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "common/store.h"

namespace tessera {

class TcpStoreServer {
 public:
  // Listens on `host`:`port` ("127.0.0.1" for loopback, "0.0.0.0" or "::" for
  // every interface; port 0 picks a free port, see port()) and starts the
  // server thread.
  // Errors: kInvalidArgument (host does not resolve), kIoError (bind/listen
  // failed, e.g. the port is taken).
  static StatusOr<std::unique_ptr<TcpStoreServer>> Start(const std::string& host = "127.0.0.1",
                                                         int port = 0);

  // Stops the thread and closes every connection; blocked clients see
  // kUnavailable.
  ~TcpStoreServer();

  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  const std::string& host() const { return host_; }
  // The port actually bound (useful after Start(host, 0)).
  int port() const { return port_; }

 private:
  TcpStoreServer(std::string host, int port, int listen_fd, int wake_read_fd, int wake_write_fd);
  void Run();

  const std::string host_;
  const int port_;
  const int listen_fd_;
  const int wake_read_fd_;   // the destructor writes a byte to wake_write_fd_
  const int wake_write_fd_;  // to make poll() return and the thread exit
  std::thread thread_;
};

class TcpStore : public Store {
 public:
  // Connects to a TcpStoreServer at `host`:`port`, retrying refused
  // connections (the server may start after this rank) until
  // `timeout_seconds` pass. `timeout_seconds` also bounds how long Set and
  // Add wait for the server's answer.
  // Errors: kUnavailable (nothing accepted the connection in time),
  // kInvalidArgument (host does not resolve).
  static StatusOr<std::unique_ptr<TcpStore>> Connect(const std::string& host, int port,
                                                     double timeout_seconds);

  ~TcpStore() override;

  Status Set(const std::string& key, const std::string& value) override;
  StatusOr<std::string> Get(const std::string& key, double timeout_seconds) override;
  Status Wait(const std::vector<std::string>& keys, double timeout_seconds) override;
  StatusOr<int64_t> Add(const std::string& key, int64_t delta) override;

  // "127.0.0.1:29500", for messages.
  std::string address() const;

 private:
  TcpStore(std::string host, int port, double timeout_seconds, int fd);

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
  std::mutex mu_;
  int fd_;  // guarded by mu_; -1 after a failure until the next reconnect
};

}  // namespace tessera
