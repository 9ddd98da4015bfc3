#include "coordinator/api/tool_call_grammar.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

namespace tessera {
namespace {

using json = nlohmann::json;

ApiError ToolError(std::string message, std::string param, std::string code) {
  ApiError e;
  e.http_status = 400;
  e.message = std::move(message);
  e.param = std::move(param);
  e.code = std::move(code);
  return e;
}

using ordered_json = nlohmann::ordered_json;

// Function i's parameters schema as the request wrote it (key order kept);
// an object without properties when it has none.
ordered_json ParamsSchema(const ToolsRequest& tools, size_t i) {
  const ordered_json& fn = tools.tools_json[i]["function"];
  auto it = fn.find("parameters");
  return it != fn.end() && !it->is_null()
             ? *it
             : ordered_json{{"type", "object"}, {"properties", ordered_json::object()}};
}

// The JSON Schema of one call of the allowed functions. Key order matters:
// LLGuidance generates properties in the schema's order, so "name" comes
// first (a stream can name the call early) and each function's parameters
// keep the request's order.
ordered_json CallSchema(const ToolsRequest& tools, const char* args_key) {
  ordered_json any = ordered_json::array();
  for (size_t i = 0; i < tools.functions.size(); ++i) {
    const ToolFunction& f = tools.functions[i];
    if (tools.choice == ToolChoice::kNamed && f.name != tools.named) continue;
    ordered_json properties = ordered_json::object();
    properties["name"] = {{"const", f.name}};
    properties[args_key] = ParamsSchema(tools, i);
    any.push_back({{"type", "object"},
                   {"properties", std::move(properties)},
                   {"required", {"name", args_key}},
                   {"additionalProperties", false}});
  }
  ordered_json schema = any.size() == 1 ? any[0] : ordered_json{{"anyOf", any}};
  schema["x-guidance"] = {{"whitespace_flexible", false}};
  return schema;
}

// A Lark literal for `marker`: its special token by id, else the text.
std::string Marker(const Tokenizer& tokenizer, const std::string& marker) {
  const std::optional<int32_t> id = tokenizer.TokenToId(marker);
  if (id && tokenizer.IsSpecial(*id)) return fmt::format("<[{}]>", *id);
  return json(marker).dump();
}

std::string ParamsField(const ToolsRequest& tools, size_t i) {
  return tools.legacy ? fmt::format("functions[{}].parameters", i)
                      : fmt::format("tools[{}].function.parameters", i);
}

}  // namespace

GrammarSpec ToolCallGrammar(ToolCallFormat format, const ToolsRequest& tools,
                            const Tokenizer& tokenizer) {
  std::string start;
  const char* args_key = "arguments";
  // A named function is called once (as vLLM's named tool choice); required
  // calls one or more unless parallel_tool_calls is false.
  const bool parallel = tools.parallel && tools.choice != ToolChoice::kNamed;
  switch (format) {
    case ToolCallFormat::kHermes:
      start = parallel ? "start: block (\"\\n\" block)*\n" : "start: block\n";
      start += "block: \"<tool_call>\\n\" call \"\\n</tool_call>\"\n";
      break;
    case ToolCallFormat::kLlama3Json:
      args_key = "parameters";
      start = parallel ? "start: call (\"; \" call)*\n" : "start: call\n";
      break;
    case ToolCallFormat::kMistral:
      start = fmt::format("start: {} \" [\" call {}\"]\"\n", Marker(tokenizer, "[TOOL_CALLS]"),
                          parallel ? "(\", \" call)* " : "");
      break;
  }
  GrammarSpec spec;
  spec.kind = GrammarKind::kLark;
  spec.schema =
      "%llguidance {}\n" + start + "call: %json " + CallSchema(tools, args_key).dump() + "\n";
  return spec;
}

std::optional<ApiError> PlanToolCalls(const ToolsRequest& tools, const ChatTemplate& chat_template,
                                      const Tokenizer& tokenizer, GrammarCheck& grammar_check,
                                      const std::string& model, ToolCallPlan* out) {
  *out = ToolCallPlan{};
  if (tools.functions.empty()) return std::nullopt;
  const char* field = tools.legacy ? "functions" : "tools";
  if (!chat_template.references_tools())
    return ToolError(fmt::format("{}: the chat template of the model '{}' does not render tools, "
                                 "so the model cannot be asked to call them",
                                 field, model),
                     field, "tools_unsupported");
  const std::optional<ToolCallFormat> format = DetectToolCallFormat(chat_template.source());
  if (tools.choice == ToolChoice::kNone) return std::nullopt;  // rendered, never parsed
  if (!format)
    return ToolError(fmt::format("{}: the chat template of the model '{}' asks for tool calls in "
                                 "a format Tessera does not parse (it parses <tool_call> blocks, "
                                 "[TOOL_CALLS] and Llama 3.1 JSON calls)",
                                 field, model),
                     field, "tools_unsupported");
  out->format = format;
  // Each parameters schema must compile; without the engine (auto only)
  // the shape checks of GetTools stand.
  for (size_t i = 0; i < tools.functions.size(); ++i) {
    bool loaded = true;
    const std::optional<std::string> reason =
        grammar_check.Reason({GrammarKind::kJsonSchema, ParamsSchema(tools, i).dump()}, &loaded);
    if (!loaded && !tools.enforced()) break;
    if (!loaded)
      return ToolError(
          fmt::format("tool_choice '{}' needs the grammar engine, which is "
                      "unavailable on this server: {}",
                      tools.choice == ToolChoice::kNamed ? tools.named : "required", *reason),
          "tool_choice", "structured_output_unavailable");
    if (reason)
      return ToolError(fmt::format("{}: the grammar engine (LLGuidance) cannot use it: {}",
                                   ParamsField(tools, i), *reason),
                       ParamsField(tools, i), "invalid_json_schema");
  }
  if (!tools.enforced()) return std::nullopt;
  out->grammar = ToolCallGrammar(*format, tools, tokenizer);
  if (out->grammar.schema.size() > kMaxGrammarSchemaBytes)
    return ToolError(fmt::format("{}: the tool-call grammar of these functions is {} bytes; at "
                                 "most {} are accepted",
                                 field, out->grammar.schema.size(), kMaxGrammarSchemaBytes),
                     field, "tools_too_large");
  bool loaded = true;
  if (auto reason = grammar_check.Reason(out->grammar, &loaded))
    return ToolError(fmt::format("tool_choice: the grammar engine (LLGuidance) cannot compile "
                                 "the tool-call grammar: {}",
                                 *reason),
                     "tool_choice", "invalid_json_schema");
  return std::nullopt;
}

}  // namespace tessera
