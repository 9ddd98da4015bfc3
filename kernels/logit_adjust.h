// Logits processing on the sampling rank: logit_bias, the repetition,
// frequency and presence penalties and min_tokens' ban, applied in place to
// rows of F32 logits before sampling (kernels/sampling.h). The formula and
// its sources are in kernels/logit_adjust_entry.h; worker/model/sampler.h
// builds the entries from each sequence's SamplingParams and token history.
//
// Only the logits an entry names change (sparse: a row's entries are its
// seen tokens, its biased tokens and its banned ones), so the cost is
// O(entries), not O(rows x vocab). On CUDA the entries are uploaded and one
// thread applies each (no two entries name the same logit).
//
// Thread-safety: stateless.
#pragma once

#include <vector>

#include "common/base/status.h"
#include "common/base/tensor.h"
#include "kernels/logit_adjust_entry.h"

namespace tessera::kernels {

// logits [n, vocab] F32 (CPU or CUDA), changed in place.
// Errors: kInvalidArgument on the shape, an entry's row outside [0, n) or
// token outside [0, vocab), repetition <= 0, or two entries for one logit.
Status AdjustLogits(Tensor& logits, const std::vector<LogitAdjustment>& entries);

// The shared argument check.
Status CheckLogitAdjustments(const Tensor& logits, const std::vector<LogitAdjustment>& entries);

namespace cpu {
Status AdjustLogits(Tensor& logits, const std::vector<LogitAdjustment>& entries);
}
namespace cuda {
Status AdjustLogits(Tensor& logits, const std::vector<LogitAdjustment>& entries);
}

}  // namespace tessera::kernels
