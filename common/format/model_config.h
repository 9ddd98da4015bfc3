// ModelConfig: the typed form of a Hugging Face `config.json` for the decoder
// families Tessera runs (LlamaForCausalLM, MistralForCausalLM,
// Qwen2ForCausalLM, Qwen3ForCausalLM, Phi3ForCausalLM).
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

namespace tessera {

enum class Architecture { kLlama, kMistral, kQwen2, kQwen3, kPhi3 };
const char* ArchitectureName(Architecture arch);  // the HF class name

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
  // The sliding-attention window in effect on every layer (0 = none): the
  // token at position p attends to positions (p - sliding_window, p], as
  // transformers' sliding-window mask has it. Mistral and Phi-3:
  // "sliding_window". Qwen2/Qwen3 "use_sliding_window" with a window
  // narrower than max_position_embeddings (per-layer windows) is refused.
  int64_t sliding_window = 0;

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
// max_position_embeddings, and for Phi-3's "partial_rotary_factor" other
// than 1.
StatusOr<ModelConfig> ParseModelConfig(const std::string& json_text, const std::string& path);
// Reads and parses `<dir>/config.json`. Errors: kNotFound naming the path when
// it does not exist, kIoError when it cannot be read, else as ParseModelConfig.
StatusOr<ModelConfig> LoadModelConfig(const std::string& model_dir);

}  // namespace tessera
