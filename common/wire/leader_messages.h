// The rules of the control-plane bodies between the coordinator and a
// replica's leader (common/wire/control.proto: Generate, CancelRequests,
// RequestUpdates), checked by ValidateEnvelope (control_codec.h) on both
// sides of the wire. Conversions to the engine's types are in
// common/engine/generation_codec.h.
//
// Thread-safety: pure functions.
#pragma once

#include "common/base/status.h"
#include "common/wire/control.pb.h"

namespace tessera {

// Most requests in one Generate (one API request's prompts x choices) and
// most stop strings per request, each of at most kMaxStopBytes bytes.
inline constexpr int kMaxGenerateRequests = 4096;
inline constexpr int kMaxStopStrings = 16;
inline constexpr size_t kMaxStopBytes = 1024;

// Errors (kInvalidArgument) name the field, with its index:
//  - plan_version 0; no requests, or more than kMaxGenerateRequests;
//  - per request: request_id <= 0 or repeated; an empty prompt or an id
//    < 0; max_tokens < 0; sampling as the step rules; a stop_token_id < 0;
//    more than kMaxStopStrings stop strings, an empty one or one longer
//    than kMaxStopBytes; a resume_token < 0, or as many resume_tokens as
//    max_tokens or more; share_prompt_of not -1 and not an earlier index
//    whose prompt is the same.
Status ValidateGenerate(const control::Generate& generate);
// plan_version 0; no request ids; an id <= 0.
Status ValidateCancelRequests(const control::CancelRequests& cancel);
// plan_version 0; per update: request_id <= 0; a token_id < -1; a logprob
// not finite or > 0, or set without has_logprobs; more than
// kMaxTopLogprobs top logprobs; a finish_reason that is not one of
// "length", "eos", "stop", "cancelled", "error" (or set without finished);
// an error without finish_reason "error" or "error" without an error;
// negative prompt_tokens or cached_tokens; a load with more free KV blocks
// than blocks, or more prefix-cache hit tokens than query tokens.
Status ValidateRequestUpdates(const control::RequestUpdates& updates);

}  // namespace tessera
