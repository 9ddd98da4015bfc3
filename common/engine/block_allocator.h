// BlockAllocator: the KV-cache block ids of one pipeline, reference counted,
// with the prefix cache's index of full blocks.
//
// The scheduler owns the authoritative allocator of a deployment: every
// stage of the pipeline receives the same block tables, and a block id
// indexes the same block in every layer of every stage
// (worker/model/kv_cache.h holds the storage). The single-process engine owns
// one too.
//
// Prefix caching (the scheduler decides what to share, common/engine/
// scheduler.h): a full block whose content is final can be registered under
// its BlockKey (common/engine/block_key.h). Another sequence that finds the
// key takes a reference to the same block (AddRef) instead of computing it
// again. Only full blocks are ever shared and nobody writes into a full
// block again, so no copy-on-write is needed. A block is in one of three
// states:
//   - referenced: in the block table of at least one sequence;
//   - cached: unreferenced but registered (its KV is kept for later hits);
//     cached blocks are evicted least recently released first when
//     Allocate runs out of unused ones;
//   - unused: no reference and no key.
// num_free() counts what Allocate can hand out: unused plus cached blocks.
//
// Thread-safety: not thread-safe; owned by the scheduler's owner thread.
#pragma once

#include <cstdint>
#include <list>
#include <optional>
#include <queue>
#include <unordered_map>
#include <vector>

#include "common/base/status.h"
#include "common/engine/block_key.h"

namespace tessera {

// Block ids [0, num_blocks). Allocate hands out the lowest unused ids first,
// then evicts cached blocks, so runs are reproducible.
//
// Cost: memory grows with the blocks ever handed out, not with num_blocks
// (a GPU's pool is 10^5 blocks, and a coordinator holds one per replica);
// Allocate, Free and eviction are O(log n) per block.
class BlockAllocator {
 public:
  explicit BlockAllocator(int64_t num_blocks);

  // Blocks Allocate can hand out now: unused plus cached (unreferenced).
  int64_t num_free() const {
    return static_cast<int64_t>(unused_.size() + lru_.size()) + (num_blocks_ - fresh_);
  }
  // Unreferenced blocks that hold a registered prefix block (part of num_free).
  int64_t num_cached() const { return static_cast<int64_t>(lru_.size()); }
  // Blocks with a key (referenced or cached): the prefix cache's size.
  int64_t num_registered() const { return static_cast<int64_t>(index_.size()); }
  int64_t num_blocks() const { return num_blocks_; }
  // References to `block` (0 when unused or cached).
  int32_t ref_count(int32_t block) const {
    return static_cast<size_t>(block) < blocks_.size() ? blocks_[static_cast<size_t>(block)].refs
                                                       : 0;
  }

  // Appends `n` block ids to `table`, each with one reference: unused blocks
  // first (lowest id first), then cached ones, least recently released
  // first (their keys are dropped). Errors: kResourceExhausted (nothing is
  // allocated then) naming how many were asked for and how many are free.
  Status Allocate(int64_t n, std::vector<int32_t>& table);
  // Drops one reference to every block of `table` and clears it. A block
  // left unreferenced becomes cached if it has a key, else unused. The
  // table's last block is released first, so a sequence's deepest blocks
  // are evicted before the prefix they hang from.
  void Free(std::vector<int32_t>& table);
  // Blocks needed to hold `tokens` positions.
  static int64_t BlocksFor(int64_t tokens, int64_t block_size) {
    return (tokens + block_size - 1) / block_size;
  }

  // ---- Prefix cache ----
  // The block registered under `key` (referenced or cached), if any.
  std::optional<int32_t> Find(const BlockKey& key) const;
  // Adds a reference to `block`: a block Find returned (a cached block stops
  // being evictable), or a full block another sequence holds (the choices
  // of one prompt share its blocks, GenerationRequest::share_prompt_of).
  void AddRef(int32_t block);
  // Registers `block` (referenced, its content final) under `key`. Returns
  // false, changing nothing, when another block already holds `key` (the
  // same content computed twice: `block` stays private) or `block` already
  // has a key.
  bool Register(int32_t block, const BlockKey& key);
  // Forgets every key (a plan change or a lost worker: the KV they name may
  // be gone): cached blocks become unused, referenced ones stay referenced
  // without a key.
  void ClearCache();

 private:
  struct Block {
    int32_t refs = 0;
    std::optional<BlockKey> key;
    std::list<int32_t>::iterator lru;  // valid while cached
  };

  void Release(int32_t block);  // the last reference went
  void Evict(int32_t block);    // a cached block loses its key, becomes unused

  int64_t num_blocks_;
  // Blocks [0, fresh_) were handed out at least once; [fresh_, num_blocks_)
  // never were (unused, with no state held).
  int64_t fresh_ = 0;
  std::vector<Block> blocks_;  // size fresh_
  // Unused blocks below fresh_, lowest id on top.
  std::priority_queue<int32_t, std::vector<int32_t>, std::greater<int32_t>> unused_;
  std::list<int32_t> lru_;  // cached blocks, least recently released first
  std::unordered_map<BlockKey, int32_t, BlockKeyHash> index_;
};

}  // namespace tessera
