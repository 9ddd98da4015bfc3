// Tensor roles: every weight tensor of a model family, typed, in one table
// per family (issue "Tensor roles").
//
// A TensorRole names what a weight does in the forward pass (q_proj,
// post_attention_layernorm, lm_head, ...), independent of its checkpoint
// name. Each family (Llama, Mistral, Qwen2, Qwen3, Phi3, Gemma2, Gemma3 text, and the
// mixtures of experts Mixtral, Qwen2-MoE, Qwen3-MoE: common/model/moe_roles.cc) has one table
// of RoleSpecs giving,
// for each role it has:
//  - the Hugging Face safetensors name, as a pattern in which "{layer}" stands
//    for the decoder-layer index ("model.layers.{layer}.self_attn.q_proj.weight");
//  - where it lives: the first pipeline stage (embed_tokens), every decoder
//    layer, or the last stage (the final norm, lm_head);
//  - its shape, in symbolic dimensions (hidden, heads*head_dim, ...) that
//    resolve against a ModelConfig; the product is the role's parameter count;
//  - its tensor-parallel split (SplitKind) and the split dimension's symbol,
//    which also says how the split is aligned: a dimension of query or KV rows
//    is split on head boundaries (column-parallel by heads), the intermediate
//    dimension evenly (column-parallel), the vocab padded to a multiple of tp
//    (vocab-parallel);
//  - when it exists: always, with ModelConfig::attention_bias, or with
//    ModelConfig::mlp_bias, and whether a tied model reads it from the
//    embedding instead (lm_head with tie_word_embeddings);
//  - whether its rows are part of a fused checkpoint tensor (Phi-3's
//    qkv_proj holds q, k and v stacked along dim 0; gate_up_proj holds gate
//    then up): the role then keeps its own shape (its parameters) and split,
//    and is read from its rows of the fused tensor, so each rank reads its q
//    rows, its k rows and its v rows, never a fraction of the fused tensor;
//  - the transformers module attribute it comes from, as documentation.
//
// The tables are the one home of this knowledge: ShardSpec builds a rank's
// tensor list from them, the weight loader binds each tensor by its role, the
// parameter counts (LayerParameterCount, ModelParameterCount) are sums over
// them, and the tests iterate them (tests/unit/common/model/tensor_roles_test.cc
// checks them against the fixture checkpoints). Adding a family means adding
// its table here and its forward-pass differences in worker/model/llama_model.cc
// (docs/architecture.md, "Adding a model family").
//
// Thread-safety: the tables are immutable statics; every function is pure and
// may be called concurrently.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/format/model_config.h"

namespace tessera {

enum class SplitKind {
  kReplicated,      // every rank of the stage holds the whole tensor
  kColumnParallel,  // split along output dim 0
  kRowParallel,     // split along input dim 1
  kVocabParallel,   // split along vocab dim 0, vocab padded to a multiple of tp
};
// "replicated", "column-parallel", "row-parallel", "vocab-parallel".
const char* SplitKindName(SplitKind kind);

// What a weight does, in model order (the order ShardSpec lists a rank's
// tensors in). A model family has a subset of these (Mistral has no biases).
enum class TensorRole {
  kEmbedTokens,  // token embedding table [vocab, hidden]
  kInputNorm,    // RMSNorm weight before attention [hidden]
  kQProj,        // query projection [heads*head_dim, hidden]
  kQBias,        // its bias [heads*head_dim]
  kKProj,        // key projection [kv_heads*head_dim, hidden]
  kKBias,        // its bias [kv_heads*head_dim]
  kVProj,        // value projection [kv_heads*head_dim, hidden]
  kVBias,        // its bias [kv_heads*head_dim]
  kQNorm,        // per-head RMSNorm weight on q before RoPE [head_dim] (Qwen3)
  kKNorm,        // per-head RMSNorm weight on k before RoPE [head_dim] (Qwen3)
  kOProj,        // attention output projection [hidden, heads*head_dim]
  kOBias,        // its bias [hidden]
  // RMSNorm weight after attention [hidden]: before the MLP (Llama, ...);
  // Gemma: on the attention output, before its residual add (Gemma's MLP
  // input norm is then kPreFeedforwardNorm).
  kPostAttentionNorm,
  kPreFeedforwardNorm,  // RMSNorm weight before the MLP [hidden] (Gemma)
  kGateProj,            // MLP gate projection [intermediate, hidden]
  kGateBias,            // its bias [intermediate]
  kUpProj,              // MLP up projection [intermediate, hidden]
  kUpBias,              // its bias [intermediate]
  kDownProj,            // MLP down projection [hidden, intermediate]
  kDownBias,            // its bias [hidden]
  // Mixture of experts (sparse layers only; docs/architecture.md "The MoE layer"):
  kRouter,            // router (Mixtral block_sparse_moe.gate, Qwen mlp.gate) [experts, hidden]
  kSharedExpertGate,  // Qwen2-MoE shared_expert_gate [1, hidden]: sigmoid scale of the shared
                      // expert
  kSharedGateProj,    // shared expert gate projection [shared_intermediate, hidden]
  kSharedUpProj,      // shared expert up projection [shared_intermediate, hidden]
  kSharedDownProj,    // shared expert down projection [hidden, shared_intermediate]
  kExpertGateProj,    // routed expert e's gate projection (Mixtral w1) [moe_intermediate, hidden]
  kExpertUpProj,      // routed expert e's up projection (Mixtral w3) [moe_intermediate, hidden]
  kExpertDownProj,    // routed expert e's down projection (Mixtral w2) [hidden, moe_intermediate]
  kPostFeedforwardNorm,  // RMSNorm weight on the MLP output, before its residual add [hidden]
                         // (Gemma)
  kFinalNorm,            // RMSNorm weight after the last layer [hidden]
  kLmHead,               // output projection [vocab, hidden]
};
inline constexpr int kNumTensorRoles = 31;
// "embed_tokens", "input_layernorm", "q_proj", "q_proj.bias", ..., "norm", "lm_head".
const char* TensorRoleName(TensorRole role);

// Where a role's tensor lives in a pipeline.
enum class RolePlace {
  kFirstStage,  // once, on the first stage (embed_tokens)
  kLayer,       // once per decoder layer, on the layer's stage
  kLastStage,   // once, on the last stage (the final norm, lm_head)
};

// A symbolic dimension of a role's shape.
enum class RoleDim {
  kHidden,        // hidden_size
  kQueryRows,     // num_attention_heads * head_dim: split on query-head boundaries
  kKvRows,        // num_key_value_heads * head_dim: split on KV-head boundaries
  kIntermediate,  // intermediate_size: split evenly
  kVocab,         // vocab_size: split by padded vocab rows
  kHeadDim,       // head_dim: never split (a per-head norm weight, replicated)
  kExperts,       // num_experts: never split (the router's rows, replicated)
  // moe_intermediate_size: split evenly without expert parallelism; whole
  // (the rank holds whole experts) with it.
  kMoeIntermediate,
  kSharedIntermediate,  // shared_expert_intermediate_size: split evenly
  kOne,                 // 1 (the shared expert gate's single output row)
};
// The size of `dim` for `model` (elements).
int64_t RoleDimSize(RoleDim dim, const ModelConfig& model);

// When a role's tensor is in a model.
enum class RoleCondition {
  kAlways,
  kAttentionBias,  // ModelConfig::attention_bias
  kMlpBias,        // ModelConfig::mlp_bias
  kDenseLayer,     // a layer without experts (ModelConfig::LayerIsSparse false)
  kSparseLayer,    // a layer with experts (ModelConfig::LayerIsSparse)
  kSharedExpert,   // a sparse layer of a model with a shared expert (Qwen2-MoE)
};

// How a role appears in a checkpoint written by transformers 5, when that
// differs from the published name (hf_name): RoleSpec::alt_name.
enum class AltForm {
  kNone,
  kRenamed,        // the same tensor under alt_name (Mixtral's router as mlp.gate.weight)
  kStackedGateUp,  // expert e's rows of alt_name [experts, 2*moe_intermediate, hidden]: gate, up
  kStackedDown,    // expert e's matrix of alt_name [experts, hidden, moe_intermediate]
};

// A checkpoint tensor that stacks several roles along dim 0.
enum class FusedTensor {
  kNone,
  kQkv,     // [(heads + 2*kv_heads) * head_dim, hidden]: q rows, k rows, v rows (Phi-3 qkv_proj)
  kGateUp,  // [2 * intermediate, hidden]: gate rows, then up rows (Phi-3 gate_up_proj)
};

struct RoleSpec {
  TensorRole role;
  // HF safetensors name; "{layer}" (per-layer roles only) is the global
  // decoder-layer index.
  const char* hf_name;
  RolePlace place;
  int ndim;          // 1 or 2
  RoleDim shape[2];  // shape[0 .. ndim): [out] or [out, in], as nn.Linear stores it
  SplitKind split;   // column- and vocab-parallel split dim 0, row-parallel dim 1
  // Row-parallel biases: held whole (kReplicated) and added once, after the
  // all-reduce of the layer's partial outputs.
  bool add_after_all_reduce;
  RoleCondition condition;
  // lm_head: with tie_word_embeddings the checkpoint has no tensor of this
  // role; its values are embed_tokens' (read from that role's tensor) and it
  // adds no parameters.
  bool tied_to_embedding;
  // The transformers module attribute (and how it is constructed) it comes
  // from, e.g. "LlamaAttention.q_proj = nn.Linear(hidden, heads*head_dim,
  // bias=attention_bias)".
  const char* source;
  // kNone, or the fused tensor (hf_name) whose rows this role is: q_proj,
  // k_proj, v_proj of kQkv; gate_proj, up_proj of kGateUp.
  FusedTensor fused = FusedTensor::kNone;
  // Routed-expert roles: one tensor per expert, "{expert}" in hf_name.
  bool per_expert = false;
  // The name transformers 5 writes (nullptr: the same as hf_name), with
  // "{layer}"; the loader reads it when the checkpoint lacks hf_name.
  const char* alt_name = nullptr;
  AltForm alt = AltForm::kNone;
};

// One model family's roles.
struct FamilyRoles {
  Architecture architecture;
  // The transformers file the table is written from, e.g.
  // "transformers/models/llama/modeling_llama.py".
  const char* modeling_file;
  std::span<const RoleSpec> roles;  // in TensorRole (model) order, each role at most once
};

// The table of `arch`.
const FamilyRoles& FamilyRolesOf(Architecture arch);
// Every supported architecture, in Architecture order (for iterating all tables).
std::span<const Architecture> AllArchitectures();

// Whether `spec`'s tensor is in `model` (its condition holds in some layer).
bool RolePresent(const RoleSpec& spec, const ModelConfig& model);
// Whether `spec`'s tensor is in layer `layer` of `model` (ignored for roles
// that are not per-layer): RolePresent, and for kDenseLayer / kSparseLayer /
// kSharedExpert whether the layer has experts.
bool RolePresentInLayer(const RoleSpec& spec, const ModelConfig& model, int layer);
// Whether `spec` reads another role's tensor in `model` (tied lm_head).
bool RoleIsTied(const RoleSpec& spec, const ModelConfig& model);
// The role's own HF name: hf_name with "{layer}" replaced by `layer` (ignored
// for roles that are not per-layer) and "{expert}" by `expert` (per-expert
// roles), e.g. "model.layers.3.self_attn.q_proj.weight".
std::string RoleTensorName(const RoleSpec& spec, int layer, int expert = -1);
// The transformers 5 name of the role (RoleSpec::alt_name with "{layer}"
// replaced), or "" when it has none.
std::string RoleAltName(const RoleSpec& spec, int layer);
// The shape of the transformers 5 tensor: the role's shape for kRenamed,
// [experts, 2*moe_intermediate, hidden] for kStackedGateUp, [experts,
// hidden, moe_intermediate] for kStackedDown; empty for kNone.
std::vector<int64_t> RoleAltShape(const RoleSpec& spec, const ModelConfig& model);
// The role's name as a checkpoint that does not fuse it would have it:
// RoleTensorName, or for a fused role the fused tensor's name with the fused
// module replaced by the role's ("model.layers.3.self_attn.qkv_proj.weight"
// -> "model.layers.3.self_attn.k_proj.weight"). Unique per (role, layer).
std::string RolePartName(const RoleSpec& spec, int layer, int expert = -1);
// The checkpoint tensor the role is read from: RoleTensorName, or for a tied
// lm_head the embedding's name ("model.embed_tokens.weight").
std::string RoleSourceName(const RoleSpec& spec, const ModelConfig& model, int layer,
                           int expert = -1);
// The role's whole shape for `model`, e.g. [heads*head_dim, hidden] (for a
// fused role its own part: k_proj of qkv_proj is [kv_heads*head_dim, hidden]).
std::vector<int64_t> RoleShape(const RoleSpec& spec, const ModelConfig& model);
// The shape of the checkpoint tensor the role is read from: RoleShape, or for
// a fused role the whole fused tensor, e.g. qkv_proj
// [(heads + 2*kv_heads) * head_dim, hidden].
std::vector<int64_t> RoleSourceShape(const RoleSpec& spec, const ModelConfig& model);
// The first row of the role's part in its fused checkpoint tensor (0 when not
// fused): q 0, k heads*head_dim, v (heads + kv_heads)*head_dim; gate 0, up
// intermediate.
int64_t RoleFusedRowOffset(const RoleSpec& spec, const ModelConfig& model);
// Whether the role is a linear projection weight that an FP8 checkpoint may
// store quantized (common/format/quantization.h): q/k/v/o_proj and
// gate/up/down_proj (and so Phi-3's fused qkv_proj and gate_up_proj). Never
// the embedding, lm_head, norms or biases.
bool RoleIsQuantizable(TensorRole role);

// Elements of the role's tensor: the product of RoleShape.
int64_t RoleNumel(const RoleSpec& spec, const ModelConfig& model);

// Parameters (elements, not bytes) of decoder layer `layer`: the sum of
// RoleNumel over the family's roles present in it (q/k/v/o projections,
// their biases per attention_bias, gate/up/down plus biases per mlp_bias, the
// RMSNorm weights: two, Gemma's four, Qwen3's and Gemma 3's per-head q/k
// norms; a sparse layer's router, every routed expert (num_experts times its
// gate/up/down) and the shared expert). Multiply by DTypeSize for bytes.
int64_t LayerParameterCount(const ModelConfig& model, int layer);
// The largest LayerParameterCount over the layers (every layer's, for a
// model whose layers are all alike).
int64_t LayerParameterCount(const ModelConfig& model);
// Of a sparse layer's parameters, those of its routed experts:
// num_experts * 3 * hidden * moe_intermediate (0 for a dense model).
int64_t LayerExpertParameterCount(const ModelConfig& model);
// Parameters of one decoder layer that every tp rank of its stage holds
// whole: the present per-layer roles with SplitKind::kReplicated (the
// RMSNorm weights, the row-parallel biases, the router), the largest over
// the layers.
int64_t LayerReplicatedParameterCount(const ModelConfig& model);
// Parameters of the whole model: embed_tokens, every layer's, the
// final norm and lm_head (not counted again when tied), i.e. the elements of
// every tensor of the checkpoint.
int64_t ModelParameterCount(const ModelConfig& model);

}  // namespace tessera
