// The OpenAI-compatible wire format: typed requests parsed and validated from
// JSON bodies, and the JSON of every response Tessera sends on /v1/*.
//
// Requests (POST /v1/completions, POST /v1/chat/completions):
//   - fields absent or JSON null take their OpenAI default;
//   - unknown fields are ignored; known OpenAI fields Tessera does not
//     implement (a non-empty suffix) are refused rather than silently ignored
//     (docs/operations.md lists every field);
//   - every failure is an ApiError: HTTP 400, OpenAI's message and `param`
//     naming the field ("temperature must be between 0 and 2, got 5",
//     param "temperature"); malformed JSON names line and column; a wrong
//     type names the expected and the given JSON type.
// Responses follow the shapes of the OpenAI API reference (objects
// "text_completion", "chat.completion", "chat.completion.chunk", "list" /
// "model") that the official `openai` Python client parses. Streams send one
// chunk per Server-Sent Event and end with the event data kSseDone.
// Strings that are not valid UTF-8 (a token that splits a multi-byte
// character) are written with U+FFFD in place of the invalid bytes.
//
// Thread-safety: free functions on values; safe from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "common/base/sampling_params.h"
#include "common/base/status.h"
#include "common/engine/engine.h"
#include "common/tokenizer/chat_template.h"

namespace tessera {

// An error in OpenAI's shape:
//   {"error":{"message":...,"type":...,"param":...,"code":...}}
struct ApiError {
  int http_status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::optional<std::string> param;  // the request field at fault; JSON null when absent
  std::optional<std::string> code;   // e.g. "context_length_exceeded"; JSON null when absent

  std::string ToJson() const;
};

// OpenAI's rule for a function's name and response_format.json_schema.name:
// 1 to kMaxApiNameBytes characters, each a-z, A-Z, 0-9, _ or -.
inline constexpr size_t kMaxApiNameBytes = 64;
bool IsValidApiName(std::string_view name);

// A value or the ApiError that explains why there is none.
template <typename T>
class [[nodiscard]] ApiResult {
 public:
  ApiResult(ApiError error) : error_(std::move(error)) {}  // NOLINT: implicit by design
  ApiResult(T value) : value_(std::move(value)) {}         // NOLINT: implicit by design
  bool ok() const { return value_.has_value(); }
  const ApiError& error() const { return error_; }
  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T&& value() && { return std::move(*value_); }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }

 private:
  ApiError error_;
  std::optional<T> value_;
};

// Maps a Status from the serving path to an HTTP error: kInvalidArgument and
// kOutOfRange 400 (param: the request field a message starts with, as in
// "logit_bias: token id 9 is outside the vocab"), kNotFound 404, kResourceExhausted 429,
// kUnavailable 503, kDeadlineExceeded 504, anything else 500 ("server_error").
ApiError ApiErrorFromStatus(const Status& status);
// 404, code "model_not_found": "The model 'x' does not exist; this server serves 'y'".
ApiError UnknownModelError(const std::string& requested, const std::string& served);
// 400, code "context_length_exceeded", param `param` ("prompt" or
// "messages"), naming the maximum context and the requested prompt and
// completion token counts (all in tokens); param "max_tokens" instead when
// max_tokens alone reaches max_context while the prompt fits, with the
// largest max_tokens that would fit.
ApiError ContextLengthError(int64_t max_context, int64_t prompt_tokens, int64_t max_tokens,
                            const std::string& param);
// 429, type "rate_limit_error", code "queue_full", naming the queue limit.
ApiError QueueFullError(int64_t queue_limit);
// 400, code "prompt_too_long", param `param` ("prompt" or "messages"): the
// prompt's tokens over `limit` tokens, naming the config key `limit_key`.
ApiError PromptLimitError(int64_t limit, int64_t prompt_tokens, const std::string& param,
                          const std::string& limit_key);
// 413: a prompt (or a chat request's message contents) of `prompt_bytes`
// bytes of text, over server.max_prompt_bytes; checked before tokenizing.
// `param`: "prompt" or "messages". code "prompt_too_large".
ApiError PromptBytesError(int64_t limit, int64_t prompt_bytes, const std::string& param);
// 400, code "max_tokens_too_large", param "max_tokens": the request's
// max_tokens over `limit` tokens, naming the config key `limit_key`.
ApiError MaxTokensLimitError(int64_t limit, int64_t max_tokens, const std::string& limit_key);
// 429, type "rate_limit_error", code "too_many_streams": `limit` streams are
// open, naming the config key `limit_key`.
ApiError StreamLimitError(int64_t limit, const std::string& limit_key);
// 400, param "prompt", code "too_many_prompts": a request with more prompts
// than the queue holds (`limit_key` = scheduler.queue_limit) can never be
// admitted, so it is refused as a bad request, not as a retryable 429.
ApiError TooManyPromptsError(int64_t limit, int64_t prompts, const std::string& limit_key);
// 400, param `field` ("n" or "best_of"), code "too_many_choices": prompts x
// choices requests exceed the queue (`limit_key` = scheduler.queue_limit).
ApiError TooManyChoicesError(int64_t limit, int64_t prompts, int64_t choices,
                             const std::string& field, const std::string& limit_key);
// 400, code "empty_prompt", param `param` ("prompt" or "messages"): the
// prompt is empty once tokenized (an empty string), so there is nothing to
// continue from.
ApiError EmptyPromptError(const std::string& param);

// One prompt of a completion request: text to tokenize, or token ids.
struct Prompt {
  bool is_tokens = false;
  std::string text;                // when !is_tokens
  std::vector<int32_t> token_ids;  // when is_tokens; each >= 0
};

// Most logit_bias entries and stop_token_ids per request (they travel with
// every step of the sequence).
inline constexpr size_t kMaxLogitBiasEntries = 1024;
inline constexpr size_t kMaxStopTokenIds = 256;
// n and best_of at most (choices per prompt).
inline constexpr int64_t kMaxChoices = 128;

// Sampling and stopping fields shared by both endpoints.
struct GenerationFields {
  double temperature = 1.0;       // [0, 2]; 0 = greedy
  double top_p = 1.0;             // (0, 1]
  int32_t top_k = 0;              // >= 0; 0 = off (-1 is accepted as off)
  std::optional<uint64_t> seed;   // absent: the server picks one
  std::vector<std::string> stop;  // at most 4 non-empty strings
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage (only with stream)
  bool ignore_eos = false;     // keep generating past EOS (up to max_tokens)
  // Choices per prompt, 1..kMaxChoices; choice j samples with seed + j and
  // shares the prompt's KV blocks with choice 0 (GenerationRequest::
  // share_prompt_of).
  int32_t n = 1;
  // Logits processing (common/base/sampling_params.h; formulas in
  // kernels/logit_adjust_entry.h). OpenAI's two penalties, then vLLM's
  // extensions.
  double presence_penalty = 0.0;    // [-2, 2]
  double frequency_penalty = 0.0;   // [-2, 2]
  double repetition_penalty = 1.0;  // (0, 100]
  double min_p = 0.0;               // [0, 1]
  int32_t min_tokens = 0;           // [0, max_tokens]
  // {"token id": bias}: at most kMaxLogitBiasEntries, bias in [-100, 100].
  std::vector<std::pair<int32_t, float>> logit_bias;
  std::vector<int32_t> stop_token_ids;  // at most kMaxStopTokenIds
  // response_format (coordinator/api/response_format.h): the grammar the
  // output follows; kNone for text.
  GrammarSpec grammar;

  // The per-sequence sampling parameters; `default_seed` is used when the
  // request carries no seed.
  SamplingParams ToSamplingParams(uint64_t default_seed) const;
};

struct CompletionRequest {
  std::string model;
  std::vector<Prompt> prompts;      // one per requested prompt (>= 1); choice i answers prompt i
  int32_t max_tokens = 16;          // >= 1 (OpenAI's default is 16); 0 allowed with echo
  std::optional<int32_t> logprobs;  // 0..20: alternatives per token; absent = no logprobs
  // The prompt's text before the completion; with logprobs, every prompt
  // token's log-probability too (null for the first); streamed as the
  // choice's first chunk.
  bool echo = false;
  // vLLM's extension: the choice's "prompt_logprobs", 0..20 alternatives.
  std::optional<int32_t> prompt_logprobs;
  // Choices generated per prompt, n..kMaxChoices; the n with the highest
  // cumulative log-probability of their tokens are returned (not with stream
  // when above n).
  int32_t best_of = 1;
  GenerationFields gen;
};

struct ToolsRequest;  // coordinator/api/tool_calls.h

struct ChatCompletionRequest {
  std::string model;
  // >= 1; role system/user/assistant/tool ("developer" -> system, "function" -> tool); an
  // assistant's tool_calls and a tool message's tool_call_id in ChatMessage::extra.
  std::vector<ChatMessage> messages;
  // tools, tool_choice, parallel_tool_calls, functions, function_call; never null.
  std::shared_ptr<ToolsRequest> tools;
  std::optional<int32_t> max_tokens;  // max_completion_tokens, else max_tokens; absent = to context
  bool logprobs = false;
  int32_t top_logprobs = 0;  // 0..20; requires logprobs
  GenerationFields gen;
};

// Parse and validate a request body (JSON text). Errors: ApiError 400.
ApiResult<CompletionRequest> ParseCompletionRequest(std::string_view body);
ApiResult<ChatCompletionRequest> ParseChatCompletionRequest(std::string_view body);

// POST /tokenize, as vLLM serves it: {"prompt": text} or {"messages": [...]}
// (rendered with the chat template), "add_special_tokens" (default true
// for a prompt, the template's own for messages), "add_generation_prompt"
// (messages; default true); "model" optional.
struct TokenizeRequest {
  std::string model;  // empty: not given
  bool chat = false;
  std::string prompt;                 // when !chat
  std::vector<ChatMessage> messages;  // when chat
  std::optional<bool> add_special_tokens;
  bool add_generation_prompt = true;
};
// POST /detokenize: {"tokens": [ids]} ("model" optional).
struct DetokenizeRequest {
  std::string model;
  std::vector<int32_t> tokens;  // each in [0, 2^31)
};
// Errors: ApiError 400 naming the field (prompt and messages both or
// neither given, wrong types).
ApiResult<TokenizeRequest> ParseTokenizeRequest(std::string_view body);
ApiResult<DetokenizeRequest> ParseDetokenizeRequest(std::string_view body);

// ---- Responses ----

// OpenAI's finish_reason for the engine's (common/engine/engine.h): "stop" for EOS
// or a stop string, "length" for max_tokens.
const char* OpenAIFinishReason(FinishReason reason);

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;  // total_tokens is their sum
  // Prompt tokens served from the prefix cache (GenerationResult::
  // cached_tokens), as prompt_tokens_details.cached_tokens.
  int64_t cached_tokens = 0;
};

// One generated token with its log-probability (natural log, of the raw
// distribution log_softmax(logits) before temperature/top-k/top-p; see
// kernels/sampling.h) and the top alternatives, best first.
struct TokenLogprob {
  std::string token;  // the token's text
  float logprob = 0.0f;
  std::vector<std::pair<std::string, float>> top;  // (text, logprob)
  // false: the first prompt token of an echo (logprob and top are null).
  bool has_logprob = true;
};

struct CompletionChoice {
  int index = 0;
  std::string text;
  std::optional<FinishReason> finish_reason;          // null while streaming
  std::optional<std::vector<TokenLogprob>> logprobs;  // when the request asked for logprobs
  // text_offset of logprobs[0]: 0 for a whole choice; in a stream, the bytes
  // of the token texts of the choice's earlier chunks.
  int64_t logprobs_offset = 0;
  // vLLM's prompt_logprobs: one entry per prompt token, the first null
  // (nullopt); each maps token ids to (logprob, decoded text): the prompt
  // token, then its top alternatives.
  std::optional<std::vector<std::optional<std::vector<std::tuple<int32_t, float, std::string>>>>>
      prompt_logprobs;
};

// A tool call in a chat response (coordinator/api/tool_call_stream.h parses
// them from the output).
struct ToolCall {
  std::string id;         // "call_" + 24 hex digits (Mistral: 9 letters and digits)
  std::string name;       // the function's
  std::string arguments;  // JSON text of the arguments, as the model wrote them
};
// A streamed piece of tool call `index` of a choice: the first carries id and
// name (with the arguments so far), the later ones more argument text.
struct ToolCallDelta {
  int index = 0;
  std::optional<std::string> id;
  std::optional<std::string> name;
  std::string arguments;
};
// The tool side of one chat chunk.
struct ChatToolDeltas {
  std::vector<ToolCallDelta> calls;
  bool finish_as_calls = false;  // a stop finish_reason is written "tool_calls"
  bool legacy = false;           // the request used functions: delta.function_call
};

struct ChatChoice {
  int index = 0;
  std::string content;
  std::optional<FinishReason> finish_reason;
  std::optional<std::vector<TokenLogprob>> logprobs;
  // Calls parsed from the output: message.tool_calls, content null when
  // empty, a stop finish_reason written "tool_calls". With legacy (the
  // request used functions) the first is message.function_call and the
  // finish_reason "function_call".
  std::vector<ToolCall> tool_calls;
  bool legacy = false;
};

// A fresh id, "<prefix>-" and 24 random hex digits ("cmpl", "chatcmpl").
std::string NewResponseId(std::string_view prefix);
// Seconds since the Unix epoch, for "created".
int64_t UnixSeconds();

// POST /v1/completions, stream false: object "text_completion" with usage.
std::string CompletionResponseJson(const std::string& id, int64_t created, const std::string& model,
                                   const std::vector<CompletionChoice>& choices,
                                   const Usage& usage);
// One streamed completion chunk (object "text_completion"; `text` is the new
// text only). `usage` is written when given (the last chunk with
// include_usage); with include_usage the other chunks carry "usage": null.
std::string CompletionChunkJson(const std::string& id, int64_t created, const std::string& model,
                                const std::vector<CompletionChoice>& choices,
                                const std::optional<Usage>& usage, bool include_usage);

// POST /v1/chat/completions, stream false: object "chat.completion".
std::string ChatCompletionResponseJson(const std::string& id, int64_t created,
                                       const std::string& model,
                                       const std::vector<ChatChoice>& choices, const Usage& usage);
// One streamed chat chunk (object "chat.completion.chunk") for choice
// `index`: delta {"role":"assistant"} when `role` (the first chunk), plus
// {"content": ...} when `content` is given; finish_reason null until the
// last. `logprobs` covers the tokens of this delta. `tools`: the delta's
// tool_calls ([{index, id, type, function: {name, arguments}}]).
std::string ChatCompletionChunkJson(const std::string& id, int64_t created,
                                    const std::string& model, int index, bool role,
                                    const std::optional<std::string>& content,
                                    std::optional<FinishReason> finish_reason,
                                    const std::optional<std::vector<TokenLogprob>>& logprobs,
                                    bool include_usage, const ChatToolDeltas* tools = nullptr);
// The final chunk of a chat stream with include_usage: "choices": [] and usage.
std::string ChatCompletionUsageChunkJson(const std::string& id, int64_t created,
                                         const std::string& model, const Usage& usage);

// POST /tokenize's answer (vLLM's shape): {"count", "max_model_len", "tokens"}.
std::string TokenizeResponseJson(const std::vector<int32_t>& tokens, int64_t max_model_len);
// POST /detokenize's answer: {"prompt": text}.
std::string DetokenizeResponseJson(const std::string& text);

// The data of the last event of every stream: "data: [DONE]".
inline constexpr std::string_view kSseDone = "[DONE]";

struct ModelCard {
  std::string id;
  int64_t created = 0;  // Unix seconds: when the coordinator started serving it
  std::string owned_by = "tessera";
  int64_t max_model_len = 0;  // prompt + completion tokens at most (vLLM's field)
};
// GET /v1/models: {"object":"list","data":[{"id","object":"model","created","owned_by",
// "root","parent":null,"max_model_len"}]}.
std::string ModelListJson(const std::vector<ModelCard>& models);

}  // namespace tessera
