#include "common/model/tensor_roles.h"

#include <algorithm>
#include <string_view>

#include "common/base/status.h"
#include "common/model/role_rows.h"

namespace tessera {

namespace {

using namespace role_rows;  // NOLINT: the row builders

// The rows below follow transformers' modeling code (names: the attributes of
// <Family>Model / <Family>DecoderLayer / <Family>Attention / <Family>MLP /
// <Family>ForCausalLM; shapes: nn.Linear(in, out) stores weight [out, in],
// nn.Embedding(vocab, hidden) stores [vocab, hidden], <Family>RMSNorm(hidden)
// stores [hidden]). Llama, Mistral and Qwen2 share the checkpoint layout and
// differ only in which biases exist; Qwen3 adds per-head q/k norms; Phi-3
// fuses q/k/v and gate/up in the checkpoint; Gemma 2 and 3 add norms after
// attention and the MLP (and Gemma 3 Qwen3's q/k norms).

// transformers/models/llama/modeling_llama.py
constexpr RoleSpec kLlama[] = {
    Matrix(R::kEmbedTokens, "model.embed_tokens.weight", P::kFirstStage, D::kVocab, D::kHidden,
           S::kVocabParallel, "LlamaModel.embed_tokens = nn.Embedding(vocab_size, hidden_size)"),
    Norm(R::kInputNorm, "model.layers.{layer}.input_layernorm.weight", P::kLayer,
         "LlamaDecoderLayer.input_layernorm = LlamaRMSNorm(hidden_size)"),
    Matrix(R::kQProj, "model.layers.{layer}.self_attn.q_proj.weight", P::kLayer, D::kQueryRows,
           D::kHidden, S::kColumnParallel,
           "LlamaAttention.q_proj = nn.Linear(hidden_size, num_attention_heads * head_dim, "
           "bias=attention_bias)"),
    Vector(R::kQBias, "model.layers.{layer}.self_attn.q_proj.bias", D::kQueryRows,
           S::kColumnParallel, C::kAttentionBias, "LlamaAttention.q_proj.bias"),
    Matrix(R::kKProj, "model.layers.{layer}.self_attn.k_proj.weight", P::kLayer, D::kKvRows,
           D::kHidden, S::kColumnParallel,
           "LlamaAttention.k_proj = nn.Linear(hidden_size, num_key_value_heads * head_dim, "
           "bias=attention_bias)"),
    Vector(R::kKBias, "model.layers.{layer}.self_attn.k_proj.bias", D::kKvRows, S::kColumnParallel,
           C::kAttentionBias, "LlamaAttention.k_proj.bias"),
    Matrix(R::kVProj, "model.layers.{layer}.self_attn.v_proj.weight", P::kLayer, D::kKvRows,
           D::kHidden, S::kColumnParallel,
           "LlamaAttention.v_proj = nn.Linear(hidden_size, num_key_value_heads * head_dim, "
           "bias=attention_bias)"),
    Vector(R::kVBias, "model.layers.{layer}.self_attn.v_proj.bias", D::kKvRows, S::kColumnParallel,
           C::kAttentionBias, "LlamaAttention.v_proj.bias"),
    Matrix(R::kOProj, "model.layers.{layer}.self_attn.o_proj.weight", P::kLayer, D::kHidden,
           D::kQueryRows, S::kRowParallel,
           "LlamaAttention.o_proj = nn.Linear(num_attention_heads * head_dim, hidden_size, "
           "bias=attention_bias)"),
    RowBias(R::kOBias, "model.layers.{layer}.self_attn.o_proj.bias", C::kAttentionBias,
            "LlamaAttention.o_proj.bias"),
    Norm(R::kPostAttentionNorm, "model.layers.{layer}.post_attention_layernorm.weight", P::kLayer,
         "LlamaDecoderLayer.post_attention_layernorm = LlamaRMSNorm(hidden_size)"),
    Matrix(R::kGateProj, "model.layers.{layer}.mlp.gate_proj.weight", P::kLayer, D::kIntermediate,
           D::kHidden, S::kColumnParallel,
           "LlamaMLP.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=mlp_bias)"),
    Vector(R::kGateBias, "model.layers.{layer}.mlp.gate_proj.bias", D::kIntermediate,
           S::kColumnParallel, C::kMlpBias, "LlamaMLP.gate_proj.bias"),
    Matrix(R::kUpProj, "model.layers.{layer}.mlp.up_proj.weight", P::kLayer, D::kIntermediate,
           D::kHidden, S::kColumnParallel,
           "LlamaMLP.up_proj = nn.Linear(hidden_size, intermediate_size, bias=mlp_bias)"),
    Vector(R::kUpBias, "model.layers.{layer}.mlp.up_proj.bias", D::kIntermediate,
           S::kColumnParallel, C::kMlpBias, "LlamaMLP.up_proj.bias"),
    Matrix(R::kDownProj, "model.layers.{layer}.mlp.down_proj.weight", P::kLayer, D::kHidden,
           D::kIntermediate, S::kRowParallel,
           "LlamaMLP.down_proj = nn.Linear(intermediate_size, hidden_size, bias=mlp_bias)"),
    RowBias(R::kDownBias, "model.layers.{layer}.mlp.down_proj.bias", C::kMlpBias,
            "LlamaMLP.down_proj.bias"),
    Norm(R::kFinalNorm, "model.norm.weight", P::kLastStage,
         "LlamaModel.norm = LlamaRMSNorm(hidden_size)"),
    LmHead("LlamaForCausalLM.lm_head = nn.Linear(hidden_size, vocab_size, bias=False); tied to "
           "embed_tokens (absent from the checkpoint) when tie_word_embeddings"),
};

// transformers/models/mistral/modeling_mistral.py
// Llama's layout without biases (MistralAttention's and MistralMLP's
// nn.Linear all have bias=False).
constexpr RoleSpec kMistral[] = {
    Matrix(R::kEmbedTokens, "model.embed_tokens.weight", P::kFirstStage, D::kVocab, D::kHidden,
           S::kVocabParallel, "MistralModel.embed_tokens = nn.Embedding(vocab_size, hidden_size)"),
    Norm(R::kInputNorm, "model.layers.{layer}.input_layernorm.weight", P::kLayer,
         "MistralDecoderLayer.input_layernorm = MistralRMSNorm(hidden_size)"),
    Matrix(R::kQProj, "model.layers.{layer}.self_attn.q_proj.weight", P::kLayer, D::kQueryRows,
           D::kHidden, S::kColumnParallel,
           "MistralAttention.q_proj = nn.Linear(hidden_size, num_attention_heads * head_dim, "
           "bias=False)"),
    Matrix(R::kKProj, "model.layers.{layer}.self_attn.k_proj.weight", P::kLayer, D::kKvRows,
           D::kHidden, S::kColumnParallel,
           "MistralAttention.k_proj = nn.Linear(hidden_size, num_key_value_heads * head_dim, "
           "bias=False)"),
    Matrix(R::kVProj, "model.layers.{layer}.self_attn.v_proj.weight", P::kLayer, D::kKvRows,
           D::kHidden, S::kColumnParallel,
           "MistralAttention.v_proj = nn.Linear(hidden_size, num_key_value_heads * head_dim, "
           "bias=False)"),
    Matrix(R::kOProj, "model.layers.{layer}.self_attn.o_proj.weight", P::kLayer, D::kHidden,
           D::kQueryRows, S::kRowParallel,
           "MistralAttention.o_proj = nn.Linear(num_attention_heads * head_dim, hidden_size, "
           "bias=False)"),
    Norm(R::kPostAttentionNorm, "model.layers.{layer}.post_attention_layernorm.weight", P::kLayer,
         "MistralDecoderLayer.post_attention_layernorm = MistralRMSNorm(hidden_size)"),
    Matrix(R::kGateProj, "model.layers.{layer}.mlp.gate_proj.weight", P::kLayer, D::kIntermediate,
           D::kHidden, S::kColumnParallel,
           "MistralMLP.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)"),
    Matrix(R::kUpProj, "model.layers.{layer}.mlp.up_proj.weight", P::kLayer, D::kIntermediate,
           D::kHidden, S::kColumnParallel,
           "MistralMLP.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)"),
    Matrix(R::kDownProj, "model.layers.{layer}.mlp.down_proj.weight", P::kLayer, D::kHidden,
           D::kIntermediate, S::kRowParallel,
           "MistralMLP.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)"),
    Norm(R::kFinalNorm, "model.norm.weight", P::kLastStage,
         "MistralModel.norm = MistralRMSNorm(hidden_size)"),
    LmHead("MistralForCausalLM.lm_head = nn.Linear(hidden_size, vocab_size, bias=False); tied to "
           "embed_tokens (absent from the checkpoint) when tie_word_embeddings"),
};

// transformers/models/qwen2/modeling_qwen2.py
// q/k/v biases (Qwen2Attention hard-codes bias=True for them, and
// ParseModelConfig sets attention_bias for every Qwen2 config), none on
// o_proj or the MLP.
constexpr RoleSpec kQwen2[] = {
    Matrix(R::kEmbedTokens, "model.embed_tokens.weight", P::kFirstStage, D::kVocab, D::kHidden,
           S::kVocabParallel, "Qwen2Model.embed_tokens = nn.Embedding(vocab_size, hidden_size)"),
    Norm(R::kInputNorm, "model.layers.{layer}.input_layernorm.weight", P::kLayer,
         "Qwen2DecoderLayer.input_layernorm = Qwen2RMSNorm(hidden_size)"),
    Matrix(R::kQProj, "model.layers.{layer}.self_attn.q_proj.weight", P::kLayer, D::kQueryRows,
           D::kHidden, S::kColumnParallel,
           "Qwen2Attention.q_proj = nn.Linear(hidden_size, num_attention_heads * head_dim, "
           "bias=True)"),
    Vector(R::kQBias, "model.layers.{layer}.self_attn.q_proj.bias", D::kQueryRows,
           S::kColumnParallel, C::kAttentionBias, "Qwen2Attention.q_proj.bias"),
    Matrix(R::kKProj, "model.layers.{layer}.self_attn.k_proj.weight", P::kLayer, D::kKvRows,
           D::kHidden, S::kColumnParallel,
           "Qwen2Attention.k_proj = nn.Linear(hidden_size, num_key_value_heads * head_dim, "
           "bias=True)"),
    Vector(R::kKBias, "model.layers.{layer}.self_attn.k_proj.bias", D::kKvRows, S::kColumnParallel,
           C::kAttentionBias, "Qwen2Attention.k_proj.bias"),
    Matrix(R::kVProj, "model.layers.{layer}.self_attn.v_proj.weight", P::kLayer, D::kKvRows,
           D::kHidden, S::kColumnParallel,
           "Qwen2Attention.v_proj = nn.Linear(hidden_size, num_key_value_heads * head_dim, "
           "bias=True)"),
    Vector(R::kVBias, "model.layers.{layer}.self_attn.v_proj.bias", D::kKvRows, S::kColumnParallel,
           C::kAttentionBias, "Qwen2Attention.v_proj.bias"),
    Matrix(R::kOProj, "model.layers.{layer}.self_attn.o_proj.weight", P::kLayer, D::kHidden,
           D::kQueryRows, S::kRowParallel,
           "Qwen2Attention.o_proj = nn.Linear(num_attention_heads * head_dim, hidden_size, "
           "bias=False)"),
    Norm(R::kPostAttentionNorm, "model.layers.{layer}.post_attention_layernorm.weight", P::kLayer,
         "Qwen2DecoderLayer.post_attention_layernorm = Qwen2RMSNorm(hidden_size)"),
    Matrix(R::kGateProj, "model.layers.{layer}.mlp.gate_proj.weight", P::kLayer, D::kIntermediate,
           D::kHidden, S::kColumnParallel,
           "Qwen2MLP.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)"),
    Matrix(R::kUpProj, "model.layers.{layer}.mlp.up_proj.weight", P::kLayer, D::kIntermediate,
           D::kHidden, S::kColumnParallel,
           "Qwen2MLP.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)"),
    Matrix(R::kDownProj, "model.layers.{layer}.mlp.down_proj.weight", P::kLayer, D::kHidden,
           D::kIntermediate, S::kRowParallel,
           "Qwen2MLP.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)"),
    Norm(R::kFinalNorm, "model.norm.weight", P::kLastStage,
         "Qwen2Model.norm = Qwen2RMSNorm(hidden_size)"),
    LmHead("Qwen2ForCausalLM.lm_head = nn.Linear(hidden_size, vocab_size, bias=False); tied to "
           "embed_tokens (absent from the checkpoint) when tie_word_embeddings"),
};

// transformers/models/qwen3/modeling_qwen3.py
// Llama's layout (q/k/v/o biases with attention_bias, which Qwen3 configs
// leave false; no MLP biases) plus the per-head q_norm and k_norm of
// Qwen3Attention, applied to each head of q and k before RoPE.
constexpr RoleSpec kQwen3[] = {
    Matrix(R::kEmbedTokens, "model.embed_tokens.weight", P::kFirstStage, D::kVocab, D::kHidden,
           S::kVocabParallel, "Qwen3Model.embed_tokens = nn.Embedding(vocab_size, hidden_size)"),
    Norm(R::kInputNorm, "model.layers.{layer}.input_layernorm.weight", P::kLayer,
         "Qwen3DecoderLayer.input_layernorm = Qwen3RMSNorm(hidden_size)"),
    Matrix(R::kQProj, "model.layers.{layer}.self_attn.q_proj.weight", P::kLayer, D::kQueryRows,
           D::kHidden, S::kColumnParallel,
           "Qwen3Attention.q_proj = nn.Linear(hidden_size, num_attention_heads * head_dim, "
           "bias=attention_bias)"),
    Vector(R::kQBias, "model.layers.{layer}.self_attn.q_proj.bias", D::kQueryRows,
           S::kColumnParallel, C::kAttentionBias, "Qwen3Attention.q_proj.bias"),
    Matrix(R::kKProj, "model.layers.{layer}.self_attn.k_proj.weight", P::kLayer, D::kKvRows,
           D::kHidden, S::kColumnParallel,
           "Qwen3Attention.k_proj = nn.Linear(hidden_size, num_key_value_heads * head_dim, "
           "bias=attention_bias)"),
    Vector(R::kKBias, "model.layers.{layer}.self_attn.k_proj.bias", D::kKvRows, S::kColumnParallel,
           C::kAttentionBias, "Qwen3Attention.k_proj.bias"),
    Matrix(R::kVProj, "model.layers.{layer}.self_attn.v_proj.weight", P::kLayer, D::kKvRows,
           D::kHidden, S::kColumnParallel,
           "Qwen3Attention.v_proj = nn.Linear(hidden_size, num_key_value_heads * head_dim, "
           "bias=attention_bias)"),
    Vector(R::kVBias, "model.layers.{layer}.self_attn.v_proj.bias", D::kKvRows, S::kColumnParallel,
           C::kAttentionBias, "Qwen3Attention.v_proj.bias"),
    HeadNorm(R::kQNorm, "model.layers.{layer}.self_attn.q_norm.weight",
             "Qwen3Attention.q_norm = Qwen3RMSNorm(head_dim)"),
    HeadNorm(R::kKNorm, "model.layers.{layer}.self_attn.k_norm.weight",
             "Qwen3Attention.k_norm = Qwen3RMSNorm(head_dim)"),
    Matrix(R::kOProj, "model.layers.{layer}.self_attn.o_proj.weight", P::kLayer, D::kHidden,
           D::kQueryRows, S::kRowParallel,
           "Qwen3Attention.o_proj = nn.Linear(num_attention_heads * head_dim, hidden_size, "
           "bias=attention_bias)"),
    RowBias(R::kOBias, "model.layers.{layer}.self_attn.o_proj.bias", C::kAttentionBias,
            "Qwen3Attention.o_proj.bias"),
    Norm(R::kPostAttentionNorm, "model.layers.{layer}.post_attention_layernorm.weight", P::kLayer,
         "Qwen3DecoderLayer.post_attention_layernorm = Qwen3RMSNorm(hidden_size)"),
    Matrix(R::kGateProj, "model.layers.{layer}.mlp.gate_proj.weight", P::kLayer, D::kIntermediate,
           D::kHidden, S::kColumnParallel,
           "Qwen3MLP.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)"),
    Matrix(R::kUpProj, "model.layers.{layer}.mlp.up_proj.weight", P::kLayer, D::kIntermediate,
           D::kHidden, S::kColumnParallel,
           "Qwen3MLP.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)"),
    Matrix(R::kDownProj, "model.layers.{layer}.mlp.down_proj.weight", P::kLayer, D::kHidden,
           D::kIntermediate, S::kRowParallel,
           "Qwen3MLP.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)"),
    Norm(R::kFinalNorm, "model.norm.weight", P::kLastStage,
         "Qwen3Model.norm = Qwen3RMSNorm(hidden_size)"),
    LmHead("Qwen3ForCausalLM.lm_head = nn.Linear(hidden_size, vocab_size, bias=False); tied to "
           "embed_tokens (absent from the checkpoint) when tie_word_embeddings"),
};

// transformers/models/phi3/modeling_phi3.py
// Llama's decoder with fused checkpoint tensors: Phi3Attention.qkv_proj
// stacks q, k and v rows, Phi3MLP.gate_up_proj stacks gate and up rows (its
// forward: gate, up = gate_up_proj(x).chunk(2, dim=-1)). Each role is read
// from its own rows of the fused tensor. No biases.
constexpr RoleSpec kPhi3[] = {
    Matrix(R::kEmbedTokens, "model.embed_tokens.weight", P::kFirstStage, D::kVocab, D::kHidden,
           S::kVocabParallel, "Phi3Model.embed_tokens = nn.Embedding(vocab_size, hidden_size)"),
    Norm(R::kInputNorm, "model.layers.{layer}.input_layernorm.weight", P::kLayer,
         "Phi3DecoderLayer.input_layernorm = Phi3RMSNorm(hidden_size)"),
    FusedMatrix(R::kQProj, "model.layers.{layer}.self_attn.qkv_proj.weight", D::kQueryRows,
                FusedTensor::kQkv,
                "Phi3Attention.qkv_proj = nn.Linear(hidden_size, (num_attention_heads + 2 * "
                "num_key_value_heads) * head_dim, bias=False), rows [0, heads * head_dim)"),
    FusedMatrix(R::kKProj, "model.layers.{layer}.self_attn.qkv_proj.weight", D::kKvRows,
                FusedTensor::kQkv,
                "Phi3Attention.qkv_proj rows [heads * head_dim, (heads + kv_heads) * head_dim)"),
    FusedMatrix(R::kVProj, "model.layers.{layer}.self_attn.qkv_proj.weight", D::kKvRows,
                FusedTensor::kQkv,
                "Phi3Attention.qkv_proj rows [(heads + kv_heads) * head_dim, (heads + 2 * "
                "kv_heads) * head_dim)"),
    Matrix(R::kOProj, "model.layers.{layer}.self_attn.o_proj.weight", P::kLayer, D::kHidden,
           D::kQueryRows, S::kRowParallel,
           "Phi3Attention.o_proj = nn.Linear(num_attention_heads * head_dim, hidden_size, "
           "bias=False)"),
    Norm(R::kPostAttentionNorm, "model.layers.{layer}.post_attention_layernorm.weight", P::kLayer,
         "Phi3DecoderLayer.post_attention_layernorm = Phi3RMSNorm(hidden_size)"),
    FusedMatrix(R::kGateProj, "model.layers.{layer}.mlp.gate_up_proj.weight", D::kIntermediate,
                FusedTensor::kGateUp,
                "Phi3MLP.gate_up_proj = nn.Linear(hidden_size, 2 * intermediate_size, bias=False), "
                "rows [0, intermediate_size)"),
    FusedMatrix(R::kUpProj, "model.layers.{layer}.mlp.gate_up_proj.weight", D::kIntermediate,
                FusedTensor::kGateUp,
                "Phi3MLP.gate_up_proj rows [intermediate_size, 2 * intermediate_size)"),
    Matrix(R::kDownProj, "model.layers.{layer}.mlp.down_proj.weight", P::kLayer, D::kHidden,
           D::kIntermediate, S::kRowParallel,
           "Phi3MLP.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)"),
    Norm(R::kFinalNorm, "model.norm.weight", P::kLastStage,
         "Phi3Model.norm = Phi3RMSNorm(hidden_size)"),
    LmHead("Phi3ForCausalLM.lm_head = nn.Linear(hidden_size, vocab_size, bias=False); tied to "
           "embed_tokens (absent from the checkpoint) when tie_word_embeddings"),
};

// transformers/models/gemma2/modeling_gemma2.py
// Llama's projections (q/k/v/o biases with attention_bias, which Gemma 2
// configs leave false; no MLP biases) and four RMSNorms per layer: before
// attention, on its output, before the MLP and on its output (each output
// norm applied before the residual add). Every Gemma2RMSNorm scales by
// (1 + weight): a forward-pass property (ModelConfig::rms_norm_unit_offset),
// not a different tensor.
constexpr RoleSpec kGemma2[] = {
    Matrix(R::kEmbedTokens, "model.embed_tokens.weight", P::kFirstStage, D::kVocab, D::kHidden,
           S::kVocabParallel,
           "Gemma2Model.embed_tokens = Gemma2TextScaledWordEmbedding(vocab_size, hidden_size, "
           "embed_scale=hidden_size**0.5)"),
    Norm(R::kInputNorm, "model.layers.{layer}.input_layernorm.weight", P::kLayer,
         "Gemma2DecoderLayer.input_layernorm = Gemma2RMSNorm(hidden_size)"),
    Matrix(R::kQProj, "model.layers.{layer}.self_attn.q_proj.weight", P::kLayer, D::kQueryRows,
           D::kHidden, S::kColumnParallel,
           "Gemma2Attention.q_proj = nn.Linear(hidden_size, num_attention_heads * head_dim, "
           "bias=attention_bias)"),
    Vector(R::kQBias, "model.layers.{layer}.self_attn.q_proj.bias", D::kQueryRows,
           S::kColumnParallel, C::kAttentionBias, "Gemma2Attention.q_proj.bias"),
    Matrix(R::kKProj, "model.layers.{layer}.self_attn.k_proj.weight", P::kLayer, D::kKvRows,
           D::kHidden, S::kColumnParallel,
           "Gemma2Attention.k_proj = nn.Linear(hidden_size, num_key_value_heads * head_dim, "
           "bias=attention_bias)"),
    Vector(R::kKBias, "model.layers.{layer}.self_attn.k_proj.bias", D::kKvRows, S::kColumnParallel,
           C::kAttentionBias, "Gemma2Attention.k_proj.bias"),
    Matrix(R::kVProj, "model.layers.{layer}.self_attn.v_proj.weight", P::kLayer, D::kKvRows,
           D::kHidden, S::kColumnParallel,
           "Gemma2Attention.v_proj = nn.Linear(hidden_size, num_key_value_heads * head_dim, "
           "bias=attention_bias)"),
    Vector(R::kVBias, "model.layers.{layer}.self_attn.v_proj.bias", D::kKvRows, S::kColumnParallel,
           C::kAttentionBias, "Gemma2Attention.v_proj.bias"),
    Matrix(R::kOProj, "model.layers.{layer}.self_attn.o_proj.weight", P::kLayer, D::kHidden,
           D::kQueryRows, S::kRowParallel,
           "Gemma2Attention.o_proj = nn.Linear(num_attention_heads * head_dim, hidden_size, "
           "bias=attention_bias)"),
    RowBias(R::kOBias, "model.layers.{layer}.self_attn.o_proj.bias", C::kAttentionBias,
            "Gemma2Attention.o_proj.bias"),
    Norm(R::kPostAttentionNorm, "model.layers.{layer}.post_attention_layernorm.weight", P::kLayer,
         "Gemma2DecoderLayer.post_attention_layernorm = Gemma2RMSNorm(hidden_size), on the "
         "attention output"),
    Norm(R::kPreFeedforwardNorm, "model.layers.{layer}.pre_feedforward_layernorm.weight", P::kLayer,
         "Gemma2DecoderLayer.pre_feedforward_layernorm = Gemma2RMSNorm(hidden_size)"),
    Matrix(R::kGateProj, "model.layers.{layer}.mlp.gate_proj.weight", P::kLayer, D::kIntermediate,
           D::kHidden, S::kColumnParallel,
           "Gemma2MLP.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)"),
    Matrix(R::kUpProj, "model.layers.{layer}.mlp.up_proj.weight", P::kLayer, D::kIntermediate,
           D::kHidden, S::kColumnParallel,
           "Gemma2MLP.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)"),
    Matrix(R::kDownProj, "model.layers.{layer}.mlp.down_proj.weight", P::kLayer, D::kHidden,
           D::kIntermediate, S::kRowParallel,
           "Gemma2MLP.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)"),
    Norm(R::kPostFeedforwardNorm, "model.layers.{layer}.post_feedforward_layernorm.weight",
         P::kLayer, "Gemma2DecoderLayer.post_feedforward_layernorm = Gemma2RMSNorm(hidden_size)"),
    Norm(R::kFinalNorm, "model.norm.weight", P::kLastStage,
         "Gemma2Model.norm = Gemma2RMSNorm(hidden_size)"),
    LmHead("Gemma2ForCausalLM.lm_head = nn.Linear(hidden_size, vocab_size, bias=False); tied to "
           "embed_tokens (absent from the checkpoint) when tie_word_embeddings (the default)"),
};

// transformers/models/gemma3/modeling_gemma3.py (Gemma3ForCausalLM, the text
// model: model_type gemma3_text)
// Gemma 2's layout plus Gemma3Attention's per-head q_norm and k_norm (also
// (1 + weight) RMSNorms), applied to each head of q and k before RoPE.
constexpr RoleSpec kGemma3Text[] = {
    Matrix(R::kEmbedTokens, "model.embed_tokens.weight", P::kFirstStage, D::kVocab, D::kHidden,
           S::kVocabParallel,
           "Gemma3TextModel.embed_tokens = Gemma3TextScaledWordEmbedding(vocab_size, hidden_size, "
           "embed_scale=hidden_size**0.5)"),
    Norm(R::kInputNorm, "model.layers.{layer}.input_layernorm.weight", P::kLayer,
         "Gemma3DecoderLayer.input_layernorm = Gemma3RMSNorm(hidden_size)"),
    Matrix(R::kQProj, "model.layers.{layer}.self_attn.q_proj.weight", P::kLayer, D::kQueryRows,
           D::kHidden, S::kColumnParallel,
           "Gemma3Attention.q_proj = nn.Linear(hidden_size, num_attention_heads * head_dim, "
           "bias=attention_bias)"),
    Vector(R::kQBias, "model.layers.{layer}.self_attn.q_proj.bias", D::kQueryRows,
           S::kColumnParallel, C::kAttentionBias, "Gemma3Attention.q_proj.bias"),
    Matrix(R::kKProj, "model.layers.{layer}.self_attn.k_proj.weight", P::kLayer, D::kKvRows,
           D::kHidden, S::kColumnParallel,
           "Gemma3Attention.k_proj = nn.Linear(hidden_size, num_key_value_heads * head_dim, "
           "bias=attention_bias)"),
    Vector(R::kKBias, "model.layers.{layer}.self_attn.k_proj.bias", D::kKvRows, S::kColumnParallel,
           C::kAttentionBias, "Gemma3Attention.k_proj.bias"),
    Matrix(R::kVProj, "model.layers.{layer}.self_attn.v_proj.weight", P::kLayer, D::kKvRows,
           D::kHidden, S::kColumnParallel,
           "Gemma3Attention.v_proj = nn.Linear(hidden_size, num_key_value_heads * head_dim, "
           "bias=attention_bias)"),
    Vector(R::kVBias, "model.layers.{layer}.self_attn.v_proj.bias", D::kKvRows, S::kColumnParallel,
           C::kAttentionBias, "Gemma3Attention.v_proj.bias"),
    HeadNorm(R::kQNorm, "model.layers.{layer}.self_attn.q_norm.weight",
             "Gemma3Attention.q_norm = Gemma3RMSNorm(head_dim)"),
    HeadNorm(R::kKNorm, "model.layers.{layer}.self_attn.k_norm.weight",
             "Gemma3Attention.k_norm = Gemma3RMSNorm(head_dim)"),
    Matrix(R::kOProj, "model.layers.{layer}.self_attn.o_proj.weight", P::kLayer, D::kHidden,
           D::kQueryRows, S::kRowParallel,
           "Gemma3Attention.o_proj = nn.Linear(num_attention_heads * head_dim, hidden_size, "
           "bias=attention_bias)"),
    RowBias(R::kOBias, "model.layers.{layer}.self_attn.o_proj.bias", C::kAttentionBias,
            "Gemma3Attention.o_proj.bias"),
    Norm(R::kPostAttentionNorm, "model.layers.{layer}.post_attention_layernorm.weight", P::kLayer,
         "Gemma3DecoderLayer.post_attention_layernorm = Gemma3RMSNorm(hidden_size), on the "
         "attention output"),
    Norm(R::kPreFeedforwardNorm, "model.layers.{layer}.pre_feedforward_layernorm.weight", P::kLayer,
         "Gemma3DecoderLayer.pre_feedforward_layernorm = Gemma3RMSNorm(hidden_size)"),
    Matrix(R::kGateProj, "model.layers.{layer}.mlp.gate_proj.weight", P::kLayer, D::kIntermediate,
           D::kHidden, S::kColumnParallel,
           "Gemma3MLP.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)"),
    Matrix(R::kUpProj, "model.layers.{layer}.mlp.up_proj.weight", P::kLayer, D::kIntermediate,
           D::kHidden, S::kColumnParallel,
           "Gemma3MLP.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)"),
    Matrix(R::kDownProj, "model.layers.{layer}.mlp.down_proj.weight", P::kLayer, D::kHidden,
           D::kIntermediate, S::kRowParallel,
           "Gemma3MLP.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)"),
    Norm(R::kPostFeedforwardNorm, "model.layers.{layer}.post_feedforward_layernorm.weight",
         P::kLayer, "Gemma3DecoderLayer.post_feedforward_layernorm = Gemma3RMSNorm(hidden_size)"),
    Norm(R::kFinalNorm, "model.norm.weight", P::kLastStage,
         "Gemma3TextModel.norm = Gemma3RMSNorm(hidden_size)"),
    LmHead("Gemma3ForCausalLM.lm_head = nn.Linear(hidden_size, vocab_size, bias=False); tied to "
           "embed_tokens (absent from the checkpoint) when tie_word_embeddings (the default)"),
};

const FamilyRoles kFamilies[] = {
    {Architecture::kLlama, "transformers/models/llama/modeling_llama.py", kLlama},
    {Architecture::kMistral, "transformers/models/mistral/modeling_mistral.py", kMistral},
    {Architecture::kQwen2, "transformers/models/qwen2/modeling_qwen2.py", kQwen2},
    {Architecture::kQwen3, "transformers/models/qwen3/modeling_qwen3.py", kQwen3},
    {Architecture::kPhi3, "transformers/models/phi3/modeling_phi3.py", kPhi3},
    {Architecture::kGemma2, "transformers/models/gemma2/modeling_gemma2.py", kGemma2},
    {Architecture::kGemma3Text, "transformers/models/gemma3/modeling_gemma3.py", kGemma3Text},
    {Architecture::kMixtral, "transformers/models/mixtral/modeling_mixtral.py", MixtralRoles()},
    {Architecture::kQwen2Moe, "transformers/models/qwen2_moe/modeling_qwen2_moe.py",
     Qwen2MoeRoles()},
    {Architecture::kQwen3Moe, "transformers/models/qwen3_moe/modeling_qwen3_moe.py",
     Qwen3MoeRoles()},
};

constexpr Architecture kArchitectures[] = {Architecture::kLlama,      Architecture::kMistral,
                                           Architecture::kQwen2,      Architecture::kQwen3,
                                           Architecture::kPhi3,       Architecture::kGemma2,
                                           Architecture::kGemma3Text, Architecture::kMixtral,
                                           Architecture::kQwen2Moe,   Architecture::kQwen3Moe};

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
    case TensorRole::kQNorm:
      return "q_norm";
    case TensorRole::kKNorm:
      return "k_norm";
    case TensorRole::kOProj:
      return "o_proj";
    case TensorRole::kOBias:
      return "o_proj.bias";
    case TensorRole::kPostAttentionNorm:
      return "post_attention_layernorm";
    case TensorRole::kPreFeedforwardNorm:
      return "pre_feedforward_layernorm";
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
    case TensorRole::kRouter:
      return "router";
    case TensorRole::kSharedExpertGate:
      return "shared_expert_gate";
    case TensorRole::kSharedGateProj:
      return "shared_expert.gate_proj";
    case TensorRole::kSharedUpProj:
      return "shared_expert.up_proj";
    case TensorRole::kSharedDownProj:
      return "shared_expert.down_proj";
    case TensorRole::kExpertGateProj:
      return "experts.gate_proj";
    case TensorRole::kExpertUpProj:
      return "experts.up_proj";
    case TensorRole::kExpertDownProj:
      return "experts.down_proj";
    case TensorRole::kPostFeedforwardNorm:
      return "post_feedforward_layernorm";
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
    case RoleDim::kHeadDim:
      return model.head_dim;
    case RoleDim::kExperts:
      return model.num_experts;
    case RoleDim::kMoeIntermediate:
      return model.moe_intermediate_size;
    case RoleDim::kSharedIntermediate:
      return model.shared_expert_intermediate_size;
    case RoleDim::kOne:
      return 1;
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
    case RoleCondition::kDenseLayer:
      for (int l = 0; l < model.num_hidden_layers; ++l) {
        if (!model.LayerIsSparse(l)) return true;
      }
      return false;
    case RoleCondition::kSparseLayer:
      return model.is_moe();
    case RoleCondition::kSharedExpert:
      return model.is_moe() && model.shared_expert_intermediate_size > 0;
  }
  return false;
}

bool RolePresentInLayer(const RoleSpec& spec, const ModelConfig& model, int layer) {
  if (!RolePresent(spec, model)) return false;
  if (spec.place != RolePlace::kLayer) return true;
  switch (spec.condition) {
    case RoleCondition::kDenseLayer:
      return !model.LayerIsSparse(layer);
    case RoleCondition::kSparseLayer:
    case RoleCondition::kSharedExpert:
      return model.LayerIsSparse(layer);
    default:
      return true;
  }
}

bool RoleIsTied(const RoleSpec& spec, const ModelConfig& model) {
  return spec.tied_to_embedding && model.tie_word_embeddings;
}

namespace {

// `pattern` with "{layer}" replaced (per-layer roles) and "{expert}" too
// (per-expert roles).
std::string Substitute(const RoleSpec& spec, const char* pattern, int layer, int expert) {
  std::string name = pattern;
  if (spec.place != RolePlace::kLayer) return name;
  constexpr std::string_view kLayer = "{layer}";
  const size_t at = name.find(kLayer);
  TESSERA_CHECK(at != std::string::npos);  // per-layer patterns name the layer
  name.replace(at, kLayer.size(), std::to_string(layer));
  constexpr std::string_view kExpert = "{expert}";
  if (const size_t e = name.find(kExpert); e != std::string::npos) {
    TESSERA_CHECK(spec.per_expert && expert >= 0);  // per-expert patterns take an expert
    name.replace(e, kExpert.size(), std::to_string(expert));
  }
  return name;
}

}  // namespace

std::string RoleTensorName(const RoleSpec& spec, int layer, int expert) {
  return Substitute(spec, spec.hf_name, layer, expert);
}

std::string RoleAltName(const RoleSpec& spec, int layer) {
  if (spec.alt_name == nullptr) return "";
  return Substitute(spec, spec.alt_name, layer, -1);
}

std::vector<int64_t> RoleAltShape(const RoleSpec& spec, const ModelConfig& model) {
  const int64_t e = model.num_experts, h = model.hidden_size, i = model.moe_intermediate_size;
  switch (spec.alt) {
    case AltForm::kNone:
      return {};
    case AltForm::kRenamed:
      return RoleShape(spec, model);
    case AltForm::kStackedGateUp:
      return {e, 2 * i, h};
    case AltForm::kStackedDown:
      return {e, h, i};
  }
  return {};
}

std::string RolePartName(const RoleSpec& spec, int layer, int expert) {
  std::string name = RoleTensorName(spec, layer, expert);
  std::string_view fused;
  switch (spec.fused) {
    case FusedTensor::kNone:
      return name;
    case FusedTensor::kQkv:
      fused = "qkv_proj";
      break;
    case FusedTensor::kGateUp:
      fused = "gate_up_proj";
      break;
  }
  const size_t at = name.find(fused);
  TESSERA_CHECK(at != std::string::npos);  // fused roles name their fused module
  name.replace(at, fused.size(), TensorRoleName(spec.role));
  return name;
}

std::string RoleSourceName(const RoleSpec& spec, const ModelConfig& model, int layer, int expert) {
  if (RoleIsTied(spec, model)) {
    return RoleTensorName(EmbeddingOf(FamilyRolesOf(model.architecture)), layer);
  }
  return RoleTensorName(spec, layer, expert);
}

std::vector<int64_t> RoleShape(const RoleSpec& spec, const ModelConfig& model) {
  std::vector<int64_t> shape;
  for (int d = 0; d < spec.ndim; ++d) shape.push_back(RoleDimSize(spec.shape[d], model));
  return shape;
}

std::vector<int64_t> RoleSourceShape(const RoleSpec& spec, const ModelConfig& model) {
  std::vector<int64_t> shape = RoleShape(spec, model);
  switch (spec.fused) {
    case FusedTensor::kNone:
      break;
    case FusedTensor::kQkv:
      shape[0] = RoleDimSize(RoleDim::kQueryRows, model) + 2 * RoleDimSize(RoleDim::kKvRows, model);
      break;
    case FusedTensor::kGateUp:
      shape[0] = 2 * RoleDimSize(RoleDim::kIntermediate, model);
      break;
  }
  return shape;
}

int64_t RoleFusedRowOffset(const RoleSpec& spec, const ModelConfig& model) {
  switch (spec.fused) {
    case FusedTensor::kNone:
      return 0;
    case FusedTensor::kQkv:
      if (spec.role == TensorRole::kKProj) return RoleDimSize(RoleDim::kQueryRows, model);
      if (spec.role == TensorRole::kVProj)
        return RoleDimSize(RoleDim::kQueryRows, model) + RoleDimSize(RoleDim::kKvRows, model);
      TESSERA_CHECK(spec.role == TensorRole::kQProj);  // the parts of qkv_proj
      return 0;
    case FusedTensor::kGateUp:
      if (spec.role == TensorRole::kUpProj) return RoleDimSize(RoleDim::kIntermediate, model);
      TESSERA_CHECK(spec.role == TensorRole::kGateProj);  // the parts of gate_up_proj
      return 0;
  }
  return 0;
}

int64_t RoleNumel(const RoleSpec& spec, const ModelConfig& model) {
  int64_t n = 1;
  for (int d = 0; d < spec.ndim; ++d) n *= RoleDimSize(spec.shape[d], model);
  return n;
}

int64_t LayerParameterCount(const ModelConfig& model, int layer) {
  int64_t n = 0;
  for (const RoleSpec& s : FamilyRolesOf(model.architecture).roles) {
    if (s.place != RolePlace::kLayer || !RolePresentInLayer(s, model, layer)) continue;
    n += RoleNumel(s, model) * (s.per_expert ? model.num_experts : 1);
  }
  return n;
}

int64_t LayerParameterCount(const ModelConfig& model) {
  int64_t n = 0;
  for (int l = 0; l < std::max<int64_t>(model.num_hidden_layers, 1); ++l)
    n = std::max(n, LayerParameterCount(model, l));
  return n;
}

int64_t LayerExpertParameterCount(const ModelConfig& model) {
  return model.num_experts * 3 * model.hidden_size * model.moe_intermediate_size;
}

int64_t LayerReplicatedParameterCount(const ModelConfig& model) {
  int64_t most = 0;
  for (int l = 0; l < std::max<int64_t>(model.num_hidden_layers, 1); ++l) {
    int64_t n = 0;
    for (const RoleSpec& s : FamilyRolesOf(model.architecture).roles) {
      if (s.place == RolePlace::kLayer && s.split == SplitKind::kReplicated && !s.per_expert &&
          RolePresentInLayer(s, model, l)) {
        n += RoleNumel(s, model);
      }
    }
    most = std::max(most, n);
  }
  return most;
}

int64_t ModelParameterCount(const ModelConfig& model) {
  int64_t n = 0;
  for (int l = 0; l < model.num_hidden_layers; ++l) n += LayerParameterCount(model, l);
  for (const RoleSpec& s : FamilyRolesOf(model.architecture).roles) {
    if (s.place != RolePlace::kLayer && RolePresent(s, model) && !RoleIsTied(s, model)) {
      n += RoleNumel(s, model);
    }
  }
  return n;
}

bool RoleIsQuantizable(TensorRole role) {
  switch (role) {
    case TensorRole::kQProj:
    case TensorRole::kKProj:
    case TensorRole::kVProj:
    case TensorRole::kOProj:
    case TensorRole::kGateProj:
    case TensorRole::kUpProj:
    case TensorRole::kDownProj:
      return true;
    default:
      return false;
  }
}

}  // namespace tessera
