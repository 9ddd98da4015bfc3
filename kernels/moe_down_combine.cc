// MoeDownCombine (kernels/moe_down_combine.h): the checks, the CUDA launch where it applies, and
// otherwise the two calls it replaces.
#include "kernels/moe_down_combine.h"

#include "common/base/env_switch.h"

namespace tessera::kernels {

bool MoeDownCombineEnabled() {
  static const bool enabled = EnvSwitchOptIn("TESSERA_CUDA_MOE_DOWN_COMBINE");
  return enabled;
}

Status MoeDownCombine(Backend& backend, const Tensor& act, const MoeExpertTable& table,
                      const MoeRouting& routing, const Tensor& expert_ids, int64_t expert_begin,
                      const Tensor& weights, const Tensor& shared, const Tensor& shared_gate,
                      Tensor& out) {
  TESSERA_RETURN_IF_ERROR(CheckMoeDownCombine(act, table, routing, expert_ids, expert_begin,
                                              weights, shared, shared_gate, out));
#ifdef TESSERA_WITH_CUDA
  if (out.device() == Device::kCUDA && cuda::MoeDownCombineFuses(act, table, routing))
    return cuda::MoeDownCombine(act, table, routing, expert_ids, expert_begin, weights, shared,
                                shared_gate, out);
#endif
  TESSERA_ASSIGN_OR_RETURN(
      Tensor y, backend.Allocate({routing.slot_token.numel(), table.hidden}, out.dtype()));
  TESSERA_RETURN_IF_ERROR(MoeGroupedDown(act, table, routing, y));
  return MoeCombine(y, routing, weights, shared, shared_gate, out);
}

}  // namespace tessera::kernels
