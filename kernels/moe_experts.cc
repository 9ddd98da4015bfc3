// The grouped expert operations (kernels/moe_experts.h): the expert table,
// the argument checks both devices share, and the dispatch.
#include "kernels/moe_experts.h"

#include <string>
#include <vector>

#include "kernels/dispatch.h"
#include "kernels/moe_routing.h"

namespace tessera::kernels {

namespace {

std::string ExpertName(size_t e, const char* which) {
  return "moe expert table: held expert " + std::to_string(e) + " " + which;
}

Status CheckRouting(const MoeRouting& r, Device device, int64_t experts) {
  for (const Tensor* t : {&r.expert_rows, &r.slot_token, &r.token_slot, &r.active}) {
    if (!t->defined() || t->dtype() != DType::kI32 || t->device() != device)
      return InvalidArgument("moe routing: " + (t->defined() ? t->Describe() : "undefined") +
                             " must be an I32 tensor on the " + DeviceName(device));
  }
  if (r.expert_rows.numel() != experts + 1 || r.active.numel() != experts + 1 ||
      r.token_slot.rank() != 2 || r.slot_token.numel() != r.token_slot.numel())
    return InvalidArgument("moe routing: expert_rows " + r.expert_rows.Describe() +
                           ", slot_token " + r.slot_token.Describe() + ", token_slot " +
                           r.token_slot.Describe() + " do not fit " + std::to_string(experts) +
                           " held experts");
  return Status::Ok();
}

// a [rows, a_cols] and b [rows, b_cols] of the table's dtype on x's device.
Status CheckRows(const Tensor& t, int64_t rows, int64_t cols, DType dtype, Device device,
                 const char* what) {
  TESSERA_RETURN_IF_ERROR(ExpectFloatTensor(t, 2, device, what));
  TESSERA_RETURN_IF_ERROR(ExpectDType(t, dtype, what, "the expert weights"));
  if (t.dim(0) != rows || t.dim(1) != cols)
    return InvalidArgument(std::string(what) + ": " + t.Describe() + ", expected [" +
                           std::to_string(rows) + ", " + std::to_string(cols) + "]");
  return Status::Ok();
}

// The shared expert's output [tokens, hidden] and gate F32 [tokens, 1] for `out` (both undefined:
// no shared expert).
Status CheckShared(const Tensor& shared, const Tensor& shared_gate, const Tensor& out) {
  if (!shared.defined()) return Status::Ok();
  const Device device = out.device();
  const int64_t tokens = out.dim(0);
  TESSERA_RETURN_IF_ERROR(
      CheckRows(shared, tokens, out.dim(1), out.dtype(), device, "moe shared expert output"));
  TESSERA_RETURN_IF_ERROR(ExpectTensor(shared_gate, 2, DType::kF32, "moe shared expert gate"));
  if (shared_gate.dim(0) != tokens || shared_gate.dim(1) != 1 || shared_gate.device() != device)
    return InvalidArgument("moe combine: shared expert gate " + shared_gate.Describe() +
                           " for output " + out.Describe());
  return Status::Ok();
}

}  // namespace

StatusOr<MoeExpertTable> MakeMoeExpertTable(Backend& backend, std::span<const Tensor> gate,
                                            std::span<const Tensor> up,
                                            std::span<const Tensor> down) {
  if (gate.size() != up.size() || gate.size() != down.size() || gate.empty())
    return InvalidArgument("moe expert table: " + std::to_string(gate.size()) + " gate, " +
                           std::to_string(up.size()) + " up and " + std::to_string(down.size()) +
                           " down projections (one of each per held expert, at least one)");
  MoeExpertTable table;
  table.dtype = gate[0].dtype();
  table.experts = static_cast<int64_t>(gate.size());
  table.intermediate = gate[0].rank() == 2 ? gate[0].dim(0) : 0;
  table.hidden = gate[0].rank() == 2 ? gate[0].dim(1) : 0;
  const int64_t I = table.intermediate, H = table.hidden;
  Tensor host = Tensor::Empty({table.experts, 3}, DType::kI64);
  bool aligned = (H * static_cast<int64_t>(DTypeSize(table.dtype))) % 16 == 0 &&
                 (I * static_cast<int64_t>(DTypeSize(table.dtype))) % 16 == 0;
  for (size_t e = 0; e < gate.size(); ++e) {
    const Tensor* parts[3] = {&gate[e], &up[e], &down[e]};
    const char* names[3] = {"gate_proj", "up_proj", "down_proj"};
    for (int p = 0; p < 3; ++p) {
      const Tensor& w = *parts[p];
      const int64_t rows = p == 2 ? H : I, cols = p == 2 ? I : H;
      Status s = CheckRows(w, rows, cols, table.dtype, backend.device(), names[p]);
      if (!s.ok()) return s.WithContext(ExpertName(e, names[p]));
      const auto address = reinterpret_cast<uintptr_t>(w.raw());
      aligned = aligned && address % 16 == 0;
      host.data<int64_t>()[e * 3 + static_cast<size_t>(p)] = static_cast<int64_t>(address);
    }
  }
  table.aligned16 = aligned;
  if (backend.device() == Device::kCPU) {
    table.pointers = host;
  } else {
    TESSERA_ASSIGN_OR_RETURN(table.pointers, backend.Upload(host));
  }
  return table;
}

Status CheckMoeGateUp(const Tensor& x, const MoeExpertTable& table, const MoeRouting& routing,
                      const Tensor& act) {
  TESSERA_RETURN_IF_ERROR(CheckRouting(routing, x.device(), table.experts));
  const int64_t slots = routing.slot_token.numel(), tokens = routing.token_slot.dim(0);
  TESSERA_RETURN_IF_ERROR(CheckRows(x, tokens, table.hidden, table.dtype, x.device(), "moe x"));
  return CheckRows(act, slots, table.intermediate, table.dtype, x.device(), "moe activations");
}

Status CheckMoeDown(const Tensor& act, const MoeExpertTable& table, const MoeRouting& routing,
                    const Tensor& y) {
  TESSERA_RETURN_IF_ERROR(CheckRouting(routing, act.device(), table.experts));
  const int64_t slots = routing.slot_token.numel();
  TESSERA_RETURN_IF_ERROR(
      CheckRows(act, slots, table.intermediate, table.dtype, act.device(), "moe activations"));
  return CheckRows(y, slots, table.hidden, table.dtype, act.device(), "moe expert outputs");
}

Status CheckMoeCombine(const Tensor& y, const MoeRouting& routing, const Tensor& weights,
                       const Tensor& shared, const Tensor& shared_gate, const Tensor& out) {
  TESSERA_RETURN_IF_ERROR(ExpectFloatTensor(out, 2, out.device(), "moe layer output"));
  const Device device = out.device();
  const int64_t tokens = out.dim(0), hidden = out.dim(1);
  if (y.defined()) {
    if (!routing.token_slot.defined() || routing.token_slot.device() != device ||
        routing.token_slot.dtype() != DType::kI32 || routing.token_slot.rank() != 2 ||
        routing.token_slot.dim(0) != tokens)
      return InvalidArgument("moe combine: token_slot " + routing.token_slot.Describe() +
                             " for output " + out.Describe());
    const int64_t k = routing.token_slot.dim(1);
    TESSERA_RETURN_IF_ERROR(
        CheckRows(y, tokens * k, hidden, out.dtype(), device, "moe expert outputs"));
    TESSERA_RETURN_IF_ERROR(ExpectTensor(weights, 2, DType::kF32, "moe routing weights"));
    if (weights.shape() != routing.token_slot.shape() || weights.device() != device)
      return InvalidArgument("moe combine: routing weights " + weights.Describe() +
                             " for token_slot " + routing.token_slot.Describe());
  }
  return CheckShared(shared, shared_gate, out);
}

Status CheckMoeDownCombine(const Tensor& act, const MoeExpertTable& table,
                           const MoeRouting& routing, const Tensor& expert_ids,
                           int64_t expert_begin, const Tensor& weights, const Tensor& shared,
                           const Tensor& shared_gate, const Tensor& out) {
  TESSERA_RETURN_IF_ERROR(ExpectFloatTensor(out, 2, out.device(), "moe layer output"));
  const Device device = out.device();
  TESSERA_RETURN_IF_ERROR(CheckRouting(routing, device, table.experts));
  const int64_t slots = routing.slot_token.numel();
  TESSERA_RETURN_IF_ERROR(
      CheckRows(act, slots, table.intermediate, table.dtype, device, "moe activations"));
  TESSERA_RETURN_IF_ERROR(CheckRows(out, routing.token_slot.dim(0), table.hidden, table.dtype,
                                    device, "moe layer output"));
  TESSERA_RETURN_IF_ERROR(ExpectTensor(expert_ids, 2, DType::kI32, "moe expert ids"));
  if (expert_ids.shape() != routing.token_slot.shape() || expert_ids.device() != device ||
      expert_begin < 0)
    return InvalidArgument("moe down+combine: expert ids " + expert_ids.Describe() +
                           " from held expert " + std::to_string(expert_begin) +
                           " for token_slot " + routing.token_slot.Describe());
  TESSERA_RETURN_IF_ERROR(ExpectTensor(weights, 2, DType::kF32, "moe routing weights"));
  if (weights.shape() != routing.token_slot.shape() || weights.device() != device)
    return InvalidArgument("moe down+combine: routing weights " + weights.Describe() +
                           " for token_slot " + routing.token_slot.Describe());
  return CheckShared(shared, shared_gate, out);
}

namespace {

// MoeSortByExpert's checks, then `routing` allocated for ids of `ids_shape` [T, K].
Status PrepareRouting(Backend& backend, const Tensor& expert_ids, int64_t expert_begin,
                      int64_t expert_end, MoeRouting& routing, const Tensor* token_totals) {
  TESSERA_RETURN_IF_ERROR(ExpectTensor(expert_ids, 2, DType::kI32, "moe expert ids"));
  if (expert_ids.device() != backend.device())
    return InvalidArgument("moe expert ids " + expert_ids.Describe() + " are not on " +
                           backend.name());
  const int64_t experts = expert_end - expert_begin;
  if (expert_begin < 0 || experts < 1)
    return InvalidArgument("moe: held experts [" + std::to_string(expert_begin) + ", " +
                           std::to_string(expert_end) + ") are empty");
  if (token_totals != nullptr &&
      (token_totals->dtype() != DType::kI64 || token_totals->numel() != experts ||
       token_totals->device() != backend.device()))
    return InvalidArgument("moe token totals " + token_totals->Describe() + " for " +
                           std::to_string(experts) + " held experts on " + backend.name());
  TESSERA_ASSIGN_OR_RETURN(routing.expert_rows, backend.Allocate({experts + 1}, DType::kI32));
  TESSERA_ASSIGN_OR_RETURN(routing.slot_token, backend.Allocate({expert_ids.numel()}, DType::kI32));
  TESSERA_ASSIGN_OR_RETURN(routing.token_slot, backend.Allocate(expert_ids.shape(), DType::kI32));
  TESSERA_ASSIGN_OR_RETURN(routing.active, backend.Allocate({experts + 1}, DType::kI32));
  return Status::Ok();
}

}  // namespace

Status MoeSortByExpert(Backend& backend, const Tensor& expert_ids, int64_t expert_begin,
                       int64_t expert_end, MoeRouting& routing, Tensor* token_totals) {
  TESSERA_RETURN_IF_ERROR(
      PrepareRouting(backend, expert_ids, expert_begin, expert_end, routing, token_totals));
  return TESSERA_DISPATCH(expert_ids.device(), MoeSortByExpert, expert_ids, expert_begin,
                          expert_end, routing, token_totals);
}

Status MoeRoute(Backend& backend, const Tensor& router_logits, int64_t top_k, bool renormalize,
                int64_t expert_begin, int64_t expert_end, Tensor& expert_ids, Tensor& weights,
                MoeRouting& routing, Tensor* token_totals) {
  TESSERA_RETURN_IF_ERROR(CheckMoeTopK(router_logits, top_k, expert_ids, weights));
  TESSERA_RETURN_IF_ERROR(
      PrepareRouting(backend, expert_ids, expert_begin, expert_end, routing, token_totals));
  return TESSERA_DISPATCH(router_logits.device(), MoeRoute, router_logits, top_k, renormalize,
                          expert_begin, expert_end, expert_ids, weights, routing, token_totals);
}

Status MoeGroupedGateUp(const Tensor& x, const MoeExpertTable& table, const MoeRouting& routing,
                        Tensor& act) {
  return TESSERA_DISPATCH(x.device(), MoeGroupedGateUp, x, table, routing, act);
}

Status MoeGroupedDown(const Tensor& act, const MoeExpertTable& table, const MoeRouting& routing,
                      Tensor& y) {
  return TESSERA_DISPATCH(act.device(), MoeGroupedDown, act, table, routing, y);
}

Status MoeCombine(const Tensor& y, const MoeRouting& routing, const Tensor& weights,
                  const Tensor& shared, const Tensor& shared_gate, Tensor& out) {
  return TESSERA_DISPATCH(out.device(), MoeCombine, y, routing, weights, shared, shared_gate, out);
}

}  // namespace tessera::kernels
