#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "kernels/dispatch.h"
#include "kernels/moe_routing.h"

namespace tessera::kernels {

namespace {

Status OnHost(const Tensor& t, const char* what) {
  if (t.device() != Device::kCPU)
    return Unimplemented(std::string("moe: ") + what + " " + t.Describe() +
                         ": the CPU MoE layer's combine takes host tensors");
  return Status::Ok();
}

}  // namespace

Status CheckMoeTopK(const Tensor& router_logits, int64_t top_k, const Tensor& expert_ids,
                    const Tensor& weights) {
  TESSERA_RETURN_IF_ERROR(ExpectTensor(router_logits, 2, DType::kF32, "moe router logits"));
  const int64_t tokens = router_logits.dim(0), experts = router_logits.dim(1);
  if (top_k < 1 || top_k > experts)
    return InvalidArgument("moe: top_k " + std::to_string(top_k) + " is outside [1, " +
                           std::to_string(experts) + "]");
  TESSERA_RETURN_IF_ERROR(ExpectTensor(expert_ids, 2, DType::kI32, "moe expert ids"));
  TESSERA_RETURN_IF_ERROR(ExpectTensor(weights, 2, DType::kF32, "moe routing weights"));
  if (expert_ids.dim(0) != tokens || expert_ids.dim(1) != top_k ||
      weights.shape() != expert_ids.shape())
    return InvalidArgument("moe: outputs " + expert_ids.Describe() + ", " + weights.Describe() +
                           " for " + std::to_string(tokens) + " tokens, top_k " +
                           std::to_string(top_k));
  if (expert_ids.device() != router_logits.device() || weights.device() != router_logits.device())
    return InvalidArgument("moe: outputs " + expert_ids.Describe() + ", " + weights.Describe() +
                           " are not on the device of the logits " + router_logits.Describe());
  return Status::Ok();
}

Status MoeTopK(const Tensor& router_logits, int64_t top_k, bool renormalize, Tensor& expert_ids,
               Tensor& weights) {
  return TESSERA_DISPATCH(router_logits.device(), MoeTopK, router_logits, top_k, renormalize,
                          expert_ids, weights);
}

namespace cpu {

Status MoeTopK(const Tensor& router_logits, int64_t top_k, bool renormalize, Tensor& expert_ids,
               Tensor& weights) {
  TESSERA_RETURN_IF_ERROR(CheckMoeTopK(router_logits, top_k, expert_ids, weights));
  const int64_t tokens = router_logits.dim(0), experts = router_logits.dim(1);
  std::vector<float> p(static_cast<size_t>(experts));
  std::vector<int32_t> order(static_cast<size_t>(experts));
  for (int64_t t = 0; t < tokens; ++t) {
    const float* row = router_logits.data<float>() + t * experts;
    const float top = *std::max_element(row, row + experts);
    float sum = 0.0f;
    for (int64_t e = 0; e < experts; ++e) {
      p[static_cast<size_t>(e)] = std::exp(row[e] - top);
      sum += p[static_cast<size_t>(e)];
    }
    for (float& v : p) v /= sum;
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + top_k, order.end(), [&](int32_t a, int32_t b) {
      const float pa = p[static_cast<size_t>(a)], pb = p[static_cast<size_t>(b)];
      return pa > pb || (pa == pb && a < b);
    });
    int32_t* ids = expert_ids.data<int32_t>() + t * top_k;
    float* w = weights.data<float>() + t * top_k;
    float picked = 0.0f;
    for (int64_t k = 0; k < top_k; ++k) {
      ids[k] = order[static_cast<size_t>(k)];
      w[k] = p[static_cast<size_t>(ids[k])];
      picked += w[k];
    }
    if (renormalize) {
      for (int64_t k = 0; k < top_k; ++k) w[k] /= picked;
    }
  }
  return Status::Ok();
}

}  // namespace cpu

Status MoeScatterAdd(const Tensor& src, std::span<const int64_t> rows,
                     std::span<const float> scales, Tensor& out) {
  TESSERA_RETURN_IF_ERROR(OnHost(src, "expert output"));
  TESSERA_RETURN_IF_ERROR(OnHost(out, "layer output"));
  TESSERA_RETURN_IF_ERROR(ExpectTensor(src, 2, DType::kF32, "moe expert output"));
  TESSERA_RETURN_IF_ERROR(ExpectTensor(out, 2, DType::kF32, "moe layer output"));
  const int64_t n = src.dim(0), hidden = src.dim(1);
  if (out.dim(1) != hidden || static_cast<int64_t>(rows.size()) != n ||
      static_cast<int64_t>(scales.size()) != n)
    return InvalidArgument("moe: scatter-add of " + src.Describe() + " with " +
                           std::to_string(rows.size()) + " rows and " +
                           std::to_string(scales.size()) + " scales into " + out.Describe());
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = rows[static_cast<size_t>(i)];
    if (r < 0 || r >= out.dim(0))
      return InvalidArgument("moe: scatter-add row " + std::to_string(r) + " is outside [0, " +
                             std::to_string(out.dim(0)) + ")");
    const float s = scales[static_cast<size_t>(i)];
    const float* x = src.data<float>() + i * hidden;
    float* y = out.data<float>() + r * hidden;
    for (int64_t h = 0; h < hidden; ++h) y[h] += s * x[h];
  }
  return Status::Ok();
}

}  // namespace tessera::kernels
