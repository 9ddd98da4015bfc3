#include "common/engine/block_allocator.h"

#include <algorithm>
#include <functional>
#include <string>

namespace tessera {

BlockAllocator::BlockAllocator(int64_t num_blocks) : num_blocks_(num_blocks) {
  free_.reserve(static_cast<size_t>(num_blocks));
  for (int64_t b = num_blocks - 1; b >= 0; --b) free_.push_back(static_cast<int32_t>(b));
}

Status BlockAllocator::Allocate(int64_t n, std::vector<int32_t>& table) {
  if (n > num_free())
    return ResourceExhausted("kv cache: " + std::to_string(n) + " blocks requested, " +
                             std::to_string(num_free()) + " of " + std::to_string(num_blocks_) +
                             " free");
  for (int64_t i = 0; i < n; ++i) {
    table.push_back(free_.back());
    free_.pop_back();
  }
  return Status::Ok();
}

void BlockAllocator::Free(std::vector<int32_t>& table) {
  for (int32_t b : table) free_.push_back(b);
  std::sort(free_.begin(), free_.end(), std::greater<int32_t>());
  table.clear();
}

}  // namespace tessera
