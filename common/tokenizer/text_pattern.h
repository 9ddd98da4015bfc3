// TextPattern: the {"String": "..."} / {"Regex": "..."} pattern objects of
// tokenizer.json (Replace normalizer and decoder, Split pre-tokenizer): a
// literal string or a compiled PCRE2 regex with one matching interface.
//
// Thread-safety: immutable after parsing; methods may run concurrently.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/base/json_ref.h"
#include "common/base/regex.h"
#include "common/base/status.h"

namespace tessera {

class TextPattern {
 public:
  // Parses a pattern object. Errors: kInvalidArgument naming the JSON path for
  // a node that is not {"String": s} (non-empty) or {"Regex": r}, or a regex
  // that does not compile.
  static StatusOr<TextPattern> FromJson(const JsonRef& node);

  // Byte ranges [begin, end) of the non-overlapping matches, left to right.
  std::vector<std::pair<size_t, size_t>> FindAll(std::string_view subject) const;
  // `subject` with every match replaced by `replacement`.
  std::string ReplaceAll(std::string_view subject, std::string_view replacement) const;

 private:
  std::string literal_;
  std::optional<Regex> regex_;
};

}  // namespace tessera
