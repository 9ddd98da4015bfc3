#include "coordinator/api/grammar_check.h"

namespace tessera {

std::shared_ptr<const GrammarEngine> GrammarCheck::Engine(Status* error) {
  MutexLock lock(&mu_);
  if (!loaded_) {
    loaded_ = true;
    auto lib = LlguidanceLibrary::Load(paths_.llguidance_library, paths_.python_library);
    if (!lib.ok()) {
      load_error_ = lib.status();
    } else if (!tokenizer_->eos_id()) {
      load_error_ = FailedPrecondition(
          "the model's tokenizer has no eos_token, which a structured output needs to end");
    } else {
      // A view that does not own the tokenizer: it outlives this check.
      std::shared_ptr<const Tokenizer> view(std::shared_ptr<const Tokenizer>(), tokenizer_);
      auto engine =
          GrammarEngine::Create(*lib, view, tokenizer_->vocab_size(), *tokenizer_->eos_id());
      if (engine.ok()) {
        engine_ = *engine;
      } else {
        load_error_ = engine.status();
      }
    }
  }
  *error = load_error_;
  return engine_;
}

std::optional<std::string> GrammarCheck::Reason(const GrammarSpec& spec, bool* loaded) {
  Status error;
  std::shared_ptr<const GrammarEngine> engine = Engine(&error);
  *loaded = engine != nullptr;
  if (!engine) return error.message();
  std::pair<GrammarKind, std::string> key(spec.kind, spec.schema);
  {
    MutexLock lock(&mu_);
    auto it = verdicts_.find(key);
    if (it != verdicts_.end()) return it->second;
  }
  // Compiled outside the lock: other requests' checks go on meanwhile.
  Status st = engine->Check(spec);
  std::optional<std::string> verdict;
  if (!st.ok()) verdict = st.message();
  MutexLock lock(&mu_);
  if (verdicts_.size() >= kCachedVerdicts) verdicts_.clear();
  verdicts_.emplace(std::move(key), verdict);
  return verdict;
}

std::optional<ApiError> GrammarCheck::Check(const GrammarSpec& spec) {
  if (!spec.active()) return std::nullopt;
  bool loaded = true;
  const std::optional<std::string> reason = Reason(spec, &loaded);
  if (!reason) return std::nullopt;
  ApiError e;
  e.http_status = 400;
  if (!loaded) {
    e.message = "response_format other than text is unavailable on this server: " + *reason;
    e.param = "response_format";
    e.code = "structured_output_unavailable";
    return e;
  }
  e.message =
      "response_format.json_schema.schema: the grammar engine (LLGuidance) cannot use it: " +
      *reason;
  e.param = "response_format.json_schema.schema";
  e.code = "invalid_json_schema";
  return e;
}

}  // namespace tessera
