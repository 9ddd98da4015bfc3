// Mistral tool calls: content, then
//   [TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]
// [TOOL_CALLS] is a special token that decoding usually drops, so an output
// that starts with a JSON array of objects is taken as the calls too.
#include "coordinator/api/tool_call_parsers.h"

namespace tessera {
namespace {

constexpr std::string_view kMarker = "[TOOL_CALLS]";

// Where the calls' "[" is: after the marker, or at the start when the
// output opens with "[" followed by "{" (the marker dropped); npos when the
// output is content (so far). `pending`: not yet decidable.
size_t CallsStart(std::string_view text, bool final, size_t* content_end, bool* pending) {
  *pending = false;
  const size_t marker = text.find(kMarker);
  if (marker != std::string_view::npos) {
    *content_end = marker;
    return marker + kMarker.size();
  }
  const size_t pos = SkipJsonSpace(text, 0);
  *content_end = 0;
  if (pos < text.size() && text[pos] == '[') {
    const size_t brace = SkipJsonSpace(text, pos + 1);
    if (brace < text.size() && text[brace] == '{') return pos;
    if (brace >= text.size() && !final) *pending = true;
  } else if (pos >= text.size() && !final) {
    *pending = true;
  }
  return std::string_view::npos;
}

}  // namespace

ToolCallParse ParseMistralToolCalls(std::string_view text, bool final) {
  size_t content_end = 0;
  bool pending = false;
  const size_t start = CallsStart(text, final, &content_end, &pending);
  if (pending) return {};
  if (start == std::string_view::npos) return {HeldBackContent(text, final, kMarker), {}};
  ToolCallParse out;
  out.content = std::string(TrimRight(text.substr(0, content_end)));
  size_t pos = SkipJsonSpace(text, start);
  if (pos >= text.size()) return final ? AllContent(text) : out;
  if (text[pos] != '[') return final ? AllContent(text) : out;
  pos = SkipJsonSpace(text, pos + 1);
  while (pos < text.size()) {
    CallScan scan = ScanCallObject(text, pos, {"arguments", "parameters"});
    if (scan.state == ScanState::kMalformed) return final ? AllContent(text) : out;
    out.calls.push_back(std::move(scan.call));
    if (scan.state == ScanState::kPartial) return out;
    pos = SkipJsonSpace(text, scan.end);
    if (pos >= text.size()) break;
    if (text[pos] == ']') return out;
    if (text[pos] != ',') return final ? AllContent(text) : out;
    pos = SkipJsonSpace(text, pos + 1);
  }
  // The text ends before "]": fine while streaming or cut off at the end.
  return out;
}

}  // namespace tessera
