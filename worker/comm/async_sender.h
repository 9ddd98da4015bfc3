// AsyncSender: the one thread that sends on a point-to-point link, so the
// rank's owner thread never blocks on a rendezvous Send while the peer is busy
// sending to it (pipeline stages send forward while the last stage sends
// tokens back; synchronous sends on both would deadlock).
//
// Each message goes out as a frame: u64 byte count, then the payload. A
// sender may fan out over several links (a pipeline stage feeding a next
// stage with more tp ranks, common/model/stage_handoff.h): each frame goes to every
// link in the order given, before the next frame; with no links Enqueue
// drops the frame (a tp rank that feeds nobody). The queue is bounded
// (capacity messages); Enqueue blocks while it is full.
// The first send error is kept and returned by every later Enqueue/Flush.
//
// Thread-safety: Enqueue and Flush may be called from one producer thread.
// The sender thread is the only user of the communicators.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "common/base/status.h"
#include "worker/comm/communicator.h"

namespace tessera {

// Frame helpers used by both ends of a link.
Status SendFrame(Communicator& comm, int peer, const void* data, size_t bytes);
// Receives one frame into `out`. Errors: kInvalidArgument when the frame is
// larger than `max_bytes`; communicator errors.
Status RecvFrame(Communicator& comm, int peer, std::vector<uint8_t>& out, size_t max_bytes);

class AsyncSender {
 public:
  // Sends to rank `peer` of `comm`.
  AsyncSender(Communicator* comm, int peer, size_t capacity);
  // Sends every frame to rank `peer` of each of `comms`, in order.
  AsyncSender(std::vector<Communicator*> comms, int peer, size_t capacity);
  ~AsyncSender();  // sends what is queued, then joins

  // Queues one frame. Errors: the first failure of an earlier send.
  Status Enqueue(std::vector<uint8_t> payload);
  // Waits until every queued frame has been sent.
  Status Flush();

 private:
  void Run();

  const std::vector<Communicator*> comms_;
  const int peer_;
  const size_t capacity_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::vector<uint8_t>> queue_;  // protected by mu_
  bool stopping_ = false;                   // protected by mu_
  bool sending_ = false;                    // protected by mu_
  Status error_;                            // protected by mu_
  std::thread thread_;
};

}  // namespace tessera
