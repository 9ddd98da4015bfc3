// BlockAllocator: the free list of KV-cache block ids of one pipeline.
//
// The scheduler owns the authoritative allocator of a deployment: every
// stage of the pipeline receives the same block tables, and a block id
// indexes the same block in every layer of every stage
// (worker/model/kv_cache.h holds the storage). The single-process engine owns
// one too.
//
// Thread-safety: not thread-safe; owned by the scheduler's owner thread.
#pragma once

#include <cstdint>
#include <vector>

#include "common/base/status.h"

namespace tessera {

// Free list of block ids [0, num_blocks). Allocate hands out the lowest free
// ids first, so runs are reproducible.
class BlockAllocator {
 public:
  explicit BlockAllocator(int64_t num_blocks);

  int64_t num_free() const { return static_cast<int64_t>(free_.size()); }
  int64_t num_blocks() const { return num_blocks_; }
  // Appends `n` block ids to `table`. Errors: kResourceExhausted (nothing is
  // allocated then) naming how many were asked for and how many are free.
  Status Allocate(int64_t n, std::vector<int32_t>& table);
  // Returns every block of `table` to the free list and clears it.
  void Free(std::vector<int32_t>& table);
  // Blocks needed to hold `tokens` positions.
  static int64_t BlocksFor(int64_t tokens, int64_t block_size) {
    return (tokens + block_size - 1) / block_size;
  }

 private:
  int64_t num_blocks_;
  std::vector<int32_t> free_;  // kept sorted descending; back() is the lowest id
};

}  // namespace tessera
