#include "worker/daemon/control_client.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <optional>
#include <random>
#include <thread>
#include <utility>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "common/base/logging.h"
#include "common/net/curve_keys.h"
#include "common/net/zmq_loop.h"

namespace tessera {
namespace {

constexpr const char* kLog = "control-client";
// Handshake events of the DEALER (zmq_socket_monitor).
constexpr const char* kMonitorEndpoint = "inproc://tessera-control-client-monitor";
constexpr int kMaxFramesPerTurn = 256;

using Clock = std::chrono::steady_clock;

std::string RandomRoutingId() {
  std::random_device rd;
  const uint64_t v = (uint64_t{rd()} << 32) ^ rd();
  static const char* kHex = "0123456789abcdef";
  std::string id = "w-";
  for (int shift = 60; shift >= 0; shift -= 4) id.push_back(kHex[(v >> shift) & 15]);
  return id;
}

// The bodies the coordinator may send; anything else is dropped.
bool IsCoordinatorToWorker(control::Envelope::BodyCase body) {
  switch (body) {
    case control::Envelope::kRegisterAck:
    case control::Envelope::kAssignShard:
    case control::Envelope::kStep:
    case control::Envelope::kGenerate:        // to a replica's leader
    case control::Envelope::kCancelRequests:  // to a replica's leader
    case control::Envelope::kDrain:
    case control::Envelope::kShutdown:
    case control::Envelope::kError:
      return true;
    default:
      return false;
  }
}

}  // namespace

struct ControlClient::Impl {
  struct Counters {
    std::atomic<uint64_t> frames_received{0}, messages_delivered{0}, dropped{0}, messages_sent{0},
        heartbeats_sent{0}, registers_sent{0};
  };

  explicit Impl(ControlClientOptions o) : options(std::move(o)), routing_id(RandomRoutingId()) {
    heartbeat.set_state(control::WORKER_STATE_IDLE);
  }

  ControlClientOptions options;
  const std::string routing_id;
  zmq::context_t context{1};
  std::unique_ptr<zmq::socket_t> dealer;   // loop thread only, after Connect
  std::unique_ptr<zmq::socket_t> monitor;  // handshake events, loop thread
  std::string curve_public_key;            // this worker's Z85 public key (CURVE only)
  bool connected_once = false;
  Counters counters;
  // The owner thread of dealer and monitor, and the queue of sends to run
  // there (common/net/zmq_loop.h). Declared after the sockets: it stops
  // (and closes them) before they are destroyed.
  ZmqSocketLoop loop{context, kLog};

  // Everything below is guarded by mu.
  mutable std::mutex mu;
  std::condition_variable registration_cv;
  bool closed = true;  // not connected yet, or stopped
  uint64_t next_seq = 1;
  std::optional<control::Envelope> register_envelope;  // set by Register()
  bool register_pending = false;                       // no ack yet
  Clock::time_point next_register;
  bool registered = false;
  std::string worker_id;
  std::string refusal;  // reason of a refusing ack
  // Reason the coordinator refused this worker's CURVE key. Sticky: the
  // handshake may fail before Register is called (while the worker still
  // discovers its topology), and a later Register must not forget it.
  std::string auth_refusal;
  std::chrono::milliseconds heartbeat_interval{0};
  Clock::time_point next_heartbeat;
  control::Heartbeat heartbeat;

  std::chrono::milliseconds PollTimeout();
  void ReadFrames();
  void ReadMonitor();
  void HandleFrame(std::vector<zmq::message_t>& parts);
  void Drop(const Status& reason);
  void RunTimers();
  bool SendNow(const std::string& bytes, const char* body);
  std::string EncodeLocked(control::Envelope& envelope);
};

ControlClient::ControlClient(ControlClientOptions options)
    : impl_(std::make_unique<Impl>(std::move(options))) {}

ControlClient::~ControlClient() { Stop(); }

Status ControlClient::Connect(const std::string& endpoint) {
  Impl& c = *impl_;
  if (c.connected_once)
    return FailedPrecondition("control client already connected (it connects once)");
  const bool curve = !c.options.curve_secret_key.empty();
  if (curve != !c.options.curve_server_key.empty())
    return InvalidArgument(
        "CURVE needs both this worker's secret key and the coordinator's public key");
  if (curve) {
    if (!IsZ85Key(c.options.curve_server_key))
      return InvalidArgument("the coordinator's CURVE public key is not 40 Z85 characters");
    StatusOr<std::string> pub = CurvePublicKey(c.options.curve_secret_key);
    if (!pub.ok()) return pub.status().WithContext("this worker's CURVE secret key");
    c.curve_public_key = *pub;
  }
  try {
    c.dealer = std::make_unique<zmq::socket_t>(c.context, zmq::socket_type::dealer);
    c.dealer->set(zmq::sockopt::routing_id, c.routing_id);
    if (curve) {
      c.dealer->set(zmq::sockopt::curve_serverkey, c.options.curve_server_key);
      c.dealer->set(zmq::sockopt::curve_publickey, c.curve_public_key);
      c.dealer->set(zmq::sockopt::curve_secretkey, c.options.curve_secret_key);
    }
    // Both modes: a mechanism mismatch (CURVE on one end only) must end
    // registration with a clear reason, not be retried forever.
    if (zmq_socket_monitor(c.dealer->handle(), kMonitorEndpoint,
                           ZMQ_EVENT_HANDSHAKE_FAILED_AUTH | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                               ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL) != 0)
      throw zmq::error_t();
    c.monitor = std::make_unique<zmq::socket_t>(c.context, zmq::socket_type::pair);
    c.monitor->set(zmq::sockopt::linger, 0);
    c.monitor->connect(kMonitorEndpoint);
    c.dealer->set(zmq::sockopt::linger, static_cast<int>(c.options.linger.count()));
    c.dealer->set(zmq::sockopt::reconnect_ivl,
                  static_cast<int>(c.options.reconnect_interval.count()));
    c.dealer->set(zmq::sockopt::reconnect_ivl_max,
                  static_cast<int>(c.options.reconnect_interval_max.count()));
    const int64_t cap = c.options.max_message_bytes > static_cast<size_t>(INT64_MAX / 2)
                            ? INT64_MAX
                            : static_cast<int64_t>(c.options.max_message_bytes) * 2;
    c.dealer->set(zmq::sockopt::maxmsgsize, cap);
    c.dealer->connect(endpoint);
  } catch (const zmq::error_t& e) {
    c.monitor.reset();
    c.dealer.reset();
    return IoError("control client cannot connect to '" + endpoint + "': " + e.what());
  }
  ZmqSocketLoop::Hooks hooks;
  hooks.watches = {{c.monitor.get(), [&c] { c.ReadMonitor(); }},
                   {c.dealer.get(), [&c] { c.ReadFrames(); }}};
  hooks.poll_timeout = [&c] { return c.PollTimeout(); };
  hooks.after_poll = [&c] { c.RunTimers(); };
  hooks.on_exit = [&c] {
    if (c.monitor) {
      zmq_socket_monitor(c.dealer->handle(), nullptr, 0);
      c.monitor->close();
    }
    c.dealer->close();
  };
  {
    // Opened before the loop runs: a Register right after Connect finds
    // the client connected.
    std::lock_guard<std::mutex> lock(c.mu);
    c.closed = false;
  }
  if (Status st = c.loop.Start(std::move(hooks)); !st.ok()) {
    std::lock_guard<std::mutex> lock(c.mu);
    c.closed = true;
    c.monitor.reset();
    c.dealer.reset();
    return st;
  }
  c.connected_once = true;
  TESSERA_LOG_INFO(kLog, "connecting to {} as peer {}{}", endpoint, c.routing_id,
                   curve ? " with CURVE key " + c.curve_public_key : std::string());
  return Status::Ok();
}

Status ControlClient::Register(control::Register registration,
                               const std::string& requested_worker_id) {
  Impl& c = *impl_;
  control::Envelope envelope;
  envelope.set_protocol_version(kControlProtocolVersion);
  envelope.set_worker_id(requested_worker_id);
  *envelope.mutable_register_worker() = std::move(registration);
  TESSERA_RETURN_IF_ERROR(ValidateEnvelope(envelope));
  std::lock_guard<std::mutex> lock(c.mu);
  if (c.closed) return FailedPrecondition("control client is not connected");
  if (c.registered)
    return FailedPrecondition("control client is already registered as '" + c.worker_id + "'");
  c.register_envelope = std::move(envelope);
  c.register_pending = c.auth_refusal.empty();  // a refused key cannot register
  c.refusal.clear();
  c.next_register = Clock::now();
  c.loop.Wake();
  return Status::Ok();
}

Status ControlClient::UpdateRegistration(control::Register registration) {
  Impl& c = *impl_;
  std::lock_guard<std::mutex> lock(c.mu);
  if (!c.register_envelope) return FailedPrecondition("Register was not called");
  control::Envelope envelope = *c.register_envelope;
  *envelope.mutable_register_worker() = std::move(registration);
  TESSERA_RETURN_IF_ERROR(ValidateEnvelope(envelope));
  c.register_envelope = std::move(envelope);
  return Status::Ok();
}

StatusOr<std::string> ControlClient::WaitRegistered(std::chrono::milliseconds timeout) {
  Impl& c = *impl_;
  std::unique_lock<std::mutex> lock(c.mu);
  if (!c.register_envelope) return FailedPrecondition("Register was not called");
  const bool done = c.registration_cv.wait_for(lock, timeout, [&c] {
    return c.registered || !c.refusal.empty() || !c.auth_refusal.empty();
  });
  if (c.registered) return c.worker_id;
  if (!c.auth_refusal.empty())
    return FailedPrecondition("coordinator refused the registration: " + c.auth_refusal);
  if (!c.refusal.empty())
    return FailedPrecondition("coordinator refused the registration: " + c.refusal);
  (void)done;
  return DeadlineExceeded("no RegisterAck from the coordinator within " +
                          std::to_string(timeout.count()) + " ms");
}

void ControlClient::SetHeartbeat(control::Heartbeat heartbeat) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->heartbeat = std::move(heartbeat);
}

Status ControlClient::Send(control::Envelope envelope) {
  Impl& c = *impl_;
  std::lock_guard<std::mutex> lock(c.mu);
  if (c.closed) return FailedPrecondition("control client is not connected or stopped");
  if (!c.registered) return FailedPrecondition("control client is not registered yet");
  envelope.set_protocol_version(kControlProtocolVersion);
  envelope.set_worker_id(c.worker_id);
  envelope.set_seq(c.next_seq++);
  TESSERA_ASSIGN_OR_RETURN(std::string bytes,
                           EncodeEnvelope(envelope, c.options.max_message_bytes));
  // Posted under mu: the loop sends in seq order.
  if (!c.loop.Post([&c, bytes = std::move(bytes)] { c.SendNow(bytes, "message"); }))
    return FailedPrecondition("control client is not connected or stopped");
  return Status::Ok();
}

bool ControlClient::registered() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->registered;
}

std::string ControlClient::worker_id() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->worker_id;
}

const std::string& ControlClient::routing_id() const { return impl_->routing_id; }

ControlClientStats ControlClient::stats() const {
  const Impl::Counters& k = impl_->counters;
  ControlClientStats st;
  st.frames_received = k.frames_received;
  st.messages_delivered = k.messages_delivered;
  st.dropped = k.dropped;
  st.messages_sent = k.messages_sent;
  st.heartbeats_sent = k.heartbeats_sent;
  st.registers_sent = k.registers_sent;
  return st;
}

void ControlClient::Stop() {
  Impl& c = *impl_;
  if (!c.loop.running()) return;
  c.loop.Stop();
  std::lock_guard<std::mutex> lock(c.mu);
  c.closed = true;
  c.registration_cv.notify_all();
}

std::string ControlClient::Impl::EncodeLocked(control::Envelope& envelope) {
  envelope.set_seq(next_seq++);
  StatusOr<std::string> bytes = EncodeEnvelope(envelope, options.max_message_bytes);
  if (!bytes.ok()) {
    TESSERA_LOG_ERROR(kLog, "cannot encode {}: {}", EnvelopeBodyName(envelope),
                      bytes.status().ToString());
    return {};
  }
  return std::move(*bytes);
}

std::chrono::milliseconds ControlClient::Impl::PollTimeout() {
  using std::chrono::milliseconds;
  milliseconds timeout(100);
  std::lock_guard<std::mutex> lock(mu);
  const Clock::time_point now = Clock::now();
  auto until = [&](Clock::time_point t) {
    return std::chrono::duration_cast<milliseconds>(t - now) + milliseconds(1);
  };
  if (register_pending) timeout = std::min(timeout, until(next_register));
  if (registered) timeout = std::min(timeout, until(next_heartbeat));
  return std::max(timeout, milliseconds(0));
}

void ControlClient::Impl::RunTimers() {
  std::string register_bytes, heartbeat_bytes;
  {
    std::lock_guard<std::mutex> lock(mu);
    const Clock::time_point now = Clock::now();
    if (register_pending && now >= next_register) {
      register_bytes = EncodeLocked(*register_envelope);
      next_register = now + options.register_retry;
    }
    if (registered && now >= next_heartbeat) {
      control::Envelope envelope;
      envelope.set_protocol_version(kControlProtocolVersion);
      envelope.set_worker_id(worker_id);
      *envelope.mutable_heartbeat() = heartbeat;
      if (options.heartbeat_hook) options.heartbeat_hook(envelope.mutable_heartbeat());
      heartbeat_bytes = EncodeLocked(envelope);
      // Keep the cadence, but never burst to catch up after a stall.
      next_heartbeat = std::max(next_heartbeat + heartbeat_interval, now);
    }
  }
  if (!register_bytes.empty() && SendNow(register_bytes, "register_worker"))
    ++counters.registers_sent;
  if (!heartbeat_bytes.empty() && SendNow(heartbeat_bytes, "heartbeat")) ++counters.heartbeats_sent;
}

bool ControlClient::Impl::SendNow(const std::string& bytes, const char* body) {
  try {
    zmq::message_t payload(bytes.data(), bytes.size());
    if (dealer->send(payload, zmq::send_flags::dontwait)) {
      ++counters.messages_sent;
      return true;
    }
    TESSERA_LOG_WARN(kLog, "send of {} failed: the queue to the coordinator is full", body);
  } catch (const zmq::error_t& e) {
    TESSERA_LOG_WARN(kLog, "send of {} failed: {}", body, e.what());
  }
  return false;
}

void ControlClient::Impl::ReadFrames() {
  for (int i = 0; i < kMaxFramesPerTurn && !loop.stopping(); ++i) {
    std::vector<zmq::message_t> parts;
    zmq::message_t part;
    bool more = true;
    bool got = false;
    while (more) {
      if (!dealer->recv(part, zmq::recv_flags::dontwait)) break;
      got = true;
      more = part.more();
      parts.push_back(std::move(part));
    }
    if (!got) return;
    ++counters.frames_received;
    try {
      HandleFrame(parts);
    } catch (const std::exception& e) {
      TESSERA_LOG_ERROR(kLog, "handling a message from the coordinator threw: {}", e.what());
    }
  }
}

// A failed CURVE handshake: the coordinator refused this worker's key (ZAP
// status in the event value) or the keys do not fit together. Registration
// ends with the reason; ZeroMQ would otherwise retry the handshake forever.
void ControlClient::Impl::ReadMonitor() {
  // Ends a pending registration with `why` (logged once per refusal).
  auto refuse = [this](const std::string& why) {
    TESSERA_LOG_ERROR(kLog, "{}", why);
    std::lock_guard<std::mutex> lock(mu);
    if (!registered && auth_refusal.empty()) {
      register_pending = false;
      auth_refusal = why;
      registration_cv.notify_all();
    }
  };
  std::vector<zmq::message_t> event;
  while (zmq::recv_multipart(*monitor, std::back_inserter(event), zmq::recv_flags::dontwait)) {
    if (event.size() >= 1 && event[0].size() >= 6) {
      uint16_t id = 0;
      uint32_t value = 0;
      std::memcpy(&id, event[0].data(), sizeof id);
      std::memcpy(&value, static_cast<const char*>(event[0].data()) + 2, sizeof value);
      const bool curve = !options.curve_secret_key.empty();
      if (id == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL &&
          value == ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH) {
        const std::string why =
            curve ? "the coordinator does not use CURVE but this worker does "
                    "(control.worker_secret_key_file is set); give the coordinator "
                    "control.coordinator_secret_key_file and control.worker_public_keys"
                  : "the coordinator requires CURVE but this worker has no key; set "
                    "control.worker_secret_key_file and control.coordinator_public_key "
                    "(tessera keygen)";
        refuse(why);
        event.clear();
        continue;
      }
      if (!curve) {
        event.clear();
        continue;
      }
      if (id != ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) {
        // Possibly transient (a coordinator restarting mid-handshake): ZeroMQ
        // retries; a wrong coordinator key shows up here on every retry.
        TESSERA_LOG_WARN(kLog,
                         "the CURVE handshake with the coordinator failed (event {}, code {}); "
                         "is control.coordinator_public_key the coordinator's key?",
                         id, value);
        event.clear();
        continue;
      }
      const std::string why = "the coordinator refused this worker's CURVE public key " +
                              curve_public_key + " (ZAP status " + std::to_string(value) +
                              "); list it in the coordinator's control.worker_public_keys";
      refuse(why);
    }
    event.clear();
  }
}

void ControlClient::Impl::Drop(const Status& reason) {
  ++counters.dropped;
  TESSERA_LOG_WARN(kLog, "dropped message from the coordinator: {}", reason.ToString());
  if (options.on_dropped) options.on_dropped(reason);
}

void ControlClient::Impl::HandleFrame(std::vector<zmq::message_t>& parts) {
  if (parts.size() != 1) {
    Drop(InvalidArgument("expected 1 frame, got " + std::to_string(parts.size())));
    return;
  }
  StatusOr<control::Envelope> decoded =
      DecodeEnvelope(parts[0].to_string_view(), options.max_message_bytes);
  if (!decoded.ok()) {
    Drop(decoded.status());
    return;
  }
  const control::Envelope& envelope = *decoded;
  const std::string body = EnvelopeBodyName(envelope);
  Status reason;
  bool deliver = true;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (envelope.body_case() == control::Envelope::kRegisterAck) {
      const control::RegisterAck& ack = envelope.register_ack();
      const bool again = !ack.accepted() && ack.reason().rfind(kRegisterAgainPrefix, 0) == 0;
      if (again) {
        // Delivered while registered: the worker drops the plan it runs
        // (the coordinator declared it lost, or restarted), see on_message.
        deliver = registered;
        if (registered) {
          // The coordinator does not know us (any more): register again,
          // asking for the same id.
          TESSERA_LOG_WARN(kLog, "the coordinator asks worker '{}' to register again ({})",
                           worker_id, ack.reason());
          registered = false;
          register_pending = true;
          if (register_envelope) register_envelope->set_worker_id(worker_id);
          next_register = Clock::now();
          loop.Wake();
        }  // else: a Register is on its way already
      } else if (registered) {
        if (ack.accepted() && ack.worker_id() == worker_id) {
          deliver = false;  // the answer to a retried Register; nothing changes
        } else {
          reason = FailedPrecondition("register_ack for '" + ack.worker_id() +
                                      "' while registered as '" + worker_id + "'");
        }
      } else if (!register_pending) {
        reason = FailedPrecondition("register_ack while no Register is pending");
      } else if (ack.accepted()) {
        registered = true;
        register_pending = false;
        worker_id = ack.worker_id();
        heartbeat_interval = std::chrono::milliseconds(ack.heartbeat_interval_ms());
        next_heartbeat = Clock::now();  // the first heartbeat goes out at once
        registration_cv.notify_all();
        TESSERA_LOG_INFO(kLog, "registered as worker '{}' (heartbeat every {} ms)", worker_id,
                         ack.heartbeat_interval_ms());
      } else {
        register_pending = false;
        refusal = ack.reason();
        registration_cv.notify_all();
        TESSERA_LOG_WARN(kLog, "registration refused: {}", ack.reason());
      }
    } else if (!registered) {
      reason = FailedPrecondition(body + " arrived before this worker registered");
    } else if (envelope.worker_id() != worker_id) {
      reason = FailedPrecondition(body + " is addressed to worker '" + envelope.worker_id() +
                                  "', this is '" + worker_id + "'");
    } else if (!IsCoordinatorToWorker(envelope.body_case())) {
      reason = InvalidArgument(body + " is not a message the coordinator sends");
    }
  }
  if (!reason.ok()) {
    Drop(reason);
    return;
  }
  if (!deliver) return;
  TESSERA_LOG_DEBUG(kLog, "{} from the coordinator (seq {})", body, envelope.seq());
  ++counters.messages_delivered;
  if (options.on_message) options.on_message(envelope);
}

}  // namespace tessera
