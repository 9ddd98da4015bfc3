#include "common/tokenizer/bpe_model.h"

#include <fmt/format.h>

#include <mutex>
#include <queue>

#include "common/base/utf8.h"

namespace tessera {

namespace {

struct Symbol {
  int32_t id;
  int32_t prev;  // index of the previous live symbol, -1 at the start
  int32_t next;  // index of the next live symbol, -1 at the end
  size_t len;    // bytes of the piece covered; 0 once merged into its left neighbour
};

struct QueuedMerge {
  int32_t pos;
  int32_t rank;
  int32_t new_id;
};

// Lowest rank first, then leftmost position (word.rs `impl Ord for Merge`).
struct MergeAfter {
  bool operator()(const QueuedMerge& a, const QueuedMerge& b) const {
    if (a.rank != b.rank) return a.rank > b.rank;
    return a.pos > b.pos;
  }
};

void AddSymbol(std::vector<Symbol>& symbols, int32_t id, size_t len) {
  const auto n = static_cast<int32_t>(symbols.size());
  if (!symbols.empty()) symbols.back().next = n;
  symbols.push_back({id, n - 1, -1, len});
}

}  // namespace

StatusOr<std::unique_ptr<BpeModel>> BpeModel::FromJson(const JsonRef& model) {
  TESSERA_RETURN_IF_ERROR(model.ExpectObject());
  TESSERA_ASSIGN_OR_RETURN(std::string type, model.GetStringOr("type", "BPE"));
  if (type != "BPE") return model.Child("type").Unsupported("model type", type, "BPE");
  if (model.Has("dropout")) {
    TESSERA_ASSIGN_OR_RETURN(double dropout, model.Child("dropout").AsNumber());
    if (dropout != 0.0) {
      return model.Child("dropout").Unsupported("dropout", fmt::format("{}", dropout),
                                                "null or 0 (deterministic encoding)");
    }
  }

  std::unique_ptr<BpeModel> bpe(new BpeModel());
  TESSERA_ASSIGN_OR_RETURN(JsonRef vocab, model.Required("vocab"));
  TESSERA_RETURN_IF_ERROR(vocab.ExpectObject());
  bpe->vocab_.reserve(vocab.node().size());
  int64_t max_id = -1;
  for (const auto& [token, id_node] : vocab.node().items()) {
    if (!id_node.is_number_integer() || id_node.get<int64_t>() < 0 ||
        id_node.get<int64_t>() > INT32_MAX) {
      return vocab.Child(token).Error("expected a non-negative 32-bit integer id");
    }
    const int64_t id = id_node.get<int64_t>();
    bpe->vocab_.emplace(token, static_cast<int32_t>(id));
    max_id = std::max(max_id, id);
  }
  bpe->id_to_token_.assign(static_cast<size_t>(max_id + 1), nullptr);
  for (const auto& [token, id] : bpe->vocab_) {
    if (bpe->id_to_token_[id] == nullptr) bpe->id_to_token_[id] = &token;
  }

  TESSERA_ASSIGN_OR_RETURN(bpe->continuing_subword_prefix_,
                           model.GetStringOr("continuing_subword_prefix", ""));
  TESSERA_ASSIGN_OR_RETURN(bpe->end_of_word_suffix_, model.GetStringOr("end_of_word_suffix", ""));
  TESSERA_ASSIGN_OR_RETURN(bpe->fuse_unk_, model.GetBoolOr("fuse_unk", false));
  TESSERA_ASSIGN_OR_RETURN(bpe->byte_fallback_, model.GetBoolOr("byte_fallback", false));
  TESSERA_ASSIGN_OR_RETURN(bpe->ignore_merges_, model.GetBoolOr("ignore_merges", false));
  if (model.Has("unk_token")) {
    TESSERA_ASSIGN_OR_RETURN(std::string unk, model.GetString("unk_token"));
    // As in `tokenizers`, an unk_token outside the vocab only matters when an
    // unknown character shows up; such characters are then dropped.
    if (auto id = bpe->TokenToId(unk)) bpe->unk_id_ = *id;
  }
  if (bpe->byte_fallback_) {
    bpe->byte_ids_.assign(256, -1);
    for (int b = 0; b < 256; ++b) {
      if (auto id = bpe->TokenToId(fmt::format("<0x{:02X}>", b))) bpe->byte_ids_[b] = *id;
    }
  }

  TESSERA_ASSIGN_OR_RETURN(JsonRef merges, model.Required("merges"));
  TESSERA_RETURN_IF_ERROR(merges.ExpectArray());
  const size_t prefix_len = bpe->continuing_subword_prefix_.size();
  bpe->merges_.reserve(merges.node().size());
  std::string merged;
  for (size_t i = 0; i < merges.node().size(); ++i) {
    const nlohmann::json& m = merges.node()[i];
    // Errors build the JSON path lazily: large vocabularies have ~10^5 merges.
    auto error = [&](const std::string& what) { return merges.At(i).Error(what); };
    std::string_view a, b;
    if (m.is_string()) {
      const std::string& s = m.get_ref<const std::string&>();
      const size_t space = s.find(' ');
      if (space == std::string::npos) return error("expected \"left right\" separated by a space");
      a = std::string_view(s).substr(0, space);
      b = std::string_view(s).substr(space + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      a = m[0].get_ref<const std::string&>();
      b = m[1].get_ref<const std::string&>();
    } else {
      return error("expected a \"left right\" string or a [\"left\", \"right\"] pair");
    }
    auto a_id = bpe->TokenToId(a);
    if (!a_id) return error(fmt::format("token '{}' is not in model.vocab", a));
    auto b_id = bpe->TokenToId(b);
    if (!b_id) return error(fmt::format("token '{}' is not in model.vocab", b));
    if (b.size() < prefix_len) {
      return error(fmt::format("token '{}' is shorter than continuing_subword_prefix", b));
    }
    merged.assign(a);
    merged.append(b.substr(prefix_len));
    auto new_id = bpe->TokenToId(merged);
    if (!new_id) return error(fmt::format("merged token '{}' is not in model.vocab", merged));
    bpe->merges_[PairKey(*a_id, *b_id)] = {static_cast<int32_t>(i), *new_id};
  }
  return bpe;
}

std::optional<int32_t> BpeModel::TokenToId(std::string_view token) const {
  auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::IdToToken(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= id_to_token_.size()) return nullptr;
  return id_to_token_[id];
}

void BpeModel::Tokenize(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.empty()) return;
  if (ignore_merges_) {
    if (auto it = vocab_.find(piece); it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  const bool cacheable = piece.size() <= kMaxCachedPieceBytes;
  if (cacheable) {
    std::shared_lock lock(cache_mu_);
    if (auto it = cache_.find(piece); it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t first = out.size();
  MergeWord(piece, out);
  if (cacheable) {
    std::unique_lock lock(cache_mu_);
    if (cache_.size() < kCacheCapacity) {
      cache_.emplace(std::string(piece), std::vector<int32_t>(out.begin() + first, out.end()));
    }
  }
}

void BpeModel::MergeWord(std::string_view piece, std::vector<int32_t>& out) const {
  std::vector<Symbol> symbols;
  symbols.reserve(piece.size());
  int32_t unk_id = -1;  // a pending unk symbol (-1: none) and its bytes
  size_t unk_len = 0;
  std::string unit;
  size_t pos = 0;
  while (pos < piece.size()) {
    const size_t len = Utf8LeadLength(static_cast<unsigned char>(piece[pos]));
    const bool is_first = pos == 0;
    const bool is_last = pos + len >= piece.size();
    unit.clear();
    if (!is_first) unit.append(continuing_subword_prefix_);
    unit.append(piece.substr(pos, len));
    if (is_last) unit.append(end_of_word_suffix_);
    pos += len;

    if (auto it = vocab_.find(unit); it != vocab_.end()) {
      if (unk_id >= 0) {
        AddSymbol(symbols, unk_id, unk_len);
        unk_id = -1;
      }
      AddSymbol(symbols, it->second, len);
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (char c : unit) all = all && byte_ids_[static_cast<unsigned char>(c)] >= 0;
      if (all) {
        // Like `tokenizers`, a pending unk is not flushed here (it can only be
        // pending when some <0xNN> tokens are missing from the vocab).
        for (char c : unit) AddSymbol(symbols, byte_ids_[static_cast<unsigned char>(c)], 1);
        continue;
      }
    }
    if (unk_id_) {
      if (unk_id >= 0 && fuse_unk_) {
        unk_len += len;
      } else {
        if (unk_id >= 0) AddSymbol(symbols, unk_id, unk_len);
        unk_id = *unk_id_;
        unk_len = len;
      }
    }
  }
  if (unk_id >= 0) AddSymbol(symbols, unk_id, unk_len);

  auto find_merge = [this](int32_t a, int32_t b) -> const MergeInfo* {
    auto it = merges_.find(PairKey(a, b));
    return it == merges_.end() ? nullptr : &it->second;
  };
  std::priority_queue<QueuedMerge, std::vector<QueuedMerge>, MergeAfter> queue;
  for (size_t i = 0; i + 1 < symbols.size(); ++i) {
    if (const MergeInfo* m = find_merge(symbols[i].id, symbols[i + 1].id)) {
      queue.push({static_cast<int32_t>(i), m->rank, m->new_id});
    }
  }
  while (!queue.empty()) {
    const QueuedMerge top = queue.top();
    queue.pop();
    Symbol& cur = symbols[top.pos];
    if (cur.len == 0 || cur.next == -1) continue;  // merged away, or last symbol
    const int32_t next_pos = cur.next;
    const Symbol right = symbols[next_pos];
    // Skip stale entries: the pair at this position must still produce new_id.
    const MergeInfo* now = find_merge(cur.id, right.id);
    if (now == nullptr || now->new_id != top.new_id) continue;

    cur.id = top.new_id;
    cur.len += right.len;
    cur.next = right.next;
    symbols[next_pos].len = 0;
    if (right.next >= 0) symbols[right.next].prev = top.pos;

    if (cur.prev >= 0) {
      if (const MergeInfo* m = find_merge(symbols[cur.prev].id, cur.id)) {
        queue.push({cur.prev, m->rank, m->new_id});
      }
    }
    if (cur.next >= 0) {
      if (const MergeInfo* m = find_merge(cur.id, symbols[cur.next].id)) {
        queue.push({top.pos, m->rank, m->new_id});
      }
    }
  }
  for (const Symbol& s : symbols) {
    if (s.len != 0) out.push_back(s.id);
  }
}

}  // namespace tessera
