// RemoteExecutor: the coordinator's StepExecutor. Submit sends a Step (the
// micro-batch) to every stage-0 worker over the control plane; Collect waits
// for the StepResult that tp rank 0 of the last stage returns, in submission
// order (the pipeline is FIFO), and checks that it answers every
// want_logits sequence, with log-probabilities exactly where asked.
//
// A StepResult is taken only when it comes from the sampling rank the plan
// names (`sampler`: tp rank 0 of the last stage), for this plan's version,
// for a micro-batch in flight that has no result yet, and lists exactly the
// seq_ids of that micro-batch's sampled sequences, in batch order. Anything
// else is refused (OnStepResult says why) and changes nothing: another
// registered worker cannot end or rewrite a step.
//
// Thread-safety: Submit/Collect from the scheduler's owner thread;
// OnStepResult and OnWorkerFailed from the control server's thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "common/engine/step_executor.h"
#include "common/wire/control.pb.h"
#include "coordinator/control/control_server.h"

namespace tessera {

// Why OnStepResult refused a StepResult: `reason` is the metric label
// (tessera_control_messages_dropped_total), `detail` names the numbers.
// reason == nullptr: taken.
struct StepResultVerdict {
  const char* reason = nullptr;
  std::string detail;
  bool accepted() const { return reason == nullptr; }
};

class RemoteExecutor : public StepExecutor {
 public:
  // `first_stage` are the worker ids of stage 0 (every tp rank, tp rank 0
  // first);
  // `pipeline` every worker of the plan (a failure of any fails the steps);
  // `sampler` the one that returns StepResults.
  RemoteExecutor(ControlServer* server, uint64_t plan_version, std::vector<std::string> first_stage,
                 std::vector<std::string> pipeline, std::string sampler, int pp, int64_t vocab_size,
                 double step_timeout_seconds);

  Status Submit(const StepBatch& batch) override;
  StatusOr<std::vector<SampledToken>> Collect() override;
  int max_in_flight() const override { return pp_; }
  int64_t vocab_size() const override { return vocab_size_; }

  // Takes `result` from `worker_id`, or refuses it (see the class comment).
  StepResultVerdict OnStepResult(const std::string& worker_id, const control::StepResult& result);
  uint64_t plan_version() const { return plan_version_; }
  // The replica's leader: tp rank 0 of stage 0 (the first of first_stage).
  const std::string& leader() const { return first_stage_.front(); }
  // A worker of the plan was lost or reported an error: in-flight and later
  // steps fail with this status.
  void OnWorkerFailed(const std::string& worker_id, const Status& why);
  Status health() const;
  // A step missed its deadline (step_timeout_seconds): Collect returned
  // kDeadlineExceeded for it. Any thread.
  bool step_timed_out() const { return step_timed_out_.load(); }
  double step_timeout_seconds() const { return step_timeout_seconds_; }

 private:
  ControlServer* server_;
  const uint64_t plan_version_;
  const std::vector<std::string> first_stage_;
  const std::vector<std::string> pipeline_;
  const std::string sampler_;
  const int pp_;
  const int64_t vocab_size_;
  const double step_timeout_seconds_;
  uint64_t next_id_ = 0;          // owner thread
  std::deque<uint64_t> pending_;  // owner thread: submitted ids, oldest first
  mutable std::mutex mu_;
  std::condition_variable cv_;
  // Per submitted id: SamplingParams::logprobs of each want_logits row.
  std::map<uint64_t, std::vector<int32_t>> asked_;  // owner thread
  // Per micro-batch in flight without a result: the seq_ids its result must
  // list, in order.
  std::map<uint64_t, std::vector<int64_t>> expected_;  // protected by mu_
  std::map<uint64_t, control::StepResult> results_;    // protected by mu_
  Status failure_;                                     // protected by mu_
  std::atomic<bool> step_timed_out_{false};
};

}  // namespace tessera
