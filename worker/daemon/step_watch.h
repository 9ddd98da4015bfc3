// StepWatch: how long this rank has been computing its current step without
// waiting on a peer, for the coordinator's hung-step detection (issue #31,
// heartbeat.step_timeout_seconds). A hung kernel keeps that time growing;
// the peers it holds up wait in a collective or a receive, where it is 0.
// The worker reports it in every heartbeat (Heartbeat.step_compute_seconds);
// when a step misses its deadline the coordinator names the rank with the
// longest.
//
// The serving thread marks the step (BeginStep / EndStep) and, through
// StepWatchCommunicator around the rank's tp group and its link from the
// previous stage, every wait on a peer. A stage > 0 rank is in a step for
// the whole plan (it waits in its receive between micro-batches).
//
// Thread-safety: the Begin/End calls from the serving thread only;
// ComputeSeconds from any thread (the heartbeat's).
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "worker/comm/communicator.h"

namespace tessera {

class StepWatch {
 public:
  void BeginStep();
  void EndStep();
  void BeginWait();
  void EndWait();
  // Seconds of compute since the step began or its last wait ended; 0 when
  // not in a step or waiting.
  double ComputeSeconds() const;

 private:
  std::atomic<bool> in_step_{false};
  std::atomic<int64_t> since_ns_{0};  // steady clock; 0 = not computing
};

// Forwards every call to `inner`, marking the time it blocks as a wait on
// `watch`. `inner` and `watch` outlive it.
class StepWatchCommunicator : public Communicator {
 public:
  StepWatchCommunicator(Communicator* inner, StepWatch* watch) : inner_(inner), watch_(watch) {}

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const std::string& name() const override { return inner_->name(); }
  Device device() const override { return inner_->device(); }
  Status AllReduceSum(float* data, size_t count) override;
  Status AllGather(const float* send, size_t count_per_rank, float* recv) override;
  Status Broadcast(void* data, size_t bytes, int root) override;
  Status Send(const void* data, size_t bytes, int peer) override;
  Status Recv(void* data, size_t bytes, int peer) override;
  Status Barrier() override;
  Status AllReduceSumTyped(void* data, size_t count, DType dtype) override;
  Status AllGatherTyped(const void* send, size_t count_per_rank, DType dtype, void* recv) override;
  Status WatchEnqueued(const std::string& what) override;
  void Interrupt(const std::string& why) override { inner_->Interrupt(why); }
  std::vector<int> LostPeerWorldRanks() const override { return inner_->LostPeerWorldRanks(); }

 private:
  template <typename F>
  Status Waiting(F&& call) {
    watch_->BeginWait();
    Status s = call();
    watch_->EndWait();
    return s;
  }

  Communicator* inner_;
  StepWatch* watch_;
};

}  // namespace tessera
