#include "worker/daemon/step_watch.h"

#include <chrono>

namespace tessera {

namespace {

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

void StepWatch::BeginStep() {
  in_step_.store(true);
  since_ns_.store(NowNs());
}

void StepWatch::EndStep() {
  in_step_.store(false);
  since_ns_.store(0);
}

void StepWatch::BeginWait() { since_ns_.store(0); }

void StepWatch::EndWait() {
  if (in_step_.load()) since_ns_.store(NowNs());
}

double StepWatch::ComputeSeconds() const {
  const int64_t since = since_ns_.load();
  if (since == 0) return 0;
  return static_cast<double>(NowNs() - since) / 1e9;
}

Status StepWatchCommunicator::AllReduceSum(float* data, size_t count) {
  return Waiting([&] { return inner_->AllReduceSum(data, count); });
}

Status StepWatchCommunicator::AllGather(const float* send, size_t count_per_rank, float* recv) {
  return Waiting([&] { return inner_->AllGather(send, count_per_rank, recv); });
}

Status StepWatchCommunicator::Broadcast(void* data, size_t bytes, int root) {
  return Waiting([&] { return inner_->Broadcast(data, bytes, root); });
}

Status StepWatchCommunicator::Send(const void* data, size_t bytes, int peer) {
  return Waiting([&] { return inner_->Send(data, bytes, peer); });
}

Status StepWatchCommunicator::Recv(void* data, size_t bytes, int peer) {
  return Waiting([&] { return inner_->Recv(data, bytes, peer); });
}

Status StepWatchCommunicator::Barrier() {
  return Waiting([&] { return inner_->Barrier(); });
}

Status StepWatchCommunicator::AllReduceSumTyped(void* data, size_t count, DType dtype) {
  return Waiting([&] { return inner_->AllReduceSumTyped(data, count, dtype); });
}

Status StepWatchCommunicator::AllGatherTyped(const void* send, size_t count_per_rank, DType dtype,
                                             void* recv) {
  return Waiting([&] { return inner_->AllGatherTyped(send, count_per_rank, dtype, recv); });
}

Status StepWatchCommunicator::WatchEnqueued(const std::string& what) {
  return Waiting([&] { return inner_->WatchEnqueued(what); });
}

}  // namespace tessera
