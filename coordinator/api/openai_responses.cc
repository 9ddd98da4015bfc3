// The JSON of the responses Tessera sends on /v1/* (coordinator/api/openai_api.h).
#include <fmt/format.h>

#include <chrono>
#include <iterator>
#include <nlohmann/json.hpp>
#include <random>

#include "coordinator/api/openai_api.h"

namespace tessera {
namespace {

using json = nlohmann::json;

// `s` with each invalid UTF-8 sequence replaced by U+FFFD, as Dump() does for
// values. Used for object keys (two invalid keys must not collide only after
// the replacement).
std::string ValidUtf8(const std::string& s) {
  const std::string quoted = json(s).dump(-1, ' ', false, json::error_handler_t::replace);
  return json::parse(quoted).get<std::string>();
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
    offsets.push_back(offset);
    offset += static_cast<int64_t>(t.token.size());
    if (!t.has_logprob) {  // the first token of an echoed prompt
      token_logprobs.push_back(nullptr);
      top.push_back(nullptr);
      continue;
    }
    token_logprobs.push_back(t.logprob);
    json alternatives = json::object();
    for (const auto& [text, logprob] : t.top) {
      const std::string key = ValidUtf8(text);
      if (!alternatives.contains(key)) alternatives[key] = logprob;
    }
    top.push_back(std::move(alternatives));
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

json ToolCallsJson(const std::vector<ToolCall>& calls) {
  json out = json::array();
  for (const ToolCall& c : calls)
    out.push_back({{"id", c.id},
                   {"type", "function"},
                   {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
  return out;
}

// delta.tool_calls: the first piece of a call carries id, type and name.
json ToolCallDeltasJson(const std::vector<ToolCallDelta>& calls) {
  json out = json::array();
  for (const ToolCallDelta& d : calls) {
    json one = {{"index", d.index}};
    if (d.id) one["id"] = *d.id;
    if (d.id) one["type"] = "function";
    one["function"] = {{"arguments", d.arguments}};
    if (d.name) one["function"]["name"] = *d.name;
    out.push_back(std::move(one));
  }
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

// vLLM's prompt_logprobs of a completion choice: per prompt token null (the
// first) or {token id: {logprob, decoded_token}}.
json PromptLogprobsJson(const CompletionChoice& c) {
  json entries = json::array();
  for (const auto& e : *c.prompt_logprobs) {
    if (!e) {
      entries.push_back(nullptr);
      continue;
    }
    json m = json::object();
    for (const auto& [token, logprob, text] : *e) {
      const std::string key = std::to_string(token);
      if (!m.contains(key)) m[key] = {{"logprob", logprob}, {"decoded_token", text}};
    }
    entries.push_back(std::move(m));
  }
  return entries;
}

// Appends `s` as a JSON string, exactly as Dump writes it.
void AppendString(std::string& out, const std::string& s) { out += Dump(json(s)); }

void AppendUsage(std::string& out, const Usage& u) {
  fmt::format_to(std::back_inserter(out),
                 R"({{"completion_tokens":{},"prompt_tokens":{},)"
                 R"("prompt_tokens_details":{{"cached_tokens":{}}},"total_tokens":{}}})",
                 u.completion_tokens, u.prompt_tokens, u.cached_tokens,
                 u.prompt_tokens + u.completion_tokens);
}

// A text_completion object (a whole response, or a stream's chunk), written
// as Dump writes the object (keys in order, compact) without building one:
// it is sent once per response and per streamed token. Only log-probabilities
// go through a json value. `usage` absent: "usage" is null with
// `null_usage`, else left out.
std::string CompletionJson(const std::string& id, int64_t created, const std::string& model,
                           const std::vector<CompletionChoice>& choices,
                           const std::optional<Usage>& usage, bool null_usage) {
  std::string out = R"({"choices":[)";
  for (size_t i = 0; i < choices.size(); ++i) {
    const CompletionChoice& c = choices[i];
    if (i > 0) out += ',';
    out += R"({"finish_reason":)";
    out += c.finish_reason ? fmt::format(R"("{}")", OpenAIFinishReason(*c.finish_reason)) : "null";
    fmt::format_to(std::back_inserter(out), R"(,"index":{},"logprobs":)", c.index);
    out += c.logprobs ? Dump(CompletionLogprobsJson(c.logprobs, c.logprobs_offset)) : "null";
    if (c.prompt_logprobs) {
      out += R"(,"prompt_logprobs":)";
      out += Dump(PromptLogprobsJson(c));
    }
    out += R"(,"text":)";
    AppendString(out, c.text);
    out += '}';
  }
  fmt::format_to(std::back_inserter(out), R"(],"created":{},"id":)", created);
  AppendString(out, id);
  out += R"(,"model":)";
  AppendString(out, model);
  out += R"(,"object":"text_completion")";
  if (usage) {
    out += R"(,"usage":)";
    AppendUsage(out, *usage);
  } else if (null_usage) {
    out += R"(,"usage":null)";
  }
  out += '}';
  return out;
}

}  // namespace

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
  return CompletionJson(id, created, model, choices, usage, false);
}

std::string CompletionChunkJson(const std::string& id, int64_t created, const std::string& model,
                                const std::vector<CompletionChoice>& choices,
                                const std::optional<Usage>& usage, bool include_usage) {
  return CompletionJson(id, created, model, choices, usage, include_usage);
}

std::string ChatCompletionResponseJson(const std::string& id, int64_t created,
                                       const std::string& model,
                                       const std::vector<ChatChoice>& choices, const Usage& usage) {
  json out_choices = json::array();
  for (const ChatChoice& c : choices) {
    json message = {{"role", "assistant"}, {"content", c.content}};
    json finish = FinishJson(c.finish_reason);
    if (!c.tool_calls.empty()) {
      if (c.content.empty()) message["content"] = nullptr;
      if (c.legacy) {
        message["function_call"] = {{"name", c.tool_calls[0].name},
                                    {"arguments", c.tool_calls[0].arguments}};
      } else {
        message["tool_calls"] = ToolCallsJson(c.tool_calls);
      }
      if (finish == "stop") finish = c.legacy ? "function_call" : "tool_calls";
    }
    out_choices.push_back({{"index", c.index},
                           {"message", message},
                           {"logprobs", ChatLogprobsJson(c.logprobs)},
                           {"finish_reason", finish}});
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
                                    bool include_usage, const ChatToolDeltas* tools) {
  json delta = json::object();
  if (role) delta["role"] = "assistant";
  if (content) delta["content"] = *content;
  json finish = FinishJson(finish_reason);
  if (tools) {
    if (tools->legacy && !tools->calls.empty()) {
      const ToolCallDelta& d = tools->calls[0];
      delta["function_call"] = {{"arguments", d.arguments}};
      if (d.name) delta["function_call"]["name"] = *d.name;
    } else if (!tools->calls.empty()) {
      delta["tool_calls"] = ToolCallDeltasJson(tools->calls);
    }
    if (tools->finish_as_calls && finish == "stop")
      finish = tools->legacy ? "function_call" : "tool_calls";
  }
  json out = {{"id", id},
              {"object", "chat.completion.chunk"},
              {"created", created},
              {"model", model},
              {"choices", json::array({{{"index", index},
                                        {"delta", delta},
                                        {"logprobs", ChatLogprobsJson(logprobs)},
                                        {"finish_reason", finish}}})}};
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
    data.push_back({{"id", m.id},
                    {"object", "model"},
                    {"created", m.created},
                    {"owned_by", m.owned_by},
                    {"root", m.id},
                    {"parent", nullptr},
                    {"max_model_len", m.max_model_len}});
  }
  return Dump({{"object", "list"}, {"data", data}});
}

std::string TokenizeResponseJson(const std::vector<int32_t>& tokens, int64_t max_model_len) {
  return Dump({{"count", tokens.size()},
               {"max_model_len", max_model_len},
               {"tokens", tokens},
               {"token_strs", nullptr}});
}

std::string DetokenizeResponseJson(const std::string& text) { return Dump({{"prompt", text}}); }

}  // namespace tessera
