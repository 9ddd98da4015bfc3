// Quoting a value for an error message: a TOML basic string literal, so the
// text a user wrote (in a config file, a --set, an endpoint) is shown exactly,
// control characters visible.
//
// Thread-safety: a pure function.
#pragma once

#include <string>
#include <string_view>

namespace tessera {

// `s` double-quoted with `"` and `\` backslash-escaped, \n \t \r named and any
// other control character (< 0x20, 0x7f) as \uXXXX. Bytes >= 0x80 are copied.
std::string QuoteForMessage(std::string_view s);

}  // namespace tessera
