#include "common/tokenizer/jinja_lexer.h"

#include <algorithm>
#include <cctype>

namespace tessera::jinja {

namespace {

Status LexError(int line, const std::string& what) {
  return InvalidArgument("chat_template line " + std::to_string(line) + ": " + what);
}

bool IsSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

int LineAt(std::string_view s, size_t pos) {
  return 1 + static_cast<int>(std::count(s.begin(), s.begin() + static_cast<long>(pos), '\n'));
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    *out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    *out += static_cast<char>(0xc0 | (cp >> 6));
    *out += static_cast<char>(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    *out += static_cast<char>(0xe0 | (cp >> 12));
    *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    *out += static_cast<char>(0x80 | (cp & 0x3f));
  } else {
    *out += static_cast<char>(0xf0 | (cp >> 18));
    *out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
    *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    *out += static_cast<char>(0x80 | (cp & 0x3f));
  }
}

// Python's unicode-escape decoding of a string literal's body; an unknown
// escape keeps its backslash.
std::string Unescape(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\\' || i + 1 == s.size()) {
      out += s[i];
      continue;
    }
    const char c = s[++i];
    auto hex = [&](size_t n) -> bool {
      uint32_t cp = 0;
      for (size_t k = 1; k <= n; ++k) {
        if (i + k >= s.size() || !std::isxdigit(static_cast<unsigned char>(s[i + k]))) return false;
        const char h = static_cast<char>(std::tolower(static_cast<unsigned char>(s[i + k])));
        cp = cp * 16 + static_cast<uint32_t>(h <= '9' ? h - '0' : h - 'a' + 10);
      }
      AppendUtf8(cp, &out);
      i += n;
      return true;
    };
    switch (c) {
      case 'n':
        out += '\n';
        break;
      case 't':
        out += '\t';
        break;
      case 'r':
        out += '\r';
        break;
      case '\\':
        out += '\\';
        break;
      case '\'':
        out += '\'';
        break;
      case '"':
        out += '"';
        break;
      case 'a':
        out += '\a';
        break;
      case 'b':
        out += '\b';
        break;
      case 'f':
        out += '\f';
        break;
      case 'v':
        out += '\v';
        break;
      case '\n':
        break;
      case 'x':
        if (!hex(2)) out += "\\x";
        break;
      case 'u':
        if (!hex(4)) out += "\\u";
        break;
      case 'U':
        if (!hex(8)) out += "\\U";
        break;
      default:
        out += '\\';
        out += c;
    }
  }
  return out;
}

// Tokens inside one tag, from `pos` up to its closing delimiter `close`
// ("}}" or "%}"); returns the position of the delimiter (its "-" included).
StatusOr<size_t> LexTag(std::string_view s, size_t pos, std::string_view close,
                        std::vector<Token>* out) {
  static const char* kOps[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*",
                               "/",  "%",  "~",  "<",  ">",  "=",  "(", ")", "[",
                               "]",  "{",  "}",  ",",  ".",  ":",  "|", "?"};
  int depth = 0;  // brackets open, so "}}" of a dict literal does not close
  while (true) {
    while (pos < s.size() && IsSpace(s[pos])) ++pos;
    if (pos >= s.size()) return LexError(LineAt(s, pos), "unclosed tag");
    const int line = LineAt(s, pos);
    if (depth == 0 && s.substr(pos, close.size()) == close) return pos;
    if (depth == 0 && s[pos] == '-' && s.substr(pos + 1, close.size()) == close) return pos;
    if (close == "%}" && depth == 0 && s[pos] == '+' && s.substr(pos + 1, 2) == "%}") return pos;
    const char c = s[pos];
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t e = pos;
      while (e < s.size() && (std::isalnum(static_cast<unsigned char>(s[e])) || s[e] == '_')) ++e;
      out->push_back({TokenType::kName, std::string(s.substr(pos, e - pos)), line});
      pos = e;
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t e = pos;
      while (e < s.size() && (std::isdigit(static_cast<unsigned char>(s[e])) || s[e] == '_')) ++e;
      bool is_float = false;
      if (e + 1 < s.size() && s[e] == '.' && std::isdigit(static_cast<unsigned char>(s[e + 1]))) {
        is_float = true;
        ++e;
        while (e < s.size() && std::isdigit(static_cast<unsigned char>(s[e]))) ++e;
      }
      if (e < s.size() && (s[e] == 'e' || s[e] == 'E')) {
        size_t f = e + 1;
        if (f < s.size() && (s[f] == '+' || s[f] == '-')) ++f;
        if (f < s.size() && std::isdigit(static_cast<unsigned char>(s[f]))) {
          is_float = true;
          e = f;
          while (e < s.size() && std::isdigit(static_cast<unsigned char>(s[e]))) ++e;
        }
      }
      std::string lit(s.substr(pos, e - pos));
      lit.erase(std::remove(lit.begin(), lit.end(), '_'), lit.end());
      out->push_back({is_float ? TokenType::kFloat : TokenType::kInt, lit, line});
      pos = e;
    } else if (c == '\'' || c == '"') {
      size_t e = pos + 1;
      while (e < s.size() && s[e] != c) e += s[e] == '\\' ? 2 : 1;
      if (e >= s.size()) return LexError(line, "unclosed string literal");
      out->push_back({TokenType::kString, Unescape(s.substr(pos + 1, e - pos - 1)), line});
      pos = e + 1;
    } else {
      bool found = false;
      for (const char* op : kOps) {
        const std::string_view o(op);
        if (s.substr(pos, o.size()) == o) {
          if (o == "(" || o == "[" || o == "{") ++depth;
          if ((o == ")" || o == "]" || o == "}") && depth > 0) --depth;
          out->push_back({TokenType::kOp, std::string(o), line});
          pos += o.size();
          found = true;
          break;
        }
      }
      if (!found) return LexError(line, std::string("unexpected character '") + c + "'");
    }
  }
}

}  // namespace

StatusOr<std::vector<Token>> Lex(std::string_view source) {
  std::string_view s = source;
  if (!s.empty() && s.back() == '\n') s.remove_suffix(1);  // keep_trailing_newline=False
  std::vector<Token> out;
  size_t pos = 0;
  // How the text after the previous tag begins: strip all whitespace ("-"),
  // drop one newline (trim_blocks) or keep it.
  enum class Lead { kKeep, kStripAll, kOneNewline } lead = Lead::kKeep;
  while (pos <= s.size()) {
    size_t tag = pos;
    while (true) {
      tag = s.find('{', tag);
      if (tag == std::string_view::npos || tag + 1 >= s.size()) {
        tag = std::string_view::npos;
        break;
      }
      const char n = s[tag + 1];
      if (n == '{' || n == '%' || n == '#') break;
      ++tag;
    }
    size_t start = pos;
    size_t end = tag == std::string_view::npos ? s.size() : tag;
    if (lead == Lead::kStripAll) {
      while (start < end && IsSpace(s[start])) ++start;
    } else if (lead == Lead::kOneNewline && start < end && s[start] == '\n') {
      ++start;
    }
    if (tag != std::string_view::npos) {
      const char kind = s[tag + 1];
      const char mod = tag + 2 < s.size() ? s[tag + 2] : '\0';
      if (mod == '-') {
        while (end > start && IsSpace(s[end - 1])) --end;
      } else if (mod != '+' && kind != '{') {
        // lstrip_blocks: only spaces/tabs between the line start and the tag.
        size_t line_start = end;
        while (line_start > start && (s[line_start - 1] == ' ' || s[line_start - 1] == '\t'))
          --line_start;
        const bool at_line_start =
            line_start > start ? s[line_start - 1] == '\n' : (start == 0 || s[start - 1] == '\n');
        if (at_line_start) end = line_start;
      }
    }
    if (end > start)
      out.push_back(
          {TokenType::kText, std::string(s.substr(start, end - start)), LineAt(s, start)});
    if (tag == std::string_view::npos) break;
    const char kind = s[tag + 1];
    size_t body = tag + 2;
    if (body < s.size() && (s[body] == '-' || s[body] == '+')) ++body;
    const int line = LineAt(s, tag);
    if (kind == '#') {
      const size_t close = s.find("#}", body);
      if (close == std::string_view::npos) return LexError(line, "unclosed comment");
      lead = close > body && s[close - 1] == '-' ? Lead::kStripAll : Lead::kOneNewline;
      pos = close + 2;
      continue;
    }
    const bool var = kind == '{';
    out.push_back({var ? TokenType::kVarBegin : TokenType::kBlockBegin, "", line});
    TESSERA_ASSIGN_OR_RETURN(size_t close, LexTag(s, body, var ? "}}" : "%}", &out));
    const int close_line = LineAt(s, close);
    out.push_back({var ? TokenType::kVarEnd : TokenType::kBlockEnd, "", close_line});
    if (s[close] == '-') {
      lead = Lead::kStripAll;
      pos = close + 3;
    } else if (s[close] == '+') {
      lead = Lead::kKeep;
      pos = close + 3;
    } else {
      lead = var ? Lead::kKeep : Lead::kOneNewline;
      pos = close + 2;
    }
  }
  out.push_back({TokenType::kEof, "", LineAt(s, s.size())});
  return out;
}

}  // namespace tessera::jinja
