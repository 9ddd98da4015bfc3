// GlooCommunicator: the Communicator (worker/comm/communicator.h) for CPU ranks,
// over Gloo's TCP transport.
//
// Creation runs Gloo's rendezvous (gloo::rendezvous::Context::connectFullMesh)
// through a Tessera Store under the key prefix "<group>/", which opens one TCP
// connection between every two ranks of the group. Every operation then runs
// over Gloo unbound buffers (point-to-point send/recv on a slot, waited with
// the remaining time of the operation's deadline), with direct algorithms
// that suit the small groups of tensor parallelism (2-8 ranks):
//  - AllReduceSum: reduce-scatter then all-gather, both direct. The count is
//    split into size() chunks (the first count % size() chunks one element
//    longer); rank r receives chunk r from every rank, sums the size()
//    copies in rank order and sends the sum to every rank. Per rank it moves
//    2 * (size()-1)/size() * count floats each way, like a ring, in 2 steps
//    instead of 2 * (size()-1).
//  - AllGather: every rank sends its slice to every other rank.
//  - Broadcast: the root sends to every other rank.
//  - Barrier: every rank sends one byte to every other rank.
//  - Send/Recv: an 8-byte header carrying the byte count, then the payload;
//    the receiver checks the count before it accepts the payload.
// Because every rank waits on each peer directly, a dead or silent rank is
// named by every other rank in the error instead of a neighbour that is
// itself waiting. Gloo exceptions (gloo::IoException, gloo::EnforceNotMet,
// ...) are caught here and returned as Status.
//
// Interrupt aborts the waits of the operation in progress (Gloo's
// abortWaitRecv / abortWaitSend on its unbound buffers) and fails every later
// one with kUnavailable (the message says "interrupted").
//
// Thread-safety: as Communicator (one thread at a time per communicator;
// Interrupt from any thread). Communicators sharing a TCP device may run on
// different threads.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/base/status.h"
#include "common/net/store.h"
#include "worker/comm/communicator.h"

namespace gloo {
class Context;
namespace transport {
class Device;
class UnboundBuffer;
}  // namespace transport
}  // namespace gloo

namespace tessera {

struct GlooCommunicatorOptions {
  // Group name: the store key prefix and the name in every error message.
  // It must be unique among the groups that ever rendezvous on one store.
  std::string group;
  int rank = 0;  // this rank's index in the group, 0 <= rank < size
  int size = 1;  // number of ranks in the group
  // Bound of every operation, seconds.
  double timeout_seconds = 30.0;
  // Bound of the rendezvous in Create (all ranks must arrive), seconds.
  double connect_timeout_seconds = 60.0;
  // Address the TCP device binds to and advertises to peers, unless iface is
  // set, in which case the device binds to that interface's address.
  std::string hostname = "127.0.0.1";
  std::string iface;
  // Optional: the world rank of each group rank (size entries), added to
  // error messages as "rank 1 (world rank 3)".
  std::vector<int> world_ranks;
};

class GlooCommunicator : public Communicator {
 public:
  // A Gloo TCP device (one listening address and one event-loop thread) to
  // share among the communicators of one process. Binds to `iface` if it is
  // non-empty, else to `hostname`.
  // Errors: kInvalidArgument (unknown interface or host).
  static StatusOr<std::shared_ptr<gloo::transport::Device>> CreateTcpDevice(
      const std::string& hostname, const std::string& iface);

  // Joins group `options.group` through `store`: blocks until all
  // options.size ranks have called Create with the same group name (at most
  // options.connect_timeout_seconds) and are connected. A group of size 1
  // needs no store traffic. `device` may be null: a device is then created
  // from options.hostname / options.iface.
  // Errors: kInvalidArgument (bad options), kDeadlineExceeded (a rank did not
  // arrive in time; the message names it, e.g. "joining group tp.stage1 as
  // rank 0 of 2 (world rank 2): rank 1 (world rank 3) never joined: ...",
  // and the store key "<group>/<rank>" waited for), kUnavailable (the store
  // or a peer is unreachable).
  static StatusOr<std::unique_ptr<GlooCommunicator>> Create(
      Store& store, const GlooCommunicatorOptions& options,
      std::shared_ptr<gloo::transport::Device> device = nullptr);

  ~GlooCommunicator() override;

  int rank() const override { return options_.rank; }
  int size() const override { return options_.size; }
  const std::string& name() const override { return options_.group; }

  Status AllReduceSum(float* data, size_t count) override;
  Status AllGather(const float* send, size_t count_per_rank, float* recv) override;
  Status Broadcast(void* data, size_t bytes, int root) override;
  Status Send(const void* data, size_t bytes, int peer) override;
  Status Recv(void* data, size_t bytes, int peer) override;
  Status Barrier() override;
  void Interrupt(const std::string& why) override;
  std::vector<int> LostPeerWorldRanks() const override;

 private:
  using Clock = std::chrono::steady_clock;

  // One point-to-point transfer of an operation.
  struct Transfer {
    int peer;
    void* ptr;
    size_t bytes;
    uint64_t slot;
  };

  GlooCommunicator(GlooCommunicatorOptions options, std::shared_ptr<gloo::Context> context);

  // Posts every recv, then every send, then waits for the recvs and then the
  // sends (in the listed order) until `deadline`. Zero-byte transfers are
  // skipped. On failure marks the communicator broken and returns an error
  // naming `op` and the peer.
  Status Exchange(const char* op, const std::vector<Transfer>& sends,
                  const std::vector<Transfer>& recvs, Clock::time_point deadline);
  // kFailedPrecondition if an earlier call failed.
  Status CheckUsable(const char* op) const;
  Status CheckPeer(const char* op, int peer, const char* what) const;
  // Records `status` as the failure that broke the communicator, closes its
  // connections (so peers fail fast instead of timing out) and returns it.
  Status Break(Status status);
  Clock::time_point Deadline() const;
  // "all_reduce on rank 2 of group tp.stage1 (world rank 6)".
  std::string Where(const char* op) const;
  // "rank 3" or "rank 3 (world rank 7)".
  std::string PeerName(int peer) const;

  const GlooCommunicatorOptions options_;
  std::shared_ptr<gloo::Context> context_;  // null for a group of size 1
  uint64_t collective_seq_ = 0;             // collectives run so far
  std::vector<uint64_t> send_seq_;          // Sends to each peer so far
  std::vector<uint64_t> recv_seq_;          // Recvs from each peer so far
  Status broken_;                           // first failure, OK while usable

  // What Interrupt reaches: the buffers the operation in progress waits on.
  mutable std::mutex interrupt_mu_;
  std::vector<gloo::transport::UnboundBuffer*> waiting_;  // guarded by interrupt_mu_
  std::string interrupted_;      // guarded by interrupt_mu_: Interrupt's reason ("" = none)
  std::vector<int> lost_peers_;  // guarded by interrupt_mu_: world ranks, see LostPeerWorldRanks
};

}  // namespace tessera
