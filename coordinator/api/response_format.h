// response_format of chat completions and completions (OpenAI's structured
// outputs; vLLM accepts the field on completions too): parsed into the
// GrammarSpec that travels in SamplingParams::grammar.
//
//   {"type": "text"}                         -> no grammar
//   {"type": "json_object"}                  -> GrammarKind::kJsonObject
//   {"type": "json_schema", "json_schema": {"name": string, "schema": object,
//    "strict": bool, "description": string}} -> GrammarKind::kJsonSchema
//
// The schema's text keeps the request's key order: LLGuidance generates an
// object's properties in the order the schema lists them, and clients rely
// on that order (OpenAI and vLLM keep it). Only the shape is checked here;
// whether LLGuidance can use the schema is the frontend's check
// (GrammarCheck), a 400 naming response_format.json_schema.schema.
//
// Thread-safety: pure functions.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string_view>

#include "common/base/sampling_params.h"
#include "coordinator/api/openai_api.h"

namespace tessera {

// Reads request["response_format"] (absent or null: no grammar) into `out`;
// `body` is the request's text (`request` parsed), from which the schema is
// taken in its key order. Errors: 400 naming the field: response_format not
// an object, response_format.type not a string or not one of text/
// json_object/json_schema, response_format.json_schema missing or not an
// object, .name missing or not 1 to 64 of a-z, A-Z, 0-9, _ and - (OpenAI's
// rule), .description not a string, .strict not a boolean, .schema not an
// object or a boolean, or over kMaxGrammarSchemaBytes as JSON text.
std::optional<ApiError> GetResponseFormat(const nlohmann::json& request, std::string_view body,
                                          GrammarSpec* out);

// With a grammar the grammar decides where the output ends (EOS only once the
// document is complete, and then only EOS): ignore_eos and min_tokens > 0
// contradict it. Errors: 400 naming the field.
std::optional<ApiError> CheckGrammarFields(const GenerationFields& gen);

}  // namespace tessera
