// Logits processing and token sampling for a batch of rows: greedy,
// temperature, top-k, top-p (nucleus, Holtzman et al. 2019), in HF
// generate's warper order (temperature, then top-k, then top-p).
//
// For each row:
//  - greedy (temperature == 0 or top_k == 1): the first index of the
//    maximum, as torch.argmax;
//  - otherwise: ids sorted by logit descending (ties: lower id first), the
//    first top_k kept (0 = all), p_i = exp((l_i - l_max) / T) / sum, then the
//    smallest prefix whose mass reaches top_p kept and renormalised, and the
//    first id whose cumulative probability exceeds `uniform` taken.
// The random number comes from the caller (worker/sampler.h draws it from
// the sequence's seeded generator), so the CPU and CUDA paths draw the same
// token from the same logits, up to summation order near a boundary.
//
// Thread-safety: stateless.
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"
#include "common/tensor.h"

namespace tessera::kernels {

struct SampleRow {
  float temperature = 0.0f;  // 0 = greedy
  int32_t top_k = 0;         // 0 = off
  float top_p = 1.0f;        // 1 = off
  double uniform = 0.0;      // in [0, 1), used when not greedy
  bool greedy() const { return temperature == 0.0f || top_k == 1; }
};

// tokens[i] = the token drawn for row i of logits [rows.size(), vocab] F32
// (on the CPU or CUDA; tokens is host memory). On CUDA this is the step's
// one host synchronisation. Errors: kInvalidArgument on shapes.
Status SampleTokens(const Tensor& logits, const std::vector<SampleRow>& rows,
                    std::vector<int32_t>& tokens);

// One row on the host: logits [vocab].
int32_t SampleRowCpu(const float* logits, int64_t vocab, const SampleRow& row);

namespace cpu {
Status SampleTokens(const Tensor& logits, const std::vector<SampleRow>& rows,
                    std::vector<int32_t>& tokens);
}
namespace cuda {
Status SampleTokens(const Tensor& logits, const std::vector<SampleRow>& rows,
                    std::vector<int32_t>& tokens);
}

}  // namespace tessera::kernels
