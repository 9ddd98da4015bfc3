#include "common/engine/generation_codec.h"

#include "common/wire/control_codec.h"

namespace tessera {
namespace {

void TopToProto(const std::vector<TopLogprob>& top,
                google::protobuf::RepeatedPtrField<control::TokenLogprob>* out) {
  for (const TopLogprob& t : top) {
    control::TokenLogprob* e = out->Add();
    e->set_token_id(t.token_id);
    e->set_logprob(t.logprob);
  }
}

std::vector<TopLogprob> TopFromProto(
    const google::protobuf::RepeatedPtrField<control::TokenLogprob>& top) {
  std::vector<TopLogprob> out;
  out.reserve(static_cast<size_t>(top.size()));
  for (const control::TokenLogprob& t : top) out.push_back({t.token_id(), t.logprob()});
  return out;
}

}  // namespace

void GenerationRequestToProto(int64_t request_id, const GenerationRequest& request,
                              control::GenerationRequest* out) {
  out->set_request_id(request_id);
  out->mutable_prompt_ids()->Add(request.prompt_ids.begin(), request.prompt_ids.end());
  SamplingParamsToProto(request.sampling, out->mutable_sampling());
  out->mutable_stop_token_ids()->Add(request.sampling.stop_token_ids.begin(),
                                     request.sampling.stop_token_ids.end());
  out->set_max_tokens(request.max_tokens);
  for (const std::string& s : request.stop) out->add_stop(s);
  out->set_ignore_eos(request.ignore_eos);
  out->set_share_prompt_of(request.share_prompt_of);
  out->mutable_resume_tokens()->Add(request.resume_tokens.begin(), request.resume_tokens.end());
}

GenerationRequest GenerationRequestFromProto(const control::GenerationRequest& message) {
  GenerationRequest r;
  r.prompt_ids.assign(message.prompt_ids().begin(), message.prompt_ids().end());
  r.sampling = SamplingParamsFromProto(message.sampling());
  r.sampling.stop_token_ids.assign(message.stop_token_ids().begin(),
                                   message.stop_token_ids().end());
  r.max_tokens = message.max_tokens();
  r.stop.assign(message.stop().begin(), message.stop().end());
  r.ignore_eos = message.ignore_eos();
  r.share_prompt_of = message.share_prompt_of();
  r.resume_tokens.assign(message.resume_tokens().begin(), message.resume_tokens().end());
  return r;
}

control::LeaderOptions LeaderOptionsToProto(const SchedulerOptions& o) {
  control::LeaderOptions l;
  l.set_max_batch_tokens(o.max_batch_tokens);
  l.set_max_sequences(o.max_sequences);
  l.set_queue_limit(o.queue_limit);
  l.set_max_context(o.max_context);
  l.set_prefill_chunk_tokens(o.prefill_chunk_tokens);
  l.set_prefix_caching(o.prefix_caching);
  l.set_model_id(o.model_id);
  l.set_prefill_chunk_by_cost(o.prefill_chunk_budget == PrefillChunkBudget::kCost);
  return l;
}

SchedulerOptions LeaderOptionsFromProto(const control::LeaderOptions& l, uint64_t plan_version) {
  SchedulerOptions o;
  if (l.max_batch_tokens() > 0) o.max_batch_tokens = l.max_batch_tokens();
  if (l.max_sequences() > 0) o.max_sequences = l.max_sequences();
  if (l.queue_limit() > 0) o.queue_limit = l.queue_limit();
  if (l.max_context() > 0) o.max_context = l.max_context();
  if (l.prefill_chunk_tokens() > 0) o.prefill_chunk_tokens = l.prefill_chunk_tokens();
  o.prefix_caching = l.prefix_caching();
  o.model_id = l.model_id();
  o.prefill_chunk_budget =
      l.prefill_chunk_by_cost() ? PrefillChunkBudget::kCost : PrefillChunkBudget::kTokens;
  o.plan_version = plan_version;
  return o;
}

std::optional<FinishReason> FinishReasonFromName(std::string_view name) {
  for (FinishReason r : {FinishReason::kLength, FinishReason::kEos, FinishReason::kStop,
                         FinishReason::kCancelled, FinishReason::kError})
    if (name == FinishReasonName(r)) return r;
  return std::nullopt;
}

void TokenUpdateToProto(const std::string& text, int32_t token, const SampledToken* logprobs,
                        control::TokenUpdate* out) {
  out->set_token_id(token);
  out->set_text(text);
  if (!logprobs || !logprobs->has_logprobs) return;
  out->set_has_logprobs(true);
  out->set_logprob(logprobs->logprob);
  TopToProto(logprobs->top, out->mutable_top_logprobs());
}

std::optional<SampledToken> TokenLogprobsFromProto(const control::TokenUpdate& message) {
  if (!message.has_logprobs()) return std::nullopt;
  SampledToken t;
  t.token_id = message.token_id();
  t.has_logprobs = true;
  t.logprob = message.logprob();
  t.top = TopFromProto(message.top_logprobs());
  return t;
}

void PromptLogprobsToProto(const std::vector<SampledToken>& prompt,
                           google::protobuf::RepeatedPtrField<control::PromptTokenLogprob>* out) {
  for (const SampledToken& p : prompt) {
    control::PromptTokenLogprob* m = out->Add();
    m->set_token_id(p.token_id);
    m->set_logprob(p.logprob);
    TopToProto(p.top, m->mutable_top_logprobs());
  }
}

std::vector<SampledToken> PromptLogprobsFromProto(
    const google::protobuf::RepeatedPtrField<control::PromptTokenLogprob>& message) {
  std::vector<SampledToken> out;
  out.reserve(static_cast<size_t>(message.size()));
  for (const control::PromptTokenLogprob& m : message) {
    SampledToken t;
    t.token_id = m.token_id();
    t.has_logprobs = true;
    t.logprob = m.logprob();
    t.top = TopFromProto(m.top_logprobs());
    out.push_back(std::move(t));
  }
  return out;
}

}  // namespace tessera
