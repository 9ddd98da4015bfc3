// Generation requests and their progress on the control plane: the
// engine's types (common/engine/generation.h) <-> the messages between the
// coordinator and a replica's leader (common/wire/control.proto: Generate's
// GenerationRequest, RequestUpdate's TokenUpdate and finish). The rules the
// messages obey are checked by ValidateEnvelope (common/wire/
// leader_messages.h); these conversions assume a validated message.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "common/base/sampled_token.h"
#include "common/engine/generation.h"
#include "common/engine/scheduler.h"
#include "common/wire/control.pb.h"

namespace tessera {

// `request` as the coordinator's request `request_id` (> 0).
void GenerationRequestToProto(int64_t request_id, const GenerationRequest& request,
                              control::GenerationRequest* out);
GenerationRequest GenerationRequestFromProto(const control::GenerationRequest& message);

// A replica leader's scheduler options (AssignShard.leader) <-> the
// coordinator's SchedulerOptions (max_context resolved). From the message:
// fields <= 0 keep SchedulerOptions' defaults; `plan_version` becomes the
// options' (part of every prefix-cache key).
control::LeaderOptions LeaderOptionsToProto(const SchedulerOptions& options);
SchedulerOptions LeaderOptionsFromProto(const control::LeaderOptions& message,
                                        uint64_t plan_version);

// FinishReasonName's inverse; nullopt for any other name.
std::optional<FinishReason> FinishReasonFromName(std::string_view name);

// One on_token call: the text, the token (-1: text flushed at the finish)
// and its log-probabilities (null: none asked for).
void TokenUpdateToProto(const std::string& text, int32_t token, const SampledToken* logprobs,
                        control::TokenUpdate* out);
// The SampledToken of a TokenUpdate with has_logprobs (token_id, logprob,
// top); nullopt without.
std::optional<SampledToken> TokenLogprobsFromProto(const control::TokenUpdate& message);

// Prompt log-probabilities (GenerationResult::prompt_logprobs) <->
// RequestUpdate.prompt_logprobs.
void PromptLogprobsToProto(const std::vector<SampledToken>& prompt,
                           google::protobuf::RepeatedPtrField<control::PromptTokenLogprob>* out);
std::vector<SampledToken> PromptLogprobsFromProto(
    const google::protobuf::RepeatedPtrField<control::PromptTokenLogprob>& message);

}  // namespace tessera
