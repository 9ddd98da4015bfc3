// Scheduler::Seq: one request's state inside the Scheduler
// (common/engine/scheduler.h), shared by the scheduler's source files
// (scheduler.cc: queueing, scheduling and applying steps; scheduler_blocks.cc:
// KV blocks, preemption, prefix caching and shared prompts). Internal to the
// scheduler: include it nowhere else.
//
// Thread-safety: a Seq in waiting_ is guarded by Scheduler::mu_; one in
// running_ belongs to the owner thread.
#pragma once

#include <cstdint>
#include <vector>

#include "common/engine/block_key.h"
#include "common/engine/scheduler.h"

namespace tessera {

struct Scheduler::Seq {
  int64_t id = 0;
  GenerationRequest req;
  RequestCallbacks callbacks;
  std::vector<int32_t> tokens;  // prompt + generated
  int32_t prompt_len = 0;       // of the original prompt
  // The length RoPE scales by while prefilling (SeqStep::prompt_len): the
  // prompt, or for longrope the whole sequence recomputed at the step where
  // it outgrew original_max_position_embeddings (LongRopeRecompute).
  int32_t rope_len = 0;
  int32_t cached = 0;  // tokens in the KV cache
  std::vector<int32_t> blocks;
  // Prefix caching: keys of the first keys.size() full blocks of `tokens`,
  // computed for plan keys_version; blocks [0, registered_blocks) of `blocks` are
  // registered or were found in the cache.
  std::vector<BlockKey> keys;
  uint64_t keys_version = 0;
  int32_t registered_blocks = 0;
  int32_t generated = 0;    // tokens generated (the tail of `tokens`)
  int preemptions = 0;      // preemptions and re-queues so far
  bool registered = false;  // callbacks handed to output_
  // The sampling rank has this sequence's token history since its latest
  // admission (SeqStep::history; only for sampling.NeedsHistory()).
  bool history_sent = false;
  // The prompt's log-probabilities are still to come (sampling.prompt_logprobs
  // >= 0): the whole prompt is prefilled in one step, without prefix-cache hits.
  bool prompt_logprobs_pending = false;
  // GenerationRequest::share_prompt_of as a request id (-1 = none).
  int64_t prompt_source = -1;
  bool in_flight = false;
  bool waiting = true;  // in waiting_ (not admitted, or preempted)
  bool done = false;
};

}  // namespace tessera
