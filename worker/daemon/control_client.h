// ControlClient: a worker's end of the control plane. It connects a ZeroMQ
// DEALER socket to the coordinator's ROUTER (coordinator/control/control_server.h),
// registers, heartbeats, and exchanges control::Envelopes
// (common/wire/control.proto) with the coordinator.
//
// Behaviour:
//  - Registration: Register() hands the Register message to the owner
//    thread, which sends it and sends it again every register_retry until a
//    RegisterAck arrives (the server acknowledges a repeat without
//    registering twice). An accepting ack sets worker_id() and starts the
//    heartbeats at the ack's interval; a refusing one ends the attempt
//    (WaitRegistered returns the reason).
//  - Heartbeats: sent by the owner thread every heartbeat interval while
//    registered, carrying the latest SetHeartbeat content (state IDLE until
//    the first call).
//  - Reconnects: ZeroMQ reconnects a dropped TCP connection by itself
//    (reconnect_interval growing to reconnect_interval_max). The socket's
//    routing id is fixed for the life of this object, so the coordinator
//    (ROUTER_HANDOVER) sees the same peer after a reconnect and the
//    registration survives it. Messages sent while disconnected wait in
//    ZeroMQ's queue (up to its high-water mark).
//  - CURVE (when curve_secret_key is set): the DEALER is a CURVE client of
//    the coordinator's key, so the connection is encrypted and the
//    coordinator's ZAP handler checks this worker's public key. When the
//    coordinator refuses the key, the handshake fails: registration ends
//    with that reason (WaitRegistered) instead of retrying forever. So does
//    a mechanism mismatch: CURVE on only one end (a worker without keys
//    pointed at a CURVE coordinator, or the reverse) ends registration with
//    a reason that names the missing keys.
//  - Gatekeeping: incoming frames are decoded with DecodeEnvelope; malformed
//    ones, unknown versions and messages addressed to another worker_id are
//    logged with the reason and dropped.
//
// Threading: one thread (started by Connect) owns the socket. The handler
// runs on that thread, one message at a time, and must not block for long.
// Register, Send, SetHeartbeat, WaitRegistered, accessors and stats are safe
// from any thread (Send also from the handler); Stop from any thread but the
// handler. ZeroMQ exceptions never leave this class.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "common/base/status.h"
#include "common/wire/control.pb.h"
#include "common/wire/control_codec.h"

namespace tessera {

struct ControlClientOptions {
  // Resend an unanswered Register after this long.
  std::chrono::milliseconds register_retry{1000};
  // ZeroMQ reconnect backoff: first retry after reconnect_interval, doubling
  // up to reconnect_interval_max.
  std::chrono::milliseconds reconnect_interval{100};
  std::chrono::milliseconds reconnect_interval_max{2000};
  // How long Stop keeps unsent messages to deliver.
  std::chrono::milliseconds linger{200};
  // Largest accepted or sent Envelope, bytes.
  size_t max_message_bytes = kDefaultMaxControlMessageBytes;
  // Every valid message from the coordinator, RegisterAck included: also
  // the refusing one (reason kRegisterAgainPrefix...) that says the
  // coordinator no longer knows this registered worker (it declared it lost,
  // or restarted); the client then registers again by itself. Optional.
  std::function<void(const control::Envelope& envelope)> on_message;
  // Each dropped frame with the reason (also logged). Optional.
  std::function<void(const Status& reason)> on_dropped;
  // Fills the live fields of each heartbeat as it is sent (on the client's
  // thread, under its lock: quick, no blocking). Optional.
  std::function<void(control::Heartbeat* heartbeat)> heartbeat_hook;

  // CURVE: this worker's secret key and the coordinator's public key, both
  // Z85 (40 characters); both "" = no CURVE (plain TCP). The public half of
  // the worker's key is derived from the secret.
  std::string curve_secret_key;
  std::string curve_server_key;
};

struct ControlClientStats {
  uint64_t frames_received = 0;
  uint64_t messages_delivered = 0;  // passed to on_message
  uint64_t dropped = 0;
  uint64_t messages_sent = 0;  // Register, Heartbeat and Send messages
  uint64_t heartbeats_sent = 0;
  uint64_t registers_sent = 0;
};

class ControlClient {
 public:
  explicit ControlClient(ControlClientOptions options);
  // Stops the thread (see Stop).
  ~ControlClient();

  ControlClient(const ControlClient&) = delete;
  ControlClient& operator=(const ControlClient&) = delete;

  // Connects the DEALER socket to `endpoint` ("tcp://10.0.0.1:5555") and
  // starts the owner thread. The coordinator need not be up yet: ZeroMQ
  // connects when it appears.
  // Errors: kFailedPrecondition (already connected: a client connects once),
  // kInvalidArgument (one CURVE key without the other, or not Z85),
  // kIoError (ZeroMQ refused the endpoint; the message names it).
  Status Connect(const std::string& endpoint);

  // Starts registration with `registration`, asking for `requested_worker_id`
  // (empty: the coordinator picks). Returns at once; see WaitRegistered.
  // Errors: kFailedPrecondition (not connected, or already registered),
  // kInvalidArgument (the Register fails ValidateEnvelope; the message names
  // the field).
  Status Register(control::Register registration, const std::string& requested_worker_id = "");

  // Waits until a RegisterAck arrives or `timeout` passes. Returns the
  // assigned worker id.
  // Errors: kFailedPrecondition (refused: the coordinator's reason, or its
  // refusal of this worker's CURVE key; or Register was not called),
  // kDeadlineExceeded (no ack in time).
  StatusOr<std::string> WaitRegistered(std::chrono::milliseconds timeout);

  // Sets the content of later heartbeats (state, plan version, memory).
  void SetHeartbeat(control::Heartbeat heartbeat);

  // Replaces the Register sent by later registrations (after Register). A
  // refusing RegisterAck whose reason starts with kRegisterAgainPrefix (the
  // coordinator restarted, or declared this worker lost) makes the client
  // register again by itself, asking for the id it had, with this content.
  // Errors: kInvalidArgument (fails ValidateEnvelope), kFailedPrecondition
  // (Register was not called).
  Status UpdateRegistration(control::Register registration);

  // Queues `envelope` for the coordinator, setting protocol_version,
  // worker_id and seq; the caller sets the body.
  // Errors: kFailedPrecondition (not registered, or stopped), those of
  // EncodeEnvelope.
  Status Send(control::Envelope envelope);

  // Whether an accepting RegisterAck arrived; the id it assigned (or "").
  bool registered() const;
  std::string worker_id() const;
  // The socket's ZeroMQ routing id ("w-" + 16 hex digits, random per object).
  const std::string& routing_id() const;
  ControlClientStats stats() const;

  // Stops heartbeats and the owner thread and closes the socket, delivering
  // queued messages for up to options.linger. Idempotent.
  void Stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera
