// Wire encoding of StepBatch between pipeline stages (data plane, over the
// Communicator's point-to-point Send/Recv).
//
// Layout (little-endian): magic "TSB", version u8 (kStepCodecVersion), kind
// u8 (step, shutdown or keepalive), then the batch fields. A decoder rejects a version it
// does not know; fields are only ever appended in later versions.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <vector>

#include "common/base/status.h"
#include "common/wire/step_batch.h"

namespace tessera {

// 2: SamplingParams::logprobs (i32) after the seed.
// 3: after logprobs, the logits-processing fields: presence, frequency and
//    repetition penalties, min_p (f32 each), min_tokens (i32), logit_bias
//    (u64 count, then i32 id + f32 bias each), min_tokens_blocked (u64 count
//    + i32 ids), then SeqStep::output_start (i32) and SeqStep::history (u64
//    count + i32 ids), then SamplingParams::prompt_logprobs (i32) and
//    SeqStep::want_prompt_logprobs (u8). stop_token_ids stay with the
//    scheduler.
// 4: after want_prompt_logprobs, SamplingParams::grammar: kind (u8), schema
//    (u64 length + bytes).
inline constexpr uint8_t kStepCodecVersion = 4;

// kKeepalive: sent down an idle pipeline so a later stage's bounded receive
// does not time out while no request runs; it carries nothing.
enum class StepMessageKind : uint8_t { kStep = 1, kShutdown = 2, kKeepalive = 3 };

std::vector<uint8_t> EncodeStep(const StepBatch& batch);
std::vector<uint8_t> EncodeShutdown();
std::vector<uint8_t> EncodeKeepalive();

struct DecodedStep {
  StepMessageKind kind = StepMessageKind::kStep;
  StepBatch batch;
};
// Errors: kInvalidArgument naming what is malformed (magic, version, a
// truncated field, a count that exceeds the message).
StatusOr<DecodedStep> DecodeStep(const std::vector<uint8_t>& bytes);

}  // namespace tessera
