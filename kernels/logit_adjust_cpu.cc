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

}  // namespace cpu
}  // namespace tessera::kernels
