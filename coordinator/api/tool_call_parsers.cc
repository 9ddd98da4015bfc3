#include "coordinator/api/tool_call_parsers.h"

#include <nlohmann/json.hpp>

namespace tessera {

const char* ToolCallFormatName(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kHermes:
      return "hermes";
    case ToolCallFormat::kLlama3Json:
      return "llama3_json";
    case ToolCallFormat::kMistral:
      return "mistral";
  }
  return "?";
}

std::optional<ToolCallFormat> DetectToolCallFormat(std::string_view source) {
  if (source.find("<tool_call>") != std::string_view::npos) return ToolCallFormat::kHermes;
  if (source.find("[TOOL_CALLS]") != std::string_view::npos) return ToolCallFormat::kMistral;
  // Llama 3.1+: 'Respond in the format {"name": function name, "parameters": ...}'
  // and the history's '"parameters": ' + arguments | tojson.
  if (source.find("\"parameters\"") != std::string_view::npos &&
      source.find("<|start_header_id|>") != std::string_view::npos)
    return ToolCallFormat::kLlama3Json;
  return std::nullopt;
}

std::string_view TrimRight(std::string_view text) {
  size_t n = text.size();
  while (n > 0 &&
         (text[n - 1] == ' ' || text[n - 1] == '\n' || text[n - 1] == '\r' || text[n - 1] == '\t'))
    --n;
  return text.substr(0, n);
}

std::string HeldBackContent(std::string_view text, bool final, std::string_view marker) {
  if (final) return std::string(text);
  text = text.substr(0, text.size() - MarkerPrefixSuffix(text, marker));
  return std::string(TrimRight(text));
}

ToolCallParse AllContent(std::string_view text) { return {std::string(text), {}}; }

ToolCallParse ParseToolCalls(ToolCallFormat format, std::string_view text, bool final) {
  ToolCallParse out;
  switch (format) {
    case ToolCallFormat::kHermes:
      out = ParseHermesToolCalls(text, final);
      break;
    case ToolCallFormat::kLlama3Json:
      out = ParseLlama3JsonToolCalls(text, final);
      break;
    case ToolCallFormat::kMistral:
      out = ParseMistralToolCalls(text, final);
      break;
  }
  if (!final) return out;
  // The whole output: every call complete, named, with JSON arguments (a
  // call of a function without parameters may leave them out).
  for (PartialToolCall& c : out.calls) {
    if (c.name && !c.arguments_seen) {
      c.arguments = "{}";
      c.arguments_seen = c.arguments_complete = true;
    }
    if (!c.name || !c.arguments_complete ||
        nlohmann::json::parse(c.arguments, nullptr, false).is_discarded())
      return AllContent(text);
  }
  return out;
}

}  // namespace tessera
