// GrammarCheck: the coordinator's check of a request's response_format
// grammar before admission: LLGuidance (common/grammar/) must compile it
// against the served model's vocabulary and follow it for a few tokens
// (GrammarEngine::Check), so that a schema the engine cannot compile, or
// compiles but cannot start an output under, is a 400 naming
// response_format.json_schema.schema with the engine's reason instead of a
// failure on the sampling worker. The engine is
// loaded on the first request with a grammar; when the library is missing,
// such requests (only they) are refused naming the library and the config
// key.
//
// Thread-safety: Check from any thread (the request threads).
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "common/base/mutex.h"
#include "common/base/sampling_params.h"
#include "common/grammar/grammar_engine.h"
#include "common/grammar/grammar_library_paths.h"
#include "common/tokenizer/tokenizer.h"
#include "coordinator/api/openai_api.h"

namespace tessera {

class GrammarCheck {
 public:
  // `tokenizer` outlives this.
  GrammarCheck(GrammarLibraryPaths paths, const Tokenizer* tokenizer)
      : paths_(std::move(paths)), tokenizer_(tokenizer) {}

  // nullopt when `spec` is none or compiles. Else 400: param
  // response_format.json_schema.schema with LLGuidance's reason (code
  // "invalid_json_schema"), or param response_format naming the library
  // that did not load (code "structured_output_unavailable").
  std::optional<ApiError> Check(const GrammarSpec& spec);
  // Whether LLGuidance can use `spec` (active; GrammarEngine::Check):
  // nullopt, or its reason.
  // `loaded` false (and the reason the load error) when the engine is
  // unavailable. The verdicts of the last kCachedVerdicts distinct specs
  // are kept: clients send the same tools and schemas request after request.
  // Measured (tool_calls_test's planner, two small functions, a busy 2-core
  // host): tool_choice required 4.4 ms a request uncached, 37 us cached;
  // auto 513 us and 1.4 us.
  std::optional<std::string> Reason(const GrammarSpec& spec, bool* loaded);

  static constexpr size_t kCachedVerdicts = 64;

 private:
  // The engine, loaded on first use; nullptr with `load_error_` set when it
  // cannot be.
  std::shared_ptr<const GrammarEngine> Engine(Status* error);

  const GrammarLibraryPaths paths_;
  const Tokenizer* const tokenizer_;
  Mutex mu_;
  bool loaded_ GUARDED_BY(mu_) = false;
  std::shared_ptr<const GrammarEngine> engine_ GUARDED_BY(mu_);
  Status load_error_ GUARDED_BY(mu_);
  // Verdicts by kind and text; cleared when it reaches kCachedVerdicts.
  std::map<std::pair<GrammarKind, std::string>, std::optional<std::string>> verdicts_
      GUARDED_BY(mu_);
};

}  // namespace tessera
