#include "common/base/quote.h"

#include <fmt/format.h>

namespace tessera {

std::string QuoteForMessage(std::string_view s) {
  std::string out = "\"";
  for (char ch : s) {
    switch (ch) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      default:
        if (static_cast<unsigned char>(ch) < 0x20 || ch == 0x7f) {
          out += fmt::format("\\u{:04X}", static_cast<unsigned char>(ch));
        } else {
          out += ch;
        }
    }
  }
  return out + "\"";
}

}  // namespace tessera
