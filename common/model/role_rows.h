// Row builders for the family tables of tensor_roles.cc and moe_roles.cc
// (internal to common/model; not a public interface), so that each row of a
// table reads as one line.
#pragma once

#include <span>

#include "common/model/tensor_roles.h"

namespace tessera::role_rows {

using D = RoleDim;
using P = RolePlace;
using S = SplitKind;
using C = RoleCondition;
using R = TensorRole;

// Row builders, so that each row of a table reads as one line:
//  Matrix: a 2-D weight [out, in] (nn.Linear(in, out).weight, nn.Embedding).
//  Vector: a 1-D weight or bias [dim].
//  Norm:   an RMSNorm weight [hidden], replicated.
//  RowBias: the bias of a row-parallel layer [hidden], held whole and added
//           after the all-reduce.
//  LmHead: the output projection [vocab, hidden], vocab-parallel, read from
//          the embedding when tie_word_embeddings.
constexpr RoleSpec Matrix(R role, const char* name, P place, D out, D in, S split,
                          const char* source) {
  return {role, name, place, 2, {out, in}, split, false, C::kAlways, false, source};
}
//  FusedMatrix: a column-parallel weight [out, hidden] whose rows are part of
//              the fused checkpoint tensor `name` (Phi-3 qkv_proj, gate_up_proj).
constexpr RoleSpec FusedMatrix(R role, const char* name, D out, FusedTensor fused,
                               const char* source) {
  return {role,       name,  P::kLayer, 2,    {out, D::kHidden}, S::kColumnParallel, false,
          C::kAlways, false, source,    fused};
}
constexpr RoleSpec Vector(R role, const char* name, D dim, S split, C condition,
                          const char* source) {
  return {role, name, P::kLayer, 1, {dim, dim}, split, false, condition, false, source};
}
constexpr RoleSpec Norm(R role, const char* name, P place, const char* source) {
  return {role,           name,  place,      1,     {D::kHidden, D::kHidden},
          S::kReplicated, false, C::kAlways, false, source};
}
//  HeadNorm: a per-head RMSNorm weight [head_dim], replicated (every head of
//            every rank is normalised with the same weight).
constexpr RoleSpec HeadNorm(R role, const char* name, const char* source) {
  return {role,           name,  P::kLayer,  1,     {D::kHeadDim, D::kHeadDim},
          S::kReplicated, false, C::kAlways, false, source};
}
constexpr RoleSpec RowBias(R role, const char* name, C condition, const char* source) {
  return {role,           name, P::kLayer, 1,     {D::kHidden, D::kHidden},
          S::kReplicated, true, condition, false, source};
}
constexpr RoleSpec LmHead(const char* source) {
  return {R::kLmHead,
          "lm_head.weight",
          P::kLastStage,
          2,
          {D::kVocab, D::kHidden},
          S::kVocabParallel,
          false,
          C::kAlways,
          true,
          source};
}

//  ExpertMatrix: routed expert e's weight [out, in] ("{expert}" in `name`),
//               read from `alt_name` stacked over the experts in a
//               transformers 5 checkpoint.
constexpr RoleSpec ExpertMatrix(R role, const char* name, D out, D in, S split,
                                const char* alt_name, AltForm alt, const char* source) {
  RoleSpec s{role, name, P::kLayer, 2, {out, in}, split, false, C::kSparseLayer, false, source};
  s.per_expert = true;
  s.alt_name = alt_name;
  s.alt = alt;
  return s;
}
//  MoeMatrix: a weight of a sparse (or dense: kDenseLayer) layer that is not
//             per expert, with its transformers 5 name when that differs.
constexpr RoleSpec MoeMatrix(R role, const char* name, D out, D in, S split, C condition,
                             const char* source, const char* alt_name = nullptr) {
  RoleSpec s{role, name, P::kLayer, 2, {out, in}, split, false, condition, false, source};
  s.alt_name = alt_name;
  s.alt = alt_name ? AltForm::kRenamed : AltForm::kNone;
  return s;
}

// The Mixtral, Qwen2-MoE and Qwen3-MoE tables (moe_roles.cc).
std::span<const RoleSpec> MixtralRoles();
std::span<const RoleSpec> Qwen2MoeRoles();
std::span<const RoleSpec> Qwen3MoeRoles();

}  // namespace tessera::role_rows
