#include "coordinator/api/openai_api.h"

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>

#include "common/base/json_parse.h"
#include "common/net/http_server.h"

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
  TESSERA_API_TRY(GetInt(obj, "n", 1, kMaxInt32, &n));
  if (n && *n != 1) {
    return BadRequest(fmt::format("n must be 1: Tessera returns one choice per prompt, got {}", *n),
                      "n");
  }
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

  // OpenAI fields Tessera does not implement: refuse non-default values.
  for (const char* key : {"presence_penalty", "frequency_penalty"}) {
    double v = 0.0;
    TESSERA_API_TRY(GetNumber(obj, key, -2.0, 2.0, &v));
    if (v != 0.0) {
      return BadRequest(fmt::format("{} is not supported (only 0), got {}", key, Num(v)), key);
    }
  }
  if (const json* j = Find(obj, "logit_bias")) {
    if (!j->is_object()) return WrongType("logit_bias", "an object", *j);
    if (!j->empty()) return BadRequest("logit_bias is not supported", "logit_bias");
  }
  return std::nullopt;
}

// `s` with each invalid UTF-8 sequence replaced by U+FFFD, as Dump() does for
// values. Used for object keys (two invalid keys must not collide only after
// the replacement).
std::string ValidUtf8(const std::string& s) {
  const std::string quoted = json(s).dump(-1, ' ', false, json::error_handler_t::replace);
  return json::parse(quoted).get<std::string>();
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
    if (msg.role != "system" && msg.role != "user" && msg.role != "assistant") {
      return BadRequest(fmt::format("{}.role '{}' is not supported; use system, user or assistant",
                                    name, role->get<std::string>()),
                        name + ".role");
    }
    const json* content = Find(m, "content");
    const std::string cname = name + ".content";
    if (!content) return BadRequest(cname + " is required", cname);
    if (content->is_string()) {
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

// ---- Response helpers ----

std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

json UsageJson(const Usage& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
}

json FinishJson(const std::optional<FinishReason>& r) {
  return r ? json(OpenAIFinishReason(*r)) : json(nullptr);
}

// Legacy completions logprobs: tokens, token_logprobs, top_logprobs (one
// {text: logprob} map per token) and text_offset (byte offset of each token
// in the choice text: the sum of the earlier token texts, from `offset`).
json CompletionLogprobsJson(const std::optional<std::vector<TokenLogprob>>& lp, int64_t offset) {
  if (!lp) return nullptr;
  json tokens = json::array(), token_logprobs = json::array(), top = json::array(),
       offsets = json::array();
  for (const TokenLogprob& t : *lp) {
    tokens.push_back(t.token);
    token_logprobs.push_back(t.logprob);
    json alternatives = json::object();
    for (const auto& [text, logprob] : t.top) {
      const std::string key = ValidUtf8(text);
      if (!alternatives.contains(key)) alternatives[key] = logprob;
    }
    top.push_back(std::move(alternatives));
    offsets.push_back(offset);
    offset += static_cast<int64_t>(t.token.size());
  }
  return {{"tokens", tokens},
          {"token_logprobs", token_logprobs},
          {"top_logprobs", top},
          {"text_offset", offsets}};
}

json Bytes(const std::string& s) {
  json out = json::array();
  for (unsigned char c : s) out.push_back(static_cast<int>(c));
  return out;
}

// Chat logprobs: {"content": [{token, logprob, bytes, top_logprobs: [...]}]}.
json ChatLogprobsJson(const std::optional<std::vector<TokenLogprob>>& lp) {
  if (!lp) return nullptr;
  json content = json::array();
  for (const TokenLogprob& t : *lp) {
    json top = json::array();
    for (const auto& [text, logprob] : t.top) {
      top.push_back({{"token", text}, {"logprob", logprob}, {"bytes", Bytes(text)}});
    }
    content.push_back({{"token", t.token},
                       {"logprob", t.logprob},
                       {"bytes", Bytes(t.token)},
                       {"top_logprobs", top}});
  }
  return {{"content", content}, {"refusal", nullptr}};
}

}  // namespace

// ---- Errors ----

std::string ApiError::ToJson() const { return ErrorJson(message, type, param, code); }

ApiError ApiErrorFromStatus(const Status& status) {
  ApiError e;
  e.message = status.message();
  switch (status.code()) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kOutOfRange:
      e.http_status = 400;
      break;
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
  return p;
}

ApiResult<CompletionRequest> ParseCompletionRequest(std::string_view body) {
  json obj;
  TESSERA_API_TRY(ParseObject(body, &obj));
  CompletionRequest req;
  TESSERA_API_TRY(GetModel(obj, &req.model));
  TESSERA_API_TRY(GetPrompts(obj, &req.prompts));
  std::optional<int64_t> max_tokens;
  TESSERA_API_TRY(GetInt(obj, "max_tokens", 1, kMaxInt32, &max_tokens));
  if (max_tokens) req.max_tokens = static_cast<int32_t>(*max_tokens);
  std::optional<int64_t> logprobs;
  TESSERA_API_TRY(GetInt(obj, "logprobs", 0, kMaxLogprobs, &logprobs));
  if (logprobs) req.logprobs = static_cast<int32_t>(*logprobs);
  TESSERA_API_TRY(GetGeneration(obj, &req.gen));
  bool echo = false;
  TESSERA_API_TRY(GetBool(obj, "echo", &echo));
  if (echo) return BadRequest("echo is not supported", "echo");
  std::optional<int64_t> best_of;
  TESSERA_API_TRY(GetInt(obj, "best_of", 1, kMaxInt32, &best_of));
  if (best_of && *best_of != 1) {
    return BadRequest(fmt::format("best_of must be 1, got {}", *best_of), "best_of");
  }
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
  for (const char* key : {"tools", "functions"}) {
    if (const json* j = Find(obj, key)) {
      if (!j->is_array()) return WrongType(key, "an array", *j);
      if (!j->empty()) return BadRequest(fmt::format("{} are not supported", key), key);
    }
  }
  if (const json* j = Find(obj, "response_format")) {
    if (!j->is_object()) return WrongType("response_format", "an object", *j);
    const json* type = Find(*j, "type");
    if (!type || !type->is_string())
      return BadRequest("response_format.type must be a string", "response_format.type");
    if (type->get<std::string>() != "text") {
      return BadRequest(fmt::format("response_format type '{}' is not supported; only 'text' is",
                                    type->get<std::string>()),
                        "response_format.type");
    }
  }
  return req;
}

// ---- Responses ----

const char* OpenAIFinishReason(FinishReason reason) {
  switch (reason) {
    case FinishReason::kEos:
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kCancelled:
      return "abort";  // the client went away; no client reads it
    case FinishReason::kError:
      return "error";  // streamed after an error event
  }
  return "stop";
}

std::string NewResponseId(std::string_view prefix) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return fmt::format("{}-{:016x}{:08x}", prefix, rng(), static_cast<uint32_t>(rng()));
}

int64_t UnixSeconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string CompletionResponseJson(const std::string& id, int64_t created, const std::string& model,
                                   const std::vector<CompletionChoice>& choices,
                                   const Usage& usage) {
  json out_choices = json::array();
  for (const CompletionChoice& c : choices) {
    out_choices.push_back({{"index", c.index},
                           {"text", c.text},
                           {"logprobs", CompletionLogprobsJson(c.logprobs, c.logprobs_offset)},
                           {"finish_reason", FinishJson(c.finish_reason)}});
  }
  return Dump({{"id", id},
               {"object", "text_completion"},
               {"created", created},
               {"model", model},
               {"choices", out_choices},
               {"usage", UsageJson(usage)}});
}

std::string CompletionChunkJson(const std::string& id, int64_t created, const std::string& model,
                                const std::vector<CompletionChoice>& choices,
                                const std::optional<Usage>& usage, bool include_usage) {
  json out_choices = json::array();
  for (const CompletionChoice& c : choices) {
    out_choices.push_back({{"index", c.index},
                           {"text", c.text},
                           {"logprobs", CompletionLogprobsJson(c.logprobs, c.logprobs_offset)},
                           {"finish_reason", FinishJson(c.finish_reason)}});
  }
  json out = {{"id", id},
              {"object", "text_completion"},
              {"created", created},
              {"model", model},
              {"choices", out_choices}};
  if (usage) {
    out["usage"] = UsageJson(*usage);
  } else if (include_usage) {
    out["usage"] = nullptr;
  }
  return Dump(out);
}

std::string ChatCompletionResponseJson(const std::string& id, int64_t created,
                                       const std::string& model,
                                       const std::vector<ChatChoice>& choices, const Usage& usage) {
  json out_choices = json::array();
  for (const ChatChoice& c : choices) {
    out_choices.push_back({{"index", c.index},
                           {"message", {{"role", "assistant"}, {"content", c.content}}},
                           {"logprobs", ChatLogprobsJson(c.logprobs)},
                           {"finish_reason", FinishJson(c.finish_reason)}});
  }
  return Dump({{"id", id},
               {"object", "chat.completion"},
               {"created", created},
               {"model", model},
               {"choices", out_choices},
               {"usage", UsageJson(usage)}});
}

std::string ChatCompletionChunkJson(const std::string& id, int64_t created,
                                    const std::string& model, int index, bool role,
                                    const std::optional<std::string>& content,
                                    std::optional<FinishReason> finish_reason,
                                    const std::optional<std::vector<TokenLogprob>>& logprobs,
                                    bool include_usage) {
  json delta = json::object();
  if (role) delta["role"] = "assistant";
  if (content) delta["content"] = *content;
  json out = {{"id", id},
              {"object", "chat.completion.chunk"},
              {"created", created},
              {"model", model},
              {"choices", json::array({{{"index", index},
                                        {"delta", delta},
                                        {"logprobs", ChatLogprobsJson(logprobs)},
                                        {"finish_reason", FinishJson(finish_reason)}}})}};
  if (include_usage) out["usage"] = nullptr;
  return Dump(out);
}

std::string ChatCompletionUsageChunkJson(const std::string& id, int64_t created,
                                         const std::string& model, const Usage& usage) {
  return Dump({{"id", id},
               {"object", "chat.completion.chunk"},
               {"created", created},
               {"model", model},
               {"choices", json::array()},
               {"usage", UsageJson(usage)}});
}

std::string ModelListJson(const std::vector<ModelCard>& models) {
  json data = json::array();
  for (const ModelCard& m : models) {
    data.push_back(
        {{"id", m.id}, {"object", "model"}, {"created", m.created}, {"owned_by", m.owned_by}});
  }
  return Dump({{"object", "list"}, {"data", data}});
}

}  // namespace tessera
