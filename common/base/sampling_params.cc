#include "common/base/sampling_params.h"

#include <cmath>
#include <set>
#include <string>

namespace tessera {

namespace {

Status CheckIds(const std::vector<int32_t>& ids, const char* field) {
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] < 0)
      return InvalidArgument(std::string(field) + ": token id " + std::to_string(ids[i]) + " at " +
                             std::to_string(i) + " is negative");
  return Status::Ok();
}

}  // namespace

Status SamplingParams::Validate() const {
  if (!(temperature >= 0.0f) || !std::isfinite(temperature))
    return InvalidArgument("temperature must be >= 0, got " + std::to_string(temperature));
  if (top_k < 0) return InvalidArgument("top_k must be >= 0, got " + std::to_string(top_k));
  if (!(top_p > 0.0f && top_p <= 1.0f))
    return InvalidArgument("top_p must be in (0, 1], got " + std::to_string(top_p));
  if (logprobs < -1 || logprobs > kMaxTopLogprobs)
    return InvalidArgument("logprobs must be in -1.." + std::to_string(kMaxTopLogprobs) + ", got " +
                           std::to_string(logprobs));
  if (prompt_logprobs < -1 || prompt_logprobs > kMaxTopLogprobs)
    return InvalidArgument("prompt_logprobs must be in -1.." + std::to_string(kMaxTopLogprobs) +
                           ", got " + std::to_string(prompt_logprobs));
  if (!(presence_penalty >= -2.0f && presence_penalty <= 2.0f))
    return InvalidArgument("presence_penalty must be in [-2, 2], got " +
                           std::to_string(presence_penalty));
  if (!(frequency_penalty >= -2.0f && frequency_penalty <= 2.0f))
    return InvalidArgument("frequency_penalty must be in [-2, 2], got " +
                           std::to_string(frequency_penalty));
  if (!(repetition_penalty > 0.0f && repetition_penalty <= kMaxRepetitionPenalty))
    return InvalidArgument("repetition_penalty must be in (0, 100], got " +
                           std::to_string(repetition_penalty));
  if (!(min_p >= 0.0f && min_p <= 1.0f))
    return InvalidArgument("min_p must be in [0, 1], got " + std::to_string(min_p));
  if (min_tokens < 0)
    return InvalidArgument("min_tokens must be >= 0, got " + std::to_string(min_tokens));
  std::set<int32_t> seen;
  for (const auto& [id, bias] : logit_bias) {
    if (id < 0) return InvalidArgument("logit_bias: token id " + std::to_string(id) + " < 0");
    if (!seen.insert(id).second)
      return InvalidArgument("logit_bias: token id " + std::to_string(id) + " is given twice");
    if (!(std::fabs(bias) <= kMaxLogitBias))
      return InvalidArgument("logit_bias: the bias of token " + std::to_string(id) +
                             " must be in [-100, 100], got " + std::to_string(bias));
  }
  TESSERA_RETURN_IF_ERROR(CheckIds(min_tokens_blocked, "min_tokens"));
  TESSERA_RETURN_IF_ERROR(CheckIds(stop_token_ids, "stop_token_ids"));
  if (static_cast<uint8_t>(grammar.kind) > static_cast<uint8_t>(GrammarKind::kLark))
    return InvalidArgument("grammar: unknown kind " +
                           std::to_string(static_cast<int>(grammar.kind)));
  if (grammar.kind != GrammarKind::kJsonSchema && grammar.kind != GrammarKind::kLark &&
      !grammar.schema.empty())
    return InvalidArgument("grammar: a schema is set without kind json_schema or lark");
  if (grammar.schema.size() > kMaxGrammarSchemaBytes)
    return InvalidArgument("grammar: the schema's " + std::to_string(grammar.schema.size()) +
                           " bytes exceed " + std::to_string(kMaxGrammarSchemaBytes));
  return Status::Ok();
}

}  // namespace tessera
