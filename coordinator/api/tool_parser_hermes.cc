// Qwen2.5 / Qwen3 (Hermes-style) tool calls: content, then blocks
//   <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>
// separated by whitespace.
#include "coordinator/api/tool_call_parsers.h"

namespace tessera {
namespace {

constexpr std::string_view kOpen = "<tool_call>";
constexpr std::string_view kClose = "</tool_call>";

}  // namespace

ToolCallParse ParseHermesToolCalls(std::string_view text, bool final) {
  const size_t first = text.find(kOpen);
  if (first == std::string_view::npos) return {HeldBackContent(text, final, kOpen), {}};
  ToolCallParse out;
  out.content = std::string(TrimRight(text.substr(0, first)));
  size_t pos = first;
  while (true) {
    CallScan scan = ScanCallObject(text, pos + kOpen.size(), {"arguments", "parameters"});
    if (scan.state == ScanState::kMalformed) return final ? AllContent(text) : out;
    out.calls.push_back(std::move(scan.call));
    if (scan.state == ScanState::kPartial) return out;
    pos = SkipJsonSpace(text, scan.end);
    const std::string_view rest = text.substr(pos);
    if (rest.size() < kClose.size()) {
      if (kClose.substr(0, rest.size()) != rest && final) return AllContent(text);
      return out;  // the close tag is still coming (or, final, cut off: the call stands)
    }
    if (rest.substr(0, kClose.size()) != kClose) return final ? AllContent(text) : out;
    pos = SkipJsonSpace(text, pos + kClose.size());
    const std::string_view next = text.substr(pos);
    if (next.size() < kOpen.size() || next.substr(0, kOpen.size()) != kOpen)
      return out;  // the end, a next block's start, or text after the calls (dropped)
  }
}

}  // namespace tessera
