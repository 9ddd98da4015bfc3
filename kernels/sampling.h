// Logits processing and token sampling for a batch of rows: greedy,
// temperature, top-k, top-p (nucleus, Holtzman et al. 2019), in HF
// generate's warper order (temperature, then top-k, then top-p).
//
// For each row:
//  - greedy (temperature == 0 or top_k == 1): the first index of the
//    maximum, as torch.argmax;
//  - otherwise: ids sorted by logit descending (ties: lower id first), the
//    first top_k kept (0 = all), p_i = exp((l_i - l_max) / T) / sum, then the
//    smallest prefix whose mass reaches top_p kept and renormalised, then
//    the ids whose probability is below min_p times the first's (HF
//    MinPLogitsWarper) or exactly 0 (a banned logit,
//    kernels/logit_adjust_entry.h) dropped (renormalised when min_p > 0), and
//    the first id whose cumulative probability exceeds `uniform` taken.
// Logits processing (penalties, logit_bias, min_tokens) runs before, on the
// logits themselves (kernels/logit_adjust.h).
// The random number comes from the caller (worker/model/sampler.h draws it from
// the sequence's seeded generator), so the CPU and CUDA paths draw the same
// token from the same logits, up to summation order near a boundary.
//
// Non-finite logits: a row holding a NaN or an infinity (+inf included: the
// model's activations overflowed, so no distribution is defined) yields
// kNonFiniteLogitsToken (common/base/sampled_token.h) instead of a token, on
// both backends. On CUDA the argmax kernel, which reads every logit of every
// row anyway, writes it (a block-wide OR of !isfinite) and the sort-and-draw
// kernel leaves such rows alone: no extra pass and no extra host sync.
//
// Log-probabilities (TokenLogprobs) are those of the model's raw
// distribution over the full vocab, as OpenAI and vLLM report them:
// logprob_i = l_i - log(sum_j exp(l_j)) (log_softmax of the logits, computed
// in double as l_i - l_max - log(sum_j exp(l_j - l_max))), before
// temperature, top-k and top-p, so they do not depend on the sampling
// settings and the drawn token may lie outside the top alternatives.
// Rounding can make the most likely token's value a hair above 0; it is
// clamped to 0. On CUDA the rows that ask for them are copied to the host
// (vocab * 4 bytes each) and computed there: only sequences that request
// log-probabilities pay for the copy.
//
// Thread-safety: stateless.
#pragma once

#include <cstdint>
#include <vector>

#include "common/base/sampled_token.h"
#include "common/base/status.h"
#include "common/base/tensor.h"

namespace tessera::kernels {

struct SampleRow {
  float temperature = 0.0f;  // 0 = greedy
  int32_t top_k = 0;         // 0 = off
  float top_p = 1.0f;        // 1 = off
  float min_p = 0.0f;        // 0 = off; in [0, 1]
  double uniform = 0.0;      // in [0, 1), used when not greedy
  bool greedy() const { return temperature == 0.0f || top_k == 1; }
};

// tokens[i] = the token drawn for row i (or kNonFiniteLogitsToken) of logits [rows.size(), vocab]
// F32 (on the CPU or CUDA; tokens is host memory). On CUDA this is the step's one host
// synchronisation. Errors: kInvalidArgument on shapes; on CUDA, kUnimplemented when a row
// is sampled (not greedy) and rows x vocab exceeds 2^31 - 1 (the sort's int32 offsets:
// 8191 rows of a 262144-entry vocab).
Status SampleTokens(const Tensor& logits, const std::vector<SampleRow>& rows,
                    std::vector<int32_t>& tokens);

// One row on the host: logits [vocab]; kNonFiniteLogitsToken when a logit
// is NaN or infinite.
int32_t SampleRowCpu(const float* logits, int64_t vocab, const SampleRow& row);

// A row that wants log-probabilities: logits row `row`, the token drawn
// from it, and how many top alternatives (>= 0; more than vocab returns vocab).
struct LogprobRow {
  int64_t row = 0;
  int32_t token = 0;
  int32_t top = 0;
};

// For each rows[i]: out[i] = {token_id = token, has_logprobs, logprob =
// log_softmax(logits[row])[token], top = the min(top, vocab) largest
// log-probabilities, best first (equal logits: lower id first)}. logits
// [n, vocab] F32 on the CPU or CUDA; out is host memory.
// Errors: kInvalidArgument on shapes, a row outside [0, n), a token outside
// [0, vocab) or top < 0.
Status TokenLogprobs(const Tensor& logits, const std::vector<LogprobRow>& rows,
                     std::vector<SampledToken>& out);

// One row on the host: logits [vocab]; `top` as in TokenLogprobs.
SampledToken LogprobsRowCpu(const float* logits, int64_t vocab, int32_t token, int32_t top);

// Rows `rows` of logits [n, vocab] F32 (CPU or CUDA) copied into a new host
// tensor [rows.size(), vocab] (the raw logits the log-probabilities come
// from, kept before logits processing changes them). Errors:
// kInvalidArgument on the shape or a row outside [0, n).
StatusOr<Tensor> RowsToHost(const Tensor& logits, const std::vector<int64_t>& rows);

namespace cpu {
StatusOr<Tensor> RowsToHost(const Tensor& logits, const std::vector<int64_t>& rows);
Status SampleTokens(const Tensor& logits, const std::vector<SampleRow>& rows,
                    std::vector<int32_t>& tokens);
Status TokenLogprobs(const Tensor& logits, const std::vector<LogprobRow>& rows,
                     std::vector<SampledToken>& out);
}  // namespace cpu
namespace cuda {
StatusOr<Tensor> RowsToHost(const Tensor& logits, const std::vector<int64_t>& rows);
Status SampleTokens(const Tensor& logits, const std::vector<SampleRow>& rows,
                    std::vector<int32_t>& tokens);
Status TokenLogprobs(const Tensor& logits, const std::vector<LogprobRow>& rows,
                     std::vector<SampledToken>& out);
}  // namespace cuda

// Checks RowsToHost's arguments.
Status CheckHostRows(const Tensor& logits, const std::vector<int64_t>& rows);

// Checks `rows` against logits [n, vocab]. Errors: as TokenLogprobs.
Status CheckLogprobRows(const Tensor& logits, const std::vector<LogprobRow>& rows);

}  // namespace tessera::kernels
