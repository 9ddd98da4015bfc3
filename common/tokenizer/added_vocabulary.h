// AddedVocabulary: the tokenizer.json "added_tokens" (special tokens such as
// <s> or <|im_start|>, and plain added tokens). Input text is split on them
// before normalization and BPE, so they are never broken into pieces.
//
// Matching follows the `tokenizers` library: leftmost-longest over all
// contents; tokens with normalized=false match the raw input, tokens with
// normalized=true match the normalized text (their content normalized too);
// single_word requires no word character (Rust regex \w) right before or
// after; lstrip / rstrip make the token swallow the whitespace on its left /
// right.
//
// Thread-safety: immutable after construction; all methods may run concurrently.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/base/json_ref.h"
#include "common/base/regex.h"
#include "common/base/status.h"
#include "common/tokenizer/normalizer.h"

namespace tessera {

struct AddedToken {
  int32_t id = 0;
  std::string content;
  // The content as matched and decoded: normalized when `normalized` is set
  // (`tokenizers` returns this form from id_to_token and decodes it).
  std::string match_content;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;
  bool special = false;
};

class AddedVocabulary {
 public:
  // One stretch of a split text: bytes [begin, end) and the added token id
  // there, or id = -1 for plain text.
  struct Segment {
    size_t begin;
    size_t end;
    int32_t id;
  };

  // Reads the "added_tokens" array (a JSON null means none). `normalizer`
  // (may be null) normalizes the contents of normalized=true tokens.
  // Errors: kInvalidArgument naming the JSON path of a malformed entry.
  static StatusOr<AddedVocabulary> FromJson(const JsonRef& added_tokens,
                                            const Normalizer* normalizer);

  // Splits `text` (valid UTF-8) on the tokens with normalized == `normalized`.
  // Segments are in order and cover the text except whitespace swallowed by
  // lstrip/rstrip; plain segments are never empty.
  std::vector<Segment> Split(std::string_view text, bool normalized) const;

  const AddedToken* FindById(int32_t id) const;
  std::optional<int32_t> FindByContent(std::string_view content) const;
  // True when some special added token has this content.
  bool IsSpecialContent(std::string_view content) const;
  const std::vector<AddedToken>& tokens() const { return tokens_; }

 private:
  // A byte trie over token contents; node 0 is the root.
  struct Trie {
    struct Node {
      std::vector<std::pair<unsigned char, int32_t>> children;
      int32_t token = -1;  // index into tokens_ when a content ends here
    };
    std::vector<Node> nodes{Node{}};
    void Insert(std::string_view key, int32_t token);
    // Longest key starting at text[pos]: (token index, length), or token -1.
    std::pair<int32_t, size_t> LongestAt(std::string_view text, size_t pos) const;
  };

  AddedVocabulary() = default;
  bool EndsWithWordChar(std::string_view s) const;
  bool StartsWithWordChar(std::string_view s) const;

  std::vector<AddedToken> tokens_;
  std::unordered_map<int32_t, size_t> by_id_;
  std::unordered_map<std::string, size_t> by_content_;
  Trie raw_trie_;                   // normalized == false, raw contents
  Trie normalized_trie_;            // normalized == true, normalized contents
  std::optional<Regex> word_char_;  // a word character, for single_word tokens
};

}  // namespace tessera
