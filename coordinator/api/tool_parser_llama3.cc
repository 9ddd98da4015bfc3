// Llama 3.1+ JSON tool calls: the whole output is
//   {"name": ..., "parameters": {...}}
// optionally after <|python_tag|> (a special token, usually dropped from the
// text), several separated by ";". Output that does not start with "{" is
// content.
#include "coordinator/api/tool_call_parsers.h"

namespace tessera {
namespace {

constexpr std::string_view kPythonTag = "<|python_tag|>";

}  // namespace

ToolCallParse ParseLlama3JsonToolCalls(std::string_view text, bool final) {
  size_t pos = SkipJsonSpace(text, 0);
  if (text.substr(pos, kPythonTag.size()) == kPythonTag) {
    pos = SkipJsonSpace(text, pos + kPythonTag.size());
  } else if (!final && pos < text.size() &&
             kPythonTag.substr(0, text.size() - pos) == text.substr(pos)) {
    return {};  // may be the tag's start
  }
  if (pos >= text.size()) return {final ? std::string(text) : std::string(), {}};
  if (text[pos] != '{') return {std::string(final ? text : TrimRight(text)), {}};
  ToolCallParse out;
  while (true) {
    CallScan scan = ScanCallObject(text, pos, {"parameters", "arguments"});
    if (scan.state == ScanState::kMalformed) return final ? AllContent(text) : out;
    out.calls.push_back(std::move(scan.call));
    if (scan.state == ScanState::kPartial) return out;
    pos = SkipJsonSpace(text, scan.end);
    if (pos >= text.size()) return out;
    if (text[pos] != ';') return final ? AllContent(text) : out;
    pos = SkipJsonSpace(text, pos + 1);
    if (pos >= text.size()) return out;
  }
}

}  // namespace tessera
