#include "common/base/json_parse.h"

#include <fmt/format.h>

#include <algorithm>
#include <set>
#include <vector>

#include "common/base/utf8.h"

namespace tessera {
namespace {

using json = nlohmann::json;

// `s` cut to at most `max_bytes` bytes at a UTF-8 boundary, with "..." when cut.
std::string Cut(std::string_view s, size_t max_bytes) {
  if (s.size() <= max_bytes) return std::string(s);
  size_t n = max_bytes >= 3 ? max_bytes - 3 : 0;
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
  return std::string(s.substr(0, n)) + "...";
}

// One open array or object while parsing: where the parser is, for messages.
struct Frame {
  bool array = false;
  std::string key;             // objects: the member being read (cut for messages)
  size_t index = 0;            // arrays: the element being read
  std::set<std::string> keys;  // objects: the member names read so far
};

std::string PathOf(const std::vector<Frame>& frames) {
  std::string p;
  for (const Frame& f : frames) {
    if (p.size() > 120) return p + "...";
    if (f.array) {
      p += fmt::format("[{}]", f.index);
    } else if (!f.key.empty()) {
      if (!p.empty()) p += '.';
      p += f.key;
    }
  }
  return p;
}

std::string FirstComponent(const std::vector<Frame>& frames) {
  if (frames.empty() || frames[0].array) return "";
  return frames[0].key;
}

// Thrown by the parser callback to stop at the nesting bound or at a member
// name given twice; caught below.
struct TooDeep {};
struct DuplicateKey {};

void Append(const json& j, std::string* out, size_t limit) {
  if (out->size() > limit) return;
  switch (j.type()) {
    case json::value_t::array: {
      *out += '[';
      bool first = true;
      for (const json& e : j) {
        if (out->size() > limit) return;
        if (!first) *out += ',';
        first = false;
        Append(e, out, limit);
      }
      *out += ']';
      return;
    }
    case json::value_t::object: {
      *out += '{';
      bool first = true;
      for (auto it = j.begin(); it != j.end(); ++it) {
        if (out->size() > limit) return;
        if (!first) *out += ',';
        first = false;
        Append(json(Cut(it.key(), limit + 1)), out, limit);
        *out += ':';
        Append(it.value(), out, limit);
      }
      *out += '}';
      return;
    }
    case json::value_t::string: {
      // Quote only a prefix: a megabyte string costs what it prints.
      const std::string& s = j.get_ref<const std::string&>();
      *out += json(s.substr(0, limit + 1)).dump(-1, ' ', false, json::error_handler_t::replace);
      return;
    }
    default:
      *out += j.dump();  // scalars: short by construction
      return;
  }
}

}  // namespace

std::string ShowJsonValue(const json& value, size_t max_chars) {
  std::string out;
  Append(value, &out, max_chars);
  return Cut(out, max_chars);
}

std::string DescribeJsonParseError(std::string_view text, const json::parse_error& e) {
  // e.byte counts the characters read, 1-based; the error is at the last.
  const size_t at = std::min<size_t>(e.byte == 0 ? 0 : e.byte - 1, text.size());
  size_t line = 1, column = 1;
  for (size_t i = 0; i < at; ++i) {
    if (text[i] == '\n') {
      ++line;
      column = 1;
    } else {
      ++column;
    }
  }
  std::string reason = e.what();
  const size_t p = reason.find("parse error");
  const size_t colon = p == std::string::npos ? std::string::npos : reason.find(": ", p);
  if (colon != std::string::npos) reason = reason.substr(colon + 2);
  // nlohmann quotes the offending bytes, which may be invalid UTF-8 or long.
  return fmt::format("line {}, column {}: {}", line, column, Cut(Utf8Lossy(reason), 200));
}

bool ParseJsonBounded(std::string_view text, int max_depth, json* out, JsonParseError* error) {
  std::vector<Frame> frames;
  auto element_done = [&frames] {
    if (!frames.empty() && frames.back().array) ++frames.back().index;
  };
  json::parser_callback_t callback = [&](int /*depth*/, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        if (static_cast<int>(frames.size()) >= max_depth) throw TooDeep{};
        frames.push_back(Frame{event == json::parse_event_t::array_start, "", 0, {}});
        break;
      case json::parse_event_t::key:
        if (!frames.empty()) {
          // Two parsers may keep different copies of a repeated member (the
          // first or the last): refuse it rather than pick one.
          const std::string& name = parsed.get_ref<const std::string&>();
          frames.back().key = Cut(Utf8Lossy(name), 40);
          if (!frames.back().keys.insert(name).second) throw DuplicateKey{};
        }
        break;
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        if (!frames.empty()) frames.pop_back();
        element_done();
        break;
      case json::parse_event_t::value:
        element_done();
        break;
    }
    return true;
  };
  try {
    *out = json::parse(text.begin(), text.end(), callback);
    return true;
  } catch (const TooDeep&) {
    const std::string path = PathOf(frames);
    error->message = fmt::format("{}{}arrays and objects nest deeper than {} levels",
                                 path.empty() ? "" : path, path.empty() ? "" : ": ", max_depth);
    error->path = path;
    error->field = FirstComponent(frames);
  } catch (const DuplicateKey&) {
    const std::string path = PathOf(frames);
    error->message = fmt::format("{}: the member is given twice; give each member once", path);
    error->path = path;
    error->field = FirstComponent(frames);
  } catch (const json::parse_error& e) {
    error->message = DescribeJsonParseError(text, e);
    error->path.clear();
    error->field.clear();
  } catch (const json::out_of_range& e) {
    // 406: a number literal beyond the double range (1e400, -1e400).
    const std::string path = PathOf(frames);
    std::string what = e.what();
    const size_t q = what.find('\'');
    const std::string literal =
        q == std::string::npos ? "" : Cut(what.substr(q + 1, what.size() - q - 2), 24);
    error->message = fmt::format(
        "{}{}the number {} is out of range (a JSON number here is a double: magnitude at most "
        "about 1.8e308)",
        path.empty() ? "" : path, path.empty() ? "" : ": ", literal);
    error->path = path;
    error->field = FirstComponent(frames);
  } catch (const json::exception&) {
    error->message = "the JSON text could not be read";
    error->path = PathOf(frames);
    error->field = FirstComponent(frames);
  }
  *out = json();
  return false;
}

StatusOr<json> ParseJsonBounded(std::string_view text, int max_depth, const std::string& what) {
  json j;
  JsonParseError error;
  if (!ParseJsonBounded(text, max_depth, &j, &error))
    return InvalidArgument(what + ": " + error.message);
  return j;
}

nlohmann::ordered_json OrderedMember(std::string_view text, const char* key) {
  // Bounded already (the caller's ParseJsonBounded), so the recursive
  // copies below stay shallow.
  nlohmann::ordered_json doc = nlohmann::ordered_json::parse(text, nullptr, false);
  if (!doc.is_object()) return nullptr;
  auto it = doc.find(key);
  return it == doc.end() ? nlohmann::ordered_json() : std::move(*it);
}

}  // namespace tessera
