#include "worker/comm/gloo_communicator.h"

#include <fmt/format.h>
#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "worker/comm/gloo_store_adapter.h"

namespace tessera {
namespace {

// Slots (Gloo's message tags, matched per connection) are laid out so that
// collectives and point-to-point messages never share one:
//   collective:     1 << 56 | seq << 8 | phase
//   point-to-point: 2 << 56 | direction << 55 | seq << 1 | part
// where direction is 0 for messages from the lower to the higher rank and
// part is 0 for the header, 1 for the payload.
constexpr uint64_t kSeqMask = (uint64_t{1} << 40) - 1;

uint64_t CollectiveSlot(uint64_t seq, int phase) {
  return (uint64_t{1} << 56) | ((seq & kSeqMask) << 8) | static_cast<uint64_t>(phase);
}

uint64_t P2PSlot(int src, int dst, uint64_t seq, int part) {
  uint64_t direction = src < dst ? 0 : 1;
  return (uint64_t{2} << 56) | (direction << 55) | ((seq & kSeqMask) << 1) |
         static_cast<uint64_t>(part);
}

// Gloo messages start with "[/path/file.cc:123] "; keep only the text.
std::string GlooMessage(const std::string& what) {
  if (!what.empty() && what[0] == '[') {
    size_t end = what.find("] ");
    if (end != std::string::npos) return what.substr(end + 2);
  }
  return what;
}

// Element range [offset, offset + length) of chunk `i` when `count`
// elements are split into `n` chunks, the first count % n one longer.
size_t ChunkLength(size_t count, int n, int i) {
  return count / n + (static_cast<size_t>(i) < count % n ? 1 : 0);
}
size_t ChunkOffset(size_t count, int n, int i) {
  return static_cast<size_t>(i) * (count / n) + std::min<size_t>(i, count % n);
}

// After a rendezvous timed out: ": rank 2 (world rank 6) never joined",
// found by looking up each rank's rendezvous key "<group>/<rank>" (the key
// connectFullMesh publishes through the PrefixStore). Empty if this rank's own
// key is absent too, i.e. the key layout is not the one expected.
std::string MissingRanks(Store& store, const GlooCommunicatorOptions& options,
                         bool named_world_ranks) {
  auto key = [&](int r) { return fmt::format("{}/{}", options.group, r); };
  if (!store.Wait({key(options.rank)}, 0).ok()) return "";
  std::vector<std::string> missing;
  for (int r = 0; r < options.size; ++r) {
    if (r == options.rank || store.Wait({key(r)}, 0).ok()) continue;
    missing.push_back(named_world_ranks
                          ? fmt::format("rank {} (world rank {})", r, options.world_ranks[r])
                          : fmt::format("rank {}", r));
  }
  if (missing.empty()) return "";
  std::string list;
  for (size_t i = 0; i < missing.size(); ++i) list += (i ? ", " : "") + missing[i];
  return fmt::format(": {} never joined", list);
}

}  // namespace

StatusOr<std::shared_ptr<gloo::transport::Device>> GlooCommunicator::CreateTcpDevice(
    const std::string& hostname, const std::string& iface) {
  gloo::transport::tcp::attr attr;
  if (!iface.empty()) {
    attr.iface = iface;
  } else {
    attr.hostname = hostname;
  }
  try {
    return gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    return InvalidArgument(fmt::format("cannot create a Gloo TCP device on {} '{}': {}",
                                       iface.empty() ? "host" : "interface",
                                       iface.empty() ? hostname : iface, GlooMessage(e.what())));
  }
}

StatusOr<std::unique_ptr<GlooCommunicator>> GlooCommunicator::Create(
    Store& store, const GlooCommunicatorOptions& options,
    std::shared_ptr<gloo::transport::Device> device) {
  std::string where =
      fmt::format("joining group {} as rank {} of {}", options.group, options.rank, options.size);
  const bool named_world_ranks = options.world_ranks.size() == static_cast<size_t>(options.size);
  if (named_world_ranks && options.rank >= 0 && options.rank < options.size) {
    where += fmt::format(" (world rank {})", options.world_ranks[options.rank]);
  }
  if (options.group.empty()) return InvalidArgument(where + ": the group name is empty");
  if (options.size < 1 || options.rank < 0 || options.rank >= options.size) {
    return InvalidArgument(where + ": the rank must lie in [0, size)");
  }
  if (!(options.timeout_seconds > 0) || !(options.connect_timeout_seconds > 0)) {
    return InvalidArgument(where + ": timeouts must be positive");
  }
  if (!options.world_ranks.empty() &&
      options.world_ranks.size() != static_cast<size_t>(options.size)) {
    return InvalidArgument(fmt::format("{}: world_ranks has {} entries, expected {}", where,
                                       options.world_ranks.size(), options.size));
  }
  if (options.size == 1) {
    return std::unique_ptr<GlooCommunicator>(new GlooCommunicator(options, nullptr));
  }
  if (!device) {
    TESSERA_ASSIGN_OR_RETURN(device, CreateTcpDevice(options.hostname, options.iface));
  }

  GlooStoreAdapter adapter(store, options.connect_timeout_seconds);
  auto connect_ms = std::chrono::milliseconds(
      static_cast<int64_t>(std::ceil(options.connect_timeout_seconds * 1000.0)));
  auto op_ms =
      std::chrono::milliseconds(static_cast<int64_t>(std::ceil(options.timeout_seconds * 1000.0)));
  std::shared_ptr<gloo::rendezvous::Context> context;
  try {
    gloo::rendezvous::PrefixStore prefixed(options.group, adapter);
    context = std::make_shared<gloo::rendezvous::Context>(options.rank, options.size);
    context->setTimeout(connect_ms);
    context->connectFullMesh(prefixed, device);
    context->setTimeout(op_ms);
  } catch (const std::exception& e) {
    Status store_error = adapter.first_error();
    if (store_error.code() == StatusCode::kDeadlineExceeded) {
      return store_error.WithContext(where + MissingRanks(store, options, named_world_ranks));
    }
    if (!store_error.ok()) return store_error.WithContext(where);
    return Unavailable(fmt::format("{}: {}", where, GlooMessage(e.what())));
  }
  return std::unique_ptr<GlooCommunicator>(new GlooCommunicator(options, std::move(context)));
}

GlooCommunicator::GlooCommunicator(GlooCommunicatorOptions options,
                                   std::shared_ptr<gloo::Context> context)
    : options_(std::move(options)),
      context_(std::move(context)),
      send_seq_(options_.size, 0),
      recv_seq_(options_.size, 0) {}

GlooCommunicator::~GlooCommunicator() = default;

std::string GlooCommunicator::Where(const char* op) const {
  std::string s = fmt::format("{} on rank {} of group {}", op, options_.rank, options_.group);
  if (!options_.world_ranks.empty()) {
    s += fmt::format(" (world rank {})", options_.world_ranks[options_.rank]);
  }
  return s;
}

std::string GlooCommunicator::PeerName(int peer) const {
  if (options_.world_ranks.empty()) return fmt::format("rank {}", peer);
  return fmt::format("rank {} (world rank {})", peer, options_.world_ranks[peer]);
}

GlooCommunicator::Clock::time_point GlooCommunicator::Deadline() const {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(
                            std::chrono::duration<double>(options_.timeout_seconds));
}

Status GlooCommunicator::CheckUsable(const char* op) const {
  if (broken_.ok()) return Status::Ok();
  return FailedPrecondition(fmt::format("{}: the communicator is broken by an earlier failure: {}",
                                        Where(op), broken_.message()));
}

Status GlooCommunicator::CheckPeer(const char* op, int peer, const char* what) const {
  if (peer < 0 || peer >= options_.size || peer == options_.rank) {
    return InvalidArgument(fmt::format("{}: {} {} is not another rank of the group (size {})",
                                       Where(op), what, peer, options_.size));
  }
  return Status::Ok();
}

Status GlooCommunicator::Break(Status status) {
  if (broken_.ok()) broken_ = status;
  if (context_) {
    try {
      context_->closeConnections();
    } catch (const std::exception&) {
      // Already failing; the connections are being torn down either way.
    }
  }
  return status;
}

void GlooCommunicator::Interrupt(const std::string& why) {
  std::lock_guard<std::mutex> lock(interrupt_mu_);
  if (interrupted_.empty()) interrupted_ = why.empty() ? "interrupted" : why;
  for (gloo::transport::UnboundBuffer* b : waiting_) {
    b->abortWaitRecv();
    b->abortWaitSend();
  }
}

std::vector<int> GlooCommunicator::LostPeerWorldRanks() const {
  std::lock_guard<std::mutex> lock(interrupt_mu_);
  return lost_peers_;
}

Status GlooCommunicator::Exchange(const char* op, const std::vector<Transfer>& sends,
                                  const std::vector<Transfer>& recvs, Clock::time_point deadline) {
  std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> recv_bufs(recvs.size());
  std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> send_bufs(sends.size());
  // Interrupt reaches the buffers below while they are waited on; they are
  // unregistered before they are destroyed.
  auto interrupted = [&]() -> std::string {
    std::lock_guard<std::mutex> lock(interrupt_mu_);
    return interrupted_;
  };
  struct Unregister {
    GlooCommunicator* self;
    ~Unregister() {
      std::lock_guard<std::mutex> lock(self->interrupt_mu_);
      self->waiting_.clear();
    }
  } unregister{this};
  auto watch = [&](gloo::transport::UnboundBuffer* b) {
    std::lock_guard<std::mutex> lock(interrupt_mu_);
    waiting_.push_back(b);
  };
  if (std::string why = interrupted(); !why.empty())
    return Break(Unavailable(fmt::format("{}: interrupted: {}", Where(op), why)));
  int peer = -1;              // the peer of the step in progress
  const char* step = "post";  // "receive from" / "send to" while waiting
  auto remaining = [&] {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    return std::max(left, std::chrono::milliseconds(0));
  };
  try {
    for (size_t i = 0; i < recvs.size(); ++i) {
      if (recvs[i].bytes == 0) continue;
      peer = recvs[i].peer;
      recv_bufs[i] = context_->createUnboundBuffer(recvs[i].ptr, recvs[i].bytes);
      watch(recv_bufs[i].get());
      recv_bufs[i]->recv(peer, recvs[i].slot);
    }
    for (size_t i = 0; i < sends.size(); ++i) {
      if (sends[i].bytes == 0) continue;
      peer = sends[i].peer;
      send_bufs[i] = context_->createUnboundBuffer(sends[i].ptr, sends[i].bytes);
      watch(send_bufs[i].get());
      send_bufs[i]->send(peer, sends[i].slot);
    }
    step = "waiting for";
    for (size_t i = 0; i < recvs.size(); ++i) {
      if (!recv_bufs[i]) continue;
      peer = recvs[i].peer;
      if (!recv_bufs[i]->waitRecv(nullptr, remaining())) {
        if (std::string why = interrupted(); !why.empty())
          return Break(Unavailable(fmt::format("{}: the receive from {} was interrupted: {}",
                                               Where(op), PeerName(peer), why)));
        return Break(Internal(
            fmt::format("{}: the receive from {} was aborted", Where(op), PeerName(peer))));
      }
    }
    for (size_t i = 0; i < sends.size(); ++i) {
      if (!send_bufs[i]) continue;
      peer = sends[i].peer;
      if (!send_bufs[i]->waitSend(nullptr, remaining())) {
        if (std::string why = interrupted(); !why.empty())
          return Break(Unavailable(fmt::format("{}: the send to {} was interrupted: {}", Where(op),
                                               PeerName(peer), why)));
        return Break(
            Internal(fmt::format("{}: the send to {} was aborted", Where(op), PeerName(peer))));
      }
    }
  } catch (const gloo::IoException& e) {
    std::string msg = GlooMessage(e.what());
    if (Clock::now() >= deadline || msg.find("Timed out") != std::string::npos) {
      return Break(DeadlineExceeded(fmt::format("{}: timed out after {:.1f} s {} {}", Where(op),
                                                options_.timeout_seconds, step, PeerName(peer))));
    }
    if (peer >= 0 && !options_.world_ranks.empty() && interrupted().empty()) {
      std::lock_guard<std::mutex> lock(interrupt_mu_);
      lost_peers_.push_back(options_.world_ranks[static_cast<size_t>(peer)]);
    }
    return Break(Unavailable(
        fmt::format("{}: lost the connection to {} ({})", Where(op), PeerName(peer), msg)));
  } catch (const std::exception& e) {
    return Break(Internal(fmt::format("{}: Gloo failed while exchanging with {}: {}", Where(op),
                                      PeerName(peer), GlooMessage(e.what()))));
  }
  return Status::Ok();
}

Status GlooCommunicator::AllReduceSum(float* data, size_t count) {
  static constexpr const char* kOp = "all_reduce";
  TESSERA_RETURN_IF_ERROR(CheckUsable(kOp));
  const int n = options_.size;
  const int me = options_.rank;
  if (n == 1 || count == 0) return Status::Ok();
  const uint64_t seq = collective_seq_++;
  auto deadline = Deadline();
  const size_t my_len = ChunkLength(count, n, me);
  float* mine = data + ChunkOffset(count, n, me);

  // Reduce-scatter: rank r receives every rank's copy of chunk r.
  std::vector<float> copies(static_cast<size_t>(n) * my_len);  // [n, my_len]
  std::vector<Transfer> sends, recvs;
  for (int p = 0; p < n; ++p) {
    if (p == me) continue;
    recvs.push_back(
        {p, copies.data() + p * my_len, my_len * sizeof(float), CollectiveSlot(seq, 0)});
    sends.push_back({p, data + ChunkOffset(count, n, p), ChunkLength(count, n, p) * sizeof(float),
                     CollectiveSlot(seq, 0)});
  }
  TESSERA_RETURN_IF_ERROR(Exchange(kOp, sends, recvs, deadline));
  std::copy(mine, mine + my_len, copies.data() + me * my_len);
  for (size_t i = 0; i < my_len; ++i) mine[i] = copies[i];
  for (int r = 1; r < n; ++r) {
    const float* src = copies.data() + r * my_len;
    for (size_t i = 0; i < my_len; ++i) mine[i] += src[i];
  }

  // All-gather: rank r sends the sum of chunk r to every rank.
  sends.clear();
  recvs.clear();
  for (int p = 0; p < n; ++p) {
    if (p == me) continue;
    recvs.push_back({p, data + ChunkOffset(count, n, p), ChunkLength(count, n, p) * sizeof(float),
                     CollectiveSlot(seq, 1)});
    sends.push_back({p, mine, my_len * sizeof(float), CollectiveSlot(seq, 1)});
  }
  return Exchange(kOp, sends, recvs, deadline);
}

Status GlooCommunicator::AllGather(const float* send, size_t count_per_rank, float* recv) {
  static constexpr const char* kOp = "all_gather";
  TESSERA_RETURN_IF_ERROR(CheckUsable(kOp));
  const int n = options_.size;
  const int me = options_.rank;
  float* mine = recv + static_cast<size_t>(me) * count_per_rank;
  if (send != mine) std::memmove(mine, send, count_per_rank * sizeof(float));
  if (n == 1 || count_per_rank == 0) return Status::Ok();
  const uint64_t seq = collective_seq_++;
  std::vector<Transfer> sends, recvs;
  for (int p = 0; p < n; ++p) {
    if (p == me) continue;
    recvs.push_back({p, recv + static_cast<size_t>(p) * count_per_rank,
                     count_per_rank * sizeof(float), CollectiveSlot(seq, 0)});
    sends.push_back({p, mine, count_per_rank * sizeof(float), CollectiveSlot(seq, 0)});
  }
  return Exchange(kOp, sends, recvs, Deadline());
}

Status GlooCommunicator::Broadcast(void* data, size_t bytes, int root) {
  static constexpr const char* kOp = "broadcast";
  TESSERA_RETURN_IF_ERROR(CheckUsable(kOp));
  const int n = options_.size;
  const int me = options_.rank;
  if (root < 0 || root >= n) {
    return InvalidArgument(
        fmt::format("{}: root {} is not a rank of the group (size {})", Where(kOp), root, n));
  }
  if (n == 1 || bytes == 0) return Status::Ok();
  const uint64_t seq = collective_seq_++;
  std::vector<Transfer> sends, recvs;
  if (me == root) {
    for (int p = 0; p < n; ++p) {
      if (p != me) sends.push_back({p, data, bytes, CollectiveSlot(seq, 0)});
    }
  } else {
    recvs.push_back({root, data, bytes, CollectiveSlot(seq, 0)});
  }
  return Exchange(kOp, sends, recvs, Deadline());
}

Status GlooCommunicator::Barrier() {
  static constexpr const char* kOp = "barrier";
  TESSERA_RETURN_IF_ERROR(CheckUsable(kOp));
  const int n = options_.size;
  const int me = options_.rank;
  if (n == 1) return Status::Ok();
  const uint64_t seq = collective_seq_++;
  char token = 1;
  std::vector<char> tokens(n, 0);
  std::vector<Transfer> sends, recvs;
  for (int p = 0; p < n; ++p) {
    if (p == me) continue;
    recvs.push_back({p, &tokens[p], 1, CollectiveSlot(seq, 0)});
    sends.push_back({p, &token, 1, CollectiveSlot(seq, 0)});
  }
  return Exchange(kOp, sends, recvs, Deadline());
}

Status GlooCommunicator::Send(const void* data, size_t bytes, int peer) {
  static constexpr const char* kOp = "send";
  TESSERA_RETURN_IF_ERROR(CheckUsable(kOp));
  TESSERA_RETURN_IF_ERROR(CheckPeer(kOp, peer, "peer"));
  const uint64_t seq = send_seq_[peer]++;
  const int me = options_.rank;
  uint64_t header = bytes;
  std::vector<Transfer> sends = {{peer, &header, sizeof(header), P2PSlot(me, peer, seq, 0)},
                                 {peer, const_cast<void*>(data), bytes, P2PSlot(me, peer, seq, 1)}};
  return Exchange(kOp, sends, {}, Deadline());
}

Status GlooCommunicator::Recv(void* data, size_t bytes, int peer) {
  static constexpr const char* kOp = "recv";
  TESSERA_RETURN_IF_ERROR(CheckUsable(kOp));
  TESSERA_RETURN_IF_ERROR(CheckPeer(kOp, peer, "peer"));
  const uint64_t seq = recv_seq_[peer]++;
  const int me = options_.rank;
  auto deadline = Deadline();
  uint64_t header = 0;
  TESSERA_RETURN_IF_ERROR(
      Exchange(kOp, {}, {{peer, &header, sizeof(header), P2PSlot(peer, me, seq, 0)}}, deadline));
  if (header != bytes) {
    return Break(InvalidArgument(fmt::format("{}: {} sent {} bytes, the receive expects {} bytes",
                                             Where(kOp), PeerName(peer), header, bytes)));
  }
  return Exchange(kOp, {}, {{peer, data, bytes, P2PSlot(peer, me, seq, 1)}}, deadline);
}

}  // namespace tessera
