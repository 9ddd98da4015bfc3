#include "common/format/gemma_config.h"

#include <cmath>
#include <cstdint>
#include <vector>

namespace tessera::config_json {

namespace {

constexpr const char* kSupportedActivations = "gelu_pytorch_tanh";
constexpr const char* kGemmaRopeTypes = "default, linear";

// A soft-capping key: absent -> `absent_default`, null -> none (0), else a
// positive number.
Status SoftCap(const ConfigReader& r, const std::string& key, double absent_default, double* out) {
  *out = r.IsNull(key) ? 0.0 : absent_default;
  return r.PositiveDouble(key, false, out);
}

Status CheckGemmaRopeType(const RopeScaling& rs, const std::string& path, const std::string& key) {
  if (rs.type == RopeType::kDefault || rs.type == RopeType::kLinear) return Status::Ok();
  return Unimplemented(path + ": key '" + key + "': rope type '" + RopeTypeName(rs.type) +
                       "' is not supported for Gemma (supported: " + kGemmaRopeTypes + ")");
}

// "layer_types" (a list of "sliding_attention" / "full_attention", one per
// layer), else the family's rule: Gemma 2 slides on the even layers, Gemma 3
// on every layer but each "sliding_window_pattern"-th (default 6).
StatusOr<std::vector<bool>> LayerTypes(const ConfigReader& r, const ModelConfig& c) {
  std::vector<bool> sliding(static_cast<size_t>(c.num_hidden_layers));
  if (const json* types = r.Get("layer_types"); types != nullptr) {
    if (!types->is_array() || static_cast<int64_t>(types->size()) != c.num_hidden_layers) {
      return r.Error("layer_types", "expected a list of num_hidden_layers (" +
                                        std::to_string(c.num_hidden_layers) +
                                        ") layer types, got " + Show(*types));
    }
    for (size_t i = 0; i < types->size(); ++i) {
      const json& t = (*types)[i];
      const std::string name = t.is_string() ? t.get<std::string>() : "";
      if (name == "sliding_attention") {
        sliding[i] = true;
      } else if (name != "full_attention") {
        Status s = r.Error("layer_types", "layer " + std::to_string(i) + ": " + Show(t) +
                                              " is not supported (supported: "
                                              "sliding_attention, full_attention)");
        return Status(StatusCode::kUnimplemented, s.message());
      }
    }
    return sliding;
  }
  int64_t pattern = 2;  // Gemma 2: sliding iff (i + 1) % 2 != 0
  if (c.architecture == Architecture::kGemma3Text) {
    pattern = 6;
    TESSERA_RETURN_IF_ERROR(r.PositiveInt("sliding_window_pattern", false, &pattern));
  }
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    sliding[static_cast<size_t>(i)] = (i + 1) % pattern != 0;
  }
  return sliding;
}

}  // namespace

bool IsGemma(Architecture arch) {
  return arch == Architecture::kGemma2 || arch == Architecture::kGemma3Text;
}

void SetGemmaDefaults(ModelConfig& c) {
  c.tie_word_embeddings = true;
  c.max_position_embeddings = c.architecture == Architecture::kGemma2 ? 8192 : 131072;
}

Status ParseGemma3Rope(const ConfigReader& r, const std::string& path, ModelConfig& c) {
  TESSERA_ASSIGN_OR_RETURN(const json* params, r.Object("rope_parameters"));
  TESSERA_ASSIGN_OR_RETURN(const json* scaling, r.Object("rope_scaling"));
  c.rope_theta = 1000000.0;  // Gemma3TextConfig.default_theta
  c.local_rope_theta = 10000.0;
  TESSERA_RETURN_IF_ERROR(r.PositiveDouble("rope_theta", false, &c.rope_theta));
  TESSERA_RETURN_IF_ERROR(r.PositiveDouble("rope_local_base_freq", false, &c.local_rope_theta));
  std::string global_key = "rope_scaling";
  if (params != nullptr) {
    if (!params->contains("full_attention") && !params->contains("sliding_attention")) {
      return r.Error("rope_parameters",
                     "Gemma 3 expects one object per layer type (full_attention, "
                     "sliding_attention), got " +
                         Show(*params));
    }
    const ConfigReader pr(*params, path, "rope_parameters.");
    TESSERA_ASSIGN_OR_RETURN(const json* full, pr.Object("full_attention"));
    TESSERA_ASSIGN_OR_RETURN(const json* local, pr.Object("sliding_attention"));
    if (full != nullptr) {
      global_key = "rope_parameters.full_attention";
      TESSERA_RETURN_IF_ERROR(ParseRope(*full, path, global_key, false, &c.rope_scaling));
      TESSERA_RETURN_IF_ERROR(ConfigReader(*full, path, global_key + ".")
                                  .PositiveDouble("rope_theta", false, &c.rope_theta));
    }
    if (local != nullptr) {
      const std::string key = "rope_parameters.sliding_attention";
      RopeScaling local_rope;
      TESSERA_RETURN_IF_ERROR(ParseRope(*local, path, key, false, &local_rope));
      if (local_rope.type != RopeType::kDefault) {
        return Unimplemented(path + ": key '" + key + ".rope_type': rope type '" +
                             RopeTypeName(local_rope.type) +
                             "' is not supported for Gemma 3's sliding layers (only default)");
      }
      TESSERA_RETURN_IF_ERROR(ConfigReader(*local, path, key + ".")
                                  .PositiveDouble("rope_theta", false, &c.local_rope_theta));
    }
  }
  // transformers merges a "rope_scaling" into the global layers' parameters.
  if (scaling != nullptr) {
    global_key = "rope_scaling";
    TESSERA_RETURN_IF_ERROR(ParseRope(*scaling, path, global_key, true, &c.rope_scaling));
  }
  return CheckGemmaRopeType(c.rope_scaling, path, global_key);
}

Status ParseGemmaKeys(const ConfigReader& r, const std::string& path, ModelConfig& c) {
  c.rms_norm_unit_offset = true;
  c.mlp_bias = false;  // Gemma*MLP: bias=False; attention_bias is read (q, k, v and o)
  // Gemma*TextScaledWordEmbedding: embed_scale = hidden_size ** 0.5.
  c.embedding_multiplier = std::sqrt(static_cast<double>(c.hidden_size));
  if (c.architecture == Architecture::kGemma2) {
    TESSERA_RETURN_IF_ERROR(CheckGemmaRopeType(
        c.rope_scaling, path, r.Has("rope_scaling") ? "rope_scaling" : "rope_parameters"));
  }

  std::string act = "gelu_pytorch_tanh";
  TESSERA_RETURN_IF_ERROR(r.String("hidden_activation", &act));
  if (act != "gelu_pytorch_tanh") {
    return Unimplemented(path + ": key 'hidden_activation': '" + act +
                         "' is not supported (supported: " + kSupportedActivations + ")");
  }
  c.hidden_activation = Activation::kGeluTanh;

  c.query_pre_attn_scalar = 256.0;
  TESSERA_RETURN_IF_ERROR(
      r.PositiveDouble("query_pre_attn_scalar", false, &c.query_pre_attn_scalar));

  if (c.architecture == Architecture::kGemma2) {
    TESSERA_RETURN_IF_ERROR(SoftCap(r, "attn_logit_softcapping", 50.0, &c.attn_logit_softcapping));
    TESSERA_RETURN_IF_ERROR(
        SoftCap(r, "final_logit_softcapping", 30.0, &c.final_logit_softcapping));
  } else {
    // Read for its checks only: Gemma3Attention never applies it.
    double ignored = 0;
    TESSERA_RETURN_IF_ERROR(SoftCap(r, "attn_logit_softcapping", 0.0, &ignored));
    TESSERA_RETURN_IF_ERROR(SoftCap(r, "final_logit_softcapping", 0.0, &c.final_logit_softcapping));
  }

  bool bidirectional = false;
  TESSERA_RETURN_IF_ERROR(r.Bool("use_bidirectional_attention", &bidirectional));
  if (bidirectional) {
    return Unimplemented(path +
                         ": key 'use_bidirectional_attention': true is not supported "
                         "(attention is causal)");
  }

  // "sliding_window": absent -> 4096 (both config classes), null -> none.
  int64_t window = r.IsNull("sliding_window") ? 0 : 4096;
  TESSERA_RETURN_IF_ERROR(r.PositiveInt("sliding_window", false, &window));
  TESSERA_ASSIGN_OR_RETURN(std::vector<bool> sliding, LayerTypes(r, c));
  c.sliding_window = window;
  // The layer types also pick Gemma 3's RoPE table, window or not.
  c.sliding_layers = std::move(sliding);
  return Status::Ok();
}

}  // namespace tessera::config_json
