// The Gemma 2 and Gemma 3 (text) keys of a Hugging Face config.json, as
// transformers' Gemma2Config and Gemma3TextConfig read them (for
// ParseModelConfig in model_config.cc; not a public interface).
//
// Errors: kInvalidArgument naming the path and key for a wrong type or value;
// kUnimplemented naming the key for what the kernels do not implement
// ("hidden_activation" other than gelu_pytorch_tanh,
// "use_bidirectional_attention", RoPE types other than default and linear).
//
// Thread-safety: pure functions of their arguments.
#pragma once

#include <string>

#include "common/base/status.h"
#include "common/format/config_reader.h"
#include "common/format/model_config.h"

namespace tessera::config_json {

bool IsGemma(Architecture arch);

// The config classes' defaults for generic keys a config.json may leave out:
// tie_word_embeddings true, max_position_embeddings 8192 (Gemma 2) or 131072
// (Gemma 3). (head_dim's default, 256, is applied by ParseModelConfig where
// it reads head_dim.)
void SetGemmaDefaults(ModelConfig& c);

// Gemma 3's two RoPE tables: the global layers' from "rope_theta" (default
// 1000000) and "rope_scaling" (default or linear), the sliding layers'
// default RoPE at "rope_local_base_freq" (default 10000); or the newer
// "rope_parameters": {"full_attention": {...}, "sliding_attention": {...}}.
// Fills rope_theta, rope_scaling and local_rope_theta.
Status ParseGemma3Rope(const ConfigReader& r, const std::string& path, ModelConfig& c);

// Everything else that differs from Llama: the (1 + w) RMSNorm, the
// embedding multiplier sqrt(hidden_size), hidden_activation,
// query_pre_attn_scalar, the soft-capping keys, the per-layer sliding
// windows ("sliding_window", "layer_types", Gemma 3's
// "sliding_window_pattern"), no MLP biases, and (Gemma 2) RoPE default or
// linear. Runs after the generic keys are read.
Status ParseGemmaKeys(const ConfigReader& r, const std::string& path, ModelConfig& c);

}  // namespace tessera::config_json
