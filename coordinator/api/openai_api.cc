#include "coordinator/api/openai_api.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>

#include "common/base/json_parse.h"
#include "common/net/http_server.h"
#include "coordinator/api/response_format.h"
#include "coordinator/api/tool_calls.h"

namespace tessera {
namespace {

using json = nlohmann::json;

constexpr int kMaxStopSequences = 4;
constexpr int kMaxLogprobs = 20;
constexpr int64_t kMaxInt32 = std::numeric_limits<int32_t>::max();

// Returns the ApiError from the enclosing function when `expr` yields one.
#define TESSERA_API_TRY(expr)                             \
  do {                                                    \
    if (auto _tessera_err = (expr)) return *_tessera_err; \
  } while (0)

using MaybeError = std::optional<ApiError>;

ApiError BadRequest(std::string message, std::optional<std::string> param) {
  ApiError e;
  e.http_status = 400;
  e.message = std::move(message);
  e.param = std::move(param);
  return e;
}

const char* TypeName(const json& j) {
  switch (j.type()) {
    case json::value_t::null:
      return "null";
    case json::value_t::boolean:
      return "boolean";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
      return "integer";
    case json::value_t::number_float:
      return "number";
    case json::value_t::string:
      return "string";
    case json::value_t::array:
      return "array";
    case json::value_t::object:
      return "object";
    default:
      return "value";
  }
}

// The value as JSON text, shortened for messages (never a dump of the whole value).
std::string Show(const json& j) { return ShowJsonValue(j, 40); }

// An empty prompt array: param "prompt", code "empty_prompt" (as EmptyPromptError).
ApiError EmptyPromptArrayError(std::string message) {
  ApiError e = BadRequest(std::move(message), "prompt");
  e.code = "empty_prompt";
  return e;
}

// "must be <expected>, got <type> <value>".
ApiError WrongType(const std::string& name, const char* expected, const json& j) {
  return BadRequest(fmt::format("{} must be {}, got {} {}", name, expected, TypeName(j), Show(j)),
                    name);
}

// Formats a bound: 2 -> "2", 0.5 -> "0.5".
std::string Num(double v) { return fmt::format("{}", v); }

// nullptr when `key` is absent or null.
const json* Find(const json& obj, const char* key) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

// An integer value in [lo, hi]; integral floats (16.0) are accepted.
MaybeError ToInt(const json& j, const std::string& name, int64_t lo, int64_t hi, int64_t* out) {
  int64_t v = 0;
  if (j.is_number_unsigned()) {
    const uint64_t u = j.get<uint64_t>();
    v = u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())
            ? std::numeric_limits<int64_t>::max()
            : static_cast<int64_t>(u);
  } else if (j.is_number_integer()) {
    v = j.get<int64_t>();
  } else if (j.is_number_float()) {
    const double d = j.get<double>();
    if (!std::isfinite(d) || d != std::floor(d)) return WrongType(name, "an integer", j);
    if (d < -9.2e18 || d > 9.2e18) {
      v = d < 0 ? std::numeric_limits<int64_t>::min() : std::numeric_limits<int64_t>::max();
    } else {
      v = static_cast<int64_t>(d);
    }
  } else {
    return WrongType(name, "an integer", j);
  }
  if (v < lo || v > hi) {
    if (hi < kMaxInt32) {
      return BadRequest(fmt::format("{} must be between {} and {}, got {}", name, lo, hi, Show(j)),
                        name);
    }
    return BadRequest(v < lo ? fmt::format("{} must be at least {}, got {}", name, lo, Show(j))
                             : fmt::format("{} must be at most {}, got {}", name, hi, Show(j)),
                      name);
  }
  *out = v;
  return std::nullopt;
}

MaybeError GetInt(const json& obj, const char* key, int64_t lo, int64_t hi,
                  std::optional<int64_t>* out) {
  const json* j = Find(obj, key);
  if (!j) return std::nullopt;
  int64_t v = 0;
  TESSERA_API_TRY(ToInt(*j, key, lo, hi, &v));
  *out = v;
  return std::nullopt;
}

MaybeError GetNumber(const json& obj, const char* key, double lo, double hi, double* out) {
  const json* j = Find(obj, key);
  if (!j) return std::nullopt;
  if (!j->is_number()) return WrongType(key, "a number", *j);
  const double v = j->get<double>();
  if (!(v >= lo && v <= hi)) {
    return BadRequest(
        fmt::format("{} must be between {} and {}, got {}", key, Num(lo), Num(hi), Show(*j)), key);
  }
  *out = v;
  return std::nullopt;
}

MaybeError GetBool(const json& obj, const char* key, bool* out) {
  const json* j = Find(obj, key);
  if (!j) return std::nullopt;
  if (!j->is_boolean()) return WrongType(key, "a boolean", *j);
  *out = j->get<bool>();
  return std::nullopt;
}

// An optional string field: untouched when absent.
MaybeError GetString(const json& obj, const char* key, std::string* out) {
  const json* j = Find(obj, key);
  if (!j) return std::nullopt;
  if (!j->is_string()) return WrongType(key, "a string", *j);
  *out = j->get<std::string>();
  return std::nullopt;
}

MaybeError GetModel(const json& obj, std::string* out) {
  const json* j = Find(obj, "model");
  if (!j) return BadRequest("model is required", "model");
  if (!j->is_string()) return WrongType("model", "a string", *j);
  *out = j->get<std::string>();
  if (out->empty()) return BadRequest("model must not be empty", "model");
  return std::nullopt;
}

MaybeError GetStop(const json& obj, std::vector<std::string>* out) {
  const json* j = Find(obj, "stop");
  if (!j) return std::nullopt;
  if (j->is_string()) {
    if (j->get_ref<const std::string&>().empty())
      return BadRequest("stop must not be an empty string", "stop");
    out->push_back(j->get<std::string>());
    return std::nullopt;
  }
  if (!j->is_array()) return WrongType("stop", "a string or an array of strings", *j);
  if (j->size() > kMaxStopSequences) {
    return BadRequest(
        fmt::format("stop may hold at most {} sequences, got {}", kMaxStopSequences, j->size()),
        "stop");
  }
  for (size_t i = 0; i < j->size(); ++i) {
    const json& s = (*j)[i];
    const std::string name = fmt::format("stop[{}]", i);
    if (!s.is_string()) {
      return BadRequest(fmt::format("{} must be a string, got {} {}", name, TypeName(s), Show(s)),
                        "stop");
    }
    if (s.get_ref<const std::string&>().empty())
      return BadRequest(name + " must not be an empty string", "stop");
    out->push_back(s.get<std::string>());
  }
  return std::nullopt;
}

// {"<token id>": bias, ...}: ids as decimal strings (JSON keys), bias in
// [-100, 100].
MaybeError GetLogitBias(const json& obj, std::vector<std::pair<int32_t, float>>* out) {
  const json* j = Find(obj, "logit_bias");
  if (!j) return std::nullopt;
  if (!j->is_object()) return WrongType("logit_bias", "an object mapping token ids to biases", *j);
  if (j->size() > kMaxLogitBiasEntries)
    return BadRequest(fmt::format("logit_bias may hold at most {} entries, got {}",
                                  kMaxLogitBiasEntries, j->size()),
                      "logit_bias");
  for (const auto& [key, value] : j->items()) {
    const bool digits = !key.empty() && key.size() <= 10 &&
                        key.find_first_not_of("0123456789") == std::string::npos;
    const int64_t id = digits ? std::stoll(key) : -1;
    if (!digits || id > kMaxInt32)
      return BadRequest(fmt::format("logit_bias key '{}' must be a token id (a decimal integer "
                                    ">= 0 below 2^31)",
                                    key.substr(0, 40)),
                        "logit_bias");
    if (!value.is_number())
      return BadRequest(fmt::format("logit_bias[\"{}\"] must be a number, got {} {}", key,
                                    TypeName(value), Show(value)),
                        "logit_bias");
    const double bias = value.get<double>();
    if (!(bias >= -kMaxLogitBias && bias <= kMaxLogitBias))
      return BadRequest(
          fmt::format("logit_bias[\"{}\"] must be between -100 and 100, got {}", key, Show(value)),
          "logit_bias");
    out->emplace_back(static_cast<int32_t>(id), static_cast<float>(bias));
  }
  return std::nullopt;
}

// Penalties, logit_bias, min_p, min_tokens and stop_token_ids.
MaybeError GetLogitsProcessing(const json& obj, GenerationFields* gen) {
  TESSERA_API_TRY(GetNumber(obj, "presence_penalty", -2.0, 2.0, &gen->presence_penalty));
  TESSERA_API_TRY(GetNumber(obj, "frequency_penalty", -2.0, 2.0, &gen->frequency_penalty));
  if (const json* j = Find(obj, "repetition_penalty")) {
    if (!j->is_number()) return WrongType("repetition_penalty", "a number", *j);
    const double v = j->get<double>();
    if (!(v > 0.0 && v <= kMaxRepetitionPenalty))
      return BadRequest(
          fmt::format("repetition_penalty must be greater than 0 and at most 100, got {}",
                      Show(*j)),
          "repetition_penalty");
    gen->repetition_penalty = v;
  }
  TESSERA_API_TRY(GetNumber(obj, "min_p", 0.0, 1.0, &gen->min_p));
  std::optional<int64_t> min_tokens;
  TESSERA_API_TRY(GetInt(obj, "min_tokens", 0, kMaxInt32, &min_tokens));
  if (min_tokens) gen->min_tokens = static_cast<int32_t>(*min_tokens);
  TESSERA_API_TRY(GetLogitBias(obj, &gen->logit_bias));
  if (const json* j = Find(obj, "stop_token_ids")) {
    if (!j->is_array()) return WrongType("stop_token_ids", "an array of token ids", *j);
    if (j->size() > kMaxStopTokenIds)
      return BadRequest(fmt::format("stop_token_ids may hold at most {} ids, got {}",
                                    kMaxStopTokenIds, j->size()),
                        "stop_token_ids");
    for (size_t i = 0; i < j->size(); ++i) {
      int64_t id = 0;
      TESSERA_API_TRY(ToInt((*j)[i], "stop_token_ids", 0, kMaxInt32 - 1, &id));
      gen->stop_token_ids.push_back(static_cast<int32_t>(id));
    }
  }
  return std::nullopt;
}

// The fields both endpoints share, plus the unsupported-feature checks.
MaybeError GetGeneration(const json& obj, GenerationFields* gen) {
  TESSERA_API_TRY(GetNumber(obj, "temperature", 0.0, 2.0, &gen->temperature));
  if (const json* j = Find(obj, "top_p")) {
    if (!j->is_number()) return WrongType("top_p", "a number", *j);
    const double v = j->get<double>();
    if (!(v > 0.0 && v <= 1.0)) {
      return BadRequest(fmt::format("top_p must be greater than 0 and at most 1, got {}", Show(*j)),
                        "top_p");
    }
    gen->top_p = v;
  }
  std::optional<int64_t> top_k;
  TESSERA_API_TRY(GetInt(obj, "top_k", -1, kMaxInt32, &top_k));
  if (top_k) gen->top_k = static_cast<int32_t>(*top_k < 0 ? 0 : *top_k);
  if (const json* j = Find(obj, "seed")) {
    if (j->is_number_unsigned()) {
      gen->seed = j->get<uint64_t>();
    } else if (j->is_number_integer()) {
      gen->seed = static_cast<uint64_t>(j->get<int64_t>());
    } else if (j->is_number_float() && std::isfinite(j->get<double>()) &&
               j->get<double>() == std::floor(j->get<double>()) &&
               std::fabs(j->get<double>()) < 9.2e18) {
      gen->seed = static_cast<uint64_t>(static_cast<int64_t>(j->get<double>()));
    } else {
      return WrongType("seed", "an integer", *j);
    }
  }
  TESSERA_API_TRY(GetStop(obj, &gen->stop));
  std::optional<int64_t> n;
  TESSERA_API_TRY(GetInt(obj, "n", 1, kMaxChoices, &n));
  if (n) gen->n = static_cast<int32_t>(*n);
  TESSERA_API_TRY(GetBool(obj, "stream", &gen->stream));
  if (const json* j = Find(obj, "stream_options")) {
    if (!j->is_object()) return WrongType("stream_options", "an object", *j);
    if (!gen->stream) {
      return BadRequest("stream_options is only allowed when stream is true", "stream_options");
    }
    if (const json* u = Find(*j, "include_usage")) {
      if (!u->is_boolean()) return WrongType("stream_options.include_usage", "a boolean", *u);
      gen->include_usage = u->get<bool>();
    }
  }
  TESSERA_API_TRY(GetBool(obj, "ignore_eos", &gen->ignore_eos));
  return GetLogitsProcessing(obj, gen);
}

// Parses JSON text that must be an object, nesting at most kMaxRequestJsonDepth
// levels; a number outside the double range names its field.
MaybeError ParseObject(std::string_view body, json* out) {
  JsonParseError error;
  if (!ParseJsonBounded(body, kMaxRequestJsonDepth, out, &error)) {
    return BadRequest("the request body is not valid JSON: " + error.message,
                      error.field.empty() ? std::nullopt : std::optional<std::string>(error.field));
  }
  if (!out->is_object()) {
    return BadRequest(fmt::format("the request body must be a JSON object, got {}", TypeName(*out)),
                      std::nullopt);
  }
  return std::nullopt;
}

MaybeError ToTokenIds(const json& arr, const std::string& name, std::vector<int32_t>* out) {
  if (arr.empty()) return EmptyPromptArrayError(name + " must not be an empty array");
  out->reserve(arr.size());
  for (size_t i = 0; i < arr.size(); ++i) {
    const json& t = arr[i];
    const std::string item = fmt::format("{}[{}]", name, i);
    if (!t.is_number_integer() && !t.is_number_unsigned()) {
      return BadRequest(fmt::format("{} must be a token id (an integer >= 0), got {} {}", item,
                                    TypeName(t), Show(t)),
                        "prompt");
    }
    if (t.is_number_integer() && !t.is_number_unsigned() && t.get<int64_t>() < 0) {
      return BadRequest(
          fmt::format("{} must be a token id (an integer >= 0), got {}", item, Show(t)), "prompt");
    }
    if (t.get<uint64_t>() > static_cast<uint64_t>(kMaxInt32)) {
      return BadRequest(fmt::format("{} must be a token id below 2^31, got {}", item, Show(t)),
                        "prompt");
    }
    out->push_back(static_cast<int32_t>(t.get<int64_t>()));
  }
  return std::nullopt;
}

MaybeError GetPrompts(const json& obj, std::vector<Prompt>* out) {
  const json* j = Find(obj, "prompt");
  if (!j) return BadRequest("prompt is required", "prompt");
  constexpr const char* kShapes =
      "a string, an array of strings, an array of token ids or an array of token-id arrays";
  if (j->is_string()) {
    out->push_back(Prompt{false, j->get<std::string>(), {}});
    return std::nullopt;
  }
  if (!j->is_array()) return WrongType("prompt", kShapes, *j);
  if (j->empty()) return EmptyPromptArrayError("prompt must not be an empty array");
  const json& first = (*j)[0];
  if (first.is_number()) {
    Prompt p;
    p.is_tokens = true;
    TESSERA_API_TRY(ToTokenIds(*j, "prompt", &p.token_ids));
    out->push_back(std::move(p));
    return std::nullopt;
  }
  for (size_t i = 0; i < j->size(); ++i) {
    const json& e = (*j)[i];
    const std::string name = fmt::format("prompt[{}]", i);
    if (first.is_string() && e.is_string()) {
      out->push_back(Prompt{false, e.get<std::string>(), {}});
    } else if (first.is_array() && e.is_array()) {
      Prompt p;
      p.is_tokens = true;
      TESSERA_API_TRY(ToTokenIds(e, name, &p.token_ids));
      out->push_back(std::move(p));
    } else {
      return BadRequest(
          fmt::format("prompt must be {}; {} is {} {}", kShapes, name, TypeName(e), Show(e)),
          "prompt");
    }
  }
  return std::nullopt;
}

MaybeError GetMessages(const json& obj, std::vector<ChatMessage>* out) {
  const json* j = Find(obj, "messages");
  if (!j) return BadRequest("messages is required", "messages");
  if (!j->is_array()) return WrongType("messages", "an array of message objects", *j);
  if (j->empty()) return BadRequest("messages must not be empty", "messages");
  for (size_t i = 0; i < j->size(); ++i) {
    const json& m = (*j)[i];
    const std::string name = fmt::format("messages[{}]", i);
    if (!m.is_object()) return WrongType(name, "an object", m);
    ChatMessage msg;
    const json* role = Find(m, "role");
    if (!role) return BadRequest(name + ".role is required", name + ".role");
    if (!role->is_string()) return WrongType(name + ".role", "a string", *role);
    msg.role = role->get<std::string>();
    if (msg.role == "developer") msg.role = "system";
    if (msg.role != "system" && msg.role != "user" && msg.role != "assistant" &&
        msg.role != "tool" && msg.role != "function") {
      return BadRequest(
          fmt::format("{}.role '{}' is not supported; use system, user, assistant or tool", name,
                      role->get<std::string>()),
          name + ".role");
    }
    TESSERA_API_TRY(GetMessageToolFields(m, name, &msg));
    const json* content = Find(m, "content");
    const std::string cname = name + ".content";
    if (!content && msg.role == "assistant" && msg.extra.contains("tool_calls")) {
      msg.content_null = true;  // a message that only calls tools
    } else if (!content) {
      return BadRequest(cname + " is required", cname);
    } else if (content->is_string()) {
      msg.content = content->get<std::string>();
    } else if (content->is_array()) {
      for (size_t k = 0; k < content->size(); ++k) {
        const json& part = (*content)[k];
        const std::string pname = fmt::format("{}[{}]", cname, k);
        if (!part.is_object()) return WrongType(pname, "a content part object", part);
        const json* type = Find(part, "type");
        if (!type || !type->is_string()) {
          return BadRequest(pname + ".type must be the string \"text\"", pname + ".type");
        }
        if (type->get<std::string>() != "text") {
          return BadRequest(fmt::format("{}.type '{}' is not supported; only text parts are", pname,
                                        type->get<std::string>()),
                            pname + ".type");
        }
        const json* text = Find(part, "text");
        if (!text) return BadRequest(pname + ".text is required", pname + ".text");
        if (!text->is_string()) return WrongType(pname + ".text", "a string", *text);
        msg.content += text->get<std::string>();
      }
    } else {
      return WrongType(cname, "a string or an array of text parts", *content);
    }
    out->push_back(std::move(msg));
  }
  return std::nullopt;
}

}  // namespace

// ---- Errors ----

std::string ApiError::ToJson() const { return ErrorJson(message, type, param, code); }

bool IsValidApiName(std::string_view name) {
  if (name.empty() || name.size() > kMaxApiNameBytes) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '-';
  });
}

ApiError ApiErrorFromStatus(const Status& status) {
  ApiError e;
  e.message = status.message();
  switch (status.code()) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kOutOfRange: {
      e.http_status = 400;
      // "field: reason" names the request field (common/engine/scheduler.h).
      const size_t colon = e.message.find(':');
      if (colon != std::string::npos && colon > 0 &&
          e.message.find_first_not_of("abcdefghijklmnopqrstuvwxyz_") == colon)
        e.param = e.message.substr(0, colon);
      break;
    }
    case StatusCode::kNotFound:
      e.http_status = 404;
      break;
    case StatusCode::kResourceExhausted:
      e.http_status = 429;
      e.type = "rate_limit_error";
      break;
    case StatusCode::kUnavailable:
      e.http_status = 503;
      break;
    case StatusCode::kDeadlineExceeded:
      e.http_status = 504;
      break;
    default:
      e.http_status = 500;
      break;
  }
  if (e.http_status >= 500) e.type = "server_error";
  return e;
}

ApiError UnknownModelError(const std::string& requested, const std::string& served) {
  ApiError e;
  e.http_status = 404;
  e.message =
      fmt::format("The model '{}' does not exist; this server serves '{}'", requested, served);
  e.param = "model";
  e.code = "model_not_found";
  return e;
}

ApiError ContextLengthError(int64_t max_context, int64_t prompt_tokens, int64_t max_tokens,
                            const std::string& param) {
  ApiError e;
  e.http_status = 400;
  e.code = "context_length_exceeded";
  if (max_tokens >= max_context && prompt_tokens < max_context) {
    // The completion alone cannot fit, whatever the prompt: blame max_tokens.
    e.message = fmt::format(
        "This model's maximum context length is {} tokens. However, you requested {} tokens ({} "
        "in the {}, {} in the completion). max_tokens alone reaches the context length; please "
        "set max_tokens to at most {}.",
        max_context, prompt_tokens + max_tokens, prompt_tokens, param, max_tokens,
        max_context - prompt_tokens);
    e.param = "max_tokens";
    return e;
  }
  e.message = fmt::format(
      "This model's maximum context length is {} tokens. However, you requested {} tokens ({} in "
      "the {}, {} in the completion). Please reduce the length of the {} or completion.",
      max_context, prompt_tokens + max_tokens, prompt_tokens, param, max_tokens, param);
  e.param = param;
  return e;
}

ApiError QueueFullError(int64_t queue_limit) {
  ApiError e;
  e.http_status = 429;
  e.type = "rate_limit_error";
  e.message = fmt::format(
      "The server is overloaded: {} requests are already queued, its limit; retry later",
      queue_limit);
  e.code = "queue_full";
  return e;
}

ApiError PromptLimitError(int64_t limit, int64_t prompt_tokens, const std::string& param,
                          const std::string& limit_key) {
  ApiError e;
  e.http_status = 400;
  e.message = fmt::format("{} tokens in the {}; this server accepts at most {} prompt tokens ({})",
                          prompt_tokens, param, limit, limit_key);
  e.param = param;
  e.code = "prompt_too_long";
  return e;
}

ApiError PromptBytesError(int64_t limit, int64_t prompt_bytes, const std::string& param) {
  ApiError e;
  e.http_status = 413;
  e.message = fmt::format(
      "the {} is {} bytes; this server accepts at most {} bytes of prompt text "
      "(server.max_prompt_bytes)",
      param, prompt_bytes, limit);
  e.param = param;
  e.code = "prompt_too_large";
  return e;
}

ApiError MaxTokensLimitError(int64_t limit, int64_t max_tokens, const std::string& limit_key) {
  ApiError e;
  e.http_status = 400;
  e.message = fmt::format("max_tokens is {}; this server generates at most {} tokens ({})",
                          max_tokens, limit, limit_key);
  e.param = "max_tokens";
  e.code = "max_tokens_too_large";
  return e;
}

ApiError StreamLimitError(int64_t limit, const std::string& limit_key) {
  ApiError e;
  e.http_status = 429;
  e.type = "rate_limit_error";
  e.message = fmt::format(
      "The server has {} streaming responses open, its limit ({}); retry later or use "
      "stream: false",
      limit, limit_key);
  e.code = "too_many_streams";
  return e;
}

ApiError TooManyPromptsError(int64_t limit, int64_t prompts, const std::string& limit_key) {
  ApiError e;
  e.http_status = 400;
  e.message = fmt::format(
      "the request holds {} prompts; this server queues at most {} requests ({}), so it can never "
      "be admitted: send fewer prompts per request",
      prompts, limit, limit_key);
  e.param = "prompt";
  e.code = "too_many_prompts";
  return e;
}

ApiError TooManyChoicesError(int64_t limit, int64_t prompts, int64_t choices,
                             const std::string& field, const std::string& limit_key) {
  ApiError e = BadRequest(
      fmt::format("{} prompt(s) x {} {} = {} requests; this server queues at most {} ({}), so "
                  "the request can never be admitted: lower {}",
                  prompts, choices, field, prompts * choices, limit, limit_key, field),
      field);
  e.code = "too_many_choices";
  return e;
}

ApiError EmptyPromptError(const std::string& param) {
  ApiError e = BadRequest(
      fmt::format("the {} is empty: give at least one token of text to continue from", param),
      param);
  e.code = "empty_prompt";
  return e;
}

// ---- Requests ----

SamplingParams GenerationFields::ToSamplingParams(uint64_t default_seed) const {
  SamplingParams p;
  p.temperature = static_cast<float>(temperature);
  p.top_p = static_cast<float>(top_p);
  p.top_k = top_k;
  p.seed = seed.value_or(default_seed);
  p.presence_penalty = static_cast<float>(presence_penalty);
  p.frequency_penalty = static_cast<float>(frequency_penalty);
  p.repetition_penalty = static_cast<float>(repetition_penalty);
  p.min_p = static_cast<float>(min_p);
  p.min_tokens = min_tokens;
  p.logit_bias = logit_bias;
  p.stop_token_ids = stop_token_ids;
  p.grammar = grammar;
  return p;
}

// min_tokens above max_tokens can never be met.
MaybeError CheckMinTokens(const GenerationFields& gen, std::optional<int64_t> max_tokens) {
  if (max_tokens && gen.min_tokens > *max_tokens)
    return BadRequest(
        fmt::format("min_tokens ({}) must not exceed max_tokens ({})", gen.min_tokens, *max_tokens),
        "min_tokens");
  return std::nullopt;
}

ApiResult<CompletionRequest> ParseCompletionRequest(std::string_view body) {
  json obj;
  TESSERA_API_TRY(ParseObject(body, &obj));
  CompletionRequest req;
  TESSERA_API_TRY(GetModel(obj, &req.model));
  TESSERA_API_TRY(GetPrompts(obj, &req.prompts));
  std::optional<int64_t> max_tokens;
  TESSERA_API_TRY(GetInt(obj, "max_tokens", 0, kMaxInt32, &max_tokens));
  if (max_tokens) req.max_tokens = static_cast<int32_t>(*max_tokens);
  std::optional<int64_t> logprobs;
  TESSERA_API_TRY(GetInt(obj, "logprobs", 0, kMaxLogprobs, &logprobs));
  if (logprobs) req.logprobs = static_cast<int32_t>(*logprobs);
  TESSERA_API_TRY(GetGeneration(obj, &req.gen));
  TESSERA_API_TRY(CheckMinTokens(req.gen, req.max_tokens));
  TESSERA_API_TRY(GetBool(obj, "echo", &req.echo));
  TESSERA_API_TRY(GetResponseFormat(obj, body, &req.gen.grammar));
  TESSERA_API_TRY(CheckGrammarFields(req.gen));
  if (req.max_tokens == 0 && !req.echo)
    return BadRequest("max_tokens must be at least 1 (0 only with echo: true), got 0",
                      "max_tokens");
  std::optional<int64_t> prompt_logprobs;
  TESSERA_API_TRY(GetInt(obj, "prompt_logprobs", 0, kMaxLogprobs, &prompt_logprobs));
  if (prompt_logprobs) req.prompt_logprobs = static_cast<int32_t>(*prompt_logprobs);
  std::optional<int64_t> best_of;
  TESSERA_API_TRY(GetInt(obj, "best_of", 1, kMaxChoices, &best_of));
  req.best_of = best_of ? static_cast<int32_t>(*best_of) : req.gen.n;
  if (req.best_of < req.gen.n)
    return BadRequest(fmt::format("best_of ({}) must be at least n ({})", req.best_of, req.gen.n),
                      "best_of");
  if (req.best_of > req.gen.n && req.gen.stream)
    return BadRequest(
        "best_of above n is not supported with stream: true (the best choices are "
        "known only at the end)",
        "best_of");
  if (const json* j = Find(obj, "suffix")) {
    if (!j->is_string()) return WrongType("suffix", "a string", *j);
    if (!j->get_ref<const std::string&>().empty())
      return BadRequest("suffix is not supported", "suffix");
  }
  return req;
}

ApiResult<ChatCompletionRequest> ParseChatCompletionRequest(std::string_view body) {
  json obj;
  TESSERA_API_TRY(ParseObject(body, &obj));
  ChatCompletionRequest req;
  TESSERA_API_TRY(GetModel(obj, &req.model));
  TESSERA_API_TRY(GetMessages(obj, &req.messages));
  std::optional<int64_t> max_tokens, max_completion_tokens;
  TESSERA_API_TRY(GetInt(obj, "max_tokens", 1, kMaxInt32, &max_tokens));
  TESSERA_API_TRY(GetInt(obj, "max_completion_tokens", 1, kMaxInt32, &max_completion_tokens));
  if (max_completion_tokens) {
    req.max_tokens = static_cast<int32_t>(*max_completion_tokens);
  } else if (max_tokens) {
    req.max_tokens = static_cast<int32_t>(*max_tokens);
  }
  TESSERA_API_TRY(GetBool(obj, "logprobs", &req.logprobs));
  std::optional<int64_t> top_logprobs;
  TESSERA_API_TRY(GetInt(obj, "top_logprobs", 0, kMaxLogprobs, &top_logprobs));
  if (top_logprobs) {
    if (!req.logprobs) {
      return BadRequest("top_logprobs requires logprobs to be true", "top_logprobs");
    }
    req.top_logprobs = static_cast<int32_t>(*top_logprobs);
  }
  TESSERA_API_TRY(GetGeneration(obj, &req.gen));
  TESSERA_API_TRY(CheckMinTokens(req.gen, req.max_tokens));
  req.tools = std::make_shared<ToolsRequest>();
  TESSERA_API_TRY(GetTools(obj, body, req.tools.get()));
  TESSERA_API_TRY(GetResponseFormat(obj, body, &req.gen.grammar));
  TESSERA_API_TRY(CheckGrammarFields(req.gen));
  if (req.gen.grammar.active() && req.tools->enforced())
    return BadRequest(
        "tool_choice required or a named function cannot be combined with a response_format "
        "other than text: both constrain the whole output",
        "tool_choice");
  return req;
}

// ---- /tokenize and /detokenize ----

ApiResult<TokenizeRequest> ParseTokenizeRequest(std::string_view body) {
  json obj;
  TESSERA_API_TRY(ParseObject(body, &obj));
  TokenizeRequest req;
  TESSERA_API_TRY(GetString(obj, "model", &req.model));
  const json* prompt = Find(obj, "prompt");
  const bool messages = Find(obj, "messages") != nullptr;
  if ((prompt != nullptr) == messages)
    return BadRequest("give either prompt (text) or messages (a conversation), not both or neither",
                      prompt ? "messages" : "prompt");
  if (prompt) {
    if (!prompt->is_string()) return WrongType("prompt", "a string", *prompt);
    req.prompt = prompt->get<std::string>();
  } else {
    req.chat = true;
    TESSERA_API_TRY(GetMessages(obj, &req.messages));
  }
  if (Find(obj, "add_special_tokens")) {
    bool v = true;
    TESSERA_API_TRY(GetBool(obj, "add_special_tokens", &v));
    req.add_special_tokens = v;
  }
  TESSERA_API_TRY(GetBool(obj, "add_generation_prompt", &req.add_generation_prompt));
  return req;
}

ApiResult<DetokenizeRequest> ParseDetokenizeRequest(std::string_view body) {
  json obj;
  TESSERA_API_TRY(ParseObject(body, &obj));
  DetokenizeRequest req;
  TESSERA_API_TRY(GetString(obj, "model", &req.model));
  const json* tokens = Find(obj, "tokens");
  if (!tokens) return BadRequest("tokens is required", "tokens");
  if (!tokens->is_array()) return WrongType("tokens", "an array of token ids", *tokens);
  for (size_t i = 0; i < tokens->size(); ++i) {
    int64_t id = 0;
    TESSERA_API_TRY(ToInt((*tokens)[i], "tokens", 0, kMaxInt32 - 1, &id));
    req.tokens.push_back(static_cast<int32_t>(id));
  }
  return req;
}

}  // namespace tessera
