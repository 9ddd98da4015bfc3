// OpenAIFrontend: the OpenAI-compatible endpoints of the coordinator,
// POST /v1/completions, POST /v1/chat/completions and GET /v1/models, and
// vLLM's POST /tokenize and POST /detokenize (the coordinator's tokenizer
// and chat template; they work before a plan serves).
//
// A request is parsed and checked (coordinator/api/openai_api.h: the model
// name, scheduler.max_completion_tokens, max_prompt_tokens, queue_limit,
// max_context, server.max_streams), its prompts are submitted to the
// RequestSink all or none (a full queue is a real 429, even for a stream),
// and the sink's callbacks answer it: one JSON body, or Server-Sent Events
// ending with [DONE]. A client that goes away cancels its requests. Before
// a plan serves (ClusterStatus::ready) every request gets a 503.
//
// Thread-safety: handlers run on the HTTP server's threads; the callbacks on
// the serving loop's.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "common/base/work_pool.h"
#include "common/config/daemon_config.h"
#include "common/net/http_server.h"
#include "common/tokenizer/chat_template.h"
#include "common/tokenizer/tokenizer.h"
#include "coordinator/api/grammar_check.h"
#include "coordinator/api/openai_api.h"
#include "coordinator/api/request_metrics.h"
#include "coordinator/serving/cluster_status.h"
#include "coordinator/serving/request_sink.h"

namespace tessera {

class OpenAIFrontend {
 public:
  // Everything pointed to outlives the frontend. `chat_template`: none when
  // the model has no recognised one (chat requests then get a 400 naming
  // model.chat_template). `max_context`: prompt + completion tokens at most.
  OpenAIFrontend(const DaemonConfig* config, std::string model_name, int64_t max_context,
                 const Tokenizer* tokenizer, std::optional<ChatTemplate> chat_template,
                 RequestSink* sink, const ClusterStatus* status, RequestMetrics* metrics)
      : config_(*config),
        model_name_(std::move(model_name)),
        max_context_(max_context),
        tokenizer_(tokenizer),
        chat_template_(std::move(chat_template)),
        sink_(sink),
        status_(status),
        metrics_(metrics),
        created_(UnixSeconds()),
        grammar_check_(config->structured_output.paths(), tokenizer),
        pool_(std::make_unique<WorkPool>("tessera-prep", RequestThreads(*config),
                                         static_cast<size_t>(config->server.max_connections),
                                         kRequestThreadNice)) {}

  // Registers the five routes on `api`.
  void Register(HttpServer& api);
  // Finishes the requests being prepared and stops the request threads
  // (after the HTTP server stopped). Idempotent.
  void Stop() { pool_->Stop(); }

  // The request threads' nice value: below serving (the decode loop, the
  // control plane), so a flood of heavy requests slows admission, not
  // streams in progress.
  static constexpr int kRequestThreadNice = 10;
  // server.request_threads, 0 resolved: one per two hardware threads, >= 1.
  static int RequestThreads(const DaemonConfig& config);

 private:
  void HandleCompletions(const HttpRequest& req, std::shared_ptr<Responder> res, bool chat);
  void HandleTokenize(const HttpRequest& req, Responder& res) const;
  void HandleDetokenize(const HttpRequest& req, Responder& res) const;
  // Runs HandleCompletions on a request thread (a copy of `req`); 503 when
  // server.max_connections requests already wait for one.
  void Offload(const HttpRequest& req, std::shared_ptr<Responder> res, bool chat);

  const DaemonConfig& config_;
  const std::string model_name_;
  const int64_t max_context_;
  const Tokenizer* const tokenizer_;
  const std::optional<ChatTemplate> chat_template_;
  RequestSink* const sink_;
  const ClusterStatus* const status_;
  RequestMetrics* const metrics_;
  std::atomic<int> open_streams_{0};  // streaming responses open (server.max_streams)
  const int64_t created_;             // Unix seconds at construction (/v1/models)
  GrammarCheck grammar_check_;        // response_format grammars compile
  std::unique_ptr<WorkPool> pool_;    // the request threads
};

}  // namespace tessera
