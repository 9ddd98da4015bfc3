// Communicator: the collective and point-to-point operations one rank runs
// with the other ranks of a group (the tensor-parallel ranks of a stage, or
// the two ends of a pipeline link). GlooCommunicator implements it on CPU
// over TCP; NcclCommunicator (worker/comm/nccl_communicator.h, CUDA builds)
// implements it on device buffers.
//
// Contract shared by every implementation:
//  - Ranks are numbered 0..size()-1 within the group.
//  - Every rank of the group calls the same collectives in the same order
//    with the same counts (and root). Point-to-point calls between two ranks
//    match in order: the k-th Send(.., peer=b) on rank a pairs with the k-th
//    Recv(.., peer=a) on rank b, and both give the same byte count.
//  - Every call is bounded by the timeout configured when the communicator
//    was created. No call hangs: it returns kDeadlineExceeded if a peer was
//    not heard from in time, kUnavailable if a peer's connection broke. The
//    message names the operation, this rank, the group and the peer rank
//    that failed or was not heard from, e.g.
//      "all_reduce on rank 2 of group tp.stage1: timed out after 5.0 s
//       waiting for rank 3"
//  - After any failed call the communicator is broken: its connections may
//    be half-used, so every later call returns kFailedPrecondition quoting
//    the first failure. Recover by building a new communicator (a new group
//    name) with the surviving ranks.
//
// Buffers live where device() says: host memory for Gloo, device memory of
// the rank's GPU for NCCL. dtypes are float32 for the reducing and gathering
// collectives (F32/BF16/F16 through the *Typed variants) and raw bytes for
// Broadcast/Send/Recv.
//
// Thread-safety: a communicator is used by one thread at a time (the thread
// that runs its rank's forward pass), except Interrupt, which any thread may
// call at any time. Distinct communicators may be used concurrently from
// distinct threads.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "common/base/dtype.h"
#include "common/base/status.h"
#include "common/base/tensor.h"

namespace tessera {

class Communicator {
 public:
  virtual ~Communicator() = default;

  // This rank's index in the group, 0 <= rank() < size().
  virtual int rank() const = 0;
  // Number of ranks in the group.
  virtual int size() const = 0;
  // The group's name, e.g. "tp.stage1" or "pipe.stage0-1.tp0".
  virtual const std::string& name() const = 0;
  // Where the buffers of every call live.
  virtual Device device() const { return Device::kCPU; }

  // In place: data[i] = sum over ranks r of data_r[i], for i < count.
  // data: float32[count], count equal on every rank. Every rank ends with
  // bitwise identical results (each element is summed once, in rank order
  // 0..size()-1, and that sum is sent to every rank).
  virtual Status AllReduceSum(float* data, size_t count) = 0;

  // recv[r * count_per_rank + i] = send_r[i] for every rank r, i <
  // count_per_rank. send: float32[count_per_rank]; recv:
  // float32[size(), count_per_rank] (size() * count_per_rank elements).
  // `send` may point into `recv` at this rank's slot.
  virtual Status AllGather(const float* send, size_t count_per_rank, float* recv) = 0;

  // Copies `bytes` bytes at `data` on rank `root` to `data` on every rank.
  // Errors: kInvalidArgument if root is not in [0, size()).
  virtual Status Broadcast(void* data, size_t bytes, int root) = 0;

  // Sends `bytes` bytes to rank `peer` of this group. Rendezvous semantics
  // (like MPI_Ssend): returns only after the peer has posted the matching
  // Recv and the bytes have been handed to the transport, so two ranks that
  // Send to each other at the same time both time out; order them (one sends
  // first, the other receives first). `data` may be reused on return.
  // Errors: kInvalidArgument if peer is this rank or not in [0, size()).
  virtual Status Send(const void* data, size_t bytes, int peer) = 0;

  // Receives exactly `bytes` bytes from rank `peer` into `data`. Errors: as
  // Send, plus kInvalidArgument if the peer sent a different byte count.
  virtual Status Recv(void* data, size_t bytes, int peer) = 0;

  // Returns once every rank of the group has entered Barrier().
  virtual Status Barrier() = 0;

  // AllReduceSum / AllGather over `dtype` elements (F32, BF16 or F16; a
  // 16-bit sum is accumulated as the implementation does, NCCL in fp32 per
  // step of its ring). The default handles F32 through the float overloads
  // and answers other dtypes with kUnimplemented naming the dtype and group.
  virtual Status AllReduceSumTyped(void* data, size_t count, DType dtype);

  // Device communicators: puts the work enqueued so far on the rank's stream
  // (e.g. a replayed CUDA graph whose collectives were recorded, not issued
  // one by one) under the call timeout, as one operation named `what`.
  // Collectives recorded into a graph are not watched themselves. A no-op for
  // host communicators, whose calls complete before they return.
  virtual Status WatchEnqueued(const std::string& what);
  virtual Status AllGatherTyped(const void* send, size_t count_per_rank, DType dtype, void* recv);

  // Thread-safe, from any thread: makes the call blocked now, if any, and
  // every later call return kUnavailable naming `why` (the communicator is
  // broken from then on). The worker uses it when its plan ends while a
  // receive waits on a peer that will never send (a plan change). Host
  // communicators implement it; the default does nothing (device
  // communicators are bounded by their watchdog).
  virtual void Interrupt(const std::string& why);

  // Thread-safe: the world ranks of peers whose connection broke in a failed
  // call (kUnavailable: closed or reset, not a timeout), in the order seen;
  // empty for communicators that do not know world ranks.
  virtual std::vector<int> LostPeerWorldRanks() const;
};

}  // namespace tessera
