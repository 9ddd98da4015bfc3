// Regex: a PCRE2 pattern compiled once (UTF + UCP, JIT when available) for the
// tokenizer's pre-tokenizers and normalizers. The Hugging Face `tokenizers`
// library uses Oniguruma; with UTF and UCP set, PCRE2 gives the same matches
// for the patterns in use (\p{L}, \p{N}, \s, (?i:...), (?!\S)).
//
// Thread-safety: a compiled Regex is immutable; FindAll may be called
// concurrently from many threads (each call owns its match data).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/base/status.h"

namespace tessera {

class Regex {
 public:
  // Compiles `pattern`. `where` names the pattern's origin for error messages
  // (e.g. "tokenizer.json: pre_tokenizer.pattern.Regex").
  // Errors: kInvalidArgument with PCRE2's message and the offset of the error.
  static StatusOr<Regex> Compile(std::string_view pattern, const std::string& where);

  Regex(Regex&&) noexcept = default;
  Regex& operator=(Regex&&) noexcept = default;
  ~Regex() = default;

  // Byte ranges [begin, end) of the successive non-overlapping matches in
  // `subject` (valid UTF-8), left to right. After an empty match the search
  // resumes one character later. Lookaround sees the whole subject. Should
  // PCRE2 give up (its match/depth limits, only reachable with pathological
  // patterns), the rest of the subject counts as unmatched.
  std::vector<std::pair<size_t, size_t>> FindAll(std::string_view subject) const;

  const std::string& pattern() const { return pattern_; }

 private:
  struct Code;
  struct CodeDeleter {
    void operator()(Code* code) const;
  };
  Regex() = default;

  std::string pattern_;
  std::unique_ptr<Code, CodeDeleter> code_;
};

}  // namespace tessera
