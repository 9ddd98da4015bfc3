// The grouped expert operations on the CPU (kernels/moe_experts.h), F32: the
// reference the CUDA kernels are tested against. Slots within an expert are in
// token order here.
#include <cmath>
#include <string>
#include <vector>

#include "kernels/dispatch.h"
#include "kernels/moe_experts.h"
#include "kernels/moe_routing.h"

namespace tessera::kernels::cpu {

namespace {

Status F32Only(const Tensor& t, const char* what) {
  if (t.dtype() != DType::kF32)
    return InvalidArgument(std::string(what) + ": " + t.Describe() + " (the CPU computes in F32)");
  return Status::Ok();
}

const float* Weight(const MoeExpertTable& table, int64_t expert, int part) {
  return reinterpret_cast<const float*>(
      static_cast<uintptr_t>(table.pointers.data<int64_t>()[expert * 3 + part]));
}

// The held expert of slot s: the e with expert_rows[e] <= s < expert_rows[e + 1].
int64_t ExpertOfSlot(const int32_t* rows, int64_t experts, int64_t s) {
  int64_t e = 0;
  while (e + 1 < experts && rows[e + 1] <= s) ++e;
  return e;
}

}  // namespace

Status MoeSortByExpert(const Tensor& expert_ids, int64_t expert_begin, int64_t expert_end,
                       MoeRouting& routing, Tensor* token_totals) {
  const int64_t experts = expert_end - expert_begin, pairs = expert_ids.numel();
  const int32_t* ids = expert_ids.data<int32_t>();
  int32_t* rows = routing.expert_rows.data<int32_t>();
  std::vector<int32_t> count(static_cast<size_t>(experts), 0);
  for (int64_t i = 0; i < pairs; ++i) {
    if (ids[i] < 0)
      return InvalidArgument("moe sort: expert id " + std::to_string(ids[i]) + " at pair " +
                             std::to_string(i) + " is negative");
    const int64_t e = ids[i] - expert_begin;
    if (e >= 0 && e < experts) ++count[static_cast<size_t>(e)];
  }
  rows[0] = 0;
  int32_t* active = routing.active.data<int32_t>();
  active[0] = 0;
  for (int64_t e = 0; e < experts; ++e) {
    rows[e + 1] = rows[e] + count[static_cast<size_t>(e)];
    if (count[static_cast<size_t>(e)] > 0) active[1 + active[0]++] = static_cast<int32_t>(e);
  }
  std::vector<int32_t> next(rows, rows + experts);
  const int64_t k = expert_ids.dim(1);
  for (int64_t i = 0; i < pairs; ++i) {
    const int64_t e = ids[i] - expert_begin;
    if (e < 0 || e >= experts) {
      routing.token_slot.data<int32_t>()[i] = -1;
      continue;
    }
    const int32_t slot = next[static_cast<size_t>(e)]++;
    routing.token_slot.data<int32_t>()[i] = slot;
    routing.slot_token.data<int32_t>()[slot] = static_cast<int32_t>(i / k);
  }
  if (token_totals != nullptr)
    for (int64_t e = 0; e < experts; ++e)
      token_totals->data<int64_t>()[e] += count[static_cast<size_t>(e)];
  return Status::Ok();
}

Status MoeGroupedGateUp(const Tensor& x, const MoeExpertTable& table, const MoeRouting& routing,
                        Tensor& act) {
  TESSERA_RETURN_IF_ERROR(CheckMoeGateUp(x, table, routing, act));
  TESSERA_RETURN_IF_ERROR(F32Only(x, "moe x"));
  const int64_t H = table.hidden, I = table.intermediate;
  const int32_t* rows = routing.expert_rows.data<int32_t>();
  for (int64_t s = 0; s < rows[table.experts]; ++s) {
    const int64_t e = ExpertOfSlot(rows, table.experts, s);
    const float* xr = x.data<float>() + routing.slot_token.data<int32_t>()[s] * H;
    const float *g = Weight(table, e, 0), *u = Weight(table, e, 1);
    for (int64_t i = 0; i < I; ++i) {
      float gs = 0.0f, us = 0.0f;
      for (int64_t h = 0; h < H; ++h) {
        gs += xr[h] * g[i * H + h];
        us += xr[h] * u[i * H + h];
      }
      act.data<float>()[s * I + i] = gs / (1.0f + std::exp(-gs)) * us;
    }
  }
  return Status::Ok();
}

Status MoeGroupedDown(const Tensor& act, const MoeExpertTable& table, const MoeRouting& routing,
                      Tensor& y) {
  TESSERA_RETURN_IF_ERROR(CheckMoeDown(act, table, routing, y));
  TESSERA_RETURN_IF_ERROR(F32Only(act, "moe activations"));
  const int64_t H = table.hidden, I = table.intermediate;
  const int32_t* rows = routing.expert_rows.data<int32_t>();
  for (int64_t s = 0; s < rows[table.experts]; ++s) {
    const float* d = Weight(table, ExpertOfSlot(rows, table.experts, s), 2);
    const float* a = act.data<float>() + s * I;
    for (int64_t h = 0; h < H; ++h) {
      float sum = 0.0f;
      for (int64_t i = 0; i < I; ++i) sum += a[i] * d[h * I + i];
      y.data<float>()[s * H + h] = sum;
    }
  }
  return Status::Ok();
}

Status MoeCombine(const Tensor& y, const MoeRouting& routing, const Tensor& weights,
                  const Tensor& shared, const Tensor& shared_gate, Tensor& out) {
  TESSERA_RETURN_IF_ERROR(CheckMoeCombine(y, routing, weights, shared, shared_gate, out));
  TESSERA_RETURN_IF_ERROR(F32Only(out, "moe layer output"));
  const int64_t tokens = out.dim(0), H = out.dim(1);
  const int64_t k = y.defined() ? routing.token_slot.dim(1) : 0;
  for (int64_t t = 0; t < tokens; ++t) {
    float* o = out.data<float>() + t * H;
    for (int64_t h = 0; h < H; ++h) o[h] = 0.0f;
    for (int64_t j = 0; j < k; ++j) {
      const int32_t slot = routing.token_slot.data<int32_t>()[t * k + j];
      if (slot < 0) continue;
      const float w = weights.data<float>()[t * k + j];
      const float* yr = y.data<float>() + static_cast<int64_t>(slot) * H;
      for (int64_t h = 0; h < H; ++h) o[h] += w * yr[h];
    }
    if (shared.defined()) {
      const float g = 1.0f / (1.0f + std::exp(-shared_gate.data<float>()[t]));
      const float* sr = shared.data<float>() + t * H;
      for (int64_t h = 0; h < H; ++h) o[h] += g * sr[h];
    }
  }
  return Status::Ok();
}

Status MoeRoute(const Tensor& router_logits, int64_t top_k, bool renormalize, int64_t expert_begin,
                int64_t expert_end, Tensor& expert_ids, Tensor& weights, MoeRouting& routing,
                Tensor* token_totals) {
  TESSERA_RETURN_IF_ERROR(MoeTopK(router_logits, top_k, renormalize, expert_ids, weights));
  return MoeSortByExpert(expert_ids, expert_begin, expert_end, routing, token_totals);
}

}  // namespace tessera::kernels::cpu
