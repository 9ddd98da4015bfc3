// ControlServer / ControlClient test peers over real ZeroMQ sockets: what the server's and the
// client's callbacks saw, their options, and a raw DEALER socket that sends arbitrary frames
// (tests/unit/coordinator/control/control_plane_test.cc, control_plane_events_test.cc).
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "common/wire/control_codec.h"
#include "coordinator/control/control_server.h"
#include "support/control_envelopes.h"
#include "worker/daemon/control_client.h"

namespace tessera {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

// ---------------------------------------------------------------------------
// Server and client over real sockets.

// Polls `pred` every 2 ms until it holds or `timeout` passes.
inline bool WaitUntil(const std::function<bool()>& pred, milliseconds timeout) {
  const Clock::time_point deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(milliseconds(2));
  }
  return pred();
}

// What the server's callbacks saw.
struct ServerLog {
  std::mutex mu;
  std::vector<std::pair<ControlPeer, Envelope>> messages;
  std::vector<Clock::time_point> received;  // when each of messages arrived
  std::vector<std::pair<std::string, Clock::time_point>> lost;
  std::vector<ControlWorkerLoss> losses;  // why each of lost was declared
  std::vector<std::pair<ControlPeer, Status>> drops;

  size_t Count(Envelope::BodyCase body) {
    std::lock_guard<std::mutex> lock(mu);
    size_t n = 0;
    for (const auto& m : messages) n += m.second.body_case() == body;
    return n;
  }
  size_t Drops() {
    std::lock_guard<std::mutex> lock(mu);
    return drops.size();
  }
  size_t Lost() {
    std::lock_guard<std::mutex> lock(mu);
    return lost.size();
  }
  std::optional<Envelope> Last(Envelope::BodyCase body) {
    std::lock_guard<std::mutex> lock(mu);
    for (auto it = messages.rbegin(); it != messages.rend(); ++it)
      if (it->second.body_case() == body) return it->second;
    return std::nullopt;
  }
};

inline ControlServerOptions ServerOptions(ServerLog* log, milliseconds interval, int misses = 3) {
  ControlServerOptions o;
  o.heartbeat_interval = interval;
  o.heartbeat_miss_limit = misses;
  o.linger = milliseconds(0);
  o.on_message = [log](const ControlPeer& p, const Envelope& e) {
    std::lock_guard<std::mutex> lock(log->mu);
    log->messages.emplace_back(p, e);
    log->received.push_back(Clock::now());
  };
  o.on_worker_lost = [log](const std::string& id, const ControlWorkerLoss& loss) {
    std::lock_guard<std::mutex> lock(log->mu);
    log->lost.emplace_back(id, Clock::now());
    log->losses.push_back(loss);
  };
  o.on_dropped = [log](const ControlPeer& p, const Status& s) {
    std::lock_guard<std::mutex> lock(log->mu);
    log->drops.emplace_back(p, s);
  };
  return o;
}

// What a client's callbacks saw.
struct ClientLog {
  std::mutex mu;
  std::vector<Envelope> messages;
  std::vector<Status> drops;

  size_t Count(Envelope::BodyCase body) {
    std::lock_guard<std::mutex> lock(mu);
    size_t n = 0;
    for (const auto& m : messages) n += m.body_case() == body;
    return n;
  }
  size_t Drops() {
    std::lock_guard<std::mutex> lock(mu);
    return drops.size();
  }
};

inline ControlClientOptions ClientOptions(ClientLog* log) {
  ControlClientOptions o;
  o.linger = milliseconds(0);
  o.register_retry = milliseconds(100);
  o.reconnect_interval = milliseconds(20);
  o.reconnect_interval_max = milliseconds(100);
  o.on_message = [log](const Envelope& e) {
    std::lock_guard<std::mutex> lock(log->mu);
    log->messages.push_back(e);
  };
  o.on_dropped = [log](const Status& s) {
    std::lock_guard<std::mutex> lock(log->mu);
    log->drops.push_back(s);
  };
  return o;
}

// A bare DEALER socket, for sending what a well-behaved client never would.
class RawDealer {
 public:
  RawDealer(const std::string& endpoint, const std::string& routing_id)
      : socket_(context_, zmq::socket_type::dealer) {
    socket_.set(zmq::sockopt::routing_id, routing_id);
    socket_.set(zmq::sockopt::linger, 0);
    socket_.connect(endpoint);
  }
  void Send(const std::string& bytes) {
    zmq::message_t m(bytes.data(), bytes.size());
    socket_.send(m, zmq::send_flags::none);
  }
  void SendTwoFrames(const std::string& a, const std::string& b) {
    zmq::message_t ma(a.data(), a.size()), mb(b.data(), b.size());
    socket_.send(ma, zmq::send_flags::sndmore);
    socket_.send(mb, zmq::send_flags::none);
  }
  std::optional<Envelope> Recv(milliseconds timeout) {
    zmq_pollitem_t item{socket_.handle(), 0, ZMQ_POLLIN, 0};
    if (zmq::poll(&item, 1, timeout) == 0) return std::nullopt;
    zmq::message_t m;
    if (!socket_.recv(m, zmq::recv_flags::none)) return std::nullopt;
    StatusOr<Envelope> d = DecodeEnvelope(m.to_string_view());
    if (!d.ok()) return std::nullopt;
    return *d;
  }

 private:
  zmq::context_t context_{1};
  zmq::socket_t socket_;
};

inline std::string Serialize(const Envelope& e) { return e.SerializeAsString(); }

}  // namespace tessera
