#include "common/tokenizer/added_vocabulary.h"

#include <fmt/format.h>

#include <algorithm>

#include "common/base/utf8.h"

namespace tessera {

void AddedVocabulary::Trie::Insert(std::string_view key, int32_t token) {
  int32_t node = 0;
  for (char ch : key) {
    const auto c = static_cast<unsigned char>(ch);
    auto& children = nodes[node].children;
    auto it =
        std::find_if(children.begin(), children.end(), [c](const auto& p) { return p.first == c; });
    if (it != children.end()) {
      node = it->second;
      continue;
    }
    const auto next = static_cast<int32_t>(nodes.size());
    nodes[node].children.emplace_back(c, next);
    nodes.emplace_back();
    node = next;
  }
  if (nodes[node].token < 0) nodes[node].token = token;  // the first token with a content wins
}

std::pair<int32_t, size_t> AddedVocabulary::Trie::LongestAt(std::string_view text,
                                                            size_t pos) const {
  std::pair<int32_t, size_t> best{-1, 0};
  int32_t node = 0;
  for (size_t i = pos; i < text.size(); ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    const auto& children = nodes[node].children;
    auto it =
        std::find_if(children.begin(), children.end(), [c](const auto& p) { return p.first == c; });
    if (it == children.end()) break;
    node = it->second;
    if (nodes[node].token >= 0) best = {nodes[node].token, i + 1 - pos};
  }
  return best;
}

StatusOr<AddedVocabulary> AddedVocabulary::FromJson(const JsonRef& added_tokens,
                                                    const Normalizer* normalizer) {
  AddedVocabulary vocab;
  if (added_tokens.is_null()) return vocab;
  TESSERA_RETURN_IF_ERROR(added_tokens.ExpectArray());
  bool any_single_word = false;
  for (size_t i = 0; i < added_tokens.node().size(); ++i) {
    const JsonRef entry = added_tokens.At(i);
    TESSERA_RETURN_IF_ERROR(entry.ExpectObject());
    AddedToken t;
    TESSERA_ASSIGN_OR_RETURN(JsonRef id_node, entry.Required("id"));
    TESSERA_ASSIGN_OR_RETURN(int64_t id, id_node.AsInt());
    if (id < 0 || id > INT32_MAX) return id_node.Error("expected a non-negative 32-bit id");
    t.id = static_cast<int32_t>(id);
    TESSERA_ASSIGN_OR_RETURN(t.content, entry.GetString("content"));
    if (t.content.empty()) return entry.Child("content").Error("empty added token");
    TESSERA_ASSIGN_OR_RETURN(t.special, entry.GetBoolOr("special", false));
    TESSERA_ASSIGN_OR_RETURN(t.single_word, entry.GetBoolOr("single_word", false));
    TESSERA_ASSIGN_OR_RETURN(t.lstrip, entry.GetBoolOr("lstrip", false));
    TESSERA_ASSIGN_OR_RETURN(t.rstrip, entry.GetBoolOr("rstrip", false));
    TESSERA_ASSIGN_OR_RETURN(t.normalized, entry.GetBoolOr("normalized", !t.special));
    any_single_word = any_single_word || t.single_word;

    const auto index = static_cast<int32_t>(vocab.tokens_.size());
    vocab.by_id_.emplace(t.id, vocab.tokens_.size());
    vocab.by_content_.emplace(t.content, vocab.tokens_.size());
    t.match_content = t.content;
    if (t.normalized) {
      if (normalizer != nullptr) normalizer->Normalize(t.match_content);
      if (!t.match_content.empty()) vocab.normalized_trie_.Insert(t.match_content, index);
    } else {
      vocab.raw_trie_.Insert(t.content, index);
    }
    vocab.tokens_.push_back(std::move(t));
  }
  if (any_single_word) {
    // Rust regex's Unicode \w (the `tokenizers` library's word test), which
    // unlike PCRE2's \w excludes No/Nl numbers such as '²'.
    TESSERA_ASSIGN_OR_RETURN(Regex re,
                             Regex::Compile(R"([\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\x{200C}\x{200D}])",
                                            "single_word check"));
    vocab.word_char_.emplace(std::move(re));
  }
  return vocab;
}

bool AddedVocabulary::EndsWithWordChar(std::string_view s) const {
  if (s.empty()) return false;
  size_t start = s.size() - 1;
  while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
  return !word_char_->FindAll(s.substr(start)).empty();
}

bool AddedVocabulary::StartsWithWordChar(std::string_view s) const {
  if (s.empty()) return false;
  const size_t len = Utf8LeadLength(static_cast<unsigned char>(s[0]));
  return !word_char_->FindAll(s.substr(0, len)).empty();
}

std::vector<AddedVocabulary::Segment> AddedVocabulary::Split(std::string_view text,
                                                             bool normalized) const {
  std::vector<Segment> out;
  const Trie& trie = normalized ? normalized_trie_ : raw_trie_;
  const size_t n = text.size();
  if (trie.nodes[0].children.empty()) {
    if (n > 0) out.push_back({0, n, -1});
    return out;
  }
  size_t start_offset = 0;  // end of the last emitted segment
  size_t i = 0;
  while (i < n) {
    const auto [index, len] = trie.LongestAt(text, i);
    if (index < 0) {
      ++i;
      continue;
    }
    const AddedToken& tok = tokens_[index];
    size_t start = i;
    size_t stop = i + len;
    if (tok.single_word) {
      const bool start_space = start == 0 || !EndsWithWordChar(text.substr(0, start));
      const bool stop_space = stop == n || !StartsWithWordChar(text.substr(stop));
      if (!start_space || !stop_space) {
        i = stop;  // the rejected match still consumes its bytes
        continue;
      }
    }
    if (tok.lstrip) {
      // Back up over the whitespace before the token (not past the last segment).
      size_t new_start = start;
      while (new_start > 0) {
        size_t char_start = new_start - 1;
        while (char_start > 0 && (static_cast<unsigned char>(text[char_start]) & 0xC0) == 0x80) {
          --char_start;
        }
        size_t pos = char_start;
        if (!IsUnicodeWhitespace(NextCodePoint(text, pos))) break;
        new_start = char_start;
      }
      start = std::max(new_start, start_offset);
    }
    if (tok.rstrip) {
      size_t pos = stop;
      while (pos < n) {
        size_t next = pos;
        if (!IsUnicodeWhitespace(NextCodePoint(text, next))) break;
        pos = next;
      }
      stop = pos;
    }
    if (start_offset < start) out.push_back({start_offset, start, -1});
    out.push_back({start, stop, tok.id});
    start_offset = stop;
    i = std::max(i + len, stop);
  }
  if (start_offset < n) out.push_back({start_offset, n, -1});
  return out;
}

const AddedToken* AddedVocabulary::FindById(int32_t id) const {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &tokens_[it->second];
}

std::optional<int32_t> AddedVocabulary::FindByContent(std::string_view content) const {
  auto it = by_content_.find(std::string(content));
  if (it == by_content_.end()) return std::nullopt;
  return tokens_[it->second].id;
}

bool AddedVocabulary::IsSpecialContent(std::string_view content) const {
  auto it = by_content_.find(std::string(content));
  return it != by_content_.end() && tokens_[it->second].special;
}

}  // namespace tessera
