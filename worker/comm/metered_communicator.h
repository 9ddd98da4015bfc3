// MeteredCommunicator: a Communicator decorator that times every call and
// counts its payload bytes into the worker's metrics, by op:
//   tessera_comm_duration_seconds{...,op}  histogram of call durations
//   tessera_comm_bytes_total{...,op}       payload bytes (for all_reduce and
//                                          all_gather: this rank's buffer)
// ops: all_reduce, all_gather, broadcast, send, recv, barrier. Results and
// errors of the wrapped communicator pass through unchanged.
//
// Optional recv hooks let a pipeline stage see when it starts waiting on its
// previous stage and what arrived (worker/daemon/worker_metrics.h uses them for the
// stage's busy/idle time and step latency without touching the executor).
//
// Thread-safety: as the wrapped communicator (one thread at a time); the
// metric children are thread-safe.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "common/metrics/metrics_registry.h"
#include "worker/comm/communicator.h"

namespace tessera {

struct RecvHooks {
  std::function<void()> before;                               // a Recv is about to wait
  std::function<void(const void* data, size_t bytes)> after;  // a Recv returned OK
};

class MeteredCommunicator : public Communicator {
 public:
  // `labels` are the values of the rank labels (node, gpu, uuid, stage,
  // tp_rank), to which the op is appended. `inner` must outlive this.
  MeteredCommunicator(Communicator* inner, HistogramFamily& seconds, CounterFamily& bytes,
                      const std::vector<std::string>& labels, RecvHooks hooks = {});

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const std::string& name() const override { return inner_->name(); }
  Status AllReduceSum(float* data, size_t count) override;
  Status AllGather(const float* send, size_t count_per_rank, float* recv) override;
  Status Broadcast(void* data, size_t bytes, int root) override;
  Status Send(const void* data, size_t bytes, int peer) override;
  Status Recv(void* data, size_t bytes, int peer) override;
  Status Barrier() override;
  // Device communicators stay device communicators through the wrapper; the
  // typed collectives are timed as enqueued (a device collective returns
  // once it is on the stream, so its time is the launch, not the transfer).
  Device device() const override { return inner_->device(); }
  Status AllReduceSumTyped(void* data, size_t count, DType dtype) override;
  Status AllGatherTyped(const void* send, size_t count_per_rank, DType dtype, void* recv) override;
  Status WatchEnqueued(const std::string& what) override { return inner_->WatchEnqueued(what); }
  void Interrupt(const std::string& why) override { inner_->Interrupt(why); }
  std::vector<int> LostPeerWorldRanks() const override { return inner_->LostPeerWorldRanks(); }

 private:
  enum Op { kAllReduce, kAllGather, kBroadcast, kSend, kRecv, kBarrier, kNumOps };
  template <typename F>
  Status Timed(Op op, size_t bytes, F&& call);

  Communicator* inner_;
  Histogram* seconds_[kNumOps];
  Counter* bytes_[kNumOps];
  RecvHooks hooks_;
};

}  // namespace tessera
