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

#include <cstdint>
#include <vector>

#include "common/base/status.h"
#include "common/base/tensor.h"
#include "kernels/logit_adjust_entry.h"

namespace tessera::kernels {

// logits [n, vocab] F32 (CPU or CUDA), changed in place.
// Errors: kInvalidArgument on the shape, an entry's row outside [0, n) or
// token outside [0, vocab), repetition <= 0, or two entries for one logit.
Status AdjustLogits(Tensor& logits, const std::vector<LogitAdjustment>& entries);

// Structured output (worker/model/grammar_masks.h): in logits row rows[i],
// every token t < vocab whose bit is clear (bit t % 32 of word
// words[i * words_per_row + t / 32]) becomes kBannedLogit, so it is never
// drawn (kernels/sampling.h drops probability-0 tokens) while the row stays
// finite. Applied after AdjustLogits. logits [n, vocab] F32 (CPU or CUDA),
// in place; on CUDA the rows and words are uploaded (words_per_row * 4 bytes
// a row) and one thread masks each logit. Errors: kInvalidArgument on the
// shape, a row outside [0, n), words_per_row < ceil(vocab / 32) or words not
// rows.size() * words_per_row long.
Status MaskLogits(Tensor& logits, const std::vector<int64_t>& rows,
                  const std::vector<uint32_t>& words, int64_t words_per_row);
Status CheckLogitMasks(const Tensor& logits, const std::vector<int64_t>& rows,
                       const std::vector<uint32_t>& words, int64_t words_per_row);

// The shared argument check.
Status CheckLogitAdjustments(const Tensor& logits, const std::vector<LogitAdjustment>& entries);

namespace cpu {
Status AdjustLogits(Tensor& logits, const std::vector<LogitAdjustment>& entries);
Status MaskLogits(Tensor& logits, const std::vector<int64_t>& rows,
                  const std::vector<uint32_t>& words, int64_t words_per_row);
}  // namespace cpu
namespace cuda {
Status AdjustLogits(Tensor& logits, const std::vector<LogitAdjustment>& entries);
Status MaskLogits(Tensor& logits, const std::vector<int64_t>& rows,
                  const std::vector<uint32_t>& words, int64_t words_per_row);
}  // namespace cuda

}  // namespace tessera::kernels
