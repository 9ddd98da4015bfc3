#include <algorithm>
#include <string>
#include <utility>

#include "kernels/dispatch.h"
#include "kernels/logit_adjust.h"

namespace tessera::kernels {

Status CheckLogitAdjustments(const Tensor& logits, const std::vector<LogitAdjustment>& entries) {
  TESSERA_RETURN_IF_ERROR(ExpectTensor(logits, 2, DType::kF32, "adjusted logits"));
  std::vector<std::pair<int64_t, int32_t>> keys;
  keys.reserve(entries.size());
  for (size_t i = 0; i < entries.size(); ++i) {
    const LogitAdjustment& e = entries[i];
    if (e.row < 0 || e.row >= logits.dim(0) || e.token < 0 || e.token >= logits.dim(1) ||
        !(e.repetition > 0.0f))
      return InvalidArgument("logits adjustment " + std::to_string(i) + " (row " +
                             std::to_string(e.row) + ", token " + std::to_string(e.token) +
                             ", repetition " + std::to_string(e.repetition) +
                             ") does not fit logits " + logits.Describe());
    keys.emplace_back(e.row, e.token);
  }
  std::sort(keys.begin(), keys.end());
  const auto dup = std::adjacent_find(keys.begin(), keys.end());
  if (dup != keys.end())
    return InvalidArgument("logits adjustments name row " + std::to_string(dup->first) + " token " +
                           std::to_string(dup->second) + " twice");
  return Status::Ok();
}

Status AdjustLogits(Tensor& logits, const std::vector<LogitAdjustment>& entries) {
  return TESSERA_DISPATCH(logits.device(), AdjustLogits, logits, entries);
}

Status CheckLogitMasks(const Tensor& logits, const std::vector<int64_t>& rows,
                       const std::vector<uint32_t>& words, int64_t words_per_row) {
  TESSERA_RETURN_IF_ERROR(ExpectTensor(logits, 2, DType::kF32, "masked logits"));
  const int64_t vocab = logits.dim(1);
  if (words_per_row < (vocab + 31) / 32 ||
      static_cast<int64_t>(words.size()) != static_cast<int64_t>(rows.size()) * words_per_row)
    return InvalidArgument("token masks of " + std::to_string(words.size()) + " words, " +
                           std::to_string(words_per_row) + " a row, for " +
                           std::to_string(rows.size()) + " rows of logits " + logits.Describe());
  for (int64_t r : rows)
    if (r < 0 || r >= logits.dim(0))
      return InvalidArgument("token mask row " + std::to_string(r) + " is outside logits " +
                             logits.Describe());
  return Status::Ok();
}

Status MaskLogits(Tensor& logits, const std::vector<int64_t>& rows,
                  const std::vector<uint32_t>& words, int64_t words_per_row) {
  return TESSERA_DISPATCH(logits.device(), MaskLogits, logits, rows, words, words_per_row);
}

namespace cpu {

Status AdjustLogits(Tensor& logits, const std::vector<LogitAdjustment>& entries) {
  TESSERA_RETURN_IF_ERROR(CheckLogitAdjustments(logits, entries));
  float* l = logits.data<float>();
  const int64_t vocab = logits.dim(1);
  for (const LogitAdjustment& e : entries) {
    float& v = l[e.row * vocab + e.token];
    v = AdjustedLogit(v, e);
  }
  return Status::Ok();
}

Status MaskLogits(Tensor& logits, const std::vector<int64_t>& rows,
                  const std::vector<uint32_t>& words, int64_t words_per_row) {
  TESSERA_RETURN_IF_ERROR(CheckLogitMasks(logits, rows, words, words_per_row));
  const int64_t vocab = logits.dim(1);
  for (size_t i = 0; i < rows.size(); ++i) {
    float* l = logits.data<float>() + rows[i] * vocab;
    const uint32_t* w = words.data() + static_cast<int64_t>(i) * words_per_row;
    for (int64_t t = 0; t < vocab; ++t)
      if (((w[t >> 5] >> (t & 31)) & 1u) == 0) l[t] = kBannedLogit;
  }
  return Status::Ok();
}

}  // namespace cpu
}  // namespace tessera::kernels
