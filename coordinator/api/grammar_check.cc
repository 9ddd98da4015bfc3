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
  Status st = engine->Check(spec);
  if (st.ok()) return std::nullopt;
  return st.message();
}

std::optional<ApiError> GrammarCheck::Check(const GrammarSpec& spec) {
  if (!spec.active()) return std::nullopt;
  Status error;
  std::shared_ptr<const GrammarEngine> engine = Engine(&error);
  ApiError e;
  e.http_status = 400;
  if (!engine) {
    e.message = "response_format other than text is unavailable on this server: " + error.message();
    e.param = "response_format";
    e.code = "structured_output_unavailable";
    return e;
  }
  Status st = engine->Check(spec);
  if (st.ok()) return std::nullopt;
  e.message =
      "response_format.json_schema.schema: the grammar engine (LLGuidance) cannot compile "
      "it: " +
      st.message();
  e.param = "response_format.json_schema.schema";
  e.code = "invalid_json_schema";
  return e;
}

}  // namespace tessera
