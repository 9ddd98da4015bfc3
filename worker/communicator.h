// Placeholder of the Communicator interface; replaced by the comm branch.
#pragma once
#include <cstddef>
#include "common/status.h"
namespace tessera {
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual Status AllReduceSum(float* data, size_t count) = 0;
  virtual Status AllGather(const float* send, size_t count_per_rank, float* recv) = 0;
  virtual Status Broadcast(void* data, size_t bytes, int root) = 0;
  virtual Status Send(const void* data, size_t bytes, int peer) = 0;
  virtual Status Recv(void* data, size_t bytes, int peer) = 0;
  virtual Status Barrier() = 0;
};
}  // namespace tessera
