#include "common/format/model_config.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/format/config_reader.h"
#include "common/format/gemma_config.h"
#include "common/format/moe_config.h"

namespace tessera {

namespace config_json {
namespace {

constexpr const char* kSupportedArchitectures =
    "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, Phi3ForCausalLM, "
    "Gemma2ForCausalLM, Gemma3ForCausalLM (text only), MixtralForCausalLM, Qwen2MoeForCausalLM, "
    "Qwen3MoeForCausalLM";
constexpr const char* kSupportedRopeTypes = "default, linear, dynamic, llama3, longrope (su)";
constexpr const char* kSupportedDTypes = "float32, float16, bfloat16";

// nlohmann reports the 1-based byte index of the last character read; turn
// it into 1-based line and column.
std::string LineCol(const std::string& text, size_t byte) {
  const size_t pos = std::min(byte > 0 ? byte - 1 : 0, text.size());
  size_t line = 1, line_start = 0;
  for (size_t i = 0; i < pos; ++i) {
    if (text[i] == '\n') {
      ++line;
      line_start = i + 1;
    }
  }
  return std::to_string(line) + ":" + std::to_string(pos - line_start + 1);
}

StatusOr<Architecture> ParseArchitecture(const ConfigReader& r, const std::string& path) {
  const json* archs = r.Get("architectures");
  if (archs != nullptr) {
    if (!archs->is_array() || archs->empty() || !(*archs)[0].is_string()) {
      return r.Error("architectures",
                     "expected a non-empty list of class names, got " + Show(*archs));
    }
    const std::string name = (*archs)[0].get<std::string>();
    if (name == "LlamaForCausalLM") return Architecture::kLlama;
    if (name == "MistralForCausalLM") return Architecture::kMistral;
    if (name == "Qwen2ForCausalLM") return Architecture::kQwen2;
    if (name == "Qwen3ForCausalLM") return Architecture::kQwen3;
    if (name == "Phi3ForCausalLM") return Architecture::kPhi3;
    if (name == "Gemma2ForCausalLM") return Architecture::kGemma2;
    if (name == "Gemma3ForCausalLM") return Architecture::kGemma3Text;
    if (name == "MixtralForCausalLM") return Architecture::kMixtral;
    if (name == "Qwen2MoeForCausalLM") return Architecture::kQwen2Moe;
    if (name == "Qwen3MoeForCausalLM") return Architecture::kQwen3Moe;
    if (IsUnservedMoe(name, r)) {
      return Unimplemented(path + ": key 'architectures': '" + name +
                           "' is a mixture-of-experts model Tessera does not serve (MoE "
                           "families served: " +
                           kServedMoeArchitectures + "; all supported: " + kSupportedArchitectures +
                           ")");
    }
    if (name == "Gemma3ForConditionalGeneration") {
      return Unimplemented(path + ": key 'architectures': '" + name +
                           "' (a vision tower) is not supported: only the text model, "
                           "Gemma3ForCausalLM with model_type gemma3_text");
    }
    return Unimplemented(path + ": key 'architectures': '" + name +
                         "' is not supported (supported: " + kSupportedArchitectures + ")");
  }
  // Some configs omit "architectures"; fall back to "model_type".
  std::string model_type;
  TESSERA_RETURN_IF_ERROR(r.String("model_type", &model_type));
  if (model_type.empty()) return r.Missing("architectures");
  if (model_type == "llama") return Architecture::kLlama;
  if (model_type == "mistral") return Architecture::kMistral;
  if (model_type == "qwen2") return Architecture::kQwen2;
  if (model_type == "qwen3") return Architecture::kQwen3;
  if (model_type == "phi3") return Architecture::kPhi3;
  if (model_type == "gemma2") return Architecture::kGemma2;
  if (model_type == "gemma3_text") return Architecture::kGemma3Text;
  if (model_type == "mixtral") return Architecture::kMixtral;
  if (model_type == "qwen2_moe") return Architecture::kQwen2Moe;
  if (model_type == "qwen3_moe") return Architecture::kQwen3Moe;
  return Unimplemented(path + ": key 'model_type': '" + model_type +
                       "' is not supported and 'architectures' is absent (supported: " +
                       kSupportedArchitectures + ")");
}

// Completes a longrope RopeScaling as transformers'
// _compute_longrope_parameters does: original_max_position_embeddings from
// the top-level key (Phi-3 keeps it there), else rope_scaling's, else
// max_position_embeddings; attention_factor, when not given, from the
// extension factor f = max_position_embeddings / original (Phi-3's rule,
// taking precedence over rope_scaling.factor when the top-level key exists):
// 1 when f <= 1, else sqrt(1 + ln(f) / ln(original)). Both factor lists must
// hold head_dim / 2 values.
Status FinishLongRope(const ConfigReader& r, ModelConfig& c) {
  RopeScaling& rs = c.rope_scaling;
  double factor = rs.factor;
  if (r.Has("original_max_position_embeddings")) {
    TESSERA_RETURN_IF_ERROR(r.PositiveInt("original_max_position_embeddings", false,
                                          &rs.original_max_position_embeddings));
    factor = static_cast<double>(c.max_position_embeddings) /
             static_cast<double>(rs.original_max_position_embeddings);
  } else if (rs.original_max_position_embeddings == 0) {
    rs.original_max_position_embeddings = c.max_position_embeddings;
  }
  if (rs.original_max_position_embeddings < 2) {
    // transformers divides by ln(original_max_position_embeddings).
    return r.Error(
        "original_max_position_embeddings",
        "longrope needs at least 2, got " + std::to_string(rs.original_max_position_embeddings));
  }
  if (rs.attention_factor == 0) {
    rs.attention_factor =
        factor <= 1.0
            ? 1.0
            : std::sqrt(1.0 + std::log(factor) / std::log(static_cast<double>(
                                                     rs.original_max_position_embeddings)));
  }
  const size_t half = static_cast<size_t>(c.head_dim / 2);
  const char* key = r.Has("rope_scaling") ? "rope_scaling" : "rope_parameters";
  if (rs.short_factor.size() != half || rs.long_factor.size() != half) {
    return r.Error(
        key, "longrope short_factor and long_factor need head_dim / 2 = " + std::to_string(half) +
                 " values each, got " + std::to_string(rs.short_factor.size()) + " and " +
                 std::to_string(rs.long_factor.size()));
  }
  return Status::Ok();
}

StatusOr<DType> ParseTorchDType(const ConfigReader& r) {
  const char* key = r.Has("torch_dtype") ? "torch_dtype" : "dtype";
  std::string name;
  TESSERA_RETURN_IF_ERROR(r.String(key, &name));
  if (name.empty() || name == "float32") return DType::kF32;
  if (name == "float16") return DType::kF16;
  if (name == "bfloat16") return DType::kBF16;
  Status s = r.Error(key, "'" + name + "' is not supported (supported: " + kSupportedDTypes + ")");
  return Status(StatusCode::kUnimplemented, s.message());
}

}  // namespace

Status ParseRope(const json& obj, const std::string& path, const std::string& key,
                 bool type_required, RopeScaling* out) {
  ConfigReader r(obj, path, key + ".");
  std::string type;
  const char* type_key = r.Has("rope_type") ? "rope_type" : "type";
  TESSERA_RETURN_IF_ERROR(r.String(type_key, &type));
  if (type.empty()) {
    if (type_required) return r.Missing("rope_type");
    type = "default";
  }
  RopeScaling rs;
  if (type == "default") {
    rs.type = RopeType::kDefault;
    *out = rs;
    return Status::Ok();
  }
  if (type == "linear") {
    rs.type = RopeType::kLinear;
  } else if (type == "dynamic") {
    rs.type = RopeType::kDynamic;
  } else if (type == "llama3") {
    rs.type = RopeType::kLlama3;
  } else if (type == "longrope" || type == "su") {
    // Phi-3 (transformers renamed "su" to "longrope"). The factor lists are
    // checked against head_dim, and attention_factor completed, by the caller.
    rs.type = RopeType::kLongRope;
    TESSERA_RETURN_IF_ERROR(r.PositiveDouble("factor", false, &rs.factor));
    TESSERA_RETURN_IF_ERROR(r.PositiveInt("original_max_position_embeddings", false,
                                          &rs.original_max_position_embeddings));
    rs.attention_factor = 0;  // 0: not given
    TESSERA_RETURN_IF_ERROR(r.PositiveDouble("attention_factor", false, &rs.attention_factor));
    for (const char* list : {"short_factor", "long_factor"}) {
      const json* v = r.Get(list);
      if (v == nullptr) return r.Missing(list);
      if (!v->is_array()) return r.Error(list, "expected a list of numbers, got " + Show(*v));
      std::vector<double>& out_list =
          std::string(list) == "short_factor" ? rs.short_factor : rs.long_factor;
      for (const json& e : *v) {
        if (!e.is_number() || !(e.get<double>() > 0))
          return r.Error(list, "expected positive numbers, got " + Show(e));
        out_list.push_back(e.get<double>());
      }
    }
    *out = rs;
    return Status::Ok();
  } else {
    return Unimplemented(path + ": key '" + key + "." + type_key + "': rope type '" + type +
                         "' is not supported (supported: " + kSupportedRopeTypes + ")");
  }
  TESSERA_RETURN_IF_ERROR(r.PositiveDouble("factor", /*required=*/true, &rs.factor));
  const bool llama3 = rs.type == RopeType::kLlama3;
  TESSERA_RETURN_IF_ERROR(r.PositiveInt("original_max_position_embeddings", llama3,
                                        &rs.original_max_position_embeddings));
  if (llama3) {
    TESSERA_RETURN_IF_ERROR(r.PositiveDouble("low_freq_factor", true, &rs.low_freq_factor));
    TESSERA_RETURN_IF_ERROR(r.PositiveDouble("high_freq_factor", true, &rs.high_freq_factor));
    // The llama3 blend divides by (high_freq_factor - low_freq_factor).
    if (!(rs.low_freq_factor < rs.high_freq_factor)) {
      return r.Error("high_freq_factor", "must exceed low_freq_factor (" +
                                             std::to_string(rs.low_freq_factor) + "), got " +
                                             std::to_string(rs.high_freq_factor));
    }
  }
  *out = rs;
  return Status::Ok();
}

}  // namespace config_json

using config_json::ConfigReader;
using config_json::FinishLongRope;
using config_json::IsGemma;
using config_json::json;
using config_json::LineCol;
using config_json::ParseArchitecture;
using config_json::ParseRope;
using config_json::ParseTorchDType;
using config_json::Show;

const char* ArchitectureName(Architecture arch) {
  switch (arch) {
    case Architecture::kLlama:
      return "LlamaForCausalLM";
    case Architecture::kMistral:
      return "MistralForCausalLM";
    case Architecture::kQwen2:
      return "Qwen2ForCausalLM";
    case Architecture::kQwen3:
      return "Qwen3ForCausalLM";
    case Architecture::kPhi3:
      return "Phi3ForCausalLM";
    case Architecture::kGemma2:
      return "Gemma2ForCausalLM";
    case Architecture::kGemma3Text:
      return "Gemma3ForCausalLM";
    case Architecture::kMixtral:
      return "MixtralForCausalLM";
    case Architecture::kQwen2Moe:
      return "Qwen2MoeForCausalLM";
    case Architecture::kQwen3Moe:
      return "Qwen3MoeForCausalLM";
  }
  return "?";
}

const char* ActivationName(Activation act) {
  switch (act) {
    case Activation::kSilu:
      return "silu";
    case Activation::kGeluTanh:
      return "gelu_pytorch_tanh";
  }
  return "?";
}

const char* RopeTypeName(RopeType type) {
  switch (type) {
    case RopeType::kDefault:
      return "default";
    case RopeType::kLinear:
      return "linear";
    case RopeType::kDynamic:
      return "dynamic";
    case RopeType::kLlama3:
      return "llama3";
    case RopeType::kLongRope:
      return "longrope";
  }
  return "?";
}

int64_t ModelConfig::KvBytesPerTokenPerLayer(DType dtype) const {
  return 2 * num_key_value_heads * head_dim * static_cast<int64_t>(DTypeSize(dtype));
}

int64_t ModelConfig::LayerSlidingWindow(int64_t layer) const {
  if (sliding_layers.empty()) return sliding_window;
  if (layer < 0 || layer >= static_cast<int64_t>(sliding_layers.size())) return 0;
  return sliding_layers[static_cast<size_t>(layer)] ? sliding_window : 0;
}

bool ModelConfig::LayerUsesLocalRope(int64_t layer) const {
  return local_rope_theta > 0 && layer >= 0 &&
         layer < static_cast<int64_t>(sliding_layers.size()) &&
         sliding_layers[static_cast<size_t>(layer)];
}

bool ModelConfig::LayerIsSparse(int64_t layer) const {
  if (num_experts <= 0) return false;
  if (std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer) != mlp_only_layers.end())
    return false;
  return decoder_sparse_step > 0 && (layer + 1) % decoder_sparse_step == 0;
}

double ModelConfig::AttentionScale() const {
  return 1.0 / std::sqrt(query_pre_attn_scalar > 0 ? query_pre_attn_scalar
                                                   : static_cast<double>(head_dim));
}

StatusOr<ModelConfig> ParseModelConfig(const std::string& json_text, const std::string& path) {
  json root;
  try {
    root = json::parse(json_text);
  } catch (const json::parse_error& e) {
    // Drop nlohmann's "[json.exception...] parse error at ...: " prefix; the
    // location is reported as path:line:col instead.
    std::string what = e.what();
    if (const size_t p = what.find(": "); what.rfind("[json.exception", 0) == 0 && p != what.npos) {
      what = what.substr(p + 2);
    }
    return InvalidArgument(path + ":" + LineCol(json_text, e.byte) + ": malformed JSON: " + what);
  } catch (const json::exception& e) {
    return InvalidArgument(path + ": malformed JSON: " + e.what());
  }
  if (!root.is_object()) return InvalidArgument(path + ": top level is not a JSON object");
  const ConfigReader r(root, path);

  // A multimodal config (Gemma3ForConditionalGeneration, ...) nests its
  // text model under text_config beside a vision tower.
  if (r.Has("vision_config")) {
    return Unimplemented(path +
                         ": key 'vision_config': a vision tower is not supported (text "
                         "models only: for Gemma 3, Gemma3ForCausalLM with model_type "
                         "gemma3_text)");
  }
  ModelConfig c;
  TESSERA_ASSIGN_OR_RETURN(c.architecture, ParseArchitecture(r, path));
  const bool gemma = IsGemma(c.architecture);
  if (gemma) config_json::SetGemmaDefaults(c);
  TESSERA_RETURN_IF_ERROR(r.String("model_type", &c.model_type));
  TESSERA_RETURN_IF_ERROR(r.PositiveInt("hidden_size", true, &c.hidden_size));
  TESSERA_RETURN_IF_ERROR(r.PositiveInt("intermediate_size", true, &c.intermediate_size));
  TESSERA_RETURN_IF_ERROR(r.PositiveInt("num_hidden_layers", true, &c.num_hidden_layers));
  TESSERA_RETURN_IF_ERROR(r.PositiveInt("num_attention_heads", true, &c.num_attention_heads));
  TESSERA_RETURN_IF_ERROR(r.PositiveInt("vocab_size", true, &c.vocab_size));
  c.num_key_value_heads = c.num_attention_heads;
  TESSERA_RETURN_IF_ERROR(r.PositiveInt("num_key_value_heads", false, &c.num_key_value_heads));
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    return r.Error("num_key_value_heads", std::to_string(c.num_key_value_heads) +
                                              " does not divide num_attention_heads (" +
                                              std::to_string(c.num_attention_heads) + ")");
  }
  if (r.Has("head_dim")) {
    TESSERA_RETURN_IF_ERROR(r.PositiveInt("head_dim", false, &c.head_dim));
  } else if (gemma) {
    c.head_dim = 256;  // Gemma2Config / Gemma3TextConfig default
  } else {
    if (c.hidden_size % c.num_attention_heads != 0) {
      return r.Error("num_attention_heads",
                     std::to_string(c.num_attention_heads) + " does not divide hidden_size (" +
                         std::to_string(c.hidden_size) + ") and no head_dim is given");
    }
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }
  // The weights the shape implies (embedding and lm_head, then per layer the
  // q/k/v/o projections and the gate/up/down MLP), bounded so every byte
  // count derived from them fits int64: 2^48 parameters, far above any model.
  {
    const long double h = c.hidden_size, d = c.head_dim, q = c.num_attention_heads * d,
                      kv = static_cast<long double>(c.num_key_value_heads) * d;
    const long double params =
        2.0L * c.vocab_size * h +
        c.num_hidden_layers * (h * (q + 2 * kv) + q * h + 3.0L * h * c.intermediate_size);
    if (params > 281474976710656.0L) {
      return r.Error("hidden_size",
                     "the shape (hidden_size, intermediate_size, vocab_size, "
                     "num_hidden_layers, heads) implies " +
                         std::to_string(static_cast<double>(params)) +
                         " parameters, more than 2^48");
    }
  }
  TESSERA_RETURN_IF_ERROR(r.PositiveDouble("rms_norm_eps", false, &c.rms_norm_eps));
  TESSERA_RETURN_IF_ERROR(
      r.PositiveInt("max_position_embeddings", false, &c.max_position_embeddings));

  // RoPE: "rope_theta" + "rope_scaling" (transformers 4.x), or one
  // "rope_parameters" object holding both (newer transformers).
  // Gemma 3 has one set per layer type (config_json::ParseGemma3Rope).
  TESSERA_ASSIGN_OR_RETURN(const json* rope_params, r.Object("rope_parameters"));
  TESSERA_ASSIGN_OR_RETURN(const json* rope_scaling, r.Object("rope_scaling"));
  if (c.architecture == Architecture::kGemma3Text) {
    TESSERA_RETURN_IF_ERROR(config_json::ParseGemma3Rope(r, path, c));
  } else if (r.Has("rope_theta")) {
    TESSERA_RETURN_IF_ERROR(r.PositiveDouble("rope_theta", false, &c.rope_theta));
  } else if (rope_params != nullptr) {
    TESSERA_RETURN_IF_ERROR(ConfigReader(*rope_params, path, "rope_parameters.")
                                .PositiveDouble("rope_theta", false, &c.rope_theta));
  }
  if (c.architecture == Architecture::kGemma3Text) {
    // read above
  } else if (rope_scaling != nullptr) {
    TESSERA_RETURN_IF_ERROR(ParseRope(*rope_scaling, path, "rope_scaling", true, &c.rope_scaling));
  } else if (rope_params != nullptr) {
    TESSERA_RETURN_IF_ERROR(
        ParseRope(*rope_params, path, "rope_parameters", false, &c.rope_scaling));
  }

  if (c.rope_scaling.type == RopeType::kLongRope) {
    TESSERA_RETURN_IF_ERROR(FinishLongRope(r, c));
  }
  // Phi-3 (and Phi-4-mini) may rotate only part of each head: the top-level
  // key, or (newer transformers) in rope_parameters.
  for (const json* obj : std::initializer_list<const json*>{&root, rope_params}) {
    if (obj == nullptr) continue;
    const std::string prefix = obj == &root ? "" : "rope_parameters.";
    const ConfigReader rr(*obj, path, prefix);
    double partial_rotary = 1.0;
    TESSERA_RETURN_IF_ERROR(rr.PositiveDouble("partial_rotary_factor", false, &partial_rotary));
    if (partial_rotary != 1.0) {
      return Unimplemented(path + ": key '" + prefix +
                           "partial_rotary_factor': " + Show(*rr.Get("partial_rotary_factor")) +
                           " is not supported (RoPE rotates whole heads: only 1.0)");
    }
  }

  TESSERA_RETURN_IF_ERROR(r.Bool("tie_word_embeddings", &c.tie_word_embeddings));
  TESSERA_RETURN_IF_ERROR(r.Bool("attention_bias", &c.attention_bias));
  TESSERA_RETURN_IF_ERROR(r.Bool("mlp_bias", &c.mlp_bias));
  // The HF modeling code hard-codes these for Qwen2, Qwen3 and Mistral.
  if (c.architecture == Architecture::kQwen2) {
    c.attention_bias = true;
    c.mlp_bias = false;
  } else if (c.architecture == Architecture::kQwen2Moe) {
    // Qwen2MoeAttention: q/k/v bias=config.qkv_bias (default true), o none.
    c.attention_bias = true;
    TESSERA_RETURN_IF_ERROR(r.Bool("qkv_bias", &c.attention_bias));
    c.mlp_bias = false;
  } else if (c.architecture == Architecture::kQwen3 || c.architecture == Architecture::kQwen3Moe) {
    c.mlp_bias = false;  // Qwen3MLP: bias=False; attention_bias is read (q, k, v and o)
  } else if (c.architecture == Architecture::kMistral || c.architecture == Architecture::kPhi3 ||
             c.architecture == Architecture::kMixtral) {
    c.attention_bias = false;
    c.mlp_bias = false;
  }
  TESSERA_RETURN_IF_ERROR(r.IntList("bos_token_id", &c.bos_token_ids));
  TESSERA_RETURN_IF_ERROR(r.IntList("eos_token_id", &c.eos_token_ids));
  TESSERA_ASSIGN_OR_RETURN(c.torch_dtype, ParseTorchDType(r));
  TESSERA_ASSIGN_OR_RETURN(const json* quant, r.Object("quantization_config"));
  if (quant != nullptr) {
    TESSERA_ASSIGN_OR_RETURN(c.quantization, ParseQuantizationConfig(*quant, path));
  }
  if (gemma) {
    TESSERA_RETURN_IF_ERROR(config_json::ParseGemmaKeys(r, path, c));
    return c;
  }
  if (config_json::IsMoe(c.architecture))
    TESSERA_RETURN_IF_ERROR(config_json::ParseMoeKeys(r, path, c));

  // Sliding-window attention. Mistral and Phi-3 apply "sliding_window" on
  // every layer whenever it is set (MistralAttention / Phi3Attention pass
  // sliding_window=config.sliding_window): implemented. Qwen2 and Qwen3 apply
  // it only with "use_sliding_window" and only on layers >= "max_window_layers";
  // newer configs may also list per-layer "layer_types". Those per-layer
  // windows are not implemented: one narrower than max_position_embeddings
  // (so that it masks something) is refused; a wider one never masks.
  int64_t window = 0;
  TESSERA_RETURN_IF_ERROR(r.PositiveInt("sliding_window", false, &window));
  if (c.architecture == Architecture::kMistral || c.architecture == Architecture::kPhi3 ||
      c.architecture == Architecture::kMixtral) {
    c.sliding_window = window;
    return c;
  }
  bool sliding = false;
  const char* sliding_key = "sliding_window";
  if (c.architecture == Architecture::kQwen2 || c.architecture == Architecture::kQwen3 ||
      c.architecture == Architecture::kQwen2Moe || c.architecture == Architecture::kQwen3Moe) {
    bool use = false;
    TESSERA_RETURN_IF_ERROR(r.Bool("use_sliding_window", &use));
    int64_t max_window_layers = 0;
    TESSERA_RETURN_IF_ERROR(r.Int("max_window_layers", false, &max_window_layers));
    sliding = use && window > 0 &&
              (!r.Has("max_window_layers") || max_window_layers < c.num_hidden_layers);
    sliding_key = "use_sliding_window";
  }
  if (const json* types = r.Get("layer_types"); types != nullptr && types->is_array()) {
    for (const json& t : *types) {
      if (t.is_string() && t.get<std::string>() == "sliding_attention" && window > 0) {
        sliding = true;
        sliding_key = "layer_types";
      }
    }
  }
  if (sliding) c.sliding_window = window;
  if (sliding && window < c.max_position_embeddings) {
    return Unimplemented(path + ": key '" + sliding_key +
                         "': per-layer sliding-window attention (window " + std::to_string(window) +
                         " < max_position_embeddings " + std::to_string(c.max_position_embeddings) +
                         ") is not supported for " + ArchitectureName(c.architecture) +
                         " (only a window on every layer, as Mistral and Phi-3 have)");
  }
  return c;
}

bool ContextLimit::unbounded() const { return max_tokens == std::numeric_limits<int64_t>::max(); }

ContextLimit ModelContextLimit(const ModelConfig& c) {
  ContextLimit l;
  const int64_t mpe = c.max_position_embeddings;
  if (c.rope_scaling.type != RopeType::kDynamic) {
    l.default_tokens = l.max_tokens = mpe;
    l.bound = "max_position_embeddings " + std::to_string(mpe);
    return l;
  }
  const double scaled = static_cast<double>(mpe) * std::max(1.0, c.rope_scaling.factor);
  l.default_tokens =
      scaled >= 9.0e18 ? std::numeric_limits<int64_t>::max() : static_cast<int64_t>(scaled);
  l.max_tokens = std::numeric_limits<int64_t>::max();
  return l;
}

StatusOr<ModelConfig> LoadModelConfig(const std::string& model_dir) {
  const std::string path = (std::filesystem::path(model_dir) / "config.json").string();
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return NotFound(path + ": no such file");
  std::ifstream in(path, std::ios::binary);
  if (!in) return IoError(path + ": cannot read: " + std::strerror(errno));
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return IoError(path + ": read failed");
  return ParseModelConfig(ss.str(), path);
}

}  // namespace tessera
