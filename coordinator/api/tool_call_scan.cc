#include "coordinator/api/tool_call_scan.h"

#include <nlohmann/json.hpp>
#include <vector>

namespace tessera {
namespace {

bool IsSpace(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

// A string starting at s[pos] == '"'.
ValueScan ScanString(std::string_view s, size_t pos) {
  for (size_t i = pos + 1; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '\\') {
      ++i;
    } else if (c == '"') {
      return {ScanState::kComplete, i + 1};
    } else if (static_cast<unsigned char>(c) < 0x20) {
      return {ScanState::kMalformed, i};
    }
  }
  return {ScanState::kPartial, s.size()};
}

// An array or object starting at s[pos]: brackets matched, strings skipped.
ValueScan ScanNested(std::string_view s, size_t pos) {
  std::vector<char> open;
  for (size_t i = pos; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '"') {
      const ValueScan str = ScanString(s, i);
      if (str.state != ScanState::kComplete) return str;
      i = str.end - 1;
    } else if (c == '{' || c == '[') {
      open.push_back(c == '{' ? '}' : ']');
    } else if (c == '}' || c == ']') {
      if (open.empty() || open.back() != c) return {ScanState::kMalformed, i};
      open.pop_back();
      if (open.empty()) return {ScanState::kComplete, i + 1};
    }
  }
  return {ScanState::kPartial, s.size()};
}

bool IsScalarChar(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || c == '-' || c == '+' || c == '.' ||
         c == 'E';
}

}  // namespace

size_t SkipJsonSpace(std::string_view s, size_t pos) {
  while (pos < s.size() && IsSpace(s[pos])) ++pos;
  return pos;
}

ValueScan ScanJsonValue(std::string_view s, size_t pos) {
  pos = SkipJsonSpace(s, pos);
  if (pos >= s.size()) return {ScanState::kPartial, s.size()};
  const char c = s[pos];
  if (c == '"') return ScanString(s, pos);
  if (c == '{' || c == '[') return ScanNested(s, pos);
  size_t i = pos;
  while (i < s.size() && IsScalarChar(s[i])) ++i;
  if (i == pos) return {ScanState::kMalformed, pos};
  if (i == s.size()) return {ScanState::kPartial, i};  // "12" may go on as "123"
  return {ScanState::kComplete, i};
}

CallScan ScanCallObject(std::string_view s, size_t pos,
                        std::initializer_list<std::string_view> args_keys) {
  CallScan out;
  size_t i = SkipJsonSpace(s, pos);
  if (i >= s.size()) return out;
  if (s[i] != '{') return {ScanState::kMalformed, i, {}};
  ++i;
  while (true) {
    i = SkipJsonSpace(s, i);
    if (i >= s.size()) return out;
    if (s[i] == '}') break;
    if (s[i] != '"') return {ScanState::kMalformed, i, std::move(out.call)};
    const ValueScan key = ScanString(s, i);
    if (key.state != ScanState::kComplete) {
      out.state = key.state;
      return out;
    }
    const auto key_text = nlohmann::json::parse(s.substr(i, key.end - i), nullptr, false);
    if (!key_text.is_string()) return {ScanState::kMalformed, i, std::move(out.call)};
    const std::string name = key_text.get<std::string>();
    i = SkipJsonSpace(s, key.end);
    if (i >= s.size()) return out;
    if (s[i] != ':') return {ScanState::kMalformed, i, std::move(out.call)};
    i = SkipJsonSpace(s, i + 1);
    if (i >= s.size()) return out;
    const ValueScan value = ScanJsonValue(s, i);
    bool is_args = false;
    for (std::string_view k : args_keys) is_args = is_args || name == k;
    if (is_args && value.state != ScanState::kMalformed) {
      out.call.arguments_seen = true;
      out.call.arguments = std::string(s.substr(i, value.end - i));
      out.call.arguments_complete = value.state == ScanState::kComplete;
    }
    if (value.state != ScanState::kComplete) {
      out.state = value.state;
      return out;
    }
    if (name == "name") {
      const auto v = nlohmann::json::parse(s.substr(i, value.end - i), nullptr, false);
      if (!v.is_string()) return {ScanState::kMalformed, i, std::move(out.call)};
      out.call.name = v.get<std::string>();
    }
    i = SkipJsonSpace(s, value.end);
    if (i >= s.size()) return out;
    if (s[i] == ',') {
      ++i;
      continue;
    }
    if (s[i] != '}') return {ScanState::kMalformed, i, std::move(out.call)};
    break;
  }
  out.state = ScanState::kComplete;
  out.end = i + 1;
  return out;
}

size_t MarkerPrefixSuffix(std::string_view text, std::string_view marker) {
  const size_t most = std::min(text.size(), marker.size() - 1);
  for (size_t n = most; n > 0; --n)
    if (text.substr(text.size() - n) == marker.substr(0, n)) return n;
  return 0;
}

}  // namespace tessera
