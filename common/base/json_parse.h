// Parsing JSON text that nobody vouches for (HTTP request bodies, admin
// requests, topology reports inside control messages) into nlohmann::json with
// bounds, and showing parsed values in error messages without serializing an
// unbounded value.
//
// Why: nlohmann's parser is iterative, but its serializer, copy and comparison
// recurse once per nesting level, so a 120 KB body of 60,000 nested arrays
// overflows the stack of whatever dumps it. Every untrusted document is parsed
// here with a nesting bound, and every value quoted in a message goes through
// ShowJsonValue, which stops after a few dozen characters.
//
// Errors never carry the library's exception text: a syntax error gives
// "line L, column C: <reason>", a number that does not fit a double (1e400)
// or a value nested too deep names the JSON path of the value at fault.
//
// Thread-safety: free functions over their arguments; safe from any thread.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "common/base/status.h"

namespace tessera {

// The nesting bound of request bodies: OpenAI-style requests nest at most
// about six levels (messages[i].content[j].image_url.url); 64 leaves room for
// tool schemas while keeping every later recursion over the value shallow.
inline constexpr int kMaxRequestJsonDepth = 64;

// Why a parse failed, for callers that map errors to a request field.
struct JsonParseError {
  // "line 1, column 9: syntax error ...", "prompt[1]: the number 1e400 is out
  // of range ...", "prompt[0][0]...: nesting deeper than 64 levels".
  std::string message;
  // The JSON path of the value at fault ("user", "prompt[1]", "messages[0].content");
  // empty for a syntax error or a problem with the document as a whole.
  std::string path;
  // The first component of `path` ("prompt" for "prompt[1]"): the request
  // field an API error names; empty when `path` is.
  std::string field;
};

// Parses `text` into `*out`. Arrays and objects may nest at most `max_depth`
// levels (the document itself is level 1). Returns the error on malformed JSON,
// a number outside the double range, or deeper nesting; `*out` is then
// unspecified. Never throws.
bool ParseJsonBounded(std::string_view text, int max_depth, nlohmann::json* out,
                      JsonParseError* error);

// The same as a Status: kInvalidArgument with "<what>: <message>".
StatusOr<nlohmann::json> ParseJsonBounded(std::string_view text, int max_depth,
                                          const std::string& what);

// The top-level member `key` of `text`, a JSON object that ParseJsonBounded
// accepted, with every object's keys in the order the text gives them
// (nlohmann::json sorts them by name): for what must reach its consumer as
// the client wrote it, a JSON Schema (LLGuidance generates properties in its
// order) or the tools a chat template renders. JSON null when `text` has no
// such member or is no JSON object. Never throws.
nlohmann::ordered_json OrderedMember(std::string_view text, const char* key);

// "line L, column C: <reason>" for a parse error nlohmann reported while
// reading `text` (the line and column of the byte it stopped at, 1-based; the
// reason without the library's prefix, invalid UTF-8 replaced, cut to about
// 200 characters).
std::string DescribeJsonParseError(std::string_view text, const nlohmann::json::parse_error& e);

// `value` as compact JSON text of at most `max_chars` characters (longer ones
// end in "..."). Walks only as much of the value as it prints, so it is cheap
// and shallow for any value, however large or deep.
std::string ShowJsonValue(const nlohmann::json& value, size_t max_chars = 40);

}  // namespace tessera
