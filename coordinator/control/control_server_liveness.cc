// ControlServer's liveness (control_server_impl.h): the socket monitor's
// closed connections, and the losses CheckLiveness declares from them and
// from missed heartbeats.
#include <algorithm>
#include <cstring>
#include <exception>
#include <iterator>
#include <string>
#include <utility>
#include <vector>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "common/base/logging.h"
#include "common/base/mutex.h"
#include "coordinator/control/control_server_impl.h"

namespace tessera {

using control_server_internal::Clock;
using control_server_internal::kLog;

void ControlServer::Impl::HandleMonitor() {
  while (!loop.stopping()) {
    std::vector<zmq::message_t> event;
    if (!zmq::recv_multipart(*monitor, std::back_inserter(event), zmq::recv_flags::dontwait))
      return;
    // ZeroMQ's monitor event: a 6-byte frame (uint16 event, uint32 value:
    // the file descriptor for ZMQ_EVENT_DISCONNECTED), then the endpoint.
    if (event.empty() || event[0].size() < 6) continue;
    uint16_t kind = 0;
    uint32_t value = 0;
    std::memcpy(&kind, event[0].data(), sizeof kind);
    std::memcpy(&value, static_cast<const char*>(event[0].data()) + 2, sizeof value);
    if (kind != ZMQ_EVENT_DISCONNECTED) continue;
    const Clock::time_point now = Clock::now();
    // A registered worker's connection closing is an event (a stopping
    // coordinator waits for its workers to go: CoordinatorDaemon::Stop).
    NotifyAtExit notify(&activity);
    MutexLock lock(&registry_mu);
    for (Record& rec : records) {
      if (!rec.alive || rec.fd < 0 || rec.fd != static_cast<int>(value)) continue;
      rec.closed_fd = rec.fd;
      rec.fd = -1;
      rec.connection_closed = true;
      rec.closed_at = now;
      ++counters.connections_closed;
      notify.Arm();
      TESSERA_LOG_INFO(kLog,
                       "the control connection of worker '{}' closed; it is lost unless heard "
                       "from within {:.1f} s",
                       rec.worker_id, kClosedConnectionGraceSeconds);
    }
  }
}

std::vector<std::pair<std::string, ControlWorkerLoss>> ControlServer::Impl::MarkLostLocked(
    Clock::time_point now,
    const std::function<std::optional<ControlWorkerLoss>(const Record&)>& lost_now) {
  std::vector<std::pair<std::string, ControlWorkerLoss>> lost;
  for (Record& rec : records) {
    if (!rec.alive) continue;
    std::optional<ControlWorkerLoss> loss = lost_now(rec);
    if (!loss) continue;
    rec.alive = false;
    rec.watched = false;
    rec.lost_at = now;
    lost.emplace_back(rec.worker_id, std::move(*loss));
  }
  return lost;
}

void ControlServer::Impl::CheckLiveness() {
  const Clock::time_point now = Clock::now();
  if (now < next_liveness_check) return;
  next_liveness_check = now + std::clamp<Clock::duration>(options.heartbeat_interval / 4,
                                                          std::chrono::milliseconds(5),
                                                          std::chrono::milliseconds(100));
  const auto grace = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(kClosedConnectionGraceSeconds));
  std::vector<std::pair<std::string, ControlWorkerLoss>> lost;
  // Losses are events, once on_worker_lost ran for each.
  NotifyAtExit notify(&activity);
  {
    MutexLock lock(&registry_mu);
    lost = MarkLostLocked(now, [&](const Record& rec) -> std::optional<ControlWorkerLoss> {
      if (rec.connection_closed && now - rec.closed_at >= grace)
        return ControlWorkerLoss{ControlWorkerLoss::Cause::kConnectionClosed, rec.closed_at};
      if (now - rec.last_seen > LostAfter())
        return ControlWorkerLoss{ControlWorkerLoss::Cause::kMissedHeartbeats, rec.last_seen};
      return std::nullopt;
    });
  }
  std::vector<std::string> forgotten;
  if (options.forget_lost_after.count() > 0) {
    MutexLock lock(&registry_mu);
    forgotten = EraseRecordsLocked([&](const Record& rec) {
      return !rec.alive && now - rec.lost_at > options.forget_lost_after;
    });
  }
  for (const std::string& id : forgotten) {
    ++counters.workers_forgotten;
    TESSERA_LOG_INFO(kLog, "forgot lost worker '{}' ({} ms after its loss)", id,
                     options.forget_lost_after.count());
    try {
      if (options.on_worker_forgotten) options.on_worker_forgotten(id);
    } catch (const std::exception& e) {
      TESSERA_LOG_ERROR(kLog, "on_worker_forgotten('{}') threw: {}", id, e.what());
    }
  }
  if (!lost.empty()) notify.Arm();
  for (const auto& [id, loss] : lost) {
    ++counters.workers_lost;
    const double silent = std::chrono::duration<double>(now - loss.since).count();
    if (loss.cause == ControlWorkerLoss::Cause::kMissedHeartbeats) {
      TESSERA_LOG_WARN(kLog, "worker '{}' lost: no message for {} ms ({} heartbeat intervals)", id,
                       LostAfter().count(), options.heartbeat_miss_limit);
    } else {
      TESSERA_LOG_WARN(kLog, "worker '{}' lost: {} {:.2f} s ago and it stayed silent", id,
                       loss.reason(), silent);
    }
    try {
      if (options.on_worker_lost) options.on_worker_lost(id, loss);
    } catch (const std::exception& e) {
      TESSERA_LOG_ERROR(kLog, "on_worker_lost('{}') threw: {}", id, e.what());
    }
  }
}

std::vector<std::string> ControlServer::Impl::EraseRecordsLocked(
    const std::function<bool(const Record&)>& gone) {
  std::vector<std::string> removed;
  if (std::none_of(records.begin(), records.end(), gone)) return removed;
  std::vector<Record> kept;
  kept.reserve(records.size());
  for (Record& rec : records) {
    if (gone(rec)) {
      removed.push_back(rec.worker_id);
    } else {
      kept.push_back(std::move(rec));
    }
  }
  records.swap(kept);
  by_identity.clear();
  by_worker_id.clear();
  by_curve_key.clear();
  for (size_t i = 0; i < records.size(); ++i) {
    by_identity[records[i].identity] = i;
    by_worker_id[records[i].worker_id] = i;
    if (!records[i].curve_key.empty()) by_curve_key[records[i].curve_key] = i;
  }
  full_logged = false;
  return removed;
}

}  // namespace tessera
