#include "common/wire/leader_messages.h"

#include <algorithm>
#include <set>
#include <string>

#include "common/base/sampled_token.h"
#include "common/wire/control_codec_internal.h"

namespace tessera {
namespace {

using wire_internal::CheckLogprob;

std::string At(const char* list, int i) {
  return std::string(list) + "[" + std::to_string(i) + "]";
}

bool SamePrompt(const control::GenerationRequest& a, const control::GenerationRequest& b) {
  return std::equal(a.prompt_ids().begin(), a.prompt_ids().end(), b.prompt_ids().begin(),
                    b.prompt_ids().end());
}

Status ValidateRequest(const control::Generate& g, int i) {
  const control::GenerationRequest& r = g.requests(i);
  if (r.prompt_ids_size() == 0) return InvalidArgument("prompt_ids is empty");
  for (int k = 0; k < r.prompt_ids_size(); ++k)
    if (r.prompt_ids(k) < 0)
      return InvalidArgument(At("prompt_ids", k) + " is " + std::to_string(r.prompt_ids(k)));
  if (r.max_tokens() < 0)
    return InvalidArgument("max_tokens " + std::to_string(r.max_tokens()) + " < 0");
  TESSERA_RETURN_IF_ERROR_CTX(wire_internal::ValidateSampling(r.sampling()), "sampling");
  for (int k = 0; k < r.stop_token_ids_size(); ++k)
    if (r.stop_token_ids(k) < 0)
      return InvalidArgument(At("stop_token_ids", k) + " is " +
                             std::to_string(r.stop_token_ids(k)));
  if (r.stop_size() > kMaxStopStrings)
    return InvalidArgument(std::to_string(r.stop_size()) + " stop strings exceed " +
                           std::to_string(kMaxStopStrings));
  for (int k = 0; k < r.stop_size(); ++k)
    if (r.stop(k).empty() || r.stop(k).size() > kMaxStopBytes)
      return InvalidArgument(At("stop", k) + " is empty or longer than " +
                             std::to_string(kMaxStopBytes) + " bytes");
  for (int k = 0; k < r.resume_tokens_size(); ++k)
    if (r.resume_tokens(k) < 0)
      return InvalidArgument(At("resume_tokens", k) + " is " + std::to_string(r.resume_tokens(k)));
  if (r.resume_tokens_size() > 0 && r.resume_tokens_size() >= r.max_tokens())
    return InvalidArgument(std::to_string(r.resume_tokens_size()) +
                           " resume_tokens leave none of max_tokens " +
                           std::to_string(r.max_tokens()));
  const int src = r.share_prompt_of();
  if (src != -1 && (src < 0 || src >= i || !SamePrompt(g.requests(src), r)))
    return InvalidArgument("share_prompt_of " + std::to_string(src) +
                           " is not an earlier request with the same prompt");
  return Status::Ok();
}

Status ValidateTopLogprobs(const google::protobuf::RepeatedPtrField<control::TokenLogprob>& top,
                           const std::string& at) {
  if (top.size() > kMaxTopLogprobs)
    return InvalidArgument(at + ": " + std::to_string(top.size()) + " top_logprobs exceed " +
                           std::to_string(kMaxTopLogprobs));
  for (const control::TokenLogprob& t : top) {
    if (t.token_id() < 0) return InvalidArgument(at + ": a top_logprobs token_id < 0");
    TESSERA_RETURN_IF_ERROR(CheckLogprob(t.logprob(), at + ".top_logprobs"));
  }
  return Status::Ok();
}

Status ValidateTokens(const control::RequestUpdate& u) {
  for (int k = 0; k < u.tokens_size(); ++k) {
    const control::TokenUpdate& t = u.tokens(k);
    // Most tokens carry no log-probabilities: they pass without the
    // checks' context strings (a leader's updates are validated per token).
    if (t.token_id() >= -1 && !t.has_logprobs() && t.logprob() == 0.0f &&
        t.top_logprobs_size() == 0)
      continue;
    const std::string at = At("tokens", k);
    if (t.token_id() < -1)
      return InvalidArgument(at + ": token_id " + std::to_string(t.token_id()) + " < -1");
    if (!t.has_logprobs() && (t.logprob() != 0.0f || t.top_logprobs_size() > 0))
      return InvalidArgument(at + ": logprob or top_logprobs set without has_logprobs");
    TESSERA_RETURN_IF_ERROR(CheckLogprob(t.logprob(), at));
    TESSERA_RETURN_IF_ERROR(ValidateTopLogprobs(t.top_logprobs(), at));
  }
  for (int k = 0; k < u.prompt_logprobs_size(); ++k) {
    const control::PromptTokenLogprob& p = u.prompt_logprobs(k);
    const std::string at = At("prompt_logprobs", k);
    if (p.token_id() < 0) return InvalidArgument(at + ": token_id < 0");
    TESSERA_RETURN_IF_ERROR(CheckLogprob(p.logprob(), at));
    TESSERA_RETURN_IF_ERROR(ValidateTopLogprobs(p.top_logprobs(), at));
  }
  return Status::Ok();
}

Status ValidateFinish(const control::RequestUpdate& u) {
  static const std::set<std::string> kReasons = {"length", "eos", "stop", "cancelled", "error"};
  if (!u.finished()) {
    if (!u.finish_reason().empty() || u.has_error())
      return InvalidArgument("finish_reason or error set without finished");
    return Status::Ok();
  }
  if (!kReasons.count(u.finish_reason()))
    return InvalidArgument("finish_reason \"" + u.finish_reason() +
                           "\" is not length, eos, stop, cancelled or error");
  if ((u.finish_reason() == "error") != u.has_error())
    return InvalidArgument("an error goes with finish_reason \"error\" and only with it");
  if (u.has_error()) TESSERA_RETURN_IF_ERROR_CTX(wire_internal::ValidateError(u.error()), "error");
  if (u.prompt_tokens() < 0 || u.cached_tokens() < 0)
    return InvalidArgument("prompt_tokens or cached_tokens < 0");
  return Status::Ok();
}

}  // namespace

Status ValidateGenerate(const control::Generate& g) {
  if (g.plan_version() == 0) return InvalidArgument("plan_version is 0");
  if (g.requests_size() == 0 || g.requests_size() > kMaxGenerateRequests)
    return InvalidArgument(std::to_string(g.requests_size()) + " requests (1.." +
                           std::to_string(kMaxGenerateRequests) + " allowed)");
  std::set<int64_t> ids;
  for (int i = 0; i < g.requests_size(); ++i) {
    const int64_t id = g.requests(i).request_id();
    if (id <= 0 || !ids.insert(id).second)
      return InvalidArgument(At("requests", i) + ": request_id " + std::to_string(id) +
                             " is <= 0 or repeated");
    TESSERA_RETURN_IF_ERROR_CTX(ValidateRequest(g, i),
                                At("requests", i) + " (request_id " + std::to_string(id) + ")");
  }
  return Status::Ok();
}

Status ValidateCancelRequests(const control::CancelRequests& c) {
  if (c.plan_version() == 0) return InvalidArgument("plan_version is 0");
  if (c.request_ids_size() == 0) return InvalidArgument("request_ids is empty");
  for (int i = 0; i < c.request_ids_size(); ++i)
    if (c.request_ids(i) <= 0)
      return InvalidArgument(At("request_ids", i) + " is " + std::to_string(c.request_ids(i)));
  return Status::Ok();
}

Status ValidateRequestUpdates(const control::RequestUpdates& r) {
  if (r.plan_version() == 0) return InvalidArgument("plan_version is 0");
  const control::LeaderLoad& load = r.load();
  if (load.free_kv_blocks() > load.kv_blocks())
    return InvalidArgument("load: free_kv_blocks " + std::to_string(load.free_kv_blocks()) +
                           " > kv_blocks " + std::to_string(load.kv_blocks()));
  if (load.prefix_cache_hit_tokens() > load.prefix_cache_query_tokens())
    return InvalidArgument(
        "load: prefix_cache_hit_tokens " + std::to_string(load.prefix_cache_hit_tokens()) +
        " > prefix_cache_query_tokens " + std::to_string(load.prefix_cache_query_tokens()));
  for (int i = 0; i < r.updates_size(); ++i) {
    const control::RequestUpdate& u = r.updates(i);
    // The context is written only for an error.
    const auto at = [&] {
      return At("updates", i) + " (request_id " + std::to_string(u.request_id()) + ")";
    };
    if (u.request_id() <= 0) return InvalidArgument(at() + ": request_id <= 0");
    TESSERA_RETURN_IF_ERROR_CTX(ValidateTokens(u), at());
    TESSERA_RETURN_IF_ERROR_CTX(ValidateFinish(u), at());
  }
  return Status::Ok();
}

}  // namespace tessera
