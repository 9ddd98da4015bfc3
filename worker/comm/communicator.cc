#include "worker/comm/communicator.h"

namespace tessera {

Status Communicator::AllReduceSumTyped(void* data, size_t count, DType dtype) {
  if (dtype != DType::kF32)
    return Unimplemented(std::string("all_reduce of ") + DTypeName(dtype) + " on group " + name() +
                         " (this communicator reduces F32 only)");
  return AllReduceSum(static_cast<float*>(data), count);
}

Status Communicator::AllGatherTyped(const void* send, size_t count_per_rank, DType dtype,
                                    void* recv) {
  if (dtype != DType::kF32)
    return Unimplemented(std::string("all_gather of ") + DTypeName(dtype) + " on group " + name() +
                         " (this communicator gathers F32 only)");
  return AllGather(static_cast<const float*>(send), count_per_rank, static_cast<float*>(recv));
}

Status Communicator::WatchEnqueued(const std::string&) { return Status::Ok(); }

void Communicator::Interrupt(const std::string& /*why*/) {}

std::vector<int> Communicator::LostPeerWorldRanks() const { return {}; }

}  // namespace tessera
