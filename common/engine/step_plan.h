// StepPlan and StepOutcome: the values between the Scheduler's decisions and
// the executor that carries them out.
//
// One scheduler iteration is Schedule -> ExecutePlan -> Apply:
//   - Scheduler::Schedule decides (admission, KV-block allocation,
//     preemption, which sequences run which tokens in which micro-batch) and
//     returns a StepPlan;
//   - ExecutePlan submits the plan's micro-batches to a StepExecutor in
//     order and, when the plan says so, collects the oldest micro-batch in
//     flight, recording what happened in a StepOutcome;
//   - Scheduler::Apply updates the state from the outcome (appends the
//     sampled tokens, finishes, frees blocks, fails or re-queues on errors).
// A test can play the executor's part by filling a StepOutcome itself, so
// scheduling policy is testable without a model.
//
// Thread-safety: plain values; ExecutePlan runs on the thread that drives
// `executor` (StepExecutor is driven by one thread).
#pragma once

#include <cstdint>
#include <vector>

#include "common/base/sampled_token.h"
#include "common/base/status.h"
#include "common/engine/step_executor.h"
#include "common/wire/step_batch.h"

namespace tessera {

// One micro-batch to submit.
struct PlannedBatch {
  // What StepExecutor::Submit gets: per sequence (batch.seqs, in batch order)
  // its chunk [start_pos, start_pos + num_tokens) of prompt + generated
  // tokens; want_logits on the sequences whose chunk reaches their last
  // token (they get a sampled token back).
  StepBatch batch;
  int64_t prefill_tokens = 0;  // tokens of prompt (or recomputation) chunks
  int64_t decode_tokens = 0;   // tokens of decode steps (one per decoding sequence)
};

struct StepPlan {
  uint64_t serial = 0;  // Apply takes the plan of the latest Schedule only
  // Requests admitted by this Schedule (given KV blocks), in admission order.
  std::vector<int64_t> admitted;
  // Running sequences preempted by this Schedule to free KV blocks (newest
  // first): blocks freed, back at the front of the queue.
  std::vector<int64_t> preempted;
  // Micro-batches to submit, in order (at most the free in-flight slots).
  std::vector<PlannedBatch> submit;
  // After submitting, collect the oldest micro-batch in flight (one of an
  // earlier plan, or submit[0] when nothing else is in flight).
  bool collect = false;
  // When collect: the seq_ids of the rows that Collect returns for that
  // micro-batch (its want_logits sequences, in batch order).
  std::vector<int64_t> collect_rows;

  // Nothing to submit or collect: the scheduler is idle (or waits for work).
  bool empty() const { return submit.empty() && !collect; }
};

// What happened when a plan was carried out.
struct StepOutcome {
  // How many of plan.submit were submitted (they stop at the first failure).
  size_t submitted = 0;
  // Why submit[submitted] failed; OK when all were submitted.
  Status submit_error;
  // Optional, one per submitted batch: steady-clock seconds at its Submit
  // (stats); missing entries count as the time of Apply.
  std::vector<double> submit_times;
  // When plan.collect (and all submits succeeded): Collect's tokens for the
  // collected micro-batch, one per row of plan.collect_rows, or its error.
  StatusOr<std::vector<SampledToken>> collected = std::vector<SampledToken>{};
  // Optional: empty, or one per collected token; a non-OK entry finishes
  // that row's sequence alone with FinishReason::kError and this status
  // (the other rows apply as usual).
  std::vector<Status> row_errors;
};

// Submits plan.submit to `executor` in order (stopping at the first error),
// then, if they all went in and plan.collect, collects one micro-batch.
StepOutcome ExecutePlan(StepExecutor& executor, const StepPlan& plan);

// Steady-clock seconds (what StepOutcome::submit_times holds).
double SteadySeconds();

}  // namespace tessera
