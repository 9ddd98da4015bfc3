#include "common/engine/block_allocator.h"

#include <algorithm>
#include <functional>
#include <string>

namespace tessera {

BlockAllocator::BlockAllocator(int64_t num_blocks) : num_blocks_(num_blocks) {}

Status BlockAllocator::Allocate(int64_t n, std::vector<int32_t>& table) {
  if (n > num_free())
    return ResourceExhausted("kv cache: " + std::to_string(n) + " blocks requested, " +
                             std::to_string(num_free()) + " of " + std::to_string(num_blocks_) +
                             " free");
  for (int64_t i = 0; i < n; ++i) {
    int32_t b = 0;
    if (!unused_.empty()) {  // every id there is below fresh_: the lowest first
      b = unused_.top();
      unused_.pop();
    } else if (fresh_ < num_blocks_) {
      b = static_cast<int32_t>(fresh_++);
      blocks_.emplace_back();
    } else {
      b = lru_.front();
      Evict(b);
      unused_.pop();  // Evict made b the only unused block
    }
    blocks_[static_cast<size_t>(b)].refs = 1;
    table.push_back(b);
  }
  return Status::Ok();
}

void BlockAllocator::Free(std::vector<int32_t>& table) {
  for (auto it = table.rbegin(); it != table.rend(); ++it) {
    Block& blk = blocks_[static_cast<size_t>(*it)];
    TESSERA_CHECK(blk.refs > 0);
    if (--blk.refs > 0) continue;
    Release(*it);
  }
  table.clear();
}

void BlockAllocator::Release(int32_t block) {
  Block& blk = blocks_[static_cast<size_t>(block)];
  if (blk.key) {
    blk.lru = lru_.insert(lru_.end(), block);
  } else {
    unused_.push(block);
  }
}

void BlockAllocator::Evict(int32_t block) {
  Block& blk = blocks_[static_cast<size_t>(block)];
  TESSERA_CHECK(blk.refs == 0 && blk.key);
  lru_.erase(blk.lru);
  index_.erase(*blk.key);
  blk.key.reset();
  unused_.push(block);
}

std::optional<int32_t> BlockAllocator::Find(const BlockKey& key) const {
  auto it = index_.find(key);
  if (it == index_.end()) return std::nullopt;
  return it->second;
}

void BlockAllocator::AddRef(int32_t block) {
  Block& blk = blocks_[static_cast<size_t>(block)];
  // A cached block (Find), or one a sequence holds (choices of one prompt).
  TESSERA_CHECK(blk.key.has_value() || blk.refs > 0);
  if (blk.refs++ == 0) lru_.erase(blk.lru);
}

bool BlockAllocator::Register(int32_t block, const BlockKey& key) {
  Block& blk = blocks_[static_cast<size_t>(block)];
  TESSERA_CHECK(blk.refs > 0);
  if (blk.key || index_.count(key)) return false;
  blk.key = key;
  index_.emplace(key, block);
  return true;
}

void BlockAllocator::ClearCache() {
  for (Block& blk : blocks_) blk.key.reset();
  for (int32_t b : lru_) unused_.push(b);
  lru_.clear();
  index_.clear();
}

}  // namespace tessera
