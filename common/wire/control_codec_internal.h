// The control codec's field rules, shared by its files (control_codec.cc,
// leader_messages.cc). Not for use outside common/wire/.
//
// Thread-safety: pure functions.
#pragma once

#include <string>

#include "common/base/sampling_params.h"
#include "common/base/status.h"
#include "common/wire/control.pb.h"

namespace tessera::wire_internal {

// The step rules for sampling (ValidateEnvelope's list).
Status ValidateSampling(const control::SamplingParams& s);
// An Error: a known code and a message.
Status ValidateError(const control::Error& e);
// A log-probability: finite and <= 0; the error names `at`.
Status CheckLogprob(float logprob, const std::string& at);

}  // namespace tessera::wire_internal
