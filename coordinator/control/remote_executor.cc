#include "coordinator/control/remote_executor.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>

#include "common/wire/control_codec.h"

namespace tessera {

RemoteExecutor::RemoteExecutor(ControlServer* server, uint64_t plan_version,
                               std::vector<std::string> first_stage,
                               std::vector<std::string> pipeline, std::string sampler, int pp,
                               int64_t vocab_size, double step_timeout_seconds)
    : server_(server),
      plan_version_(plan_version),
      first_stage_(std::move(first_stage)),
      pipeline_(std::move(pipeline)),
      sampler_(std::move(sampler)),
      pp_(pp),
      vocab_size_(vocab_size),
      step_timeout_seconds_(step_timeout_seconds) {}

Status RemoteExecutor::health() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failure_;
}

Status RemoteExecutor::Submit(const StepBatch& batch) {
  TESSERA_RETURN_IF_ERROR(health());
  const uint64_t id = next_id_++;
  {
    // Before the Step goes out: its result may come back at once.
    std::vector<int64_t> seq_ids;
    for (const SeqStep& s : batch.seqs)
      if (s.want_logits) seq_ids.push_back(s.seq_id);
    std::lock_guard<std::mutex> lock(mu_);
    expected_[id] = std::move(seq_ids);
  }
  for (const std::string& w : first_stage_) {
    control::Envelope e;
    control::Step* step = e.mutable_step();
    step->set_plan_version(plan_version_);
    step->set_micro_batch_id(id);
    StepBatchToProto(batch, step->mutable_batch());
    Status s = server_->Send(w, std::move(e));
    if (!s.ok()) {
      OnWorkerFailed(w, s);
      std::lock_guard<std::mutex> lock(mu_);
      expected_.erase(id);
      return s.WithContext("step to worker " + w);
    }
  }
  pending_.push_back(id);
  std::vector<int32_t>& asked = asked_[id];
  for (const SeqStep& s : batch.seqs)
    if (s.want_logits) asked.push_back(s.sampling.logprobs);
  return Status::Ok();
}

StatusOr<std::vector<SampledToken>> RemoteExecutor::Collect() {
  if (pending_.empty()) return FailedPrecondition("collect: no step in flight");
  const uint64_t id = pending_.front();
  pending_.pop_front();
  const std::vector<int32_t> asked = std::move(asked_[id]);
  asked_.erase(id);
  std::unique_lock<std::mutex> lock(mu_);
  const bool ready = cv_.wait_for(lock, std::chrono::duration<double>(step_timeout_seconds_),
                                  [&] { return results_.count(id) > 0 || !failure_.ok(); });
  expected_.erase(id);  // a late result for it is refused
  if (!failure_.ok()) return failure_;
  if (!ready) {
    // The pipeline is hung: it fails this step and every later one.
    step_timed_out_.store(true);
    failure_ =
        DeadlineExceeded(fmt::format("micro-batch {}: no result from the last stage within {:g} s "
                                     "(heartbeat.step_timeout_seconds)",
                                     id, step_timeout_seconds_));
    return failure_;
  }
  const control::StepResult result = std::move(results_[id]);
  results_.erase(id);
  lock.unlock();
  const std::string what = "micro-batch " + std::to_string(id) + " result";
  if (result.tokens_size() != static_cast<int>(asked.size()))
    return Internal(what + " has " + std::to_string(result.tokens_size()) + " tokens for " +
                    std::to_string(asked.size()) + " sampled sequences");
  std::vector<SampledToken> tokens(asked.size());
  for (size_t i = 0; i < asked.size(); ++i) {
    const control::SampledToken& t = result.tokens(static_cast<int>(i));
    SampledToken& out = tokens[i];
    out.token_id = t.token_id();
    // Non-finite logits: no token and no log-probabilities; the scheduler
    // fails this sequence alone.
    if (IsFailedToken(t.token_id())) continue;
    if (t.token_id() < 0 || t.token_id() >= vocab_size_)
      return Internal(what + ": token " + std::to_string(t.token_id()) + " of seq_id " +
                      std::to_string(t.seq_id()) + " is outside the vocab of " +
                      std::to_string(vocab_size_));
    if (t.has_logprobs() != (asked[i] >= 0) ||
        (asked[i] >= 0 && t.top_logprobs_size() != std::min<int64_t>(asked[i], vocab_size_)))
      return Internal(what + ": seq_id " + std::to_string(t.seq_id()) + " asked for " +
                      (asked[i] < 0 ? std::string("no log-probabilities")
                                    : std::to_string(asked[i]) + " top log-probabilities") +
                      " but got " +
                      (t.has_logprobs() ? std::to_string(t.top_logprobs_size()) + " top"
                                        : std::string("none")));
    for (const control::PromptTokenLogprob& p : t.prompt_logprobs()) {
      SampledToken e;
      e.token_id = p.token_id();
      e.has_logprobs = true;
      e.logprob = p.logprob();
      for (const control::TokenLogprob& top : p.top_logprobs())
        e.top.push_back({top.token_id(), top.logprob()});
      bool inside = e.token_id < vocab_size_;
      for (const TopLogprob& top : e.top) inside = inside && top.token_id < vocab_size_;
      if (!inside)
        return Internal(what + ": a prompt log-probability of seq_id " +
                        std::to_string(t.seq_id()) + " names a token outside the vocab of " +
                        std::to_string(vocab_size_));
      out.prompt_logprobs.push_back(std::move(e));
    }
    if (!t.has_logprobs()) continue;
    out.has_logprobs = true;
    out.logprob = t.logprob();
    for (const control::TokenLogprob& top : t.top_logprobs()) {
      if (top.token_id() >= vocab_size_)
        return Internal(what + ": top token " + std::to_string(top.token_id()) +
                        " is outside the vocab of " + std::to_string(vocab_size_));
      out.top.push_back({top.token_id(), top.logprob()});
    }
  }
  return tokens;
}

StepResultVerdict RemoteExecutor::OnStepResult(const std::string& worker_id,
                                               const control::StepResult& result) {
  const std::string mb = "micro-batch " + std::to_string(result.micro_batch_id());
  if (worker_id != sampler_)
    return {"wrong_rank", "worker '" + worker_id + "' sent a StepResult for " + mb + " of plan " +
                              std::to_string(result.plan_version()) + "; plan " +
                              std::to_string(plan_version_) + " samples on worker '" + sampler_ +
                              "'"};
  if (result.plan_version() != plan_version_)
    return {"wrong_plan_version", "StepResult for " + mb + " of plan " +
                                      std::to_string(result.plan_version()) +
                                      ", the current plan is " + std::to_string(plan_version_)};
  std::lock_guard<std::mutex> lock(mu_);
  auto it = expected_.find(result.micro_batch_id());
  if (it == expected_.end() || results_.count(result.micro_batch_id()))
    return {"unknown_micro_batch",
            "StepResult for " + mb + ", which is not in flight or already has its result"};
  const bool failed =
      result.has_error() && result.error().code() != control::ERROR_CODE_UNSPECIFIED;
  if (!failed) {
    const std::vector<int64_t>& want = it->second;
    bool same = static_cast<size_t>(result.tokens_size()) == want.size();
    for (size_t i = 0; same && i < want.size(); ++i)
      same = result.tokens(static_cast<int>(i)).seq_id() == want[i];
    if (!same) {
      std::string got;
      for (const control::SampledToken& t : result.tokens())
        got += (got.empty() ? "" : ",") + std::to_string(t.seq_id());
      std::string wanted;
      for (int64_t id : want) wanted += (wanted.empty() ? "" : ",") + std::to_string(id);
      return {"wrong_seq_ids", "StepResult for " + mb + " lists seq_ids [" + got +
                                   "], the micro-batch samples [" + wanted + "]"};
    }
  }
  if (failed) {
    failure_ = ErrorToStatus(result.error()).WithContext("worker " + worker_id);
  } else {
    results_[result.micro_batch_id()] = result;
  }
  cv_.notify_all();
  return {};
}

void RemoteExecutor::OnWorkerFailed(const std::string& worker_id, const Status& why) {
  if (std::find(pipeline_.begin(), pipeline_.end(), worker_id) == pipeline_.end()) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (failure_.ok()) failure_ = Unavailable("worker " + worker_id + " failed: " + why.message());
  cv_.notify_all();
}

}  // namespace tessera
