#include "worker/comm/metered_communicator.h"

#include <chrono>

namespace tessera {

MeteredCommunicator::MeteredCommunicator(Communicator* inner, HistogramFamily& seconds,
                                         CounterFamily& bytes,
                                         const std::vector<std::string>& labels, RecvHooks hooks)
    : inner_(inner), hooks_(std::move(hooks)) {
  static const char* kNames[kNumOps] = {"all_reduce", "all_gather", "broadcast",
                                        "send",       "recv",       "barrier"};
  for (int op = 0; op < kNumOps; ++op) {
    std::vector<std::string> l = labels;
    l.push_back(kNames[op]);
    seconds_[op] = &seconds.WithLabels(l);
    bytes_[op] = &bytes.WithLabels(l);
  }
}

template <typename F>
Status MeteredCommunicator::Timed(Op op, size_t bytes, F&& call) {
  const auto t0 = std::chrono::steady_clock::now();
  Status s = call();
  seconds_[op]->Observe(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  if (s.ok()) bytes_[op]->Inc(static_cast<double>(bytes));
  return s;
}

Status MeteredCommunicator::AllReduceSum(float* data, size_t count) {
  return Timed(kAllReduce, count * sizeof(float),
               [&] { return inner_->AllReduceSum(data, count); });
}

Status MeteredCommunicator::AllGather(const float* send, size_t count_per_rank, float* recv) {
  return Timed(kAllGather, count_per_rank * sizeof(float),
               [&] { return inner_->AllGather(send, count_per_rank, recv); });
}

Status MeteredCommunicator::AllReduceSumTyped(void* data, size_t count, DType dtype) {
  return Timed(kAllReduce, count * DTypeSize(dtype),
               [&] { return inner_->AllReduceSumTyped(data, count, dtype); });
}

Status MeteredCommunicator::AllGatherTyped(const void* send, size_t count_per_rank, DType dtype,
                                           void* recv) {
  return Timed(kAllGather, count_per_rank * DTypeSize(dtype),
               [&] { return inner_->AllGatherTyped(send, count_per_rank, dtype, recv); });
}

Status MeteredCommunicator::Broadcast(void* data, size_t bytes, int root) {
  return Timed(kBroadcast, bytes, [&] { return inner_->Broadcast(data, bytes, root); });
}

Status MeteredCommunicator::Send(const void* data, size_t bytes, int peer) {
  return Timed(kSend, bytes, [&] { return inner_->Send(data, bytes, peer); });
}

Status MeteredCommunicator::Recv(void* data, size_t bytes, int peer) {
  if (hooks_.before) hooks_.before();
  Status s = Timed(kRecv, bytes, [&] { return inner_->Recv(data, bytes, peer); });
  if (s.ok() && hooks_.after) hooks_.after(data, bytes);
  return s;
}

Status MeteredCommunicator::Barrier() {
  return Timed(kBarrier, 0, [&] { return inner_->Barrier(); });
}

}  // namespace tessera
