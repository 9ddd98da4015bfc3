// UTF-8 helpers for the tokenizer: validation, code point iteration and the
// lossy conversion that Rust's `String::from_utf8_lossy` performs (which the
// Hugging Face decoders use), so that decoded text matches them byte for byte.
//
// Thread-safety: free functions on values; safe from any thread.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace tessera {

// U+FFFD REPLACEMENT CHARACTER as UTF-8 (3 bytes).
inline constexpr std::string_view kUtf8Replacement = "\xEF\xBF\xBD";

// True when `s` is well-formed UTF-8 (no overlongs, no surrogates, <= U+10FFFF).
bool IsValidUtf8(std::string_view s);

// Length in bytes of the well-formed UTF-8 sequence starting at s[pos], or 0
// when the bytes there do not start one (invalid lead, truncated, overlong).
size_t ValidUtf8SequenceLength(std::string_view s, size_t pos);

// Converts arbitrary bytes to UTF-8, replacing each maximal invalid subpart
// with one U+FFFD: the rule of Rust's `String::from_utf8_lossy` (and of the
// Unicode "U+FFFD substitution of maximal subparts" practice).
std::string Utf8Lossy(std::string_view bytes);

// Appends the UTF-8 encoding of `cp` (must be <= U+10FFFF, not a surrogate).
void AppendUtf8(std::string& out, char32_t cp);

// Decodes the code point starting at s[pos] of well-formed UTF-8 and advances
// `pos` past it. Precondition: pos < s.size() and `s` is valid UTF-8.
char32_t NextCodePoint(std::string_view s, size_t& pos);

// Number of bytes of the UTF-8 sequence whose lead byte is `lead` (1..4), for
// iterating over text already known to be valid.
inline size_t Utf8LeadLength(unsigned char lead) {
  if (lead < 0x80) return 1;
  if (lead < 0xE0) return 2;
  if (lead < 0xF0) return 3;
  return 4;
}

// Rust `char::is_whitespace`: the Unicode White_Space property.
bool IsUnicodeWhitespace(char32_t cp);

}  // namespace tessera
