// The tool-calling fields of a chat request (OpenAI's function calling):
// `tools`, `tool_choice`, `parallel_tool_calls`, the legacy `functions` and
// `function_call` (mapped onto tools), and the history's tool messages:
// assistant messages with `tool_calls` (content may be null) and `tool`
// messages with `tool_call_id`.
//
// Only the request's shape is checked here: whether the model's template can
// render tools, and whether LLGuidance compiles each parameters schema, are
// the frontend's checks (tool_call_grammar.h).
//
// Thread-safety: pure functions.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/tokenizer/chat_template.h"
#include "coordinator/api/openai_api.h"

namespace tessera {

// Most tools per request (OpenAI's limit; a name's is kMaxApiNameBytes).
inline constexpr size_t kMaxTools = 128;

struct ToolFunction {
  std::string name;           // [a-zA-Z0-9_-]{1,64}, unique in the request
  nlohmann::json parameters;  // a JSON Schema object; {"type":"object","properties":{}} if absent
};

enum class ToolChoice {
  kNone,      // never parsed, never forced
  kAuto,      // free text, parsed into tool calls when it holds some
  kRequired,  // at least one call (LLGuidance enforces the format)
  kNamed,     // a call of `named` (enforced)
};

struct ToolsRequest {
  std::vector<ToolFunction> functions;  // empty: the request has no tools
  // The tools as sent (OpenAI's {"type": "function", "function": {...}},
  // key order kept), for the chat template; legacy `functions` are wrapped
  // into that shape.
  nlohmann::ordered_json tools_json;
  ToolChoice choice = ToolChoice::kNone;  // default: auto with tools, else none
  std::string named;                      // kNamed: the function's name
  bool parallel = true;                   // parallel_tool_calls: more than one call allowed
  bool legacy = false;  // given as functions/function_call (answered as tool_calls)

  bool parse() const { return !functions.empty() && choice != ToolChoice::kNone; }
  bool enforced() const { return choice == ToolChoice::kRequired || choice == ToolChoice::kNamed; }
};

// Reads tools/functions, tool_choice/function_call and parallel_tool_calls
// from the request `obj` (`body`: its text, re-read in key order for the
// template). Errors: 400 naming the field: tools not an array of
// {"type": "function", "function": {...}}; a name missing, not a string,
// not [a-zA-Z0-9_-]{1,64} or repeated (tools[i].function.name);
// tools[i].function.parameters not a JSON Schema object (a "type" that is no
// JSON type, "properties" not an object of schemas, "required" not an array
// of strings); tool_choice not one of none/auto/required/{"type":
// "function", "function": {"name"}}, naming a function not in tools, or
// given without tools; tools and functions both given.
std::optional<ApiError> GetTools(const nlohmann::json& obj, std::string_view body,
                                 ToolsRequest* out);

// The tool fields of messages[i] (`m`, named `name`) into `msg`: role
// "tool" needs tool_call_id (a string) and content; an assistant's
// tool_calls are [{"id", "type": "function", "function": {"name",
// "arguments": JSON text}}], passed to the template with the arguments
// parsed (as vLLM does; templates write them with tojson); role "function"
// (legacy) becomes "tool". Errors: 400 naming the field.
std::optional<ApiError> GetMessageToolFields(const nlohmann::json& m, const std::string& name,
                                             ChatMessage* msg);

}  // namespace tessera
