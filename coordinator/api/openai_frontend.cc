#include "coordinator/api/openai_frontend.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <numeric>
#include <thread>
#include <vector>

#include "coordinator/api/openai_api.h"
#include "coordinator/api/token_texts.h"
#include "coordinator/api/tool_call_grammar.h"
#include "coordinator/api/tool_call_stream.h"

namespace tessera {

using nlohmann::json;

namespace {

// A streamed choice: whether its first chunk went out, the logprobs of
// tokens whose text has not been sent yet, and the text_offset of the next
// token (bytes of the choice's earlier token texts).
struct ChoiceStream {
  bool first = true;
  bool echoed = false;  // echo: the prompt's chunk went out
  std::vector<TokenLogprob> pending;
  int64_t offset = 0;
  // Completions: each token's text as emitted (coordinator/api/token_texts.h).
  std::shared_ptr<TokenTextStream> texts;
  // Chat with tools parsed: the output turned into content and tool-call deltas.
  std::shared_ptr<ToolCallStream> tools;
};

// The API's view of one sampled token: the texts of it and of its
// alternatives are single-token decodes, special tokens included (a token
// holding part of a UTF-8 character reads as U+FFFD).
TokenLogprob ApiLogprob(const SampledToken& t, const Tokenizer& tokenizer) {
  TokenLogprob out;
  out.token = tokenizer.Decode(&t.token_id, 1, false);
  out.logprob = t.logprob;
  for (const TopLogprob& top : t.top)
    out.top.emplace_back(tokenizer.Decode(&top.token_id, 1, false), top.logprob);
  return out;
}

// The logprobs of a finished choice, when the request asked for them. For
// completions (`offsets`: text_offset indexes the text) each token's text is
// the incremental text it emitted (token_texts.h).
std::optional<std::vector<TokenLogprob>> ResultLogprobs(const GenerationResult& r, bool asked,
                                                        const Tokenizer& tokenizer,
                                                        bool offsets = false) {
  if (!asked) return std::nullopt;
  std::vector<std::string> texts;
  if (offsets) texts = IncrementalTokenTexts(tokenizer, r.tokens, r.text);
  std::vector<TokenLogprob> out;
  for (size_t i = 0; i < r.logprobs.size(); ++i) {
    if (!r.logprobs[i].has_logprobs) continue;
    out.push_back(ApiLogprob(r.logprobs[i], tokenizer));
    if (offsets && i < texts.size()) out.back().token = texts[i];
  }
  return out;
}

// echo: the prompt's text, token by token as the incremental detokenizer
// emits it (so text_offset indexes the echoed text), and with logprobs each
// prompt token's entry: null for the first, then its log-probability given
// the tokens before it (GenerationResult::prompt_logprobs) and alternatives.
std::string EchoPrompt(const std::vector<int32_t>& prompt, const GenerationResult& r,
                       const Tokenizer& tokenizer, std::vector<TokenLogprob>* logprobs) {
  TokenTextStream stream(tokenizer);
  std::vector<std::string> texts;
  for (int32_t id : prompt) texts.push_back(stream.Push(id));
  if (!texts.empty()) texts.back() += stream.Flush();
  std::string text;
  for (size_t i = 0; i < texts.size(); ++i) {
    text += texts[i];
    if (!logprobs) continue;
    TokenLogprob t;
    t.has_logprob = i > 0 && i - 1 < r.prompt_logprobs.size();
    if (t.has_logprob) t = ApiLogprob(r.prompt_logprobs[i - 1], tokenizer);
    t.token = texts[i];
    logprobs->push_back(std::move(t));
  }
  return text;
}

// vLLM's prompt_logprobs of one choice: null, then per prompt token the
// token and its alternatives (id, logprob, text).
std::vector<std::optional<std::vector<std::tuple<int32_t, float, std::string>>>> PromptLogprobs(
    const GenerationResult& r, const Tokenizer& tokenizer) {
  std::vector<std::optional<std::vector<std::tuple<int32_t, float, std::string>>>> out;
  out.emplace_back(std::nullopt);
  for (const SampledToken& p : r.prompt_logprobs) {
    std::vector<std::tuple<int32_t, float, std::string>> e;
    e.emplace_back(p.token_id, p.logprob, tokenizer.Decode(&p.token_id, 1, false));
    for (const TopLogprob& t : p.top)
      e.emplace_back(t.token_id, t.logprob, tokenizer.Decode(&t.token_id, 1, false));
    out.emplace_back(std::move(e));
  }
  return out;
}

// `count` choices of one prompt: choice j samples with seed + j and shares
// the prompt's KV blocks with choice 0 (GenerationRequest::share_prompt_of).
// With `rank` (best_of above n) each choice returns its tokens'
// log-probabilities, which rank it.
void AddChoices(std::vector<GenerationRequest>& gens, const GenerationRequest& g, int count,
                bool rank) {
  const int32_t first = static_cast<int32_t>(gens.size());
  for (int j = 0; j < count; ++j) {
    GenerationRequest c = g;
    c.sampling.seed = g.sampling.seed + static_cast<uint64_t>(j);
    if (j > 0) c.share_prompt_of = first;
    if (rank) c.sampling.logprobs = std::max(c.sampling.logprobs, 0);
    gens.push_back(std::move(c));
  }
}

// The state one HTTP request shares with the scheduler callbacks of its
// prompts (run on the scheduler thread).
struct Exchange {
  std::shared_ptr<Responder> res;
  bool chat = false;
  bool stream = false;
  bool include_usage = false;
  std::string id;
  int64_t created = 0;
  std::string model;
  bool logprobs = false;                      // the request asked for log-probabilities
  bool echo = false;                          // completions: the prompt before the completion
  bool prompt_logprobs = false;               // completions: vLLM's prompt_logprobs field
  std::vector<std::vector<int32_t>> prompts;  // completions with echo: each choice's prompt
  int n = 1;                                  // choices returned per prompt
  int best_of = 1;  // choices generated per prompt (results[p * best_of + j])
  std::optional<ToolCallFormat> tool_format;  // chat: parse the output into tool calls
  bool tools_legacy = false;                  // ... answered as function_call
  const Tokenizer* tokenizer = nullptr;       // for token texts
  std::mutex mu;
  std::vector<GenerationResult> results;  // protected by mu
  std::vector<ChoiceStream> streams;      // protected by mu; one per choice when streaming
  int remaining = 0;                      // protected by mu
  Usage usage;                            // protected by mu
  bool failed = false;                    // protected by mu
  Gauge* depth = nullptr;                 // tessera_scheduler_queue_depth, while accepted
  // The daemon's count of open streams, when this exchange holds one of its
  // slots (server.max_streams); given back when the exchange ends.
  std::atomic<int>* stream_slot = nullptr;

  ~Exchange() {
    if (depth) depth->Add(-1);
    if (stream_slot) stream_slot->fetch_sub(1);
  }
};

// Ends the exchange's stream, however it ended (completed or failed). Its
// server.max_streams slot is given back first, before the end reaches the
// client: a client that reads the end and sends its next stream on the same
// connection must find the slot free (with max_streams = 1 it got a 429).
// The destructor gives the slot back when the exchange ends any other way.
// Under x.mu.
void FinishStream(Exchange& x) {
  if (x.stream_slot) x.stream_slot->fetch_sub(1);
  x.stream_slot = nullptr;
  x.res->Finish();
}

// Sum of the log-probabilities of a choice's tokens (best_of ranks by it).
double CumulativeLogprob(const GenerationResult& r) {
  double sum = 0.0;
  for (const SampledToken& t : r.logprobs)
    if (t.has_logprobs) sum += t.logprob;
  return sum;
}

// The results returned, in choice order: per prompt, the n of its best_of
// with the highest cumulative log-probability (all of them when equal).
std::vector<size_t> ChosenResults(const Exchange& x) {
  std::vector<size_t> out;
  const size_t per = static_cast<size_t>(x.best_of);
  for (size_t p = 0; p * per < x.results.size(); ++p) {
    std::vector<size_t> c(per);
    std::iota(c.begin(), c.end(), p * per);
    if (x.best_of > x.n)
      std::stable_sort(c.begin(), c.end(), [&](size_t a, size_t b) {
        return CumulativeLogprob(x.results[a]) > CumulativeLogprob(x.results[b]);
      });
    out.insert(out.end(), c.begin(), c.begin() + x.n);
  }
  return out;
}

// A streamed echo: the prompt's text (and with logprobs its tokens' entries)
// as the choice's first chunk, once; `prompt` holds the prompt's
// log-probabilities when they were asked for. Under x.mu.
void SendEcho(Exchange& x, int index, const std::vector<SampledToken>* prompt) {
  ChoiceStream& st = x.streams[static_cast<size_t>(index)];
  if (!x.echo || st.echoed) return;
  st.echoed = true;
  GenerationResult r;
  if (prompt) r.prompt_logprobs = *prompt;
  std::vector<TokenLogprob> entries;
  CompletionChoice c;
  c.index = index;
  c.text = EchoPrompt(x.prompts[static_cast<size_t>(index)], r, *x.tokenizer,
                      x.logprobs ? &entries : nullptr);
  if (x.logprobs) c.logprobs = entries;
  c.logprobs_offset = st.offset;
  x.res->SendEvent(
      CompletionChunkJson(x.id, x.created, x.model, {c}, std::nullopt, x.include_usage));
  for (const TokenLogprob& t : entries) st.offset += static_cast<int64_t>(t.token.size());
}

// The end of a streamed chat choice whose output is parsed for tool calls:
// what the whole-output parse adds to what was sent (text held back as a
// possible call that was none), then the finish chunk ("tool_calls" once a
// call went out). Under x.mu.
void SendToolCallsEnd(Exchange& x, int index, FinishReason finish,
                      std::optional<std::vector<TokenLogprob>> logprobs) {
  ChoiceStream& st = x.streams[static_cast<size_t>(index)];
  if (!st.tools) st.tools = std::make_shared<ToolCallStream>(*x.tool_format);
  ToolCallStream::Update rest = st.tools->Finish();
  if (!rest.empty()) {
    ChatToolDeltas deltas{std::move(rest.calls), false, x.tools_legacy};
    x.res->SendEvent(ChatCompletionChunkJson(
        x.id, x.created, x.model, index, st.first,
        rest.content.empty() ? std::nullopt : std::optional<std::string>(rest.content),
        std::nullopt, std::nullopt, x.include_usage, &deltas));
    st.first = false;
  }
  ChatToolDeltas end{{}, st.tools->called(), x.tools_legacy};
  x.res->SendEvent(ChatCompletionChunkJson(x.id, x.created, x.model, index, st.first, std::nullopt,
                                           finish, logprobs, x.include_usage, &end));
}

void SendFinal(Exchange& x) {
  if (x.failed) return;
  if (x.stream) {
    if (x.include_usage && x.chat)
      x.res->SendEvent(ChatCompletionUsageChunkJson(x.id, x.created, x.model, x.usage));
    if (x.include_usage && !x.chat)
      x.res->SendEvent(CompletionChunkJson(x.id, x.created, x.model, {}, x.usage, true));
    x.res->SendEvent(kSseDone);
    FinishStream(x);
    return;
  }
  const std::vector<size_t> chosen = ChosenResults(x);
  if (x.chat) {
    std::vector<ChatChoice> choices;
    for (size_t k = 0; k < chosen.size(); ++k) {
      const GenerationResult& r = x.results[chosen[k]];
      ChatChoice c;
      c.index = static_cast<int>(k);
      c.content = r.text;
      if (x.tool_format) {
        ToolCallOutput out = ParseToolCallOutput(*x.tool_format, r.text);
        c.content = std::move(out.content);
        c.tool_calls = std::move(out.calls);
        c.legacy = x.tools_legacy;
      }
      c.finish_reason = r.finish_reason;
      c.logprobs = ResultLogprobs(r, x.logprobs, *x.tokenizer);
      choices.push_back(c);
    }
    x.res->SendJson(200, ChatCompletionResponseJson(x.id, x.created, x.model, choices, x.usage));
  } else {
    std::vector<CompletionChoice> choices;
    for (size_t k = 0; k < chosen.size(); ++k) {
      const size_t i = chosen[k];
      CompletionChoice c;
      c.index = static_cast<int>(k);
      const GenerationResult& r = x.results[i];
      c.finish_reason = r.finish_reason;
      c.logprobs = ResultLogprobs(r, x.logprobs, *x.tokenizer, true);
      c.text = r.text;
      if (x.echo) {
        std::vector<TokenLogprob> echoed;
        c.text = EchoPrompt(x.prompts[i], r, *x.tokenizer, x.logprobs ? &echoed : nullptr) + r.text;
        if (c.logprobs) c.logprobs->insert(c.logprobs->begin(), echoed.begin(), echoed.end());
      }
      if (x.prompt_logprobs) c.prompt_logprobs = PromptLogprobs(r, *x.tokenizer);
      choices.push_back(c);
    }
    x.res->SendJson(200, CompletionResponseJson(x.id, x.created, x.model, choices, x.usage));
  }
}

}  // namespace

void OpenAIFrontend::HandleCompletions(const HttpRequest& req, std::shared_ptr<Responder> res,
                                       bool chat) {
  const auto arrival = std::chrono::steady_clock::now();
  if (!status_->ready()) {
    res->SendError(503, "no plan is loaded and serving yet; see /readyz", std::nullopt,
                   "not_ready");
    return;
  }
  auto x = std::make_shared<Exchange>();
  x->res = res;
  x->chat = chat;
  x->created = UnixSeconds();
  x->model = model_name_;
  x->tokenizer = tokenizer_;
  std::vector<GenerationRequest> gens;
  std::string requested_model;
  if (chat) {
    auto parsed = ParseChatCompletionRequest(req.body);
    if (!parsed.ok()) {
      const ApiError& e = parsed.error();
      res->Send(e.http_status, "application/json", e.ToJson());
      return;
    }
    const ChatCompletionRequest& r = parsed.value();
    requested_model = r.model;
    if (!chat_template_) {
      res->SendError(
          400,
          "the model has no chat template; set model.chat_template (chatml, llama3, llama2) in "
          "the config",
          std::string("messages"), "unknown_chat_template");
      return;
    }
    int64_t content_bytes = 0;
    for (const ChatMessage& m : r.messages) content_bytes += static_cast<int64_t>(m.content.size());
    if (content_bytes > config_.server.max_prompt_bytes) {
      metrics_->Rejected();
      const ApiError e =
          PromptBytesError(config_.server.max_prompt_bytes, content_bytes, "messages");
      res->Send(e.http_status, "application/json", e.ToJson());
      return;
    }
    const ToolsRequest& tools = *r.tools;
    ToolCallPlan plan;
    if (auto e = PlanToolCalls(tools, *chat_template_, *tokenizer_, grammar_check_, model_name_,
                               &plan)) {
      res->Send(e->http_status, "application/json", e->ToJson());
      return;
    }
    GenerationFields gen = r.gen;
    gen.grammar = plan.grammar.active() ? plan.grammar : gen.grammar;
    if (plan.grammar.active() && (gen.ignore_eos || gen.min_tokens > 0)) {
      // The enforced call's grammar decides where the output ends.
      const char* field = gen.ignore_eos ? "ignore_eos" : "min_tokens";
      res->SendError(400,
                     fmt::format("{} cannot be combined with tool_choice required or a named "
                                 "function: the call's grammar decides where the output ends",
                                 field),
                     std::string(field), std::nullopt);
      return;
    }
    auto text = chat_template_->Render(r.messages, true,
                                       tools.functions.empty() ? nullptr : &tools.tools_json);
    if (!text.ok()) {
      res->SendError(400, text.status().message(), std::string("messages"), "chat_template_error");
      return;
    }
    const int64_t max_completion = config_.scheduler.max_completion_tokens;
    if (r.max_tokens && max_completion > 0 && *r.max_tokens > max_completion) {
      const ApiError e =
          MaxTokensLimitError(max_completion, *r.max_tokens, "scheduler.max_completion_tokens");
      res->Send(e.http_status, "application/json", e.ToJson());
      return;
    }
    GenerationRequest g;
    g.prompt_ids = tokenizer_->Encode(*text, chat_template_->add_special_tokens());
    int64_t room = std::max<int64_t>(max_context_ - static_cast<int64_t>(g.prompt_ids.size()), 0);
    if (max_completion > 0) room = std::min(room, max_completion);
    g.max_tokens = r.max_tokens ? *r.max_tokens : static_cast<int32_t>(room);
    g.sampling = gen.ToSamplingParams(static_cast<uint64_t>(x->created));
    g.sampling.logprobs = r.logprobs ? r.top_logprobs : -1;
    g.stop = r.gen.stop;
    g.ignore_eos = r.gen.ignore_eos;
    AddChoices(gens, g, r.gen.n, false);
    x->n = x->best_of = r.gen.n;
    x->stream = r.gen.stream;
    x->include_usage = r.gen.include_usage;
    x->logprobs = r.logprobs;
    x->tool_format = plan.format;
    x->tools_legacy = tools.legacy;
    x->id = NewResponseId("chatcmpl");
  } else {
    auto parsed = ParseCompletionRequest(req.body);
    if (!parsed.ok()) {
      const ApiError& e = parsed.error();
      res->Send(e.http_status, "application/json", e.ToJson());
      return;
    }
    const CompletionRequest& r = parsed.value();
    requested_model = r.model;
    const int64_t max_completion = config_.scheduler.max_completion_tokens;
    if (max_completion > 0 && r.max_tokens > max_completion) {
      const ApiError e =
          MaxTokensLimitError(max_completion, r.max_tokens, "scheduler.max_completion_tokens");
      res->Send(e.http_status, "application/json", e.ToJson());
      return;
    }
    for (const Prompt& p : r.prompts) {
      if (!p.is_tokens && static_cast<int64_t>(p.text.size()) > config_.server.max_prompt_bytes) {
        metrics_->Rejected();
        const ApiError e = PromptBytesError(config_.server.max_prompt_bytes,
                                            static_cast<int64_t>(p.text.size()), "prompt");
        res->Send(e.http_status, "application/json", e.ToJson());
        return;
      }
    }
    for (const Prompt& p : r.prompts) {
      GenerationRequest g;
      g.prompt_ids = p.is_tokens ? p.token_ids : tokenizer_->Encode(p.text, true);
      g.max_tokens = r.max_tokens;
      g.sampling = r.gen.ToSamplingParams(static_cast<uint64_t>(x->created));
      g.sampling.logprobs = r.logprobs.value_or(-1);
      // echo with logprobs and vLLM's prompt_logprobs both need the prompt's.
      g.sampling.prompt_logprobs =
          std::max(r.echo && r.logprobs ? *r.logprobs : -1, r.prompt_logprobs.value_or(-1));
      g.stop = r.gen.stop;
      g.ignore_eos = r.gen.ignore_eos;
      for (int j = 0; j < r.best_of && r.echo; ++j) x->prompts.push_back(g.prompt_ids);
      AddChoices(gens, g, r.best_of, r.best_of > r.gen.n);
    }
    x->n = r.gen.n;
    x->best_of = r.best_of;
    x->stream = r.gen.stream;
    x->include_usage = r.gen.include_usage;
    x->logprobs = r.logprobs.has_value();
    x->echo = r.echo;
    x->prompt_logprobs = r.prompt_logprobs.has_value();
    x->id = NewResponseId("cmpl");
  }
  if (!requested_model.empty() && requested_model != model_name_) {
    const ApiError e = UnknownModelError(requested_model, model_name_);
    res->Send(e.http_status, "application/json", e.ToJson());
    return;
  }
  // Every choice and prompt carries the request's one grammar (a tool-call
  // grammar was compiled by PlanToolCalls).
  if (!gens.empty() && gens[0].sampling.grammar.kind != GrammarKind::kLark) {
    if (auto e = grammar_check_.Check(gens[0].sampling.grammar)) {
      res->Send(e->http_status, "application/json", e->ToJson());
      return;
    }
  }
  if (static_cast<int64_t>(gens.size()) > config_.scheduler.queue_limit) {
    metrics_->Rejected();
    const int64_t prompts = static_cast<int64_t>(gens.size()) / x->best_of;
    const ApiError e =
        x->best_of == 1
            ? TooManyPromptsError(config_.scheduler.queue_limit, prompts, "scheduler.queue_limit")
            : TooManyChoicesError(config_.scheduler.queue_limit, prompts, x->best_of,
                                  x->best_of > x->n ? "best_of" : "n", "scheduler.queue_limit");
    res->Send(e.http_status, "application/json", e.ToJson());
    return;
  }
  for (const GenerationRequest& g : gens) {
    if (g.prompt_ids.empty()) {
      metrics_->Rejected();
      const ApiError e = EmptyPromptError(chat ? "messages" : "prompt");
      res->Send(e.http_status, "application/json", e.ToJson());
      return;
    }
    const int64_t prompt_limit = config_.scheduler.max_prompt_tokens;
    if (prompt_limit > 0 && static_cast<int64_t>(g.prompt_ids.size()) > prompt_limit) {
      const ApiError e =
          PromptLimitError(prompt_limit, static_cast<int64_t>(g.prompt_ids.size()),
                           chat ? "messages" : "prompt", "scheduler.max_prompt_tokens");
      metrics_->Rejected();
      res->Send(e.http_status, "application/json", e.ToJson());
      return;
    }
    const int64_t total = static_cast<int64_t>(g.prompt_ids.size()) + g.max_tokens;
    if (total > max_context_) {
      metrics_->Rejected();
      const ApiError e = ContextLengthError(max_context_, static_cast<int64_t>(g.prompt_ids.size()),
                                            g.max_tokens, chat ? "messages" : "prompt");
      res->Send(e.http_status, "application/json", e.ToJson());
      return;
    }
  }
  if (x->stream) {
    if (open_streams_.fetch_add(1) >= config_.server.max_streams) {
      open_streams_.fetch_sub(1);
      metrics_->Rejected();
      const ApiError e = StreamLimitError(config_.server.max_streams, "server.max_streams");
      res->Send(e.http_status, "application/json", e.ToJson());
      return;
    }
    x->stream_slot = &open_streams_;
  }
  x->depth = &metrics_->queue_depth();
  x->depth->Add(1);
  x->results.resize(gens.size());
  x->streams.resize(gens.size());
  x->remaining = static_cast<int>(gens.size());
  // Admission happens before the response starts, so a full queue is a real
  // HTTP 429 even for streamed requests. The callbacks lock x->mu, so none
  // emits before the stream has started (or after the request was refused).
  std::unique_lock<std::mutex> admit(x->mu);
  std::vector<RequestCallbacks> callbacks;
  for (size_t i = 0; i < gens.size(); ++i) {
    RequestCallbacks cb;
    const int index = static_cast<int>(i);
    if (x->stream) {
      // A chunk goes out with new text and carries the logprobs of every
      // token since the previous chunk (text held back for a partial
      // character or a stop-string prefix delays its tokens' logprobs).
      cb.on_token = [x, index](const std::string& text, int32_t token, const SampledToken* lp) {
        std::lock_guard<std::mutex> lock(x->mu);
        if (x->failed) return;
        SendEcho(*x, index, nullptr);  // echo without logprobs: before the first token
        ChoiceStream& st = x->streams[static_cast<size_t>(index)];
        if (lp && lp->has_logprobs) {
          st.pending.push_back(ApiLogprob(*lp, *x->tokenizer));
          if (!x->chat) {  // text_offset must index the text (token_texts.h)
            if (!st.texts) st.texts = std::make_shared<TokenTextStream>(*x->tokenizer);
            st.pending.back().token = st.texts->Push(token);
          }
        } else if (token < 0 && st.texts && !st.pending.empty()) {
          st.pending.back().token += st.texts->Flush();  // held back to the end
        }
        if (text.empty()) return;
        std::optional<ToolCallStream::Update> tools;
        if (x->tool_format) {
          if (!st.tools) st.tools = std::make_shared<ToolCallStream>(*x->tool_format);
          tools = st.tools->Push(text);
          if (tools->empty()) return;  // held back: the tokens' logprobs wait too
        }
        std::optional<std::vector<TokenLogprob>> logprobs;
        if (x->logprobs) logprobs = std::move(st.pending);
        st.pending.clear();
        if (tools) {
          ChatToolDeltas deltas{std::move(tools->calls), false, x->tools_legacy};
          x->res->SendEvent(ChatCompletionChunkJson(
              x->id, x->created, x->model, index, st.first,
              tools->content.empty() ? std::nullopt : std::optional<std::string>(tools->content),
              std::nullopt, logprobs, x->include_usage, &deltas));
        } else if (x->chat) {
          x->res->SendEvent(ChatCompletionChunkJson(x->id, x->created, x->model, index, st.first,
                                                    text, std::nullopt, logprobs,
                                                    x->include_usage));
        } else {
          CompletionChoice c;
          c.index = index;
          c.text = text;
          c.logprobs = logprobs;
          c.logprobs_offset = st.offset;
          x->res->SendEvent(CompletionChunkJson(x->id, x->created, x->model, {c}, std::nullopt,
                                                x->include_usage));
        }
        if (logprobs)
          for (const TokenLogprob& t : *logprobs) st.offset += static_cast<int64_t>(t.token.size());
        st.first = false;
      };
    }
    if (x->stream && x->echo) {
      cb.on_prompt_logprobs = [x, index](const std::vector<SampledToken>& prompt) {
        std::lock_guard<std::mutex> lock(x->mu);
        if (!x->failed) SendEcho(*x, index, &prompt);
      };
    }
    cb.on_finish = [x, index](const GenerationResult& r) {
      // A stream's end is several events at once (the finish chunk, then
      // with the last choice the usage chunk, [DONE] and the end): one
      // flush and one write carry them all.
      std::optional<Responder::EventHold> hold;
      if (x->stream) hold.emplace(x->res->HoldEvents());
      std::lock_guard<std::mutex> lock(x->mu);
      if (x->failed && r.finish_reason != FinishReason::kError) return;  // refused at admission
      x->results[static_cast<size_t>(index)] = r;
      // The prompt counts once per prompt, not once per choice (n, best_of),
      // as OpenAI and vLLM report usage.
      if (index % x->best_of == 0) {
        x->usage.prompt_tokens += r.prompt_tokens;
        x->usage.cached_tokens += r.cached_tokens;
      }
      x->usage.completion_tokens += static_cast<int64_t>(r.tokens.size());
      if (r.finish_reason == FinishReason::kError) {
        if (!x->failed) {
          x->failed = true;
          // kDataLoss: the model itself produced NaN/inf logits (a server
          // error, 500); anything else is a worker or transport failure.
          const bool nonfinite = r.error.code() == StatusCode::kDataLoss;
          const bool stopping = r.error.message() == kShuttingDownMessage;
          const int http = nonfinite ? 500 : 503;
          const std::string err = ErrorJson("generation failed: " + r.error.message(),
                                            DefaultErrorType(http), std::nullopt,
                                            std::string(nonfinite  ? "internal_error"
                                                        : stopping ? "shutting_down"
                                                                   : "worker_failed"));
          if (x->stream) {
            x->res->SendEvent(err);
            x->res->SendEvent(kSseDone);  // the stream still ends as streams do
            FinishStream(*x);
          } else {
            x->res->Send(http, "application/json", err);
          }
        }
      } else if (x->stream) {
        SendEcho(*x, index, nullptr);  // max_tokens 0
        // Tokens whose text never went out (EOS, a stop string's last
        // token) have their logprobs in the finish chunk.
        ChoiceStream& st = x->streams[static_cast<size_t>(index)];
        std::optional<std::vector<TokenLogprob>> logprobs;
        if (x->logprobs && !st.pending.empty()) logprobs = std::move(st.pending);
        st.pending.clear();
        if (x->chat && x->tool_format) {
          SendToolCallsEnd(*x, index, r.finish_reason, std::move(logprobs));
        } else if (x->chat) {
          x->res->SendEvent(ChatCompletionChunkJson(x->id, x->created, x->model, index, false,
                                                    std::nullopt, r.finish_reason, logprobs,
                                                    x->include_usage));
        } else {
          CompletionChoice c;
          c.index = index;
          c.finish_reason = r.finish_reason;
          c.logprobs = logprobs;
          c.logprobs_offset = st.offset;
          x->res->SendEvent(CompletionChunkJson(x->id, x->created, x->model, {c}, std::nullopt,
                                                x->include_usage));
        }
      }
      if (--x->remaining == 0) SendFinal(*x);
    };
    callbacks.push_back(metrics_->Instrument(std::move(cb), arrival));
  }
  // All prompts of the request join the queue, or none does: a refused
  // request takes no queue slot, even briefly, and nothing is cancelled.
  auto enqueued = sink_->Submit(std::move(gens), std::move(callbacks));
  if (!enqueued.ok()) {
    metrics_->Rejected();
    const ApiError e = enqueued.status().code() == StatusCode::kResourceExhausted
                           ? QueueFullError(config_.scheduler.queue_limit)
                           : ApiErrorFromStatus(enqueued.status());
    res->Send(e.http_status, "application/json", e.ToJson());
    x->failed = true;
    return;
  }
  const std::vector<int64_t> ids = std::move(*enqueued);
  if (x->stream) res->StartStream(200);
  admit.unlock();
  RequestSink* sink = sink_;
  res->OnClientGone([sink, ids] { sink->Cancel(ids); });
}

int OpenAIFrontend::RequestThreads(const DaemonConfig& config) {
  if (config.server.request_threads > 0) return config.server.request_threads;
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency() / 2));
}

void OpenAIFrontend::Offload(const HttpRequest& req, std::shared_ptr<Responder> res, bool chat) {
  auto copy = std::make_shared<HttpRequest>(req);
  if (pool_->TrySubmit([this, copy, res, chat] { HandleCompletions(*copy, res, chat); })) return;
  metrics_->Rejected();
  res->SendError(503,
                 fmt::format("{} requests are waiting to be prepared (server.max_connections); "
                             "retry later",
                             config_.server.max_connections),
                 std::nullopt, "overloaded");
}

void OpenAIFrontend::Register(HttpServer& api) {
  // Parsing, chat templates and tokenization grow with the prompt: they run
  // on the request threads, never on the server's I/O threads (a client's
  // huge prompt must not stall other clients' streams or /healthz).
  api.Handle("POST", "/v1/completions",
             [this](const HttpRequest& r, std::shared_ptr<Responder> res) {
               Offload(r, std::move(res), false);
             });
  api.Handle("POST", "/v1/chat/completions",
             [this](const HttpRequest& r, std::shared_ptr<Responder> res) {
               Offload(r, std::move(res), true);
             });
  api.Handle("GET", "/v1/models", [this](const HttpRequest&, std::shared_ptr<Responder> res) {
    ModelCard card;
    card.id = model_name_;
    card.created = created_;
    card.max_model_len = max_context_;
    res->Send(200, "application/json", ModelListJson({card}));
  });
  // (De)tokenizing grows with the input too: on the request threads.
  for (const bool tokenize : {true, false}) {
    api.Handle("POST", tokenize ? "/tokenize" : "/detokenize",
               [this, tokenize](const HttpRequest& r, std::shared_ptr<Responder> res) {
                 auto copy = std::make_shared<HttpRequest>(r);
                 if (pool_->TrySubmit([this, copy, res, tokenize] {
                       tokenize ? HandleTokenize(*copy, *res) : HandleDetokenize(*copy, *res);
                     }))
                   return;
                 res->SendError(503,
                                "requests waiting to be prepared fill server.max_connections; "
                                "retry later",
                                std::nullopt, "overloaded");
               });
  }
}

void OpenAIFrontend::HandleTokenize(const HttpRequest& req, Responder& res) const {
  auto parsed = ParseTokenizeRequest(req.body);
  ApiError e;
  if (!parsed.ok()) {
    e = parsed.error();
  } else if (!parsed->model.empty() && parsed->model != model_name_) {
    e = UnknownModelError(parsed->model, model_name_);
  } else if (!parsed->chat) {
    const auto ids = tokenizer_->Encode(parsed->prompt, parsed->add_special_tokens.value_or(true));
    res.Send(200, "application/json", TokenizeResponseJson(ids, max_context_));
    return;
  } else if (!chat_template_) {
    res.SendError(400, "the model has no chat template; set model.chat_template in the config",
                  std::string("messages"), "unknown_chat_template");
    return;
  } else {
    auto text = chat_template_->Render(parsed->messages, parsed->add_generation_prompt);
    if (!text.ok()) {
      res.SendError(400, text.status().message(), std::string("messages"), "chat_template_error");
      return;
    }
    const bool special = parsed->add_special_tokens.value_or(chat_template_->add_special_tokens());
    res.Send(200, "application/json",
             TokenizeResponseJson(tokenizer_->Encode(*text, special), max_context_));
    return;
  }
  res.Send(e.http_status, "application/json", e.ToJson());
}

void OpenAIFrontend::HandleDetokenize(const HttpRequest& req, Responder& res) const {
  auto parsed = ParseDetokenizeRequest(req.body);
  if (parsed.ok() && !parsed->model.empty() && parsed->model != model_name_)
    parsed = UnknownModelError(parsed->model, model_name_);
  if (!parsed.ok()) {
    res.Send(parsed.error().http_status, "application/json", parsed.error().ToJson());
    return;
  }
  for (size_t i = 0; i < parsed->tokens.size(); ++i)
    if (parsed->tokens[i] >= tokenizer_->vocab_size()) {
      res.SendError(400,
                    "tokens[" + std::to_string(i) + "] = " + std::to_string(parsed->tokens[i]) +
                        " is outside the tokenizer's vocab [0, " +
                        std::to_string(tokenizer_->vocab_size()) + ")",
                    std::string("tokens"), std::nullopt);
      return;
    }
  res.Send(200, "application/json",
           DetokenizeResponseJson(tokenizer_->Decode(parsed->tokens, false)));
}

}  // namespace tessera
