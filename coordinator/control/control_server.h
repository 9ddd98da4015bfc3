// ControlServer: the coordinator's end of the control plane. It binds a
// ZeroMQ ROUTER socket that every worker's DEALER (worker/daemon/control_client.h)
// connects to, and exchanges control::Envelopes (common/wire/control.proto)
// with them.
//
// What it does on its own:
//  - Registration: a Register from any peer is answered with a RegisterAck.
//    The worker gets the id it asked for, or "worker-<n>" when it asked for
//    none; it is refused when another live peer holds that id, when the peer
//    is registered under a different id, or when the `accept_register` hook
//    says no. A repeated Register from a registered peer (a retry) is
//    acknowledged again with the same id and not delivered twice.
//  - Gatekeeping: every frame is decoded with DecodeEnvelope. Malformed
//    frames (not one payload frame, not a protobuf Envelope, over the size
//    limit, fields out of range), unknown protocol versions, and any message
//    but Register from a peer that is not registered (or was declared lost,
//    or whose worker_id is not the one assigned to it) are logged with the
//    reason (the first drop of each peer) and dropped; the loop keeps
//    serving. A peer that is not
//    registered or was declared lost is also answered with a refusing
//    RegisterAck whose reason starts with kRegisterAgainPrefix, so a worker
//    that outlived a coordinator restart (or its own loss) registers again.
//  - Authentication (when curve_secret_key is set): the ROUTER is a CURVE
//    server, so every connection is encrypted and authenticated. A ZAP
//    handler on the owner thread admits only the public keys in
//    curve_allowed_public_keys; any other key is refused during the
//    handshake (the peer never reaches the socket) and logged with its
//    address and key. A registered worker stays bound to the key it
//    registered with: a frame from the same routing id under another key is
//    dropped.
//    One key, one worker: a Register under the CURVE key of another live
//    worker is refused and logged (a stolen or shared key cannot add a
//    second worker).
//  - Bounds: at most max_workers records (live workers plus lost ones not
//    yet forgotten); a Register beyond that is refused (logged once until a
//    record frees up). A worker that registers again (after its loss, or a
//    restart under the same id, routing id or CURVE key) replaces its lost
//    record instead of adding one.
//  - Liveness: a registered worker from which no valid message arrived for
//    heartbeat_miss_limit * heartbeat_interval is declared lost once:
//    `on_worker_lost(worker_id, loss)` is called and later messages from it
//    are dropped until it registers again. So is a worker whose control
//    connection closed (a socket monitor reports it; the connection of a
//    worker is the one its last valid message came on) and that was not
//    heard from again within kClosedConnectionGraceSeconds: a killed
//    process's kernel closes its sockets at once, so a kill -9 is acted on
//    in well under a second instead of after the heartbeat timeout, while a
//    live worker that reconnects (ZeroMQ does so by itself) and speaks is
//    kept. A lost record is forgotten after
//    forget_lost_after (`on_worker_forgotten(worker_id)`): Workers() no
//    longer lists it.
//  - Events (activity(), worker_activity.h): a registration, a loss, a
//    closed connection, and the next message of a watched worker (Watch)
//    advance the activity's generation, after their callbacks ran, so
//    threads wait for them instead of polling Workers(). Other messages
//    are no event (a fleet's steps wake nobody).
//
// Threading: one thread (started by Start) owns the ROUTER socket and runs a
// poll loop; the callbacks run on that thread, one at a time, and must not
// block for long (hand work to another thread). Send, Workers, stats and Stop
// are safe from any thread, including from inside a callback (Stop excepted:
// not from a callback). Other threads reach the socket only through Send,
// which queues the encoded message and wakes the loop through an inproc PAIR
// socket. ZeroMQ exceptions never leave this class.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/base/status.h"
#include "common/config/daemon_config.h"
#include "common/wire/control.pb.h"
#include "common/wire/control_codec.h"
#include "coordinator/control/worker_activity.h"

namespace tessera {

// A worker whose control connection closed is declared lost unless a valid
// message from it arrives within this many seconds (the grace a survivor's
// accusation gets too: coordinator/serving/plan_runner.cc).
inline constexpr double kClosedConnectionGraceSeconds = 0.2;

// Why a worker was declared lost, for on_worker_lost.
struct ControlWorkerLoss {
  enum class Cause { kMissedHeartbeats, kConnectionClosed };
  Cause cause = Cause::kMissedHeartbeats;
  // The first sign of the loss: when its connection closed, or (missed
  // heartbeats) its last valid message. The time to detect the loss is
  // measured from here (GET /admin/plan history `detect_seconds`).
  std::chrono::steady_clock::time_point since;
  // "missed heartbeats" or "its control connection closed", for logs and
  // re-plan reasons.
  const char* reason() const {
    return cause == Cause::kConnectionClosed ? "its control connection closed"
                                             : "missed heartbeats";
  }
};

// A connected peer as the server sees it.
struct ControlPeer {
  // ZeroMQ routing id of the peer's DEALER, printable ("w-1f3a...", or hex
  // "0x..." for binary ids).
  std::string identity;
  // The id assigned at registration; empty when not registered.
  std::string worker_id;
};

struct ControlServerOptions {
  // Heartbeat period announced to workers (RegisterAck.heartbeat_interval_ms).
  // Default: heartbeat.interval_seconds'.
  std::chrono::milliseconds heartbeat_interval{
      static_cast<int64_t>(HeartbeatSection{}.interval_seconds * 1000)};
  // A worker silent for heartbeat_miss_limit * heartbeat_interval is lost.
  int heartbeat_miss_limit = 3;
  // Largest accepted or sent Envelope, bytes. ZeroMQ itself disconnects a
  // peer sending a frame over twice this (ZMQ_MAXMSGSIZE), so a huge frame
  // never reaches memory.
  size_t max_message_bytes = kDefaultMaxControlMessageBytes;
  // How long Stop keeps unsent messages to deliver, milliseconds.
  std::chrono::milliseconds linger{200};

  // Every valid message from a registered worker, and each accepted
  // Register (its Envelope.worker_id set to the assigned id). The envelope
  // is the handler's to move from: nothing reads it after the call. It
  // lives on an arena that is reset after the call: keep nothing that
  // points into it (moving a body out of it copies).
  // Optional.
  std::function<void(const ControlPeer& peer, control::Envelope& envelope)> on_message;
  // A registered worker missed its heartbeats, or its connection closed
  // and it stayed silent (see Liveness). Optional.
  std::function<void(const std::string& worker_id, const ControlWorkerLoss& loss)> on_worker_lost;
  // Vets a Register before it is accepted; a non-OK Status refuses it with
  // the status message as RegisterAck.reason. Optional (default: accept).
  std::function<Status(const ControlPeer& peer, const control::Register& registration)>
      accept_register;
  // Each dropped frame with the reason (also logged). For tests and metrics.
  std::function<void(const ControlPeer& peer, const Status& reason)> on_dropped;
  // A worker's record is gone: forgotten after its loss, or replaced by a
  // registration under another id (same routing id or CURVE key). Optional.
  std::function<void(const std::string& worker_id)> on_worker_forgotten;

  // Worker records kept at once, live and lost (not yet forgotten); a
  // Register that would add one more is refused. 0 = no bound. Default:
  // server.max_workers'.
  size_t max_workers = static_cast<size_t>(ServerSection{}.max_workers);
  // How long a lost worker's record is kept before it is forgotten;
  // 0 = until the worker registers again.
  std::chrono::milliseconds forget_lost_after{0};

  // CURVE (ZeroMQ CurveZMQ): this server's secret key, Z85 (40 characters);
  // "" = no CURVE: plain TCP, anyone who can reach the endpoint may connect.
  std::string curve_secret_key;
  // Public keys (Z85) of the workers allowed to connect when CURVE is on.
  std::vector<std::string> curve_allowed_public_keys;
};

// Counters since Start.
struct ControlServerStats {
  uint64_t frames_received = 0;       // ZeroMQ messages read from the socket
  uint64_t messages_delivered = 0;    // passed to on_message
  uint64_t dropped_malformed = 0;     // bad frames, bytes, size or fields
  uint64_t dropped_version = 0;       // unsupported protocol_version
  uint64_t dropped_unregistered = 0;  // not from a registered, live worker
  uint64_t registrations_accepted = 0;
  uint64_t registrations_refused = 0;
  uint64_t workers_lost = 0;
  uint64_t connections_closed = 0;  // a registered worker's connection closed (socket monitor)
  uint64_t messages_sent = 0;
  uint64_t send_failures = 0;                     // peer gone (EHOSTUNREACH) or its queue full
  uint64_t handshakes_refused = 0;                // CURVE connections with a key not allowed
  uint64_t registrations_refused_key_in_use = 0;  // CURVE key of another live worker
  uint64_t registrations_refused_full = 0;        // max_workers records held
  uint64_t workers_forgotten = 0;                 // lost records dropped or replaced
};

// One registered worker.
struct ControlWorkerInfo {
  std::string worker_id;
  std::string identity;
  // As it registered; never null. Shared, not copied: a snapshot of a
  // fleet's workers must not copy thousands of topology reports.
  std::shared_ptr<const control::Register> registration;
  std::string curve_public_key;  // the Z85 key it authenticated with ("" without CURVE)
  bool alive = true;             // false once declared lost
  // Its control connection closed (the worker exited or was cut off) and
  // nothing was heard from it since on another.
  bool connection_closed = false;
  double seconds_since_last_message = 0;
  uint64_t messages_received = 0;  // valid messages, including Register
};

class ControlServer {
 public:
  explicit ControlServer(ControlServerOptions options);
  // Stops the thread (see Stop).
  ~ControlServer();

  ControlServer(const ControlServer&) = delete;
  ControlServer& operator=(const ControlServer&) = delete;

  // Binds the ROUTER socket to `endpoint` ("tcp://0.0.0.0:5555";
  // "tcp://127.0.0.1:*" picks a free port) and starts the owner thread.
  // Returns the bound endpoint with the actual port ("tcp://127.0.0.1:41234").
  // Errors: kFailedPrecondition (already started: a server starts once),
  // kInvalidArgument (options out of range: heartbeat_interval not in
  // 1..UINT32_MAX ms, heartbeat_miss_limit < 1; a CURVE key that is not Z85,
  // CURVE without any allowed key), kUnimplemented (CURVE asked of a libzmq
  // without it),
  // kIoError (ZeroMQ refused the endpoint: malformed, port taken; the
  // message names the endpoint).
  StatusOr<std::string> Start(const std::string& endpoint);

  // Queues `envelope` for the worker registered as `worker_id`. Sets its
  // protocol_version, worker_id and seq; the caller sets the body.
  // Delivery is best effort: a failure after queueing (peer disconnected,
  // its queue full) is logged and counted in send_failures.
  // Errors: kFailedPrecondition (not running), kNotFound (no such worker),
  // kUnavailable (the worker was declared lost), those of EncodeEnvelope.
  Status Send(const std::string& worker_id, control::Envelope envelope);

  // Snapshot of every worker record, live or lost (not yet forgotten), in
  // registration order (a re-registration replaces the worker's lost record
  // and goes to the end).
  std::vector<ControlWorkerInfo> Workers() const;
  // The records of `worker_ids` that exist (live or lost), in the order
  // asked; O(k log n), for a caller that needs a few of a fleet's workers.
  std::vector<ControlWorkerInfo> WorkersOf(const std::vector<std::string>& worker_ids) const;
  // The records [first, first + count) of Workers()' order, and in `total`
  // how many there are: one page of a fleet without a snapshot of all of it.
  std::vector<ControlWorkerInfo> WorkersPage(size_t first, size_t count, size_t* total) const;
  ControlServerStats stats() const;

  // Thread-safe: declares `worker_id` lost now, as a heartbeat timeout does
  // (its later messages are refused with "register again"), logging
  // `reason`. Does not call on_worker_lost: the caller acts on the loss.
  // Returns false when no such worker is registered or it was lost already.
  bool DeclareLost(const std::string& worker_id, const std::string& reason);

  // The events of this server's workers (see Events above), to wait on.
  WorkerActivity& activity() const;
  // Watches `worker_ids`: the next valid message from each advances
  // activity() (once; a later message is no event unless watched again).
  // For a thread that waits until given workers speak; their losses are
  // events anyway. Ids with no live record are skipped. Thread-safe,
  // O(k log n) for k ids of n workers.
  void Watch(const std::vector<std::string>& worker_ids);

  // Stops the owner thread and closes the socket, delivering queued messages
  // for up to options.linger. Idempotent. Not from a callback.
  void Stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera
