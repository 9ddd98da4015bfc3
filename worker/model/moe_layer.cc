#include "worker/model/moe_layer.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "kernels/linear.h"
#include "kernels/moe_down_combine.h"
#include "kernels/moe_routing.h"
#include "kernels/swiglu.h"
#include "kernels/tensor_ops.h"

namespace tessera {

MoeTokenCounts::MoeTokenCounts(int64_t expert_begin, int64_t expert_end)
    : begin_(expert_begin),
      end_(expert_end),
      counts_(std::make_unique<std::atomic<int64_t>[]>(
          static_cast<size_t>(std::max<int64_t>(expert_end - expert_begin, 0)))) {}

void MoeTokenCounts::Add(int64_t expert, int64_t tokens) {
  counts_[static_cast<size_t>(expert - begin_)].fetch_add(tokens, std::memory_order_relaxed);
}

int64_t MoeTokenCounts::Tokens(int64_t expert) const {
  return counts_[static_cast<size_t>(expert - begin_)].load(std::memory_order_relaxed);
}

void MoeTokenCounts::Publish(std::span<const int64_t> totals) {
  for (size_t i = 0; i < totals.size(); ++i) counts_[i].store(totals[i], std::memory_order_relaxed);
}

namespace {

// down(silu(gate x) * up x) for x [n, hidden] -> y [n, hidden].
Status GatedMlp(kernels::Backend& backend, const Tensor& gate_w, const Tensor& up_w,
                const Tensor& down_w, const Tensor& x, Tensor& y) {
  const int64_t n = x.dim(0), inter = gate_w.dim(0);
  TESSERA_ASSIGN_OR_RETURN(Tensor gate, backend.Allocate({n, inter}, x.dtype()));
  TESSERA_ASSIGN_OR_RETURN(Tensor up, backend.Allocate({n, inter}, x.dtype()));
  TESSERA_RETURN_IF_ERROR(kernels::Linear(x, gate_w, Tensor(), gate));
  TESSERA_RETURN_IF_ERROR(kernels::Linear(x, up_w, Tensor(), up));
  TESSERA_ASSIGN_OR_RETURN(Tensor act, backend.Allocate({n, inter}, x.dtype()));
  TESSERA_RETURN_IF_ERROR(kernels::SiluMul(gate, up, act));
  return kernels::Linear(act, down_w, Tensor(), y);
}

Status RoutedExperts(const ModelConfig& config, const LayerWeights& w, kernels::Backend& backend,
                     const Tensor& x, Tensor& out, MoeTokenCounts* counts) {
  const int64_t tokens = x.dim(0), hidden = x.dim(1), k = config.num_experts_per_tok;
  TESSERA_ASSIGN_OR_RETURN(Tensor logits,
                           backend.Allocate({tokens, config.num_experts}, DType::kF32));
  TESSERA_RETURN_IF_ERROR(kernels::Linear(x, w.router, Tensor(), logits));
  Tensor ids = Tensor::Empty({tokens, k}, DType::kI32);
  Tensor weights = Tensor::Empty({tokens, k}, DType::kF32);
  TESSERA_RETURN_IF_ERROR(kernels::MoeTopK(logits, k, config.norm_topk_prob, ids, weights));
  // Tokens (and their routing weights) per held expert, in token order.
  const int64_t first = w.experts.empty() ? 0 : w.experts.front().expert;
  const int64_t held = static_cast<int64_t>(w.experts.size());
  std::vector<std::vector<int64_t>> rows(static_cast<size_t>(held));
  std::vector<std::vector<float>> scales(static_cast<size_t>(held));
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t j = 0; j < k; ++j) {
      const int64_t e = ids.data<int32_t>()[t * k + j] - first;
      if (e < 0 || e >= held) continue;  // another rank's expert
      rows[static_cast<size_t>(e)].push_back(t);
      scales[static_cast<size_t>(e)].push_back(weights.data<float>()[t * k + j]);
    }
  }
  for (int64_t e = 0; e < held; ++e) {
    const std::vector<int64_t>& r = rows[static_cast<size_t>(e)];
    if (counts != nullptr) counts->Add(first + e, static_cast<int64_t>(r.size()));
    if (r.empty()) continue;
    const ExpertWeights& ew = w.experts[static_cast<size_t>(e)];
    const int64_t n = static_cast<int64_t>(r.size());
    TESSERA_ASSIGN_OR_RETURN(Tensor xe, backend.Allocate({n, hidden}, x.dtype()));
    TESSERA_RETURN_IF_ERROR(kernels::GatherRows(x, r, xe));
    TESSERA_ASSIGN_OR_RETURN(Tensor ye, backend.Allocate({n, hidden}, x.dtype()));
    TESSERA_RETURN_IF_ERROR(GatedMlp(backend, ew.gate_proj, ew.up_proj, ew.down_proj, xe, ye));
    TESSERA_RETURN_IF_ERROR(kernels::MoeScatterAdd(ye, r, scales[static_cast<size_t>(e)], out));
  }
  return Status::Ok();
}

// Qwen2-MoE: out += sigmoid(x Wsg^T) * shared_expert(x), per token.
Status SharedExpert(const LayerWeights& w, kernels::Backend& backend, const Tensor& x,
                    Tensor& out) {
  const int64_t tokens = x.dim(0), hidden = x.dim(1);
  TESSERA_ASSIGN_OR_RETURN(Tensor y, backend.Allocate({tokens, hidden}, x.dtype()));
  TESSERA_RETURN_IF_ERROR(
      GatedMlp(backend, w.shared_gate_proj, w.shared_up_proj, w.shared_down_proj, x, y));
  TESSERA_ASSIGN_OR_RETURN(Tensor g, backend.Allocate({tokens, 1}, x.dtype()));
  TESSERA_RETURN_IF_ERROR(kernels::Linear(x, w.shared_expert_gate, Tensor(), g));
  std::vector<int64_t> rows(static_cast<size_t>(tokens));
  std::vector<float> scales(static_cast<size_t>(tokens));
  for (int64_t t = 0; t < tokens; ++t) {
    rows[static_cast<size_t>(t)] = t;
    scales[static_cast<size_t>(t)] = 1.0f / (1.0f + std::exp(-g.data<float>()[t]));
  }
  return kernels::MoeScatterAdd(y, rows, scales, out);
}

// The shared expert's output y [tokens, hidden] (x's dtype) and its gate
// logit g F32 [tokens, 1], for MoeCombine on the device.
Status SharedExpertParts(const LayerWeights& w, kernels::Backend& backend, const Tensor& x,
                         Tensor& y, Tensor& g) {
  const int64_t tokens = x.dim(0), hidden = x.dim(1);
  TESSERA_ASSIGN_OR_RETURN(y, backend.Allocate({tokens, hidden}, x.dtype()));
  TESSERA_RETURN_IF_ERROR(
      GatedMlp(backend, w.shared_gate_proj, w.shared_up_proj, w.shared_down_proj, x, y));
  TESSERA_ASSIGN_OR_RETURN(g, backend.Allocate({tokens, 1}, DType::kF32));
  return kernels::Linear(x, w.shared_expert_gate, Tensor(), g);
}

// The CUDA block (moe_layer.h): every launch's grid follows from the token
// count and the layer's sizes, none from the routing, and nothing is read
// back to the host.
Status DeviceMoe(const ModelConfig& config, const LayerWeights& w, kernels::Backend& backend,
                 const MoeDeviceLayer& dev, const Tensor& x, Tensor& out) {
  const int64_t tokens = x.dim(0), hidden = x.dim(1), k = config.num_experts_per_tok;
  Tensor y, weights, shared, shared_gate;
  kernels::MoeRouting routing;
  if (w.shared_expert_gate.defined())
    TESSERA_RETURN_IF_ERROR(SharedExpertParts(w, backend, x, shared, shared_gate));
  if (!w.experts.empty()) {
    TESSERA_ASSIGN_OR_RETURN(Tensor logits,
                             backend.Allocate({tokens, config.num_experts}, DType::kF32));
    TESSERA_RETURN_IF_ERROR(kernels::Linear(x, w.router, Tensor(), logits));
    TESSERA_ASSIGN_OR_RETURN(Tensor ids, backend.Allocate({tokens, k}, DType::kI32));
    TESSERA_ASSIGN_OR_RETURN(weights, backend.Allocate({tokens, k}, DType::kF32));
    const int64_t first = w.experts.front().expert;
    TESSERA_RETURN_IF_ERROR(kernels::MoeRoute(backend, logits, k, config.norm_topk_prob, first,
                                              first + static_cast<int64_t>(w.experts.size()), ids,
                                              weights, routing, dev.token_totals));
    TESSERA_ASSIGN_OR_RETURN(Tensor act,
                             backend.Allocate({tokens * k, dev.table.intermediate}, x.dtype()));
    TESSERA_RETURN_IF_ERROR(kernels::MoeGroupedGateUp(x, dev.table, routing, act));
    if (kernels::MoeDownCombineEnabled())  // the down product and the combine in one call
      return kernels::MoeDownCombine(backend, act, dev.table, routing, ids, first, weights, shared,
                                     shared_gate, out);
    TESSERA_ASSIGN_OR_RETURN(y, backend.Allocate({tokens * k, hidden}, x.dtype()));
    TESSERA_RETURN_IF_ERROR(kernels::MoeGroupedDown(act, dev.table, routing, y));
  }
  return kernels::MoeCombine(y, routing, weights, shared, shared_gate, out);
}

}  // namespace

StatusOr<kernels::MoeExpertTable> MakeMoeDeviceTable(kernels::Backend& backend,
                                                     const LayerWeights& w, int layer) {
  std::vector<Tensor> gate, up, down;
  for (const ExpertWeights& e : w.experts) {
    gate.push_back(e.gate_proj);
    up.push_back(e.up_proj);
    down.push_back(e.down_proj);
  }
  if (gate.empty()) return kernels::MoeExpertTable{};  // a rank holding none of the experts
  auto table = kernels::MakeMoeExpertTable(backend, gate, up, down);
  if (!table.ok()) return table.status().WithContext("MoE block of layer " + std::to_string(layer));
  return table;
}

Status MoeForward(const ModelConfig& config, const LayerWeights& w, int layer,
                  kernels::Backend& backend, const Tensor& x, Tensor& out, MoeTokenCounts* counts,
                  const MoeDeviceLayer* device) {
  const std::string where = "MoE block of layer " + std::to_string(layer);
  if (backend.device() != Device::kCPU) {
    if (device == nullptr)
      return FailedPrecondition(where + ": the " + backend.name() +
                                " backend needs the layer's expert table (MoeDeviceLayer)");
    Status s = DeviceMoe(config, w, backend, *device, x, out);
    return s.ok() ? s : s.WithContext(where);
  }
  if (out.rank() != 2 || out.shape() != x.shape() || out.dtype() != DType::kF32 ||
      x.dtype() != DType::kF32)
    return InvalidArgument(where + ": x " + x.Describe() + " and out " + out.Describe() +
                           " must be equal F32 [tokens, hidden]");
  std::fill_n(out.data<float>(), out.numel(), 0.0f);
  Status s = RoutedExperts(config, w, backend, x, out, counts);
  if (s.ok() && w.shared_expert_gate.defined()) s = SharedExpert(w, backend, x, out);
  if (!s.ok()) return s.WithContext(where);
  return Status::Ok();
}

}  // namespace tessera
