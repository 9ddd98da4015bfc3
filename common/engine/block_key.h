// BlockKey: the prefix-cache key of one full KV block.
//
// A block's key is a SHA-256 digest over a version tag, its parent block's
// key (none for the first block of a sequence), the model id, the plan
// version and the token ids the block holds, so equal keys mean equal
// content: the same tokens at the same positions after the same prefix,
// computed by the same model under the same plan. SHA-256 (OpenSSL) rather
// than a fast non-cryptographic hash: a client must not be able to craft a
// prompt whose block collides with another client's and read its KV.
//
// Thread-safety: plain values and a pure function.
#pragma once

#include <array>
#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>

namespace tessera {

struct BlockKey {
  std::array<uint8_t, 32> digest{};
  bool operator==(const BlockKey& other) const = default;
};

// For unordered containers: the digest's first 8 bytes (already uniform).
struct BlockKeyHash {
  size_t operator()(const BlockKey& key) const {
    size_t h = 0;
    std::memcpy(&h, key.digest.data(), sizeof h);
    return h;
  }
};

// The key of the block holding `tokens` (block_size token ids) whose parent
// block has key `parent` (nullptr for the first block of a sequence).
BlockKey ChainBlockKey(const BlockKey* parent, std::string_view model_id, uint64_t plan_version,
                       std::span<const int32_t> tokens);

}  // namespace tessera
