// BpeModel: byte-pair-encoding model of a Hugging Face tokenizer.json
// ("model": {"type": "BPE", ...}). Encodes one pre-tokenized piece into ids by
// applying merges in rank order, as the `tokenizers` library does
// (models/bpe/word.rs: a priority queue over adjacent pairs, lowest rank first,
// ties to the leftmost pair).
//
// Options read from JSON: vocab, merges ("a b" strings or ["a", "b"] pairs;
// rank = position), unk_token, fuse_unk, byte_fallback (<0xNN> tokens),
// ignore_merges (a piece that is itself in the vocab becomes that one token),
// continuing_subword_prefix, end_of_word_suffix. dropout must be null or 0.
//
// Thread-safety: immutable after construction except for an internal
// per-piece cache guarded by a mutex; Tokenize may run concurrently.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/base/json_ref.h"
#include "common/base/status.h"

namespace tessera {

class BpeModel {
 public:
  // Builds the model from the tokenizer.json "model" node.
  // Errors: kUnimplemented for a type other than BPE or a non-zero dropout;
  // kInvalidArgument naming the JSON path for malformed vocab/merges, a merge
  // whose parts or result are not in the vocab, or an unk_token not in it.
  static StatusOr<std::unique_ptr<BpeModel>> FromJson(const JsonRef& model);

  // Appends the ids of `piece` (valid UTF-8, already pre-tokenized) to `out`.
  // Characters not in the vocab become <0xNN> byte tokens (byte_fallback),
  // else unk_token (consecutive ones fused when fuse_unk), else are dropped.
  void Tokenize(std::string_view piece, std::vector<int32_t>& out) const;

  std::optional<int32_t> TokenToId(std::string_view token) const;
  // The token for `id`, or nullptr when no vocab entry has that id.
  const std::string* IdToToken(int32_t id) const;
  // Number of vocab entries.
  size_t vocab_size() const { return vocab_.size(); }
  // One past the largest vocab id: the ids of a vocab with holes reach past vocab_size().
  size_t id_limit() const { return id_to_token_.size(); }

 private:
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  using Vocab = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;
  struct MergeInfo {
    int32_t rank;
    int32_t new_id;
  };

  BpeModel() = default;
  static uint64_t PairKey(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  // Splits `piece` into symbols and merges them; appends the ids to `out`.
  void MergeWord(std::string_view piece, std::vector<int32_t>& out) const;

  Vocab vocab_;
  std::vector<const std::string*> id_to_token_;  // index = id; nullptr for holes
  std::unordered_map<uint64_t, MergeInfo> merges_;
  std::optional<int32_t> unk_id_;
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  std::string continuing_subword_prefix_;
  std::string end_of_word_suffix_;
  std::vector<int32_t> byte_ids_;  // <0xNN> ids when byte_fallback (-1 if missing)

  // Per-piece cache, as in the `tokenizers` library (bounded, never evicts).
  static constexpr size_t kCacheCapacity = 10000;
  static constexpr size_t kMaxCachedPieceBytes = 256;
  mutable std::shared_mutex cache_mu_;
  mutable std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>>
      cache_;  // guarded by cache_mu_
};

}  // namespace tessera
