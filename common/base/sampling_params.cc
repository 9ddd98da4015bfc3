#include "common/base/sampling_params.h"

#include <cmath>
#include <string>

namespace tessera {

Status SamplingParams::Validate() const {
  if (!(temperature >= 0.0f) || !std::isfinite(temperature))
    return InvalidArgument("temperature must be >= 0, got " + std::to_string(temperature));
  if (top_k < 0) return InvalidArgument("top_k must be >= 0, got " + std::to_string(top_k));
  if (!(top_p > 0.0f && top_p <= 1.0f))
    return InvalidArgument("top_p must be in (0, 1], got " + std::to_string(top_p));
  if (logprobs < -1 || logprobs > kMaxTopLogprobs)
    return InvalidArgument("logprobs must be in -1.." + std::to_string(kMaxTopLogprobs) + ", got " +
                           std::to_string(logprobs));
  return Status::Ok();
}

}  // namespace tessera
