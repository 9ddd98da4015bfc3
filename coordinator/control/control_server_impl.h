// The ControlServer's internals (coordinator/control/control_server.h),
// shared by its files: control_server.cc (the socket, registration,
// messages, sends) and control_server_liveness.cc (losses by missed
// heartbeats or a closed connection, forgetting lost records). Not for use
// outside them.
//
// Thread-safety: as ControlServer's: the owner thread (ZmqSocketLoop) runs
// every Impl method but Enqueue and the registry readers. The registry
// (records and their indexes, read by Send / Workers / Watch / DeclareLost
// on other threads) is GUARDED_BY(registry_mu), checked by clang's
// -Wthread-safety (scripts/thread-safety): every access holds it, the owner
// thread's reads included. Fields marked "owner thread" or "loop thread"
// are touched by that thread alone (or by Start before it runs) and take
// no lock.
#pragma once

#include <google/protobuf/arena.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>
#include <zmq.hpp>

#include "common/base/log_window.h"
#include "common/base/mutex.h"
#include "common/base/thread_annotations.h"
#include "common/net/zmq_loop.h"
#include "coordinator/control/control_server.h"

namespace tessera {
namespace control_server_internal {

inline constexpr const char* kLog = "control-server";
using Clock = std::chrono::steady_clock;

// A routing id as logs and ControlPeer show it: itself when printable, else
// "0x" and its bytes in hex.
inline std::string PrintableIdentity(const std::string& id) {
  const bool printable =
      !id.empty() && std::all_of(id.begin(), id.end(), [](char c) { return c > 0x20 && c < 0x7f; });
  if (printable) return id;
  static const char* kHex = "0123456789abcdef";
  std::string out = "0x";
  for (unsigned char c : id) {
    out.push_back(kHex[c >> 4]);
    out.push_back(kHex[c & 15]);
  }
  return out;
}

}  // namespace control_server_internal

struct ControlServer::Impl {
  using Clock = control_server_internal::Clock;

  struct Record {
    std::string worker_id;
    std::string identity;  // raw routing id
    // Shared with every Workers() snapshot: a Register carries the host's
    // topology report (kilobytes), and a fleet has thousands of workers.
    std::shared_ptr<const control::Register> registration;
    std::string curve_key;  // Z85 key it authenticated with ("" without CURVE)
    bool alive = true;
    Clock::time_point last_seen;
    Clock::time_point lost_at;  // when declared lost (alive == false)
    uint64_t messages_received = 0;
    // ControlServer::Watch asked for an event on its next valid message.
    bool watched = false;
    // The connection (its file descriptor in libzmq, ZMQ_SRCFD) its last
    // valid message came on; -1 unknown or closed.
    int fd = -1;
    // That connection (closed_fd) closed at closed_at and nothing was heard
    // since on another one.
    bool connection_closed = false;
    int closed_fd = -1;
    Clock::time_point closed_at;
    // A valid message from it arrived on connection `from_fd`. One that
    // arrives on the closed connection was sent before it closed (libzmq
    // hands over what its pipe had read after the monitor's disconnect
    // event): it does not cancel the loss. (A new connection that gets the
    // closed one's descriptor number looks the same: that worker is
    // declared lost and registers again.)
    void Heard(Clock::time_point now, int from_fd) {
      last_seen = now;
      if (connection_closed && from_fd == closed_fd) return;
      fd = from_fd;
      connection_closed = false;
    }
  };
  struct Outgoing {
    std::string identity;  // raw routing id
    std::string bytes;
    std::string worker_id;
    const char* body;
  };
  struct Counters {
    std::atomic<uint64_t> frames_received{0}, messages_delivered{0}, dropped_malformed{0},
        dropped_version{0}, dropped_unregistered{0}, registrations_accepted{0},
        registrations_refused{0}, workers_lost{0}, messages_sent{0}, send_failures{0},
        handshakes_refused{0}, registrations_refused_key_in_use{0}, registrations_refused_full{0},
        workers_forgotten{0}, connections_closed{0};
  };

  explicit Impl(ControlServerOptions o) : options(std::move(o)) {}

  static google::protobuf::ArenaOptions FrameArenaOptions(char* block, size_t bytes) {
    google::protobuf::ArenaOptions o;
    o.initial_block = block;
    o.initial_block_size = bytes;
    return o;
  }

  ControlServerOptions options;
  zmq::context_t context{1};
  std::unique_ptr<zmq::socket_t> router;  // loop thread only, after Start
  std::unique_ptr<zmq::socket_t> zap;     // ZAP handler (CURVE only), loop thread
  // The ROUTER's disconnect events (zmq_socket_monitor), loop thread.
  std::unique_ptr<zmq::socket_t> monitor;
  // 32-byte binary public keys (CURVE only): filled by Start before the
  // owner thread starts, read there only after.
  std::set<std::string> allowed_keys;
  // Owner thread: refused handshakes, and registrations refused for a
  // CURVE key in use, are logged at most kRefusalLogBurst times a minute
  // each (a flood of unknown keys, or of one stolen key, must not flood the
  // log); the rest are counted and summed up in the next minute's first line.
  static constexpr int kRefusalLogBurst = 10;
  LogWindow handshake_refusals{kRefusalLogBurst};
  LogWindow key_in_use_refusals{kRefusalLogBurst};
  bool started = false;  // Start succeeded once
  // Owner thread: HandleFrame decodes each frame onto frame_arena and
  // resets it after the frame, so a leader's RequestUpdates (a message per
  // token, a string per text) cost no heap allocation and no free each.
  // The initial block stays across resets; a larger frame's extra blocks
  // are freed at its reset.
  static constexpr size_t kFrameArenaBytes = 256 * 1024;
  std::unique_ptr<char[]> frame_arena_block{new char[kFrameArenaBytes]};
  google::protobuf::Arena frame_arena{FrameArenaOptions(frame_arena_block.get(), kFrameArenaBytes)};
  std::atomic<uint64_t> next_seq{1};
  Counters counters;

  // The events of the workers (ControlServer::activity).
  WorkerActivity activity;
  // Registry: written by the owner thread (and by DeclareLost / Watch on
  // the caller's thread), read by Send / Workers. Every access holds
  // registry_mu, the owner thread's too: the hot path (HandleMessage) takes
  // it once per message to find the sender's record and mark it heard.
  mutable Mutex registry_mu;
  std::vector<Record> records GUARDED_BY(registry_mu);  // registration order
  // raw routing id -> latest record
  std::map<std::string, size_t> by_identity GUARDED_BY(registry_mu);
  // worker id -> latest record
  std::map<std::string, size_t> by_worker_id GUARDED_BY(registry_mu);
  // CURVE key -> latest record
  std::unordered_map<std::string, size_t> by_curve_key GUARDED_BY(registry_mu);
  // The next "worker-N" id handed to a Register that asks for none (picked
  // against by_worker_id, under the same lock).
  uint64_t next_auto_id GUARDED_BY(registry_mu) = 0;
  // The "max_workers reached" refusal was logged; cleared when a record
  // goes (EraseRecordsLocked).
  bool full_logged GUARDED_BY(registry_mu) = false;
  // The next liveness scan (owner thread): every heartbeat_interval / 4,
  // not every turn, so a fleet's messages do not each cost a scan of it.
  Clock::time_point next_liveness_check{};
  // Printable routing ids whose dropped frames were logged (the first one
  // each). Owner thread only; at most kMaxDropLoggedPeers.
  std::set<std::string> drop_logged;
  // The owner thread of router and zap, and the queue of sends to run
  // there (common/net/zmq_loop.h). Declared after the sockets: it stops
  // (and closes them) before they are destroyed.
  ZmqSocketLoop loop{context, control_server_internal::kLog};

  // The handlers below take registry_mu themselves, and release it before
  // a callback runs (callbacks may call Send or Workers): EXCLUDES.
  void ReadFrames() EXCLUDES(registry_mu);
  // Reads the monitor's events: marks the worker whose connection closed.
  void HandleMonitor() EXCLUDES(registry_mu);
  void HandleFrame(std::vector<zmq::message_t>& parts) EXCLUDES(registry_mu);
  void HandleZap();
  bool HandleOneZap();  // false when no request was waiting
  // `fd`: the connection the frame came on (ZMQ_SRCFD; -1 unknown).
  void HandleRegister(const std::string& identity, const std::string& curve_key, int fd,
                      control::Envelope envelope) EXCLUDES(registry_mu);
  void HandleMessage(const std::string& identity, const std::string& curve_key, int fd,
                     control::Envelope& envelope) EXCLUDES(registry_mu);
  // `log` false: counted and answered, not logged (a flood of refusals).
  void Refuse(const std::string& identity, const std::string& requested, const std::string& reason,
              bool log = true);
  void Drop(const ControlPeer& peer, const Status& reason, std::atomic<uint64_t>* counter);
  bool SendNow(const Outgoing& out);
  void CheckLiveness() EXCLUDES(registry_mu);
  // Marks lost the live records `lost_now` picks, at `now`; their ids and
  // losses.
  std::vector<std::pair<std::string, ControlWorkerLoss>> MarkLostLocked(
      Clock::time_point now,
      const std::function<std::optional<ControlWorkerLoss>(const Record&)>& lost_now)
      REQUIRES(registry_mu);
  // The snapshot of record `index`.
  ControlWorkerInfo InfoLocked(size_t index, Clock::time_point now) const REQUIRES(registry_mu) {
    const Record& r = records[index];
    ControlWorkerInfo info;
    info.worker_id = r.worker_id;
    info.identity = control_server_internal::PrintableIdentity(r.identity);
    info.registration = r.registration;
    info.curve_public_key = r.curve_key;
    info.alive = r.alive;
    info.connection_closed = r.connection_closed;
    info.seconds_since_last_message = std::chrono::duration<double>(now - r.last_seen).count();
    info.messages_received = r.messages_received;
    return info;
  }
  // Removes the records `gone` says to drop and rebuilds the indexes.
  // Returns the worker ids removed.
  std::vector<std::string> EraseRecordsLocked(const std::function<bool(const Record&)>& gone)
      REQUIRES(registry_mu);
  Status Enqueue(Outgoing out);
  // Notifies `activity` when it goes out of scope, if armed: after the
  // callbacks of an event ran, also when one threw.
  class NotifyAtExit {
   public:
    explicit NotifyAtExit(WorkerActivity* activity) : activity_(activity) {}
    ~NotifyAtExit() {
      if (armed_) activity_->Notify();
    }
    NotifyAtExit(const NotifyAtExit&) = delete;
    NotifyAtExit& operator=(const NotifyAtExit&) = delete;
    void Arm() { armed_ = true; }

   private:
    WorkerActivity* activity_;
    bool armed_ = false;
  };
  std::chrono::milliseconds LostAfter() const {
    return options.heartbeat_interval * options.heartbeat_miss_limit;
  }
};

}  // namespace tessera
