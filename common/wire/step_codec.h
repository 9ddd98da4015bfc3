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
inline constexpr uint8_t kStepCodecVersion = 2;

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
