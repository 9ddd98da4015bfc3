// ModelConfig: the typed form of a Hugging Face `config.json` for the decoder
// families Tessera runs (LlamaForCausalLM, MistralForCausalLM,
// Qwen2ForCausalLM, Qwen3ForCausalLM, Phi3ForCausalLM, Gemma2ForCausalLM,
// the text-only Gemma3ForCausalLM, and the mixtures of experts
// MixtralForCausalLM, Qwen2MoeForCausalLM and Qwen3MoeForCausalLM).
//
// Every field names the HF config key it comes from. Parsing and validation
// happen once, in ParseModelConfig; the rest of Tessera reads this struct.
//
// Thread-safety: a plain value.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/base/dtype.h"
#include "common/base/status.h"
#include "common/format/quantization.h"

namespace tessera {

enum class Architecture {
  kLlama,
  kMistral,
  kQwen2,
  kQwen3,
  kPhi3,
  kGemma2,
  kGemma3Text,
  kMixtral,   // MixtralForCausalLM: Mistral attention, a sparse MoE block in every layer
  kQwen2Moe,  // Qwen2MoeForCausalLM: Qwen2 attention, routed experts + a gated shared expert
  kQwen3Moe,  // Qwen3MoeForCausalLM: Qwen3 attention (q/k norms), routed experts
};
const char* ArchitectureName(Architecture arch);  // the HF class name

// The activation of the gated MLP: down(act(gate(x)) * up(x)).
//  - kSilu: x / (1 + exp(-x)) (SwiGLU: Llama, Mistral, Qwen2, Qwen3, Phi-3).
//  - kGeluTanh: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) (GeGLU:
//    Gemma's "hidden_activation" gelu_pytorch_tanh).
enum class Activation { kSilu, kGeluTanh };
const char* ActivationName(Activation act);  // "silu", "gelu_pytorch_tanh"

// HF `rope_scaling` (or `rope_parameters` in newer transformers). Formulas as in
// transformers' modeling_rope_utils.py:
//  - kDefault: inv_freq[i] = 1 / theta^(2i/d).
//  - kLinear:  inv_freq / factor.
//  - kDynamic: NTK-aware; when seq_len > max_position_embeddings,
//              base = theta * ((factor*seq_len/max_pos) - (factor-1))^(d/(d-2)).
//  - kLlama3:  per-frequency blend using factor, low_freq_factor,
//              high_freq_factor and original_max_position_embeddings.
//  - kLongRope: Phi-3's "longrope" (older configs: "su"):
//              inv_freq[i] = 1 / (ext[i] * theta^(2i/d)), ext = short_factor
//              while seq_len <= original_max_position_embeddings, else
//              long_factor; cos and sin are scaled by attention_factor.
enum class RopeType { kDefault, kLinear, kDynamic, kLlama3, kLongRope };
const char* RopeTypeName(RopeType type);

struct RopeScaling {
  RopeType type = RopeType::kDefault;
  double factor = 1.0;            // "factor"
  double low_freq_factor = 1.0;   // "low_freq_factor" (llama3)
  double high_freq_factor = 4.0;  // "high_freq_factor" (llama3)
  // "original_max_position_embeddings" (llama3: in rope_scaling; longrope:
  // the top-level key, else in rope_scaling, else max_position_embeddings).
  int64_t original_max_position_embeddings = 0;
  std::vector<double> short_factor;  // "short_factor" (longrope): head_dim / 2 values
  std::vector<double> long_factor;   // "long_factor" (longrope): head_dim / 2 values
  // longrope: "attention_factor" when given, else as transformers computes
  // it: with f = max_position_embeddings / original_max_position_embeddings,
  // 1 when f <= 1, else sqrt(1 + ln(f) / ln(original_max_position_embeddings)).
  // 1 for every other type.
  double attention_factor = 1.0;
};

struct ModelConfig {
  Architecture architecture = Architecture::kLlama;  // "architectures"[0]
  std::string model_type;                            // "model_type"
  int64_t hidden_size = 0;                           // "hidden_size"
  int64_t intermediate_size = 0;                     // "intermediate_size"
  int64_t num_hidden_layers = 0;                     // "num_hidden_layers"
  int64_t num_attention_heads = 0;                   // "num_attention_heads"
  int64_t num_key_value_heads = 0;                   // "num_key_value_heads" (default: heads)
  // "head_dim" when given and not null (may differ from hidden/heads), else
  // hidden_size / num_attention_heads.
  int64_t head_dim = 0;
  double rms_norm_eps = 1e-6;              // "rms_norm_eps"
  double rope_theta = 10000.0;             // "rope_theta", else "rope_parameters"."rope_theta"
  int64_t max_position_embeddings = 2048;  // "max_position_embeddings"
  RopeScaling rope_scaling;                // "rope_scaling" when not null, else "rope_parameters"
  bool tie_word_embeddings = false;        // "tie_word_embeddings"
  // Llama, Qwen3: "attention_bias" (biases on q, k, v and o). Qwen2: always
  // true, biases on q, k, v only (o_proj has none). Mistral: always false.
  bool attention_bias = false;
  // Llama: "mlp_bias" (gate, up, down). Mistral, Qwen2, Qwen3: always false.
  bool mlp_bias = false;
  int64_t vocab_size = 0;              // "vocab_size"
  std::vector<int64_t> bos_token_ids;  // "bos_token_id" (int, list or null -> empty)
  std::vector<int64_t> eos_token_ids;  // "eos_token_id" (int, list or null -> empty)
  // "torch_dtype", else "dtype": "float32", "float16" or "bfloat16"; absent -> F32.
  DType torch_dtype = DType::kF32;
  // "quantization_config" (common/format/quantization.h): how the linear
  // projections are stored; method kNone for a dense checkpoint. torch_dtype
  // stays the dtype of the dense tensors (norms, embeddings) and of compute.
  QuantizationConfig quantization;
  // The sliding-attention window (0 = none): the token at position p attends
  // to positions (p - sliding_window, p], as transformers' sliding-window
  // mask has it. Mistral and Phi-3: "sliding_window" on every layer. Gemma:
  // on the layers sliding_layers marks. Qwen2/Qwen3 "use_sliding_window"
  // with a window narrower than max_position_embeddings is refused.
  int64_t sliding_window = 0;
  // Per-layer attention types (Gemma's "layer_types"): empty = every layer
  // has sliding_window; else num_hidden_layers entries, true for a sliding
  // layer (window sliding_window, none when that is 0; a Gemma 3 sliding
  // layer also rotates with local_rope_theta) and false for a global one
  // (causal over the whole context). Gemma 2 without "layer_types": the even layers
  // slide. Gemma 3: every "sliding_window_pattern"-th layer (default 6) is
  // global. Indexed by the global layer index. Use LayerSlidingWindow.
  std::vector<bool> sliding_layers;

  // Gemma (both): every RMSNorm (the hidden norms and the per-head q/k
  // norms) scales by (1 + weight) instead of weight, in fp32, rounded once.
  bool rms_norm_unit_offset = false;
  // The MLP activation: kSilu, or Gemma's "hidden_activation" (default and
  // only accepted value gelu_pytorch_tanh).
  Activation hidden_activation = Activation::kSilu;
  // The embedding rows are multiplied by this (1 = not at all). Gemma:
  // sqrt(hidden_size), rounded to the compute dtype before the multiply as
  // transformers' Gemma*TextScaledWordEmbedding does.
  double embedding_multiplier = 1.0;
  // Gemma "query_pre_attn_scalar" (default 256): the attention scores are
  // q.k * query_pre_attn_scalar^-0.5. 0 = head_dim (every other family).
  double query_pre_attn_scalar = 0;
  // Tanh soft-capping, cap * tanh(x / cap), 0 = none. Gemma 2:
  // "attn_logit_softcapping" on the scaled attention scores before the mask
  // and softmax (absent: 50; null: none); "final_logit_softcapping" on the
  // logits (absent: 30; null: none). Gemma 3: the final one when set
  // (default none); its attention scores are never capped (transformers'
  // Gemma3Attention does not pass attn_logit_softcapping to attention).
  double attn_logit_softcapping = 0;
  double final_logit_softcapping = 0;
  // Gemma 3: the sliding layers rotate with default RoPE at this base
  // ("rope_local_base_freq", default 10000; or rope_parameters
  // .sliding_attention.rope_theta) while the global layers use rope_theta
  // and rope_scaling. 0 = every layer uses rope_theta and rope_scaling.
  double local_rope_theta = 0;

  // Mixture of experts (Mixtral, Qwen2-MoE, Qwen3-MoE; common/format/moe_config.h).
  // 0 = a dense model: every layer has the gated MLP of intermediate_size.
  // Mixtral "num_local_experts"; Qwen "num_experts".
  int64_t num_experts = 0;
  int64_t num_experts_per_tok = 0;  // "num_experts_per_tok": the top-k of the router
  // The intermediate size of one routed expert: Qwen "moe_intermediate_size";
  // Mixtral "intermediate_size" (its layers have no dense MLP).
  int64_t moe_intermediate_size = 0;
  // Qwen2-MoE "shared_expert_intermediate_size": the shared expert, gated by
  // sigmoid(shared_expert_gate(x)), that every token runs; 0 = none.
  int64_t shared_expert_intermediate_size = 0;
  // Whether the top-k routing weights are renormalised to sum to 1: Mixtral
  // always; Qwen "norm_topk_prob" (default false).
  bool norm_topk_prob = false;
  // Qwen: layer l is sparse iff l is not in "mlp_only_layers" and
  // (l + 1) % "decoder_sparse_step" == 0; other layers have the dense MLP of
  // intermediate_size. Mixtral: every layer is sparse.
  int64_t decoder_sparse_step = 1;
  std::vector<int64_t> mlp_only_layers;

  // Whether the model has routed experts (num_experts > 0).
  bool is_moe() const { return num_experts > 0; }
  // Whether global layer `layer` runs the MoE block instead of the dense MLP.
  bool LayerIsSparse(int64_t layer) const;

  // The window of global layer `layer`: sliding_window, or 0 for a global
  // layer of a per-layer model.
  int64_t LayerSlidingWindow(int64_t layer) const;
  // Whether layer `layer` rotates with local_rope_theta (a sliding layer of
  // a model with local_rope_theta > 0).
  bool LayerUsesLocalRope(int64_t layer) const;
  // The attention score scale: query_pre_attn_scalar^-0.5, or head_dim^-0.5.
  double AttentionScale() const;

  // Parameter counts are sums over the family's tensor table:
  // LayerParameterCount / ModelParameterCount in common/model/tensor_roles.h.
  // Bytes of K and V for one token in one layer at `dtype`:
  // 2 * num_key_value_heads * head_dim * DTypeSize(dtype).
  int64_t KvBytesPerTokenPerLayer(DType dtype) const;
};

// The context a model takes (prompt + generated tokens), the one rule the
// coordinator (scheduler.max_context) and the CLI (prompt + --max-tokens)
// apply, as transformers does:
//  - default, linear and llama3 RoPE: max_position_embeddings (for llama3 it
//    is already the extended context; original_max_position_embeddings is
//    the pre-training one), both the default and the most accepted;
//  - dynamic NTK RoPE: the inverse frequencies are recomputed for the
//    sequence length once it passes max_position_embeddings, so transformers
//    sets no bound; the most accepted is unbounded (INT64_MAX) (a sliding
//    window, which attention applies, bounds nothing), and the default (what
//    scheduler.max_context = 0 means) is max_position_embeddings x factor.
struct ContextLimit {
  int64_t default_tokens = 0;  // the context when none is configured
  int64_t max_tokens = 0;      // the most accepted; INT64_MAX = unbounded
  // What sets max_tokens, for messages: "max_position_embeddings 16"; ""
  // when unbounded.
  std::string bound;
  bool unbounded() const;
};
ContextLimit ModelContextLimit(const ModelConfig& config);

// Parses `json_text` (the contents of `path`, used only in error messages).
// Errors: kInvalidArgument naming the path and line:col for malformed JSON,
// or the path and key for a missing required key or a wrong type or value
// (non-positive size, heads % kv_heads != 0, hidden % heads != 0 without
// head_dim, a longrope factor list of the wrong length);
// kUnimplemented naming the key for an architecture, rope type or dtype that
// is not supported (listing the supported ones), for Qwen2/Qwen3 per-layer
// sliding windows ("use_sliding_window", "layer_types") narrower than
// max_position_embeddings, for Phi-3's "partial_rotary_factor" other
// than 1, for a vision tower ("vision_config": Gemma3ForConditionalGeneration
// and other multimodal configs), and for Gemma's "hidden_activation" other
// than gelu_pytorch_tanh, "use_bidirectional_attention" and Gemma 3 rope
// types other than default and linear; ParseQuantizationConfig's errors for
// "quantization_config" (an unsupported quant_method names
// quantization_config.quant_method and lists the supported ones); a
// mixture-of-experts architecture Tessera does not serve (DeepSeek-V3,
// gpt-oss, ...) is kUnimplemented naming 'architectures' and listing the MoE
// families it serves.
StatusOr<ModelConfig> ParseModelConfig(const std::string& json_text, const std::string& path);
// Reads and parses `<dir>/config.json`. Errors: kNotFound naming the path when
// it does not exist, kIoError when it cannot be read, else as ParseModelConfig.
StatusOr<ModelConfig> LoadModelConfig(const std::string& model_dir);

}  // namespace tessera
