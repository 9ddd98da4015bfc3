// The mixture-of-experts keys of a Hugging Face config.json, as transformers'
// MixtralConfig, Qwen2MoeConfig and Qwen3MoeConfig read them (for
// ParseModelConfig in model_config.cc; not a public interface), and the
// refusal of MoE architectures Tessera does not serve.
//
// Errors: kInvalidArgument naming the path and key for a wrong type or value
// (no experts, a top-k outside [1, num_experts], an mlp_only_layers entry
// outside the layers, a non-positive decoder_sparse_step).
//
// Thread-safety: pure functions of their arguments.
#pragma once

#include <string>

#include "common/base/status.h"
#include "common/format/config_reader.h"
#include "common/format/model_config.h"

namespace tessera::config_json {

// The MoE architectures Tessera serves, for messages.
inline constexpr const char* kServedMoeArchitectures =
    "MixtralForCausalLM, Qwen2MoeForCausalLM, Qwen3MoeForCausalLM";

bool IsMoe(Architecture arch);

// Whether `architecture` (config.json's "architectures"[0], not one Tessera
// parses) is a mixture of experts: a known MoE class (DeepseekV3ForCausalLM,
// GptOssForCausalLM, ...) or a config with routed-expert keys
// ("num_experts", "num_local_experts", "n_routed_experts").
bool IsUnservedMoe(const std::string& architecture, const ConfigReader& r);

// Mixtral: num_local_experts, num_experts_per_tok, the expert size from
// intermediate_size, norm_topk_prob true, every layer sparse.
// Qwen2-MoE / Qwen3-MoE: num_experts, num_experts_per_tok,
// moe_intermediate_size, norm_topk_prob, decoder_sparse_step,
// mlp_only_layers; Qwen2-MoE also shared_expert_intermediate_size.
// Runs after the generic keys are read.
Status ParseMoeKeys(const ConfigReader& r, const std::string& path, ModelConfig& c);

}  // namespace tessera::config_json
