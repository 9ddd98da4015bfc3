#include <span>

#include "common/model/role_rows.h"

// The tensor tables of the mixture-of-experts families (see
// common/model/tensor_roles.h for what a row says). Attention is the dense
// families' (Mixtral: Mistral's; Qwen2-MoE: Qwen2's; Qwen3-MoE: Qwen3's with
// its per-head q/k norms). A sparse layer replaces the MLP with the router
// and the routed experts (and Qwen2-MoE's gated shared expert); a Qwen dense
// layer (mlp_only_layers, decoder_sparse_step) keeps the MLP of
// intermediate_size. Each expert role is one row with "{expert}" in its
// published name; transformers 5 stacks the experts into one 3-D tensor per
// layer (gate_up_proj [experts, 2*moe_intermediate, hidden], down_proj
// [experts, hidden, moe_intermediate]), named by alt_name, and renames
// Mixtral's block_sparse_moe to mlp.

namespace tessera::role_rows {

namespace {

// transformers/models/mixtral/modeling_mixtral.py
constexpr RoleSpec kMixtral[] = {
    Matrix(R::kEmbedTokens, "model.embed_tokens.weight", P::kFirstStage, D::kVocab, D::kHidden,
           S::kVocabParallel, "MixtralModel.embed_tokens = nn.Embedding(vocab_size, hidden_size)"),
    Norm(R::kInputNorm, "model.layers.{layer}.input_layernorm.weight", P::kLayer,
         "MixtralDecoderLayer.input_layernorm = MixtralRMSNorm(hidden_size)"),
    Matrix(R::kQProj, "model.layers.{layer}.self_attn.q_proj.weight", P::kLayer, D::kQueryRows,
           D::kHidden, S::kColumnParallel,
           "MixtralAttention.q_proj = nn.Linear(hidden_size, num_attention_heads * head_dim, "
           "bias=False)"),
    Matrix(R::kKProj, "model.layers.{layer}.self_attn.k_proj.weight", P::kLayer, D::kKvRows,
           D::kHidden, S::kColumnParallel,
           "MixtralAttention.k_proj = nn.Linear(hidden_size, num_key_value_heads * head_dim, "
           "bias=False)"),
    Matrix(R::kVProj, "model.layers.{layer}.self_attn.v_proj.weight", P::kLayer, D::kKvRows,
           D::kHidden, S::kColumnParallel,
           "MixtralAttention.v_proj = nn.Linear(hidden_size, num_key_value_heads * head_dim, "
           "bias=False)"),
    Matrix(R::kOProj, "model.layers.{layer}.self_attn.o_proj.weight", P::kLayer, D::kHidden,
           D::kQueryRows, S::kRowParallel,
           "MixtralAttention.o_proj = nn.Linear(num_attention_heads * head_dim, hidden_size, "
           "bias=False)"),
    Norm(R::kPostAttentionNorm, "model.layers.{layer}.post_attention_layernorm.weight", P::kLayer,
         "MixtralDecoderLayer.post_attention_layernorm = MixtralRMSNorm(hidden_size)"),
    MoeMatrix(R::kRouter, "model.layers.{layer}.block_sparse_moe.gate.weight", D::kExperts,
              D::kHidden, S::kReplicated, C::kSparseLayer,
              "MixtralSparseMoeBlock.gate = nn.Linear(hidden_size, num_local_experts, bias=False)",
              "model.layers.{layer}.mlp.gate.weight"),
    ExpertMatrix(R::kExpertGateProj,
                 "model.layers.{layer}.block_sparse_moe.experts.{expert}.w1.weight",
                 D::kMoeIntermediate, D::kHidden, S::kColumnParallel,
                 "model.layers.{layer}.mlp.experts.gate_up_proj", AltForm::kStackedGateUp,
                 "MixtralBlockSparseTop2MLP.w1 = nn.Linear(hidden_size, intermediate_size, "
                 "bias=False); transformers 5: MixtralExperts.gate_up_proj[e, :intermediate]"),
    ExpertMatrix(R::kExpertUpProj,
                 "model.layers.{layer}.block_sparse_moe.experts.{expert}.w3.weight",
                 D::kMoeIntermediate, D::kHidden, S::kColumnParallel,
                 "model.layers.{layer}.mlp.experts.gate_up_proj", AltForm::kStackedGateUp,
                 "MixtralBlockSparseTop2MLP.w3 = nn.Linear(hidden_size, intermediate_size, "
                 "bias=False); transformers 5: MixtralExperts.gate_up_proj[e, intermediate:]"),
    ExpertMatrix(R::kExpertDownProj,
                 "model.layers.{layer}.block_sparse_moe.experts.{expert}.w2.weight", D::kHidden,
                 D::kMoeIntermediate, S::kRowParallel, "model.layers.{layer}.mlp.experts.down_proj",
                 AltForm::kStackedDown,
                 "MixtralBlockSparseTop2MLP.w2 = nn.Linear(intermediate_size, hidden_size, "
                 "bias=False); transformers 5: MixtralExperts.down_proj[e]"),
    Norm(R::kFinalNorm, "model.norm.weight", P::kLastStage,
         "MixtralModel.norm = MixtralRMSNorm(hidden_size)"),
    LmHead("MixtralForCausalLM.lm_head = nn.Linear(hidden_size, vocab_size, bias=False); tied to "
           "embed_tokens (absent from the checkpoint) when tie_word_embeddings"),
};

// transformers/models/qwen2_moe/modeling_qwen2_moe.py
constexpr RoleSpec kQwen2Moe[] = {
    Matrix(R::kEmbedTokens, "model.embed_tokens.weight", P::kFirstStage, D::kVocab, D::kHidden,
           S::kVocabParallel, "Qwen2MoeModel.embed_tokens = nn.Embedding(vocab_size, hidden_size)"),
    Norm(R::kInputNorm, "model.layers.{layer}.input_layernorm.weight", P::kLayer,
         "Qwen2MoeDecoderLayer.input_layernorm = Qwen2MoeRMSNorm(hidden_size)"),
    Matrix(R::kQProj, "model.layers.{layer}.self_attn.q_proj.weight", P::kLayer, D::kQueryRows,
           D::kHidden, S::kColumnParallel,
           "Qwen2MoeAttention.q_proj = nn.Linear(hidden_size, num_attention_heads * head_dim, "
           "bias=True)"),
    Vector(R::kQBias, "model.layers.{layer}.self_attn.q_proj.bias", D::kQueryRows,
           S::kColumnParallel, C::kAttentionBias, "Qwen2MoeAttention.q_proj.bias"),
    Matrix(R::kKProj, "model.layers.{layer}.self_attn.k_proj.weight", P::kLayer, D::kKvRows,
           D::kHidden, S::kColumnParallel,
           "Qwen2MoeAttention.k_proj = nn.Linear(hidden_size, num_key_value_heads * head_dim, "
           "bias=True)"),
    Vector(R::kKBias, "model.layers.{layer}.self_attn.k_proj.bias", D::kKvRows, S::kColumnParallel,
           C::kAttentionBias, "Qwen2MoeAttention.k_proj.bias"),
    Matrix(R::kVProj, "model.layers.{layer}.self_attn.v_proj.weight", P::kLayer, D::kKvRows,
           D::kHidden, S::kColumnParallel,
           "Qwen2MoeAttention.v_proj = nn.Linear(hidden_size, num_key_value_heads * head_dim, "
           "bias=True)"),
    Vector(R::kVBias, "model.layers.{layer}.self_attn.v_proj.bias", D::kKvRows, S::kColumnParallel,
           C::kAttentionBias, "Qwen2MoeAttention.v_proj.bias"),
    Matrix(R::kOProj, "model.layers.{layer}.self_attn.o_proj.weight", P::kLayer, D::kHidden,
           D::kQueryRows, S::kRowParallel,
           "Qwen2MoeAttention.o_proj = nn.Linear(num_attention_heads * head_dim, hidden_size, "
           "bias=False)"),
    Norm(R::kPostAttentionNorm, "model.layers.{layer}.post_attention_layernorm.weight", P::kLayer,
         "Qwen2MoeDecoderLayer.post_attention_layernorm = Qwen2MoeRMSNorm(hidden_size)"),
    MoeMatrix(R::kGateProj, "model.layers.{layer}.mlp.gate_proj.weight", D::kIntermediate,
              D::kHidden, S::kColumnParallel, C::kDenseLayer,
              "Qwen2MoeMLP.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)"),
    MoeMatrix(R::kUpProj, "model.layers.{layer}.mlp.up_proj.weight", D::kIntermediate, D::kHidden,
              S::kColumnParallel, C::kDenseLayer,
              "Qwen2MoeMLP.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)"),
    MoeMatrix(R::kDownProj, "model.layers.{layer}.mlp.down_proj.weight", D::kHidden,
              D::kIntermediate, S::kRowParallel, C::kDenseLayer,
              "Qwen2MoeMLP.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)"),
    MoeMatrix(R::kRouter, "model.layers.{layer}.mlp.gate.weight", D::kExperts, D::kHidden,
              S::kReplicated, C::kSparseLayer,
              "Qwen2MoeSparseMoeBlock.gate = nn.Linear(hidden_size, num_experts, bias=False)"),
    MoeMatrix(R::kSharedExpertGate, "model.layers.{layer}.mlp.shared_expert_gate.weight", D::kOne,
              D::kHidden, S::kReplicated, C::kSharedExpert,
              "Qwen2MoeSparseMoeBlock.shared_expert_gate = nn.Linear(hidden_size, 1, bias=False)"),
    MoeMatrix(R::kSharedGateProj, "model.layers.{layer}.mlp.shared_expert.gate_proj.weight",
              D::kSharedIntermediate, D::kHidden, S::kColumnParallel, C::kSharedExpert,
              "Qwen2MoeSparseMoeBlock.shared_expert = Qwen2MoeMLP(shared_expert_intermediate_size)"
              ".gate_proj"),
    MoeMatrix(R::kSharedUpProj, "model.layers.{layer}.mlp.shared_expert.up_proj.weight",
              D::kSharedIntermediate, D::kHidden, S::kColumnParallel, C::kSharedExpert,
              "Qwen2MoeSparseMoeBlock.shared_expert.up_proj"),
    MoeMatrix(R::kSharedDownProj, "model.layers.{layer}.mlp.shared_expert.down_proj.weight",
              D::kHidden, D::kSharedIntermediate, S::kRowParallel, C::kSharedExpert,
              "Qwen2MoeSparseMoeBlock.shared_expert.down_proj"),
    ExpertMatrix(R::kExpertGateProj, "model.layers.{layer}.mlp.experts.{expert}.gate_proj.weight",
                 D::kMoeIntermediate, D::kHidden, S::kColumnParallel,
                 "model.layers.{layer}.mlp.experts.gate_up_proj", AltForm::kStackedGateUp,
                 "Qwen2MoeMLP(moe_intermediate_size).gate_proj; transformers 5: "
                 "Qwen2MoeExperts.gate_up_proj[e, :moe_intermediate]"),
    ExpertMatrix(R::kExpertUpProj, "model.layers.{layer}.mlp.experts.{expert}.up_proj.weight",
                 D::kMoeIntermediate, D::kHidden, S::kColumnParallel,
                 "model.layers.{layer}.mlp.experts.gate_up_proj", AltForm::kStackedGateUp,
                 "Qwen2MoeMLP(moe_intermediate_size).up_proj; transformers 5: "
                 "Qwen2MoeExperts.gate_up_proj[e, moe_intermediate:]"),
    ExpertMatrix(R::kExpertDownProj, "model.layers.{layer}.mlp.experts.{expert}.down_proj.weight",
                 D::kHidden, D::kMoeIntermediate, S::kRowParallel,
                 "model.layers.{layer}.mlp.experts.down_proj", AltForm::kStackedDown,
                 "Qwen2MoeMLP(moe_intermediate_size).down_proj; transformers 5: "
                 "Qwen2MoeExperts.down_proj[e]"),
    Norm(R::kFinalNorm, "model.norm.weight", P::kLastStage,
         "Qwen2MoeModel.norm = Qwen2MoeRMSNorm(hidden_size)"),
    LmHead("Qwen2MoeForCausalLM.lm_head = nn.Linear(hidden_size, vocab_size, bias=False); tied to "
           "embed_tokens (absent from the checkpoint) when tie_word_embeddings"),
};

// transformers/models/qwen3_moe/modeling_qwen3_moe.py
constexpr RoleSpec kQwen3Moe[] = {
    Matrix(R::kEmbedTokens, "model.embed_tokens.weight", P::kFirstStage, D::kVocab, D::kHidden,
           S::kVocabParallel, "Qwen3MoeModel.embed_tokens = nn.Embedding(vocab_size, hidden_size)"),
    Norm(R::kInputNorm, "model.layers.{layer}.input_layernorm.weight", P::kLayer,
         "Qwen3MoeDecoderLayer.input_layernorm = Qwen3MoeRMSNorm(hidden_size)"),
    Matrix(R::kQProj, "model.layers.{layer}.self_attn.q_proj.weight", P::kLayer, D::kQueryRows,
           D::kHidden, S::kColumnParallel,
           "Qwen3MoeAttention.q_proj = nn.Linear(hidden_size, num_attention_heads * head_dim, "
           "bias=attention_bias)"),
    Vector(R::kQBias, "model.layers.{layer}.self_attn.q_proj.bias", D::kQueryRows,
           S::kColumnParallel, C::kAttentionBias, "Qwen3MoeAttention.q_proj.bias"),
    Matrix(R::kKProj, "model.layers.{layer}.self_attn.k_proj.weight", P::kLayer, D::kKvRows,
           D::kHidden, S::kColumnParallel,
           "Qwen3MoeAttention.k_proj = nn.Linear(hidden_size, num_key_value_heads * head_dim, "
           "bias=attention_bias)"),
    Vector(R::kKBias, "model.layers.{layer}.self_attn.k_proj.bias", D::kKvRows, S::kColumnParallel,
           C::kAttentionBias, "Qwen3MoeAttention.k_proj.bias"),
    Matrix(R::kVProj, "model.layers.{layer}.self_attn.v_proj.weight", P::kLayer, D::kKvRows,
           D::kHidden, S::kColumnParallel,
           "Qwen3MoeAttention.v_proj = nn.Linear(hidden_size, num_key_value_heads * head_dim, "
           "bias=attention_bias)"),
    Vector(R::kVBias, "model.layers.{layer}.self_attn.v_proj.bias", D::kKvRows, S::kColumnParallel,
           C::kAttentionBias, "Qwen3MoeAttention.v_proj.bias"),
    HeadNorm(R::kQNorm, "model.layers.{layer}.self_attn.q_norm.weight",
             "Qwen3MoeAttention.q_norm = Qwen3MoeRMSNorm(head_dim)"),
    HeadNorm(R::kKNorm, "model.layers.{layer}.self_attn.k_norm.weight",
             "Qwen3MoeAttention.k_norm = Qwen3MoeRMSNorm(head_dim)"),
    Matrix(R::kOProj, "model.layers.{layer}.self_attn.o_proj.weight", P::kLayer, D::kHidden,
           D::kQueryRows, S::kRowParallel,
           "Qwen3MoeAttention.o_proj = nn.Linear(num_attention_heads * head_dim, hidden_size, "
           "bias=attention_bias)"),
    RowBias(R::kOBias, "model.layers.{layer}.self_attn.o_proj.bias", C::kAttentionBias,
            "Qwen3MoeAttention.o_proj.bias"),
    Norm(R::kPostAttentionNorm, "model.layers.{layer}.post_attention_layernorm.weight", P::kLayer,
         "Qwen3MoeDecoderLayer.post_attention_layernorm = Qwen3MoeRMSNorm(hidden_size)"),
    MoeMatrix(R::kGateProj, "model.layers.{layer}.mlp.gate_proj.weight", D::kIntermediate,
              D::kHidden, S::kColumnParallel, C::kDenseLayer,
              "Qwen3MoeMLP.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)"),
    MoeMatrix(R::kUpProj, "model.layers.{layer}.mlp.up_proj.weight", D::kIntermediate, D::kHidden,
              S::kColumnParallel, C::kDenseLayer,
              "Qwen3MoeMLP.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)"),
    MoeMatrix(R::kDownProj, "model.layers.{layer}.mlp.down_proj.weight", D::kHidden,
              D::kIntermediate, S::kRowParallel, C::kDenseLayer,
              "Qwen3MoeMLP.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)"),
    MoeMatrix(R::kRouter, "model.layers.{layer}.mlp.gate.weight", D::kExperts, D::kHidden,
              S::kReplicated, C::kSparseLayer,
              "Qwen3MoeSparseMoeBlock.gate = nn.Linear(hidden_size, num_experts, bias=False)"),
    ExpertMatrix(R::kExpertGateProj, "model.layers.{layer}.mlp.experts.{expert}.gate_proj.weight",
                 D::kMoeIntermediate, D::kHidden, S::kColumnParallel,
                 "model.layers.{layer}.mlp.experts.gate_up_proj", AltForm::kStackedGateUp,
                 "Qwen3MoeMLP(moe_intermediate_size).gate_proj; transformers 5: "
                 "Qwen3MoeExperts.gate_up_proj[e, :moe_intermediate]"),
    ExpertMatrix(R::kExpertUpProj, "model.layers.{layer}.mlp.experts.{expert}.up_proj.weight",
                 D::kMoeIntermediate, D::kHidden, S::kColumnParallel,
                 "model.layers.{layer}.mlp.experts.gate_up_proj", AltForm::kStackedGateUp,
                 "Qwen3MoeMLP(moe_intermediate_size).up_proj; transformers 5: "
                 "Qwen3MoeExperts.gate_up_proj[e, moe_intermediate:]"),
    ExpertMatrix(R::kExpertDownProj, "model.layers.{layer}.mlp.experts.{expert}.down_proj.weight",
                 D::kHidden, D::kMoeIntermediate, S::kRowParallel,
                 "model.layers.{layer}.mlp.experts.down_proj", AltForm::kStackedDown,
                 "Qwen3MoeMLP(moe_intermediate_size).down_proj; transformers 5: "
                 "Qwen3MoeExperts.down_proj[e]"),
    Norm(R::kFinalNorm, "model.norm.weight", P::kLastStage,
         "Qwen3MoeModel.norm = Qwen3MoeRMSNorm(hidden_size)"),
    LmHead("Qwen3MoeForCausalLM.lm_head = nn.Linear(hidden_size, vocab_size, bias=False); tied to "
           "embed_tokens (absent from the checkpoint) when tie_word_embeddings"),
};

}  // namespace

std::span<const RoleSpec> MixtralRoles() { return kMixtral; }
std::span<const RoleSpec> Qwen2MoeRoles() { return kQwen2Moe; }
std::span<const RoleSpec> Qwen3MoeRoles() { return kQwen3Moe; }

}  // namespace tessera::role_rows
