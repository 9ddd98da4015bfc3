#include "common/format/moe_config.h"

#include <algorithm>
#include <string_view>

namespace tessera::config_json {

namespace {

// transformers' MoE causal-LM classes Tessera does not run (their routers,
// expert layouts or attention differ from the three served families).
constexpr std::string_view kUnservedMoe[] = {
    "DeepseekV2ForCausalLM",
    "DeepseekV3ForCausalLM",
    "GptOssForCausalLM",
    "Qwen3NextForCausalLM",
    "PhimoeForCausalLM",
    "OlmoeForCausalLM",
    "GraniteMoeForCausalLM",
    "DbrxForCausalLM",
    "JambaForCausalLM",
    "Llama4ForCausalLM",
    "Glm4MoeForCausalLM",
    "JetMoeForCausalLM",
    "MiniMaxForCausalLM",
    "Ernie4_5_MoeForCausalLM",
    "HunYuanMoEV1ForCausalLM",
    "FlexOlmoForCausalLM",
    "GraniteMoeSharedForCausalLM",
};

}  // namespace

bool IsMoe(Architecture arch) {
  return arch == Architecture::kMixtral || arch == Architecture::kQwen2Moe ||
         arch == Architecture::kQwen3Moe;
}

bool IsUnservedMoe(const std::string& architecture, const ConfigReader& r) {
  for (std::string_view name : kUnservedMoe) {
    if (architecture == name) return true;
  }
  return r.Has("num_experts") || r.Has("num_local_experts") || r.Has("n_routed_experts");
}

Status ParseMoeKeys(const ConfigReader& r, const std::string& path, ModelConfig& c) {
  (void)path;
  const bool mixtral = c.architecture == Architecture::kMixtral;
  // Qwen2MoeConfig / Qwen3MoeConfig name it num_experts, but transformers 5
  // maps that to num_local_experts and save_pretrained writes the latter
  // (5.24: a Qwen3-MoE made by from_config has no num_experts key). Read the
  // one present; both must agree.
  const char* experts_key = mixtral || (!r.Has("num_experts") && r.Has("num_local_experts"))
                                ? "num_local_experts"
                                : "num_experts";
  if (!mixtral && r.Has("num_experts") && r.Has("num_local_experts")) {
    int64_t a = 0, b = 0;
    TESSERA_RETURN_IF_ERROR(r.PositiveInt("num_experts", true, &a));
    TESSERA_RETURN_IF_ERROR(r.PositiveInt("num_local_experts", true, &b));
    if (a != b)
      return r.Error("num_local_experts",
                     std::to_string(b) + " disagrees with num_experts (" + std::to_string(a) + ")");
  }
  // MixtralConfig: num_local_experts 8, num_experts_per_tok 2; Qwen2MoeConfig:
  // num_experts 60, top-k 4, moe_intermediate_size 1408, shared 5632;
  // Qwen3MoeConfig: 128, top-k 8, moe_intermediate_size 768.
  c.num_experts = mixtral ? 8 : (c.architecture == Architecture::kQwen2Moe ? 60 : 128);
  c.num_experts_per_tok = mixtral ? 2 : (c.architecture == Architecture::kQwen2Moe ? 4 : 8);
  TESSERA_RETURN_IF_ERROR(r.PositiveInt(experts_key, false, &c.num_experts));
  TESSERA_RETURN_IF_ERROR(r.PositiveInt("num_experts_per_tok", false, &c.num_experts_per_tok));
  if (c.num_experts_per_tok > c.num_experts) {
    return r.Error("num_experts_per_tok", std::to_string(c.num_experts_per_tok) + " exceeds " +
                                              experts_key + " (" + std::to_string(c.num_experts) +
                                              ")");
  }
  if (mixtral) {
    // MixtralSparseMoeBlock: softmax, top-k, renormalise; every layer sparse.
    c.moe_intermediate_size = c.intermediate_size;
    c.norm_topk_prob = true;
    return Status::Ok();
  }
  c.moe_intermediate_size = c.architecture == Architecture::kQwen2Moe ? 1408 : 768;
  TESSERA_RETURN_IF_ERROR(r.PositiveInt("moe_intermediate_size", false, &c.moe_intermediate_size));
  TESSERA_RETURN_IF_ERROR(r.Bool("norm_topk_prob", &c.norm_topk_prob));
  TESSERA_RETURN_IF_ERROR(r.PositiveInt("decoder_sparse_step", false, &c.decoder_sparse_step));
  TESSERA_RETURN_IF_ERROR(r.IntList("mlp_only_layers", &c.mlp_only_layers));
  for (int64_t l : c.mlp_only_layers) {
    if (l < 0 || l >= c.num_hidden_layers)
      return r.Error("mlp_only_layers", "layer " + std::to_string(l) + " is outside [0, " +
                                            std::to_string(c.num_hidden_layers) + ")");
  }
  if (c.architecture == Architecture::kQwen2Moe) {
    c.shared_expert_intermediate_size = 5632;
    TESSERA_RETURN_IF_ERROR(
        r.Int("shared_expert_intermediate_size", false, &c.shared_expert_intermediate_size));
    if (c.shared_expert_intermediate_size < 0)
      return r.Error("shared_expert_intermediate_size", "must not be negative");
  }
  return Status::Ok();
}

}  // namespace tessera::config_json
