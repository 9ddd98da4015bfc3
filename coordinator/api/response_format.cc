#include "coordinator/api/response_format.h"

#include <fmt/format.h>

#include <string>

namespace tessera {

namespace {

using json = nlohmann::json;

ApiError FieldError(std::string message, std::string field) {
  ApiError e;
  e.http_status = 400;
  e.message = std::move(message);
  e.param = std::move(field);
  return e;
}

const json* FindKey(const json& obj, const char* key) {
  auto it = obj.find(key);
  return it == obj.end() || it->is_null() ? nullptr : &*it;
}

std::optional<ApiError> GetJsonSchema(const json& format, GrammarSpec* out) {
  const json* js = FindKey(format, "json_schema");
  if (!js || !js->is_object())
    return FieldError(
        "response_format.json_schema must be an object {\"name\", \"schema\", \"strict\"} when "
        "response_format.type is json_schema",
        "response_format.json_schema");
  for (const char* key : {"name", "description"}) {
    const json* v = FindKey(*js, key);
    if (v && !v->is_string())
      return FieldError(fmt::format("response_format.json_schema.{} must be a string", key),
                        fmt::format("response_format.json_schema.{}", key));
  }
  if (const json* strict = FindKey(*js, "strict"); strict && !strict->is_boolean())
    return FieldError("response_format.json_schema.strict must be a boolean",
                      "response_format.json_schema.strict");
  const json* schema = FindKey(*js, "schema");
  if (!schema || !(schema->is_object() || schema->is_boolean()))
    return FieldError("response_format.json_schema.schema must be a JSON Schema (an object)",
                      "response_format.json_schema.schema");
  std::string text = schema->dump();
  if (text.size() > kMaxGrammarSchemaBytes)
    return FieldError(fmt::format("response_format.json_schema.schema is {} bytes of JSON; at most "
                                  "{} are accepted",
                                  text.size(), kMaxGrammarSchemaBytes),
                      "response_format.json_schema.schema");
  out->kind = GrammarKind::kJsonSchema;
  out->schema = std::move(text);
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> CheckGrammarFields(const GenerationFields& gen) {
  if (!gen.grammar.active()) return std::nullopt;
  if (gen.ignore_eos)
    return FieldError(
        "ignore_eos cannot be combined with a response_format other than text: the grammar "
        "decides where the output ends",
        "ignore_eos");
  if (gen.min_tokens > 0)
    return FieldError(
        "min_tokens cannot be combined with a response_format other than text: the grammar "
        "decides where the output ends",
        "min_tokens");
  return std::nullopt;
}

std::optional<ApiError> GetResponseFormat(const json& request, GrammarSpec* out) {
  *out = GrammarSpec{};
  const json* format = FindKey(request, "response_format");
  if (!format) return std::nullopt;
  if (!format->is_object())
    return FieldError("response_format must be an object such as {\"type\": \"json_object\"}",
                      "response_format");
  const json* type = FindKey(*format, "type");
  if (!type || !type->is_string())
    return FieldError("response_format.type must be a string: text, json_object or json_schema",
                      "response_format.type");
  const std::string& t = type->get_ref<const std::string&>();
  if (t == "text") return std::nullopt;
  if (t == "json_object") {
    out->kind = GrammarKind::kJsonObject;
    return std::nullopt;
  }
  if (t == "json_schema") return GetJsonSchema(*format, out);
  return FieldError(fmt::format("response_format.type '{}' is not one of text, json_object, "
                                "json_schema",
                                t),
                    "response_format.type");
}

}  // namespace tessera
