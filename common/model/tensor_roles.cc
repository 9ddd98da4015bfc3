#include "common/model/tensor_roles.h"

#include <string_view>

#include "common/base/status.h"

namespace tessera {

namespace {

using D = RoleDim;
using P = RolePlace;
using S = SplitKind;
using C = RoleCondition;
using R = TensorRole;

// The rows below follow transformers' modeling code (names: the attributes of
// <Family>Model / <Family>DecoderLayer / <Family>Attention / <Family>MLP /
// <Family>ForCausalLM; shapes: nn.Linear(in, out) stores weight [out, in],
// nn.Embedding(vocab, hidden) stores [vocab, hidden], <Family>RMSNorm(hidden)
// stores [hidden]). The three families share the checkpoint layout and differ
// only in which biases exist.

// transformers/models/llama/modeling_llama.py
constexpr RoleSpec kLlama[] = {
    {R::kEmbedTokens,
     "model.embed_tokens.weight",
     P::kFirstStage,
     2,
     {D::kVocab, D::kHidden},
     S::kVocabParallel,
     false,
     C::kAlways,
     false,
     "LlamaModel.embed_tokens = nn.Embedding(vocab_size, hidden_size)"},
    {R::kInputNorm,
     "model.layers.{layer}.input_layernorm.weight",
     P::kLayer,
     1,
     {D::kHidden, D::kHidden},
     S::kReplicated,
     false,
     C::kAlways,
     false,
     "LlamaDecoderLayer.input_layernorm = LlamaRMSNorm(hidden_size)"},
    {R::kQProj,
     "model.layers.{layer}.self_attn.q_proj.weight",
     P::kLayer,
     2,
     {D::kQueryRows, D::kHidden},
     S::kColumnParallel,
     false,
     C::kAlways,
     false,
     "LlamaAttention.q_proj = nn.Linear(hidden_size, num_attention_heads * head_dim, "
     "bias=attention_bias)"},
    {R::kQBias,
     "model.layers.{layer}.self_attn.q_proj.bias",
     P::kLayer,
     1,
     {D::kQueryRows, D::kHidden},
     S::kColumnParallel,
     false,
     C::kAttentionBias,
     false,
     "LlamaAttention.q_proj (bias=attention_bias)"},
    {R::kKProj,
     "model.layers.{layer}.self_attn.k_proj.weight",
     P::kLayer,
     2,
     {D::kKvRows, D::kHidden},
     S::kColumnParallel,
     false,
     C::kAlways,
     false,
     "LlamaAttention.k_proj = nn.Linear(hidden_size, num_key_value_heads * head_dim, "
     "bias=attention_bias)"},
    {R::kKBias,
     "model.layers.{layer}.self_attn.k_proj.bias",
     P::kLayer,
     1,
     {D::kKvRows, D::kHidden},
     S::kColumnParallel,
     false,
     C::kAttentionBias,
     false,
     "LlamaAttention.k_proj (bias=attention_bias)"},
    {R::kVProj,
     "model.layers.{layer}.self_attn.v_proj.weight",
     P::kLayer,
     2,
     {D::kKvRows, D::kHidden},
     S::kColumnParallel,
     false,
     C::kAlways,
     false,
     "LlamaAttention.v_proj = nn.Linear(hidden_size, num_key_value_heads * head_dim, "
     "bias=attention_bias)"},
    {R::kVBias,
     "model.layers.{layer}.self_attn.v_proj.bias",
     P::kLayer,
     1,
     {D::kKvRows, D::kHidden},
     S::kColumnParallel,
     false,
     C::kAttentionBias,
     false,
     "LlamaAttention.v_proj (bias=attention_bias)"},
    {R::kOProj,
     "model.layers.{layer}.self_attn.o_proj.weight",
     P::kLayer,
     2,
     {D::kHidden, D::kQueryRows},
     S::kRowParallel,
     false,
     C::kAlways,
     false,
     "LlamaAttention.o_proj = nn.Linear(num_attention_heads * head_dim, hidden_size, "
     "bias=attention_bias)"},
    {R::kOBias,
     "model.layers.{layer}.self_attn.o_proj.bias",
     P::kLayer,
     1,
     {D::kHidden, D::kHidden},
     S::kReplicated,
     true,
     C::kAttentionBias,
     false,
     "LlamaAttention.o_proj (bias=attention_bias)"},
    {R::kPostAttentionNorm,
     "model.layers.{layer}.post_attention_layernorm.weight",
     P::kLayer,
     1,
     {D::kHidden, D::kHidden},
     S::kReplicated,
     false,
     C::kAlways,
     false,
     "LlamaDecoderLayer.post_attention_layernorm = LlamaRMSNorm(hidden_size)"},
    {R::kGateProj,
     "model.layers.{layer}.mlp.gate_proj.weight",
     P::kLayer,
     2,
     {D::kIntermediate, D::kHidden},
     S::kColumnParallel,
     false,
     C::kAlways,
     false,
     "LlamaMLP.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=mlp_bias)"},
    {R::kGateBias,
     "model.layers.{layer}.mlp.gate_proj.bias",
     P::kLayer,
     1,
     {D::kIntermediate, D::kHidden},
     S::kColumnParallel,
     false,
     C::kMlpBias,
     false,
     "LlamaMLP.gate_proj (bias=mlp_bias)"},
    {R::kUpProj,
     "model.layers.{layer}.mlp.up_proj.weight",
     P::kLayer,
     2,
     {D::kIntermediate, D::kHidden},
     S::kColumnParallel,
     false,
     C::kAlways,
     false,
     "LlamaMLP.up_proj = nn.Linear(hidden_size, intermediate_size, bias=mlp_bias)"},
    {R::kUpBias,
     "model.layers.{layer}.mlp.up_proj.bias",
     P::kLayer,
     1,
     {D::kIntermediate, D::kHidden},
     S::kColumnParallel,
     false,
     C::kMlpBias,
     false,
     "LlamaMLP.up_proj (bias=mlp_bias)"},
    {R::kDownProj,
     "model.layers.{layer}.mlp.down_proj.weight",
     P::kLayer,
     2,
     {D::kHidden, D::kIntermediate},
     S::kRowParallel,
     false,
     C::kAlways,
     false,
     "LlamaMLP.down_proj = nn.Linear(intermediate_size, hidden_size, bias=mlp_bias)"},
    {R::kDownBias,
     "model.layers.{layer}.mlp.down_proj.bias",
     P::kLayer,
     1,
     {D::kHidden, D::kHidden},
     S::kReplicated,
     true,
     C::kMlpBias,
     false,
     "LlamaMLP.down_proj (bias=mlp_bias)"},
    {R::kFinalNorm,
     "model.norm.weight",
     P::kLastStage,
     1,
     {D::kHidden, D::kHidden},
     S::kReplicated,
     false,
     C::kAlways,
     false,
     "LlamaModel.norm = LlamaRMSNorm(hidden_size)"},
    {R::kLmHead,
     "lm_head.weight",
     P::kLastStage,
     2,
     {D::kVocab, D::kHidden},
     S::kVocabParallel,
     false,
     C::kAlways,
     true,
     "LlamaForCausalLM.lm_head = nn.Linear(hidden_size, vocab_size, bias=False); "
     "_tied_weights_keys = [\"lm_head.weight\"] (absent when tie_word_embeddings)"},
};

// transformers/models/mistral/modeling_mistral.py: Llama's layout, no biases
// (MistralAttention's and MistralMLP's nn.Linear all have bias=False).
constexpr RoleSpec kMistral[] = {
    {R::kEmbedTokens,
     "model.embed_tokens.weight",
     P::kFirstStage,
     2,
     {D::kVocab, D::kHidden},
     S::kVocabParallel,
     false,
     C::kAlways,
     false,
     "MistralModel.embed_tokens = nn.Embedding(vocab_size, hidden_size)"},
    {R::kInputNorm,
     "model.layers.{layer}.input_layernorm.weight",
     P::kLayer,
     1,
     {D::kHidden, D::kHidden},
     S::kReplicated,
     false,
     C::kAlways,
     false,
     "MistralDecoderLayer.input_layernorm = MistralRMSNorm(hidden_size)"},
    {R::kQProj,
     "model.layers.{layer}.self_attn.q_proj.weight",
     P::kLayer,
     2,
     {D::kQueryRows, D::kHidden},
     S::kColumnParallel,
     false,
     C::kAlways,
     false,
     "MistralAttention.q_proj = nn.Linear(hidden_size, num_attention_heads * head_dim, "
     "bias=False)"},
    {R::kKProj,
     "model.layers.{layer}.self_attn.k_proj.weight",
     P::kLayer,
     2,
     {D::kKvRows, D::kHidden},
     S::kColumnParallel,
     false,
     C::kAlways,
     false,
     "MistralAttention.k_proj = nn.Linear(hidden_size, num_key_value_heads * head_dim, "
     "bias=False)"},
    {R::kVProj,
     "model.layers.{layer}.self_attn.v_proj.weight",
     P::kLayer,
     2,
     {D::kKvRows, D::kHidden},
     S::kColumnParallel,
     false,
     C::kAlways,
     false,
     "MistralAttention.v_proj = nn.Linear(hidden_size, num_key_value_heads * head_dim, "
     "bias=False)"},
    {R::kOProj,
     "model.layers.{layer}.self_attn.o_proj.weight",
     P::kLayer,
     2,
     {D::kHidden, D::kQueryRows},
     S::kRowParallel,
     false,
     C::kAlways,
     false,
     "MistralAttention.o_proj = nn.Linear(num_attention_heads * head_dim, hidden_size, "
     "bias=False)"},
    {R::kPostAttentionNorm,
     "model.layers.{layer}.post_attention_layernorm.weight",
     P::kLayer,
     1,
     {D::kHidden, D::kHidden},
     S::kReplicated,
     false,
     C::kAlways,
     false,
     "MistralDecoderLayer.post_attention_layernorm = MistralRMSNorm(hidden_size)"},
    {R::kGateProj,
     "model.layers.{layer}.mlp.gate_proj.weight",
     P::kLayer,
     2,
     {D::kIntermediate, D::kHidden},
     S::kColumnParallel,
     false,
     C::kAlways,
     false,
     "MistralMLP.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)"},
    {R::kUpProj,
     "model.layers.{layer}.mlp.up_proj.weight",
     P::kLayer,
     2,
     {D::kIntermediate, D::kHidden},
     S::kColumnParallel,
     false,
     C::kAlways,
     false,
     "MistralMLP.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)"},
    {R::kDownProj,
     "model.layers.{layer}.mlp.down_proj.weight",
     P::kLayer,
     2,
     {D::kHidden, D::kIntermediate},
     S::kRowParallel,
     false,
     C::kAlways,
     false,
     "MistralMLP.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)"},
    {R::kFinalNorm,
     "model.norm.weight",
     P::kLastStage,
     1,
     {D::kHidden, D::kHidden},
     S::kReplicated,
     false,
     C::kAlways,
     false,
     "MistralModel.norm = MistralRMSNorm(hidden_size)"},
    {R::kLmHead,
     "lm_head.weight",
     P::kLastStage,
     2,
     {D::kVocab, D::kHidden},
     S::kVocabParallel,
     false,
     C::kAlways,
     true,
     "MistralForCausalLM.lm_head = nn.Linear(hidden_size, vocab_size, bias=False); "
     "_tied_weights_keys = [\"lm_head.weight\"] (absent when tie_word_embeddings)"},
};

// transformers/models/qwen2/modeling_qwen2.py: q/k/v biases (Qwen2Attention
// hard-codes bias=True for them, and ParseModelConfig sets attention_bias for
// every Qwen2 config), none on o_proj or the MLP.
constexpr RoleSpec kQwen2[] = {
    {R::kEmbedTokens,
     "model.embed_tokens.weight",
     P::kFirstStage,
     2,
     {D::kVocab, D::kHidden},
     S::kVocabParallel,
     false,
     C::kAlways,
     false,
     "Qwen2Model.embed_tokens = nn.Embedding(vocab_size, hidden_size)"},
    {R::kInputNorm,
     "model.layers.{layer}.input_layernorm.weight",
     P::kLayer,
     1,
     {D::kHidden, D::kHidden},
     S::kReplicated,
     false,
     C::kAlways,
     false,
     "Qwen2DecoderLayer.input_layernorm = Qwen2RMSNorm(hidden_size)"},
    {R::kQProj,
     "model.layers.{layer}.self_attn.q_proj.weight",
     P::kLayer,
     2,
     {D::kQueryRows, D::kHidden},
     S::kColumnParallel,
     false,
     C::kAlways,
     false,
     "Qwen2Attention.q_proj = nn.Linear(hidden_size, num_attention_heads * head_dim, "
     "bias=True)"},
    {R::kQBias,
     "model.layers.{layer}.self_attn.q_proj.bias",
     P::kLayer,
     1,
     {D::kQueryRows, D::kHidden},
     S::kColumnParallel,
     false,
     C::kAttentionBias,
     false,
     "Qwen2Attention.q_proj (bias=True)"},
    {R::kKProj,
     "model.layers.{layer}.self_attn.k_proj.weight",
     P::kLayer,
     2,
     {D::kKvRows, D::kHidden},
     S::kColumnParallel,
     false,
     C::kAlways,
     false,
     "Qwen2Attention.k_proj = nn.Linear(hidden_size, num_key_value_heads * head_dim, "
     "bias=True)"},
    {R::kKBias,
     "model.layers.{layer}.self_attn.k_proj.bias",
     P::kLayer,
     1,
     {D::kKvRows, D::kHidden},
     S::kColumnParallel,
     false,
     C::kAttentionBias,
     false,
     "Qwen2Attention.k_proj (bias=True)"},
    {R::kVProj,
     "model.layers.{layer}.self_attn.v_proj.weight",
     P::kLayer,
     2,
     {D::kKvRows, D::kHidden},
     S::kColumnParallel,
     false,
     C::kAlways,
     false,
     "Qwen2Attention.v_proj = nn.Linear(hidden_size, num_key_value_heads * head_dim, "
     "bias=True)"},
    {R::kVBias,
     "model.layers.{layer}.self_attn.v_proj.bias",
     P::kLayer,
     1,
     {D::kKvRows, D::kHidden},
     S::kColumnParallel,
     false,
     C::kAttentionBias,
     false,
     "Qwen2Attention.v_proj (bias=True)"},
    {R::kOProj,
     "model.layers.{layer}.self_attn.o_proj.weight",
     P::kLayer,
     2,
     {D::kHidden, D::kQueryRows},
     S::kRowParallel,
     false,
     C::kAlways,
     false,
     "Qwen2Attention.o_proj = nn.Linear(num_attention_heads * head_dim, hidden_size, "
     "bias=False)"},
    {R::kPostAttentionNorm,
     "model.layers.{layer}.post_attention_layernorm.weight",
     P::kLayer,
     1,
     {D::kHidden, D::kHidden},
     S::kReplicated,
     false,
     C::kAlways,
     false,
     "Qwen2DecoderLayer.post_attention_layernorm = Qwen2RMSNorm(hidden_size)"},
    {R::kGateProj,
     "model.layers.{layer}.mlp.gate_proj.weight",
     P::kLayer,
     2,
     {D::kIntermediate, D::kHidden},
     S::kColumnParallel,
     false,
     C::kAlways,
     false,
     "Qwen2MLP.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)"},
    {R::kUpProj,
     "model.layers.{layer}.mlp.up_proj.weight",
     P::kLayer,
     2,
     {D::kIntermediate, D::kHidden},
     S::kColumnParallel,
     false,
     C::kAlways,
     false,
     "Qwen2MLP.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)"},
    {R::kDownProj,
     "model.layers.{layer}.mlp.down_proj.weight",
     P::kLayer,
     2,
     {D::kHidden, D::kIntermediate},
     S::kRowParallel,
     false,
     C::kAlways,
     false,
     "Qwen2MLP.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)"},
    {R::kFinalNorm,
     "model.norm.weight",
     P::kLastStage,
     1,
     {D::kHidden, D::kHidden},
     S::kReplicated,
     false,
     C::kAlways,
     false,
     "Qwen2Model.norm = Qwen2RMSNorm(hidden_size)"},
    {R::kLmHead,
     "lm_head.weight",
     P::kLastStage,
     2,
     {D::kVocab, D::kHidden},
     S::kVocabParallel,
     false,
     C::kAlways,
     true,
     "Qwen2ForCausalLM.lm_head = nn.Linear(hidden_size, vocab_size, bias=False); "
     "_tied_weights_keys = [\"lm_head.weight\"] (absent when tie_word_embeddings)"},
};

const FamilyRoles kFamilies[] = {
    {Architecture::kLlama, "transformers/models/llama/modeling_llama.py", kLlama},
    {Architecture::kMistral, "transformers/models/mistral/modeling_mistral.py", kMistral},
    {Architecture::kQwen2, "transformers/models/qwen2/modeling_qwen2.py", kQwen2},
};

constexpr Architecture kArchitectures[] = {Architecture::kLlama, Architecture::kMistral,
                                           Architecture::kQwen2};

const RoleSpec& EmbeddingOf(const FamilyRoles& family) {
  for (const RoleSpec& s : family.roles) {
    if (s.role == TensorRole::kEmbedTokens) return s;
  }
  TESSERA_CHECK(false);  // every family has an embedding
  return family.roles.front();
}

}  // namespace

const char* SplitKindName(SplitKind kind) {
  switch (kind) {
    case SplitKind::kReplicated:
      return "replicated";
    case SplitKind::kColumnParallel:
      return "column-parallel";
    case SplitKind::kRowParallel:
      return "row-parallel";
    case SplitKind::kVocabParallel:
      return "vocab-parallel";
  }
  return "?";
}

const char* TensorRoleName(TensorRole role) {
  switch (role) {
    case TensorRole::kEmbedTokens:
      return "embed_tokens";
    case TensorRole::kInputNorm:
      return "input_layernorm";
    case TensorRole::kQProj:
      return "q_proj";
    case TensorRole::kQBias:
      return "q_proj.bias";
    case TensorRole::kKProj:
      return "k_proj";
    case TensorRole::kKBias:
      return "k_proj.bias";
    case TensorRole::kVProj:
      return "v_proj";
    case TensorRole::kVBias:
      return "v_proj.bias";
    case TensorRole::kOProj:
      return "o_proj";
    case TensorRole::kOBias:
      return "o_proj.bias";
    case TensorRole::kPostAttentionNorm:
      return "post_attention_layernorm";
    case TensorRole::kGateProj:
      return "gate_proj";
    case TensorRole::kGateBias:
      return "gate_proj.bias";
    case TensorRole::kUpProj:
      return "up_proj";
    case TensorRole::kUpBias:
      return "up_proj.bias";
    case TensorRole::kDownProj:
      return "down_proj";
    case TensorRole::kDownBias:
      return "down_proj.bias";
    case TensorRole::kFinalNorm:
      return "norm";
    case TensorRole::kLmHead:
      return "lm_head";
  }
  return "?";
}

int64_t RoleDimSize(RoleDim dim, const ModelConfig& model) {
  switch (dim) {
    case RoleDim::kHidden:
      return model.hidden_size;
    case RoleDim::kQueryRows:
      return model.num_attention_heads * model.head_dim;
    case RoleDim::kKvRows:
      return model.num_key_value_heads * model.head_dim;
    case RoleDim::kIntermediate:
      return model.intermediate_size;
    case RoleDim::kVocab:
      return model.vocab_size;
  }
  return 0;
}

const FamilyRoles& FamilyRolesOf(Architecture arch) {
  for (const FamilyRoles& f : kFamilies) {
    if (f.architecture == arch) return f;
  }
  TESSERA_CHECK(false);  // every Architecture has a table (tensor_roles_test checks)
  return kFamilies[0];
}

std::span<const Architecture> AllArchitectures() { return kArchitectures; }

bool RolePresent(const RoleSpec& spec, const ModelConfig& model) {
  switch (spec.condition) {
    case RoleCondition::kAlways:
      return true;
    case RoleCondition::kAttentionBias:
      return model.attention_bias;
    case RoleCondition::kMlpBias:
      return model.mlp_bias;
  }
  return false;
}

bool RoleIsTied(const RoleSpec& spec, const ModelConfig& model) {
  return spec.tied_to_embedding && model.tie_word_embeddings;
}

std::string RoleTensorName(const RoleSpec& spec, int layer) {
  std::string name = spec.hf_name;
  if (spec.place != RolePlace::kLayer) return name;
  constexpr std::string_view kLayer = "{layer}";
  const size_t at = name.find(kLayer);
  TESSERA_CHECK(at != std::string::npos);  // per-layer patterns name the layer
  name.replace(at, kLayer.size(), std::to_string(layer));
  return name;
}

std::string RoleSourceName(const RoleSpec& spec, const ModelConfig& model, int layer) {
  if (RoleIsTied(spec, model)) {
    return RoleTensorName(EmbeddingOf(FamilyRolesOf(model.architecture)), layer);
  }
  return RoleTensorName(spec, layer);
}

std::vector<int64_t> RoleShape(const RoleSpec& spec, const ModelConfig& model) {
  std::vector<int64_t> shape;
  for (int d = 0; d < spec.ndim; ++d) shape.push_back(RoleDimSize(spec.shape[d], model));
  return shape;
}

int64_t RoleNumel(const RoleSpec& spec, const ModelConfig& model) {
  int64_t n = 1;
  for (int d = 0; d < spec.ndim; ++d) n *= RoleDimSize(spec.shape[d], model);
  return n;
}

int64_t LayerParameterCount(const ModelConfig& model) {
  int64_t n = 0;
  for (const RoleSpec& s : FamilyRolesOf(model.architecture).roles) {
    if (s.place == RolePlace::kLayer && RolePresent(s, model)) n += RoleNumel(s, model);
  }
  return n;
}

int64_t LayerReplicatedParameterCount(const ModelConfig& model) {
  int64_t n = 0;
  for (const RoleSpec& s : FamilyRolesOf(model.architecture).roles) {
    if (s.place == RolePlace::kLayer && s.split == SplitKind::kReplicated &&
        RolePresent(s, model)) {
      n += RoleNumel(s, model);
    }
  }
  return n;
}

int64_t ModelParameterCount(const ModelConfig& model) {
  int64_t n = model.num_hidden_layers * LayerParameterCount(model);
  for (const RoleSpec& s : FamilyRolesOf(model.architecture).roles) {
    if (s.place != RolePlace::kLayer && RolePresent(s, model) && !RoleIsTied(s, model)) {
      n += RoleNumel(s, model);
    }
  }
  return n;
}

}  // namespace tessera
