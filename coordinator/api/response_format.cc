#include "coordinator/api/response_format.h"

#include <fmt/format.h>

#include <string>
#include <string_view>

#include "common/base/json_parse.h"

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

// OpenAI requires the name: 1 to 64 of a-z, A-Z, 0-9, _ and -.
std::optional<ApiError> CheckName(const json& js) {
  const json* name = FindKey(js, "name");
  if (!name)
    return FieldError(
        "response_format.json_schema.name is required (1 to 64 letters, digits, _ or -)",
        "response_format.json_schema.name");
  if (!name->is_string() || !IsValidApiName(name->get_ref<const std::string&>()))
    return FieldError(fmt::format("response_format.json_schema.name must be a string of 1 to {} "
                                  "letters, digits, _ or -, got {}",
                                  kMaxApiNameBytes, ShowJsonValue(*name)),
                      "response_format.json_schema.name");
  return std::nullopt;
}

// `body`: the request's text, whose schema is handed on in the order sent.
std::optional<ApiError> GetJsonSchema(const json& format, std::string_view body, GrammarSpec* out) {
  const json* js = FindKey(format, "json_schema");
  if (!js || !js->is_object())
    return FieldError(
        "response_format.json_schema must be an object {\"name\", \"schema\", \"strict\"} when "
        "response_format.type is json_schema",
        "response_format.json_schema");
  if (auto e = CheckName(*js)) return e;
  if (const json* v = FindKey(*js, "description"); v && !v->is_string())
    return FieldError("response_format.json_schema.description must be a string",
                      "response_format.json_schema.description");
  if (const json* strict = FindKey(*js, "strict"); strict && !strict->is_boolean())
    return FieldError("response_format.json_schema.strict must be a boolean",
                      "response_format.json_schema.strict");
  const json* schema = FindKey(*js, "schema");
  if (!schema || !(schema->is_object() || schema->is_boolean()))
    return FieldError("response_format.json_schema.schema must be a JSON Schema (an object)",
                      "response_format.json_schema.schema");
  // The shape is checked on `format` (keys sorted); the text handed to the
  // grammar engine keeps the request's key order, the order of the output.
  std::string text = OrderedMember(body, "response_format")["json_schema"]["schema"].dump();
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

std::optional<ApiError> GetResponseFormat(const json& request, std::string_view body,
                                          GrammarSpec* out) {
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
  if (t == "json_schema") return GetJsonSchema(*format, body, out);
  return FieldError(fmt::format("response_format.type '{}' is not one of text, json_object, "
                                "json_schema",
                                t),
                    "response_format.type");
}

}  // namespace tessera
