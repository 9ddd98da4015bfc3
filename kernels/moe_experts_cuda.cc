// Tensor-level CUDA grouped expert operations (kernels/moe_experts.h):
// checks, then kernels/moe_experts_cuda.cu and kernels/moe_routing_cuda.cu.
#include <algorithm>
#include <cstdlib>
#include <string>

#include "common/base/env_switch.h"
#include "kernels/cuda_context.h"
#include "kernels/cuda_launch.h"
#include "kernels/moe_down_combine.h"
#include "kernels/moe_experts.h"
#include "kernels/moe_routing.h"

namespace tessera::kernels::cuda {

namespace {

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Block rows of a grouped launch: one per expert that can have pairs.
int64_t GridExperts(const MoeExpertTable& table, int64_t slots) {
  return std::min(table.experts, slots);
}

// Which kernel runs a grouped product (moe_experts.h): the tensor-core one
// (moe_experts_tc_cuda.cu) once the held experts average at least
// kTcMinPairs slots each, where the CUDA-core kernel re-reads an expert's
// weights every 4 slots; the CUDA-core one below that (decode over many
// experts: a weight read per slot-group is the whole cost). Decided from
// the slot and expert counts alone, never from the routing, so a step stays
// a CUDA graph. TESSERA_CUDA_MOE_TC=0 in the environment keeps the CUDA-core
// kernel (for A/B runs).
constexpr int64_t kTcMinPairs = 4;
constexpr int64_t kTcWidePairs = 48;  // 64 slots per block pass from here

enum class GroupedKernel { kCudaCore, kTensorCoreNarrow, kTensorCoreWide };

GroupedKernel ChooseKernel(const MoeExpertTable& table, DType dtype, int64_t slots, bool vec) {
  static const bool enabled = EnvSwitchOn("TESSERA_CUDA_MOE_TC");
  if (!enabled || !vec || !MoeTcShapeOk(dtype, table.hidden, table.intermediate))
    return GroupedKernel::kCudaCore;
  const int64_t per_expert = slots / std::max<int64_t>(table.experts, 1);
  if (per_expert < kTcMinPairs) return GroupedKernel::kCudaCore;
  return per_expert >= kTcWidePairs ? GroupedKernel::kTensorCoreWide
                                    : GroupedKernel::kTensorCoreNarrow;
}

}  // namespace

Status MoeSortByExpert(const Tensor& expert_ids, int64_t expert_begin, int64_t expert_end,
                       MoeRouting& routing, Tensor* token_totals) {
  const int64_t experts = expert_end - expert_begin;
  if (experts > 6 * 1024)
    return InvalidArgument("moe sort: " + std::to_string(experts) +
                           " held experts; the CUDA sort counts at most 6144 in shared memory");
  TESSERA_ASSIGN_OR_RETURN(Context * ctx, Current());
  TESSERA_CUDA_LAUNCH_CHECK(
      LaunchMoeSort(
          expert_ids.data<int32_t>(), expert_ids.numel(), expert_ids.dim(1), expert_begin, experts,
          routing.expert_rows.data<int32_t>(), routing.slot_token.data<int32_t>(),
          routing.token_slot.data<int32_t>(), routing.active.data<int32_t>(),
          token_totals != nullptr ? token_totals->data<int64_t>() : nullptr, ctx->stream()),
      "MoeSortKernel");
  return Status::Ok();
}

Status MoeRoute(const Tensor& router_logits, int64_t top_k, bool renormalize, int64_t expert_begin,
                int64_t expert_end, Tensor& expert_ids, Tensor& weights, MoeRouting& routing,
                Tensor* token_totals) {
  const int64_t tokens = router_logits.dim(0), experts = router_logits.dim(1);
  const int64_t held = expert_end - expert_begin;
  if (!MoeRouteApplies(tokens, experts, top_k, held)) {
    TESSERA_RETURN_IF_ERROR(MoeTopK(router_logits, top_k, renormalize, expert_ids, weights));
    return MoeSortByExpert(expert_ids, expert_begin, expert_end, routing, token_totals);
  }
  TESSERA_ASSIGN_OR_RETURN(Context * ctx, Current());
  TESSERA_CUDA_LAUNCH_CHECK(
      LaunchMoeRoute(router_logits.data<float>(), tokens, experts, top_k, renormalize, expert_begin,
                     held, expert_ids.data<int32_t>(), weights.data<float>(),
                     routing.expert_rows.data<int32_t>(), routing.slot_token.data<int32_t>(),
                     routing.token_slot.data<int32_t>(), routing.active.data<int32_t>(),
                     token_totals != nullptr ? token_totals->data<int64_t>() : nullptr,
                     ctx->stream()),
      "MoeRouteKernel");
  return Status::Ok();
}

Status MoeGroupedGateUp(const Tensor& x, const MoeExpertTable& table, const MoeRouting& routing,
                        Tensor& act) {
  TESSERA_RETURN_IF_ERROR(CheckMoeGateUp(x, table, routing, act));
  if (act.dim(0) == 0) return Status::Ok();
  TESSERA_ASSIGN_OR_RETURN(Context * ctx, Current());
  const bool vec = table.aligned16 && Aligned16(x.raw()) && Aligned16(act.raw());
  const GroupedKernel kernel = ChooseKernel(table, x.dtype(), act.dim(0), vec);
  if (kernel != GroupedKernel::kCudaCore) {
    TESSERA_CUDA_LAUNCH_CHECK(
        LaunchMoeGateUpTc(x.dtype(), x.raw(), table.pointers.data<int64_t>(),
                          routing.expert_rows.data<int32_t>(), routing.active.data<int32_t>(),
                          routing.slot_token.data<int32_t>(), act.raw(),
                          GridExperts(table, act.dim(0)), table.hidden, table.intermediate,
                          kernel == GroupedKernel::kTensorCoreWide, ctx->stream()),
        "MoeExpertTcKernel (gate|up)");
    return Status::Ok();
  }
  TESSERA_CUDA_LAUNCH_CHECK(
      LaunchMoeGateUp(x.dtype(), x.raw(), table.pointers.data<int64_t>(),
                      routing.expert_rows.data<int32_t>(), routing.active.data<int32_t>(),
                      routing.slot_token.data<int32_t>(), act.raw(), GridExperts(table, act.dim(0)),
                      table.hidden, table.intermediate, vec, x.dim(0), ctx->stream()),
      "MoeExpertGemmKernel (gate|up)");
  return Status::Ok();
}

Status MoeGroupedDown(const Tensor& act, const MoeExpertTable& table, const MoeRouting& routing,
                      Tensor& y) {
  TESSERA_RETURN_IF_ERROR(CheckMoeDown(act, table, routing, y));
  if (y.dim(0) == 0) return Status::Ok();
  TESSERA_ASSIGN_OR_RETURN(Context * ctx, Current());
  const bool vec = table.aligned16 && Aligned16(act.raw()) && Aligned16(y.raw());
  const GroupedKernel kernel = ChooseKernel(table, act.dtype(), y.dim(0), vec);
  if (kernel != GroupedKernel::kCudaCore) {
    TESSERA_CUDA_LAUNCH_CHECK(
        LaunchMoeDownTc(act.dtype(), act.raw(), table.pointers.data<int64_t>(),
                        routing.expert_rows.data<int32_t>(), routing.active.data<int32_t>(),
                        y.raw(), GridExperts(table, y.dim(0)), table.hidden, table.intermediate,
                        kernel == GroupedKernel::kTensorCoreWide, ctx->stream()),
        "MoeExpertTcKernel (down)");
    return Status::Ok();
  }
  TESSERA_CUDA_LAUNCH_CHECK(
      LaunchMoeDown(act.dtype(), act.raw(), table.pointers.data<int64_t>(),
                    routing.expert_rows.data<int32_t>(), routing.active.data<int32_t>(), y.raw(),
                    GridExperts(table, y.dim(0)), table.hidden, table.intermediate, vec,
                    routing.token_slot.dim(0), ctx->stream()),
      "MoeExpertGemmKernel (down)");
  return Status::Ok();
}

Status MoeCombine(const Tensor& y, const MoeRouting& routing, const Tensor& weights,
                  const Tensor& shared, const Tensor& shared_gate, Tensor& out) {
  TESSERA_RETURN_IF_ERROR(CheckMoeCombine(y, routing, weights, shared, shared_gate, out));
  TESSERA_ASSIGN_OR_RETURN(Context * ctx, Current());
  const int64_t top_k = y.defined() ? routing.token_slot.dim(1) : 0;
  TESSERA_CUDA_LAUNCH_CHECK(
      LaunchMoeCombine(out.dtype(), y.defined() ? y.raw() : nullptr,
                       y.defined() ? routing.token_slot.data<int32_t>() : nullptr,
                       y.defined() ? weights.data<float>() : nullptr, top_k,
                       shared.defined() ? shared.raw() : nullptr,
                       shared.defined() ? shared_gate.data<float>() : nullptr, out.raw(),
                       out.dim(0), out.dim(1), ctx->stream()),
      "MoeCombineKernel");
  return Status::Ok();
}

bool MoeDownCombineFuses(const Tensor& act, const MoeExpertTable& table,
                         const MoeRouting& routing) {
  const int64_t tokens = routing.token_slot.dim(0), slots = routing.slot_token.numel();
  const bool vec = table.aligned16 && Aligned16(act.raw());
  const int64_t top_k = routing.token_slot.dim(1);  // at most 64: the kernel's kDcMaxK
  return tokens >= 1 && tokens <= kMoeDownCombineMaxTokens && top_k <= 64 && table.experts > 0 &&
         vec && ChooseKernel(table, act.dtype(), slots, vec) == GroupedKernel::kCudaCore;
}

Status MoeDownCombine(const Tensor& act, const MoeExpertTable& table, const MoeRouting& routing,
                      const Tensor& expert_ids, int64_t expert_begin, const Tensor& weights,
                      const Tensor& shared, const Tensor& shared_gate, Tensor& out) {
  TESSERA_ASSIGN_OR_RETURN(Context * ctx, Current());
  TESSERA_CUDA_LAUNCH_CHECK(
      LaunchMoeDownCombine(act.dtype(), act.raw(), table.pointers.data<int64_t>(),
                           routing.token_slot.data<int32_t>(), expert_ids.data<int32_t>(),
                           expert_begin, weights.data<float>(), routing.token_slot.dim(1),
                           shared.defined() ? shared.raw() : nullptr,
                           shared.defined() ? shared_gate.data<float>() : nullptr, out.raw(),
                           out.dim(0), out.dim(1), table.intermediate, ctx->stream()),
      "MoeDownCombineKernel");
  return Status::Ok();
}

}  // namespace tessera::kernels::cuda
