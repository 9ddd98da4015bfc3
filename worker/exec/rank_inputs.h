// Rank inputs: the stage-0 ranks of a tp group must run the same steps on
// the same token ids (their embedding all-reduce sums each rank's rows), so
// the inputs come from one place and are checked.
//
//  - BroadcastRequests: tp_rank 0 of stage 0 sends its generation requests
//    (prompt ids, sampling, max_tokens, stop strings, ignore_eos) to the other
//    stage-0 tp ranks, which replace theirs: every engine schedules the same
//    steps whatever each rank process was started with.
//  - CheckSameStepInputs: before a step with prompt tokens (a prefill or a
//    prefill chunk), the stage-0 tp ranks all-gather a 64-bit FNV-1a hash of
//    the batch (seq ids, positions, lengths, token ids): one fixed-size
//    collective per prefill step, so a mismatch of any kind, different
//    lengths included, becomes a kFailedPrecondition naming the ranks
//    instead of a silently wrong sum or a Gloo size mismatch.
//
// Thread-safety: call from the rank's step thread (the communicator's owner).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/engine/scheduler.h"
#include "common/wire/step_batch.h"
#include "kernels/backend.h"
#include "worker/comm/communicator.h"

namespace tessera {

// Every rank of `tp` ends with tp_rank 0's `bytes` (its size first, then
// the bytes; through device memory for a device communicator). A replica's
// leader sends its stage-0 tp peers each micro-batch this way.
// Errors: the communicator's, with context.
Status BroadcastBytes(Communicator& tp, kernels::Backend& backend, std::vector<uint8_t>& bytes);

// Every rank of `tp` (the stage-0 tp group) ends with tp_rank 0's
// `requests`. Errors: the communicator's, with context; kInvalidArgument
// for a malformed payload.
Status BroadcastRequests(Communicator& tp, kernels::Backend& backend,
                         std::vector<GenerationRequest>& requests);

// The batch's hash (seq_id, start_pos, num_tokens, want_logits of each
// sequence, then every token id).
uint64_t StepInputHash(const StepBatch& batch);

// True when a sequence of `batch` runs prompt tokens.
bool HasPromptTokens(const StepBatch& batch);

// When tp has more than one rank and `batch` has prompt tokens: all-gathers
// StepInputHash and fails with kFailedPrecondition naming the tp ranks
// whose inputs differ from tp_rank 0's (`who` names this rank). Every rank of
// the group returns the same verdict. `backend` moves the hashes through
// device memory for a device communicator (NCCL).
Status CheckSameStepInputs(Communicator& tp, kernels::Backend& backend, const StepBatch& batch,
                           const std::string& who);

}  // namespace tessera
