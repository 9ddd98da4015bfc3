// How a chat request's tools are served: the checks against the model
// (its chat template must render tools in a format Tessera parses), the
// parser to run on the output, and, for tool_choice "required" or a named
// function, the grammar LLGuidance enforces so that the output always
// parses as calls of the request's functions with arguments valid against
// their parameters schemas.
//
// The grammar (GrammarKind::kLark, LLGuidance's Lark syntax) is the family's
// call format around one %json sub-schema per call: an object with "name"
// (const: the function's) and the arguments key holding its parameters
// schema, anyOf over the allowed functions, compact JSON (whitespace_flexible
// off, as for response_format):
//   hermes       <tool_call>\n{...}\n</tool_call>   (parallel: "\n" between blocks)
//   llama3_json  {"name": ..., "parameters": ...}  (parallel: "; " between calls)
//   mistral      [TOOL_CALLS] [{...}, ...]          (the marker as its special token)
// A named function is called exactly once (as vLLM's named tool choice);
// required allows one or more calls, exactly one with parallel_tool_calls
// false.
//
// Thread-safety: pure functions, except PlanToolCalls's use of GrammarCheck
// (itself thread-safe).
#pragma once

#include <optional>
#include <string>

#include "common/base/sampling_params.h"
#include "common/tokenizer/chat_template.h"
#include "common/tokenizer/tokenizer.h"
#include "coordinator/api/grammar_check.h"
#include "coordinator/api/openai_api.h"
#include "coordinator/api/tool_call_parsers.h"
#include "coordinator/api/tool_calls.h"

namespace tessera {

// The enforced grammar of `tools` (tools.enforced()) in `format`. `tokenizer`
// tells whether the format's marker is a special token (referenced by id).
GrammarSpec ToolCallGrammar(ToolCallFormat format, const ToolsRequest& tools,
                            const Tokenizer& tokenizer);

struct ToolCallPlan {
  std::optional<ToolCallFormat> format;  // set: parse the output into tool calls
  GrammarSpec grammar;                   // tool_choice required/named: the enforced grammar
};

// Checks `tools` against the served model `model` and plans them. Errors
// (400): param "tools", code "tools_unsupported", when the template never
// references tools or writes calls in no format Tessera parses;
// tools[i].function.parameters (functions[i].parameters), code
// "invalid_json_schema", with LLGuidance's reason when it cannot use a
// schema; tool_choice, code "structured_output_unavailable", when an
// enforced choice needs LLGuidance and it did not load; "tools" when the
// enforced grammar is over kMaxGrammarSchemaBytes.
std::optional<ApiError> PlanToolCalls(const ToolsRequest& tools, const ChatTemplate& chat_template,
                                      const Tokenizer& tokenizer, GrammarCheck& grammar_check,
                                      const std::string& model, ToolCallPlan* out);

}  // namespace tessera
