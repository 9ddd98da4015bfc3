#include "common/base/utf8.h"

namespace tessera {

namespace {
inline bool IsCont(unsigned char b) { return (b & 0xC0) == 0x80; }
}  // namespace

size_t ValidUtf8SequenceLength(std::string_view s, size_t pos) {
  const size_t n = s.size();
  const auto b0 = static_cast<unsigned char>(s[pos]);
  if (b0 < 0x80) return 1;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    return (pos + 1 < n && IsCont(static_cast<unsigned char>(s[pos + 1]))) ? 2 : 0;
  }
  if (b0 >= 0xE0 && b0 <= 0xEF) {
    if (pos + 2 >= n) return 0;
    const auto b1 = static_cast<unsigned char>(s[pos + 1]);
    const bool ok1 = (b0 == 0xE0)   ? (b1 >= 0xA0 && b1 <= 0xBF)
                     : (b0 == 0xED) ? (b1 >= 0x80 && b1 <= 0x9F)
                                    : IsCont(b1);
    return (ok1 && IsCont(static_cast<unsigned char>(s[pos + 2]))) ? 3 : 0;
  }
  if (b0 >= 0xF0 && b0 <= 0xF4) {
    if (pos + 3 >= n) return 0;
    const auto b1 = static_cast<unsigned char>(s[pos + 1]);
    const bool ok1 = (b0 == 0xF0)   ? (b1 >= 0x90 && b1 <= 0xBF)
                     : (b0 == 0xF4) ? (b1 >= 0x80 && b1 <= 0x8F)
                                    : IsCont(b1);
    return (ok1 && IsCont(static_cast<unsigned char>(s[pos + 2])) &&
            IsCont(static_cast<unsigned char>(s[pos + 3])))
               ? 4
               : 0;
  }
  return 0;
}

bool IsValidUtf8(std::string_view s) {
  size_t pos = 0;
  while (pos < s.size()) {
    if (static_cast<unsigned char>(s[pos]) < 0x80) {
      ++pos;
      continue;
    }
    const size_t len = ValidUtf8SequenceLength(s, pos);
    if (len == 0) return false;
    pos += len;
  }
  return true;
}

std::string Utf8Lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  const size_t n = bytes.size();
  size_t pos = 0;
  while (pos < n) {
    const auto b0 = static_cast<unsigned char>(bytes[pos]);
    if (b0 < 0x80) {
      out.push_back(static_cast<char>(b0));
      ++pos;
      continue;
    }
    const size_t len = ValidUtf8SequenceLength(bytes, pos);
    if (len > 0) {
      out.append(bytes.substr(pos, len));
      pos += len;
      continue;
    }
    // Invalid: consume the maximal prefix of a well-formed sequence (at least
    // the lead byte) and emit one replacement character for it.
    size_t consumed = 1;
    auto byte_at = [&](size_t i) { return static_cast<unsigned char>(bytes[i]); };
    if (b0 >= 0xE0 && b0 <= 0xEF) {
      if (pos + 1 < n) {
        const auto b1 = byte_at(pos + 1);
        const bool ok1 = (b0 == 0xE0)   ? (b1 >= 0xA0 && b1 <= 0xBF)
                         : (b0 == 0xED) ? (b1 >= 0x80 && b1 <= 0x9F)
                                        : IsCont(b1);
        if (ok1) consumed = 2;  // the third byte is missing or not a continuation
      }
    } else if (b0 >= 0xF0 && b0 <= 0xF4) {
      if (pos + 1 < n) {
        const auto b1 = byte_at(pos + 1);
        const bool ok1 = (b0 == 0xF0)   ? (b1 >= 0x90 && b1 <= 0xBF)
                         : (b0 == 0xF4) ? (b1 >= 0x80 && b1 <= 0x8F)
                                        : IsCont(b1);
        if (ok1) {
          consumed = 2;
          if (pos + 2 < n && IsCont(byte_at(pos + 2))) consumed = 3;
        }
      }
    }
    out.append(kUtf8Replacement);
    pos += consumed;
  }
  return out;
}

void AppendUtf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

char32_t NextCodePoint(std::string_view s, size_t& pos) {
  const auto b0 = static_cast<unsigned char>(s[pos]);
  const size_t len = Utf8LeadLength(b0);
  char32_t cp = 0;
  switch (len) {
    case 1:
      cp = b0;
      break;
    case 2:
      cp = b0 & 0x1F;
      break;
    case 3:
      cp = b0 & 0x0F;
      break;
    default:
      cp = b0 & 0x07;
      break;
  }
  for (size_t i = 1; i < len; ++i) cp = (cp << 6) | (static_cast<unsigned char>(s[pos + i]) & 0x3F);
  pos += len;
  return cp;
}

bool IsUnicodeWhitespace(char32_t cp) {
  switch (cp) {
    case 0x09:
    case 0x0A:
    case 0x0B:
    case 0x0C:
    case 0x0D:
    case 0x20:
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

}  // namespace tessera
