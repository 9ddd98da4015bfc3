#include "coordinator/control/control_server.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <optional>
#include <set>
#include <thread>
#include <unordered_map>
#include <utility>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "common/base/log_window.h"
#include "common/base/logging.h"
#include "common/base/mutex.h"
#include "common/net/curve_keys.h"
#include "common/net/zmq_loop.h"
#include "coordinator/control/control_server_impl.h"

namespace tessera {

using control_server_internal::Clock;
using control_server_internal::kLog;
using control_server_internal::PrintableIdentity;

namespace {

// Where libzmq sends ZAP requests (RFC 27), one handler per context.
constexpr const char* kZapEndpoint = "inproc://zeromq.zap.01";
constexpr const char* kZapDomain = "tessera-control";
// Where the ROUTER's socket monitor publishes its disconnect events.
constexpr const char* kMonitorEndpoint = "inproc://tessera-control-monitor";
// Frames read per loop turn before the loop looks at its send queue and at
// liveness again, so a flood from one peer cannot starve either.
constexpr int kMaxFramesPerTurn = 256;
// ZAP requests answered per loop turn (each is one CURVE handshake).
constexpr int kMaxZapPerTurn = 256;
// Peers whose first dropped frame is logged; drops from further peers (a
// flood of routing ids) are counted only.
constexpr size_t kMaxDropLoggedPeers = 1024;

// The record index `index` holds for `key`, or null.
template <typename Index>
const size_t* Find(const Index& index, const std::string& key) {
  auto it = index.find(key);
  return it == index.end() ? nullptr : &it->second;
}

// The bodies a worker may send; anything else from a worker is dropped.
bool IsWorkerToCoordinator(control::Envelope::BodyCase body) {
  switch (body) {
    case control::Envelope::kRegisterWorker:
    case control::Envelope::kHeartbeat:
    case control::Envelope::kLoadProgress:
    case control::Envelope::kLoaded:
    case control::Envelope::kStepResult:
    case control::Envelope::kRequestUpdates:  // from a replica's leader
    case control::Envelope::kError:
      return true;
    default:
      return false;
  }
}

}  // namespace

ControlServer::ControlServer(ControlServerOptions options)
    : impl_(std::make_unique<Impl>(std::move(options))) {}

ControlServer::~ControlServer() { Stop(); }

StatusOr<std::string> ControlServer::Start(const std::string& endpoint) {
  Impl& s = *impl_;
  if (s.started) return FailedPrecondition("control server already started (it starts once)");
  if (s.options.heartbeat_interval.count() < 1 ||
      s.options.heartbeat_interval.count() > int64_t{UINT32_MAX})
    return InvalidArgument("heartbeat_interval must be in 1..4294967295 ms, got " +
                           std::to_string(s.options.heartbeat_interval.count()));
  if (s.options.heartbeat_miss_limit < 1)
    return InvalidArgument("heartbeat_miss_limit must be >= 1, got " +
                           std::to_string(s.options.heartbeat_miss_limit));
  const bool curve = !s.options.curve_secret_key.empty();
  if (curve) {
    if (!zmq_has("curve"))
      return Unimplemented("CURVE is configured but this libzmq was built without it");
    if (!IsZ85Key(s.options.curve_secret_key))
      return InvalidArgument("the control plane's CURVE secret key is not 40 Z85 characters");
    if (s.options.curve_allowed_public_keys.empty())
      return InvalidArgument("CURVE is on but no worker public key is allowed");
    for (const std::string& key : s.options.curve_allowed_public_keys) {
      uint8_t raw[32];
      if (!IsZ85Key(key) || zmq_z85_decode(raw, key.c_str()) == nullptr)
        return InvalidArgument("allowed worker public key '" + key + "' is not 40 Z85 characters");
      s.allowed_keys.emplace(reinterpret_cast<const char*>(raw), sizeof raw);
    }
  }
  std::string bound;
  try {
    if (curve) {
      // The handler must be bound before any connection is authenticated.
      s.zap = std::make_unique<zmq::socket_t>(s.context, zmq::socket_type::rep);
      s.zap->set(zmq::sockopt::linger, 0);
      s.zap->bind(kZapEndpoint);
    }
    s.router = std::make_unique<zmq::socket_t>(s.context, zmq::socket_type::router);
    if (curve) {
      s.router->set(zmq::sockopt::curve_server, 1);
      s.router->set(zmq::sockopt::curve_secretkey, s.options.curve_secret_key);
      s.router->set(zmq::sockopt::zap_domain, kZapDomain);
    }
    s.router->set(zmq::sockopt::router_mandatory, 1);
    s.router->set(zmq::sockopt::router_handover, 1);
    // A fleet's workers connect at once (a coordinator restart): a listen
    // queue of ZeroMQ's default 100 drops the rest, and each waits out a
    // TCP retransmit (1 s, 3 s, 7 s...). The kernel caps it at somaxconn.
    s.router->set(zmq::sockopt::backlog,
                  static_cast<int>(std::clamp<size_t>(s.options.max_workers, 100, 65535)));
    s.router->set(zmq::sockopt::linger, static_cast<int>(s.options.linger.count()));
    const int64_t cap = s.options.max_message_bytes > static_cast<size_t>(INT64_MAX / 2)
                            ? INT64_MAX
                            : static_cast<int64_t>(s.options.max_message_bytes) * 2;
    s.router->set(zmq::sockopt::maxmsgsize, cap);
    // A closed connection is reported at once (a killed worker's kernel
    // closes it), before the heartbeats run out.
    if (zmq_socket_monitor(s.router->handle(), kMonitorEndpoint, ZMQ_EVENT_DISCONNECTED) != 0)
      throw zmq::error_t();
    s.monitor = std::make_unique<zmq::socket_t>(s.context, zmq::socket_type::pair);
    s.monitor->set(zmq::sockopt::linger, 0);
    s.monitor->connect(kMonitorEndpoint);
    s.router->bind(endpoint);
    bound = s.router->get(zmq::sockopt::last_endpoint);
  } catch (const zmq::error_t& e) {
    s.monitor.reset();
    s.router.reset();
    s.zap.reset();
    return IoError("control server cannot bind '" + endpoint + "': " + e.what());
  }
  using std::chrono::milliseconds;
  const milliseconds poll_timeout =
      std::clamp(s.options.heartbeat_interval / 4, milliseconds(5), milliseconds(100));
  ZmqSocketLoop::Hooks hooks;
  // The monitor first: a closed connection's event is read before any
  // frame of a later connection that reuses its file descriptor.
  hooks.watches = {{s.monitor.get(), [&s] { s.HandleMonitor(); }},
                   {s.zap.get(), [&s] { s.HandleZap(); }},
                   {s.router.get(), [&s] { s.ReadFrames(); }}};
  hooks.poll_timeout = [poll_timeout] { return poll_timeout; };
  hooks.after_poll = [&s] { s.CheckLiveness(); };
  hooks.on_exit = [&s] {
    s.monitor->close();
    s.router->close();
    if (s.zap) s.zap->close();
  };
  if (Status st = s.loop.Start(std::move(hooks)); !st.ok()) {
    s.monitor.reset();
    s.router.reset();
    s.zap.reset();
    return st;
  }
  s.started = true;
  TESSERA_LOG_INFO(kLog, "listening on {} (heartbeat {} ms, lost after {} missed; {})", bound,
                   s.options.heartbeat_interval.count(), s.options.heartbeat_miss_limit,
                   curve ? fmt::format("CURVE, {} allowed worker keys", s.allowed_keys.size())
                         : std::string("no CURVE: plain TCP"));
  return bound;
}

void ControlServer::Stop() { impl_->loop.Stop(); }

bool ControlServer::DeclareLost(const std::string& worker_id, const std::string& reason) {
  Impl& s = *impl_;
  {
    MutexLock lock(&s.registry_mu);
    auto it = s.by_worker_id.find(worker_id);
    if (it == s.by_worker_id.end()) return false;
    Impl::Record& rec = s.records[it->second];
    if (!rec.alive) return false;
    rec.alive = false;
    rec.watched = false;
    rec.lost_at = Clock::now();
  }
  ++s.counters.workers_lost;
  TESSERA_LOG_WARN(kLog, "worker '{}' declared lost: {}", worker_id, reason);
  s.activity.Notify();
  return true;
}

WorkerActivity& ControlServer::activity() const { return impl_->activity; }

void ControlServer::Watch(const std::vector<std::string>& worker_ids) {
  Impl& s = *impl_;
  MutexLock lock(&s.registry_mu);
  for (const std::string& id : worker_ids) {
    auto it = s.by_worker_id.find(id);
    if (it != s.by_worker_id.end() && s.records[it->second].alive)
      s.records[it->second].watched = true;
  }
}

Status ControlServer::Send(const std::string& worker_id, control::Envelope envelope) {
  Impl& s = *impl_;
  if (!s.loop.running()) return FailedPrecondition("control server is not running");
  std::string identity;
  {
    MutexLock lock(&s.registry_mu);
    auto it = s.by_worker_id.find(worker_id);
    if (it == s.by_worker_id.end()) return NotFound("no worker '" + worker_id + "' is registered");
    const Impl::Record& rec = s.records[it->second];
    if (!rec.alive) return Unavailable("worker '" + worker_id + "' was declared lost");
    identity = rec.identity;
  }
  envelope.set_protocol_version(kControlProtocolVersion);
  envelope.set_worker_id(worker_id);
  envelope.set_seq(s.next_seq++);
  TESSERA_ASSIGN_OR_RETURN(std::string bytes,
                           EncodeEnvelope(envelope, s.options.max_message_bytes));
  return s.Enqueue({std::move(identity), std::move(bytes), worker_id, EnvelopeBodyName(envelope)});
}

std::vector<ControlWorkerInfo> ControlServer::WorkersOf(
    const std::vector<std::string>& worker_ids) const {
  const Impl& s = *impl_;
  const Clock::time_point now = Clock::now();
  MutexLock lock(&s.registry_mu);
  std::vector<ControlWorkerInfo> out;
  for (const std::string& id : worker_ids) {
    auto it = s.by_worker_id.find(id);
    if (it != s.by_worker_id.end()) out.push_back(s.InfoLocked(it->second, now));
  }
  return out;
}

std::vector<ControlWorkerInfo> ControlServer::WorkersPage(size_t first, size_t count,
                                                          size_t* total) const {
  const Impl& s = *impl_;
  const Clock::time_point now = Clock::now();
  MutexLock lock(&s.registry_mu);
  *total = s.records.size();
  std::vector<ControlWorkerInfo> out;
  for (size_t i = first; i < s.records.size() && i - first < count; ++i)
    out.push_back(s.InfoLocked(i, now));
  return out;
}

std::vector<ControlWorkerInfo> ControlServer::Workers() const {
  const Impl& s = *impl_;
  const Clock::time_point now = Clock::now();
  MutexLock lock(&s.registry_mu);
  std::vector<ControlWorkerInfo> out;
  out.reserve(s.records.size());
  for (size_t i = 0; i < s.records.size(); ++i) out.push_back(s.InfoLocked(i, now));
  return out;
}

ControlServerStats ControlServer::stats() const {
  const Impl::Counters& c = impl_->counters;
  ControlServerStats st;
  st.frames_received = c.frames_received;
  st.messages_delivered = c.messages_delivered;
  st.dropped_malformed = c.dropped_malformed;
  st.dropped_version = c.dropped_version;
  st.dropped_unregistered = c.dropped_unregistered;
  st.registrations_accepted = c.registrations_accepted;
  st.registrations_refused = c.registrations_refused;
  st.workers_lost = c.workers_lost;
  st.messages_sent = c.messages_sent;
  st.send_failures = c.send_failures;
  st.handshakes_refused = c.handshakes_refused;
  st.registrations_refused_key_in_use = c.registrations_refused_key_in_use;
  st.registrations_refused_full = c.registrations_refused_full;
  st.workers_forgotten = c.workers_forgotten;
  st.connections_closed = c.connections_closed;
  return st;
}

Status ControlServer::Impl::Enqueue(Outgoing out) {
  if (!loop.Post([this, out = std::move(out)] { SendNow(out); }))
    return FailedPrecondition("control server is stopping");
  return Status::Ok();
}

void ControlServer::Impl::ReadFrames() {
  // Closed connections first (see the watches' order in Start).
  HandleMonitor();
  for (int i = 0; i < kMaxFramesPerTurn && !loop.stopping(); ++i) {
    std::vector<zmq::message_t> parts;
    if (!zmq::recv_multipart(*router, std::back_inserter(parts), zmq::recv_flags::dontwait)) return;
    ++counters.frames_received;
    try {
      HandleFrame(parts);
    } catch (const std::exception& e) {
      // A callback threw; the frame is done with, the loop goes on.
      TESSERA_LOG_ERROR(kLog, "handling a message from {} threw: {}",
                        PrintableIdentity(parts.empty() ? std::string() : parts[0].to_string()),
                        e.what());
    }
  }
}

void ControlServer::Impl::Drop(const ControlPeer& peer, const Status& reason,
                               std::atomic<uint64_t>* counter) {
  ++*counter;
  // Logged once per peer: a misbehaving peer cannot flood the log (stats
  // and on_dropped still see every drop).
  if (!drop_logged.count(peer.identity) && drop_logged.size() < kMaxDropLoggedPeers) {
    drop_logged.insert(peer.identity);
    TESSERA_LOG_WARN(
        kLog, "dropped message from peer {}{}: {}; later drops from it are counted only",
        peer.identity, peer.worker_id.empty() ? "" : " (worker '" + peer.worker_id + "')",
        reason.ToString());
  }
  if (options.on_dropped) options.on_dropped(peer, reason);
}

// One ZAP request (ZeroMQ RFC 27): version, request id, domain, address,
// routing id, mechanism, credentials. Admits a CURVE client whose public key
// is allowed, with its Z85 key as the user id that later frames carry.
void ControlServer::Impl::HandleZap() {
  // Every handshake waits on its ZAP reply: answer all that wait, up to a
  // bound per turn (8,192 workers connecting at once queue that many).
  for (int i = 0; i < kMaxZapPerTurn && !loop.stopping(); ++i)
    if (!HandleOneZap()) return;
}

bool ControlServer::Impl::HandleOneZap() {
  std::vector<zmq::message_t> req;
  if (!zmq::recv_multipart(*zap, std::back_inserter(req), zmq::recv_flags::dontwait)) return false;
  auto frame = [&req](size_t i) { return i < req.size() ? req[i].to_string() : std::string(); };
  const std::string request_id = frame(1);
  const std::string address = frame(3);
  const std::string mechanism = frame(5);
  std::string status = "400";
  std::string text;
  std::string user_id;
  if (req.size() < 6 || frame(0) != "1.0") {
    text = "malformed ZAP request";
  } else if (mechanism != "CURVE" || req.size() != 7 || req[6].size() != 32) {
    text = "the control plane requires CURVE";
  } else {
    const std::string key = req[6].to_string();
    char z85[41] = {};
    zmq_z85_encode(z85, reinterpret_cast<const uint8_t*>(key.data()), key.size());
    user_id = z85;
    if (allowed_keys.count(key)) {
      status = "200";
      text = "OK";
    } else {
      text = "public key not allowed";
    }
  }
  if (status != "200") {
    ++counters.handshakes_refused;
    const LogWindow::Verdict v = handshake_refusals.Admit(std::chrono::steady_clock::now());
    if (v.missed > 0)
      TESSERA_LOG_WARN(kLog,
                       "refused {} more control-plane connections in the last minute "
                       "(not logged one by one)",
                       v.missed);
    if (v.log)
      TESSERA_LOG_WARN(kLog,
                       "refused a control-plane connection from {}: {}{}; an allowed worker's key "
                       "must be listed in control.worker_public_keys{}",
                       address.empty() ? "an unknown address" : address, text,
                       user_id.empty() ? "" : " (CURVE public key " + user_id + ")",
                       v.last ? " (further refusals this minute are counted, not logged)" : "");
    user_id.clear();
  }
  std::vector<zmq::message_t> reply;
  reply.emplace_back("1.0", 3);
  reply.emplace_back(request_id.data(), request_id.size());
  reply.emplace_back(status.data(), status.size());
  reply.emplace_back(text.data(), text.size());
  reply.emplace_back(user_id.data(), user_id.size());
  reply.emplace_back();  // no metadata
  (void)zmq::send_multipart(*zap, reply, zmq::send_flags::dontwait);
  return true;
}

void ControlServer::Impl::HandleFrame(std::vector<zmq::message_t>& parts) {
  const std::string identity = parts[0].to_string();
  ControlPeer peer{PrintableIdentity(identity), ""};
  // With CURVE every frame carries the key its connection authenticated.
  std::string curve_key;
  if (zap && !parts.empty()) {
    const char* user = zmq_msg_gets(parts.back().handle(), "User-Id");
    if (user != nullptr) curve_key = user;
  }
  if (parts.size() != 2) {
    Drop(peer,
         InvalidArgument("expected 1 payload frame after the routing id, got " +
                         std::to_string(parts.size() - 1)),
         &counters.dropped_malformed);
    return;
  }
  // The frame's message lives on the arena until this frame is handled
  // (the handlers and on_message keep nothing of it), however they return.
  struct ResetArena {
    google::protobuf::Arena& arena;
    ~ResetArena() { arena.Reset(); }
  } reset{frame_arena};
  control::Envelope& envelope =
      *google::protobuf::Arena::CreateMessage<control::Envelope>(&frame_arena);
  const Status decoded =
      DecodeEnvelopeInto(parts[1].to_string_view(), options.max_message_bytes, &envelope);
  if (!decoded.ok()) {
    Drop(peer, decoded,
         decoded.code() == StatusCode::kUnimplemented ? &counters.dropped_version
                                                      : &counters.dropped_malformed);
    return;
  }
  // The connection it came on (libzmq's ZMQ_SRCFD): the monitor names a
  // closed connection by its file descriptor.
  const int fd = zmq_msg_get(parts.back().handle(), ZMQ_SRCFD);
  if (envelope.body_case() == control::Envelope::kRegisterWorker) {
    HandleRegister(identity, curve_key, fd, std::move(envelope));
  } else {
    HandleMessage(identity, curve_key, fd, envelope);
  }
}

void ControlServer::Impl::HandleMessage(const std::string& identity, const std::string& curve_key,
                                        int fd, control::Envelope& envelope) {
  ControlPeer peer{PrintableIdentity(identity), ""};
  const char* body = EnvelopeBodyName(envelope);
  Status reason;
  bool unknown = false;  // not registered, or declared lost
  // A watched worker spoke: an event, once the callbacks below ran.
  NotifyAtExit notify(&activity);
  {
    MutexLock lock(&registry_mu);
    auto it = by_identity.find(identity);
    if (it == by_identity.end()) {
      unknown = true;
      reason = FailedPrecondition(std::string(body) +
                                  " from a peer that is not registered (worker_id '" +
                                  envelope.worker_id() + "'); a worker must send Register first");
    } else {
      Record& rec = records[it->second];
      peer.worker_id = rec.worker_id;
      if (!rec.alive) {
        unknown = true;
        reason = Unavailable(std::string(body) + " from worker '" + rec.worker_id +
                             "', which was declared lost; it must register again");
      } else if (curve_key != rec.curve_key) {
        reason = FailedPrecondition(std::string(body) + " for worker '" + rec.worker_id +
                                    "' arrived under CURVE key '" + curve_key +
                                    "', not the key it registered with");
      } else if (envelope.worker_id() != rec.worker_id) {
        reason =
            FailedPrecondition(std::string(body) + " carries worker_id '" + envelope.worker_id() +
                               "', but this peer registered as '" + rec.worker_id + "'");
      } else {
        rec.Heard(Clock::now(), fd);
        ++rec.messages_received;
        if (rec.watched) {
          rec.watched = false;
          notify.Arm();
        }
      }
    }
  }
  // Callbacks run without the registry lock: they may call Send or Workers.
  if (!reason.ok()) {
    Drop(peer, reason, &counters.dropped_unregistered);
    // A peer this server does not know (it restarted) or declared lost asks
    // to be heard: tell it to register again.
    if (unknown) {
      control::Envelope ack;
      ack.set_protocol_version(kControlProtocolVersion);
      ack.set_worker_id(envelope.worker_id());
      ack.set_seq(next_seq++);
      ack.mutable_register_ack()->set_accepted(false);
      ack.mutable_register_ack()->set_reason(kRegisterAgainPrefix + reason.message());
      StatusOr<std::string> bytes = EncodeEnvelope(ack, options.max_message_bytes);
      if (bytes.ok()) SendNow({identity, std::move(*bytes), envelope.worker_id(), "register_ack"});
    }
    return;
  }
  if (!IsWorkerToCoordinator(envelope.body_case())) {
    Drop(peer, InvalidArgument(std::string(body) + " is not a message a worker sends"),
         &counters.dropped_malformed);
    return;
  }
  TESSERA_LOG_DEBUG(kLog, "{} from worker '{}' (seq {})", body, peer.worker_id, envelope.seq());
  ++counters.messages_delivered;
  if (options.on_message) options.on_message(peer, envelope);
}

void ControlServer::Impl::Refuse(const std::string& identity, const std::string& requested,
                                 const std::string& reason, bool log) {
  ++counters.registrations_refused;
  if (log)
    TESSERA_LOG_WARN(kLog, "refused registration from peer {} (asked for worker_id '{}'): {}",
                     PrintableIdentity(identity), requested, reason);
  control::Envelope ack;
  ack.set_protocol_version(kControlProtocolVersion);
  ack.set_worker_id(requested);
  ack.set_seq(next_seq++);
  ack.mutable_register_ack()->set_accepted(false);
  ack.mutable_register_ack()->set_reason(reason);
  StatusOr<std::string> bytes = EncodeEnvelope(ack, options.max_message_bytes);
  if (!bytes.ok()) {
    TESSERA_LOG_ERROR(kLog, "cannot encode a refusal: {}", bytes.status().ToString());
    return;
  }
  SendNow({identity, std::move(*bytes), requested, "register_ack"});
}

void ControlServer::Impl::HandleRegister(const std::string& identity, const std::string& curve_key,
                                         int fd, control::Envelope envelope) {
  const std::string requested = envelope.worker_id();
  const Clock::time_point now = Clock::now();
  // A registration (or a watched worker's retry) is an event, once the
  // callbacks below ran: on_message's (WorkerEvents) included.
  NotifyAtExit notify(&activity);
  std::string worker_id;
  bool retry = false;
  std::string refusal;
  std::atomic<uint64_t>* refusal_counter = nullptr;  // a specific counter besides the total
  bool log_refusal = true;
  // Lost records this registration replaces: its own earlier ones.
  auto replaced = [&](const Record& rec) {
    return !rec.alive && (rec.identity == identity || rec.worker_id == worker_id ||
                          (!curve_key.empty() && rec.curve_key == curve_key));
  };
  {
    MutexLock lock(&registry_mu);
    auto mine = by_identity.find(identity);
    if (mine != by_identity.end() && records[mine->second].alive) {
      Record& rec = records[mine->second];
      if (rec.curve_key != curve_key) {
        refusal =
            "this routing id is registered as '" + rec.worker_id + "' under another CURVE key";
      } else if (requested.empty() || requested == rec.worker_id) {
        // A retried Register: answer again, deliver nothing new.
        retry = true;
        worker_id = rec.worker_id;
        rec.Heard(now, fd);
        if (rec.watched) {
          rec.watched = false;
          notify.Arm();
        }
      } else {
        refusal = "this peer is registered as '" + rec.worker_id +
                  "' and cannot register again as '" + requested + "'";
      }
    } else {
      // One key, one worker: a live worker's key cannot register another
      // (a key's records: the latest; earlier ones were replaced).
      if (!curve_key.empty()) {
        auto by_key = by_curve_key.find(curve_key);
        if (by_key != by_curve_key.end() && records[by_key->second].alive) {
          const Record& rec = records[by_key->second];
          refusal = "CURVE key " + curve_key + " is in use by live worker '" + rec.worker_id +
                    "' (peer " + PrintableIdentity(rec.identity) +
                    "); one key registers one worker";
          refusal_counter = &counters.registrations_refused_key_in_use;
          const LogWindow::Verdict v = key_in_use_refusals.Admit(now);
          if (v.missed > 0)
            TESSERA_LOG_WARN(kLog,
                             "refused {} more registrations for a CURVE key in use in the last "
                             "minute (not logged one by one)",
                             v.missed);
          log_refusal = v.log;
          if (v.last)
            TESSERA_LOG_WARN(kLog,
                             "further registrations refused for a CURVE key in use this minute "
                             "are counted, not logged");
        }
      }
      if (refusal.empty() && !requested.empty()) {
        auto held = by_worker_id.find(requested);
        if (held != by_worker_id.end() && records[held->second].alive)
          refusal = "worker_id '" + requested + "' is held by live peer " +
                    PrintableIdentity(records[held->second].identity);
        worker_id = requested;
      } else if (refusal.empty()) {
        do {
          worker_id = "worker-" + std::to_string(next_auto_id++);
        } while (by_worker_id.count(worker_id) && records[by_worker_id[worker_id]].alive);
      }
      // Counted only near the bound: below it, every record may stay.
      if (refusal.empty() && options.max_workers > 0 && records.size() >= options.max_workers) {
        const size_t kept = static_cast<size_t>(std::count_if(
            records.begin(), records.end(), [&](const Record& r) { return !replaced(r); }));
        if (kept >= options.max_workers) {
          refusal = "the coordinator holds " + std::to_string(kept) +
                    " worker records, its limit (server.max_workers = " +
                    std::to_string(options.max_workers) +
                    "); lost workers are forgotten after heartbeat.forget_failed_after_seconds";
          refusal_counter = &counters.registrations_refused_full;
          log_refusal = !full_logged;
          full_logged = true;
        }
      }
    }
  }
  if (!refusal.empty()) {
    if (refusal_counter) ++*refusal_counter;
    Refuse(identity, requested, refusal, log_refusal);
    return;
  }
  if (!retry && options.accept_register) {
    Status vetted = options.accept_register(ControlPeer{PrintableIdentity(identity), worker_id},
                                            envelope.register_worker());
    if (!vetted.ok()) {
      Refuse(identity, requested, vetted.message());
      return;
    }
  }
  if (!retry) {
    std::vector<std::string> gone;
    {
      MutexLock lock(&registry_mu);
      // A record it replaces is the latest of its routing id, worker id or
      // key: look there before scanning every record.
      bool any = false;
      for (const size_t* at : {Find(by_identity, identity), Find(by_worker_id, worker_id),
                               curve_key.empty() ? nullptr : Find(by_curve_key, curve_key)})
        any = any || (at && replaced(records[*at]));
      if (any) gone = EraseRecordsLocked(replaced);
    }
    for (const std::string& id : gone) {
      ++counters.workers_forgotten;
      TESSERA_LOG_INFO(kLog, "the lost record of worker '{}' is replaced by worker '{}'", id,
                       worker_id);
      if (id != worker_id && options.on_worker_forgotten) options.on_worker_forgotten(id);
    }
    MutexLock lock(&registry_mu);
    Record rec;
    rec.worker_id = worker_id;
    rec.identity = identity;
    rec.registration = std::make_shared<const control::Register>(envelope.register_worker());
    rec.curve_key = curve_key;
    rec.Heard(now, fd);
    rec.messages_received = 1;
    records.push_back(std::move(rec));
    by_identity[identity] = records.size() - 1;
    by_worker_id[worker_id] = records.size() - 1;
    if (!curve_key.empty()) by_curve_key[curve_key] = records.size() - 1;
  }
  control::Envelope ack;
  ack.set_protocol_version(kControlProtocolVersion);
  ack.set_worker_id(worker_id);
  ack.set_seq(next_seq++);
  control::RegisterAck* body = ack.mutable_register_ack();
  body->set_accepted(true);
  body->set_worker_id(worker_id);
  body->set_heartbeat_interval_ms(static_cast<uint32_t>(options.heartbeat_interval.count()));
  body->set_heartbeat_miss_limit(static_cast<uint32_t>(options.heartbeat_miss_limit));
  StatusOr<std::string> bytes = EncodeEnvelope(ack, options.max_message_bytes);
  if (!bytes.ok()) {
    TESSERA_LOG_ERROR(kLog, "cannot encode the ack for '{}': {}", worker_id,
                      bytes.status().ToString());
    return;
  }
  SendNow({identity, std::move(*bytes), worker_id, "register_ack"});
  if (retry) {
    TESSERA_LOG_DEBUG(kLog, "repeated Register from worker '{}' acknowledged again", worker_id);
    return;
  }
  ++counters.registrations_accepted;
  notify.Arm();
  const control::Register& reg = envelope.register_worker();
  TESSERA_LOG_INFO(kLog, "registered worker '{}' (peer {}, host {}, pid {}, {} device(s){})",
                   worker_id, PrintableIdentity(identity), reg.host(), reg.pid(),
                   reg.devices_size(), curve_key.empty() ? "" : ", CURVE key " + curve_key);
  envelope.set_worker_id(worker_id);
  ++counters.messages_delivered;
  if (options.on_message)
    options.on_message(ControlPeer{PrintableIdentity(identity), worker_id}, envelope);
}

bool ControlServer::Impl::SendNow(const Outgoing& out) {
  try {
    zmq::message_t id(out.identity.data(), out.identity.size());
    zmq::message_t payload(out.bytes.data(), out.bytes.size());
    if (router->send(id, zmq::send_flags::sndmore | zmq::send_flags::dontwait) &&
        router->send(payload, zmq::send_flags::dontwait)) {
      ++counters.messages_sent;
      return true;
    }
    TESSERA_LOG_WARN(kLog, "send of {} to worker '{}' failed: its queue is full", out.body,
                     out.worker_id);
  } catch (const zmq::error_t& e) {
    TESSERA_LOG_WARN(kLog, "send of {} to worker '{}' failed: {}", out.body, out.worker_id,
                     e.num() == EHOSTUNREACH ? "the peer is not connected" : e.what());
  }
  ++counters.send_failures;
  return false;
}

}  // namespace tessera
