// Tool calls in a model's output: which format a model family writes them in
// (chosen from its chat template) and the parser of each, for the whole
// output and for a stream's output so far.
//
// Formats (one parser each, in tool_parser_<family>.cc):
//  - kHermes (Qwen2.5, Qwen3): content, then one or more
//      <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>
//    blocks.
//  - kLlama3Json (Llama 3.1, 3.2, 3.3): the whole output is a call
//      {"name": ..., "parameters": {...}}
//    optionally after <|python_tag|>, several separated by ";".
//  - kMistral (Mistral v0.3, Mixtral): content, then
//      [TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]
//    ([TOOL_CALLS] is a special token, dropped from decoded text: a
//    leading JSON array of calls counts too).
//
// Thread-safety: pure functions.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "coordinator/api/tool_call_scan.h"

namespace tessera {

enum class ToolCallFormat { kHermes, kLlama3Json, kMistral };
const char* ToolCallFormatName(ToolCallFormat format);  // "hermes", "llama3_json", "mistral"

// The format a chat template's source asks the model to call tools in: the
// template writes <tool_call> (kHermes), [TOOL_CALLS] (kMistral), or the
// "parameters" call of Llama 3.1+ (kLlama3Json); nullopt when none of them.
std::optional<ToolCallFormat> DetectToolCallFormat(std::string_view template_source);

// The output `text` split into content and calls.
//  - final (the whole output): the calls, each complete with a name and
//    arguments that parse as JSON; when any call is malformed or cut off,
//    none, and content is the whole text (as vLLM's parsers fall back).
//  - !final (a stream's output so far): content is the text known to be
//    content (a possible marker start and trailing whitespace before it are
//    held back); calls as far as they go. Each field only grows as `text`
//    grows, so a stream sends the differences.
// Content before the first call loses its trailing whitespace.
struct ToolCallParse {
  std::string content;
  std::vector<PartialToolCall> calls;
};
ToolCallParse ParseToolCalls(ToolCallFormat format, std::string_view text, bool final);

// The family parsers ParseToolCalls dispatches to (same contract).
ToolCallParse ParseHermesToolCalls(std::string_view text, bool final);
ToolCallParse ParseLlama3JsonToolCalls(std::string_view text, bool final);
ToolCallParse ParseMistralToolCalls(std::string_view text, bool final);

// The content of text that is all content: whole when final, else less the
// trailing whitespace and a possible start of `marker` (held back).
std::string HeldBackContent(std::string_view text, bool final, std::string_view marker);
// The final result when parsing found a malformed or unfinished call.
ToolCallParse AllContent(std::string_view text);
// `text` without trailing JSON whitespace.
std::string_view TrimRight(std::string_view text);

}  // namespace tessera
