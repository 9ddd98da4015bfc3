#include "common/format/quantization.h"

#include "common/format/config_reader.h"

namespace tessera {

namespace {

using config_json::ConfigReader;
using json = nlohmann::json;

constexpr const char* kPrefix = "quantization_config.";

Status Unsupported(const ConfigReader& r, const std::string& key, const std::string& what) {
  return Status(StatusCode::kUnimplemented, r.Error(key, what).message());
}

// HF "fp8": e4m3 weights with block (or per-tensor) inverse scales, dynamic
// activations.
StatusOr<QuantizationConfig> ParseHfFp8(const json& obj, const std::string& path) {
  ConfigReader r(obj, path, kPrefix);
  QuantizationConfig q;
  q.method = QuantMethod::kFp8;
  std::string fmt = "e4m3", scheme = "dynamic";
  TESSERA_RETURN_IF_ERROR(r.String("fmt", &fmt));
  if (fmt != "e4m3") return Unsupported(r, "fmt", "'" + fmt + "' is not supported (only e4m3)");
  std::string scale_fmt = "float";
  TESSERA_RETURN_IF_ERROR(r.String("scale_fmt", &scale_fmt));
  if (scale_fmt != "float")
    return Unsupported(r, "scale_fmt", "'" + scale_fmt + "' is not supported (only float scales)");
  TESSERA_RETURN_IF_ERROR(r.String("activation_scheme", &scheme));
  if (scheme != "dynamic")
    return Unsupported(r, "activation_scheme",
                       "'" + scheme + "' is not supported (only dynamic, as transformers runs it)");
  const json* block = r.Get("weight_block_size");
  if (block == nullptr) {
    q.weight_scale = WeightScaleKind::kTensor;
    return q;
  }
  if (!block->is_array() || block->size() != 2 || !(*block)[0].is_number_integer() ||
      !(*block)[1].is_number_integer() || (*block)[0].get<int64_t>() <= 0 ||
      (*block)[1].get<int64_t>() <= 0)
    return r.Error("weight_block_size", "expected [rows, columns], two positive integers, got " +
                                            config_json::Show(*block));
  q.weight_scale = WeightScaleKind::kBlock;
  q.block_rows = (*block)[0].get<int64_t>();
  q.block_cols = (*block)[1].get<int64_t>();
  return q;
}

// compressed-tensors' kv_cache_scheme: static per-tensor fp8 K/V scales
// (`self_attn.k_scale` / `v_scale`), what the fp8 KV cache reads
// (worker/model/kv_cache_scales.h) when kv_cache.dtype = "fp8".
Status ParseKvCacheScheme(const json& kv, const std::string& path) {
  ConfigReader k(kv, path, std::string(kPrefix) + "kv_cache_scheme.");
  int64_t bits = 8;
  std::string type = "float", strategy = "tensor";
  bool dynamic = false, symmetric = true;
  TESSERA_RETURN_IF_ERROR(k.Int("num_bits", false, &bits));
  TESSERA_RETURN_IF_ERROR(k.String("type", &type));
  TESSERA_RETURN_IF_ERROR(k.String("strategy", &strategy));
  TESSERA_RETURN_IF_ERROR(k.Bool("dynamic", &dynamic));
  TESSERA_RETURN_IF_ERROR(k.Bool("symmetric", &symmetric));
  const std::string only = " (only static per-tensor 8-bit symmetric float K/V scales)";
  if (bits != 8 || type != "float" || !symmetric)
    return Status(
        StatusCode::kUnimplemented,
        k.Error("num_bits", "a KV cache of " + std::to_string(bits) + "-bit " + type +
                                (symmetric ? "" : " asymmetric") + " is not supported" + only)
            .message());
  if (strategy != "tensor")
    return Status(StatusCode::kUnimplemented,
                  k.Error("strategy", "K/V scales per '" + strategy + "' are not supported" + only)
                      .message());
  if (dynamic)
    return Status(StatusCode::kUnimplemented,
                  k.Error("dynamic", "dynamic K/V scales are not supported" + only).message());
  return Status::Ok();
}

// compressed-tensors: one config group of 8-bit symmetric float weights.
StatusOr<QuantizationConfig> ParseCompressedTensors(const json& obj, const std::string& path) {
  ConfigReader r(obj, path, kPrefix);
  QuantizationConfig q;
  q.method = QuantMethod::kCompressedTensors;
  std::string format;
  TESSERA_RETURN_IF_ERROR(r.String("format", &format));
  if (format != "float-quantized" && format != "naive-quantized")
    return Unsupported(
        r, "format",
        "'" + format + "' is not supported (supported: float-quantized, naive-quantized)");
  TESSERA_ASSIGN_OR_RETURN(const json* kv, r.Object("kv_cache_scheme"));
  if (kv != nullptr) {
    TESSERA_RETURN_IF_ERROR(ParseKvCacheScheme(*kv, path));
    q.kv_cache_scales = true;
  }
  TESSERA_ASSIGN_OR_RETURN(const json* groups, r.Object("config_groups"));
  if (groups == nullptr) return r.Missing("config_groups");
  if (groups->size() != 1)
    return Unsupported(r, "config_groups",
                       "has " + std::to_string(groups->size()) +
                           " groups; only one (every quantized Linear alike) is supported");
  const std::string gname = groups->begin().key();
  const std::string gprefix = std::string(kPrefix) + "config_groups." + gname + ".";
  if (!groups->begin()->is_object())
    return r.Error("config_groups." + gname,
                   "expected an object, got " + config_json::Show(*groups->begin()));
  ConfigReader g(*groups->begin(), path, gprefix);
  if (g.Has("output_activations"))
    return Status(StatusCode::kUnimplemented,
                  g.Error("output_activations", "output quantization is not supported").message());
  TESSERA_ASSIGN_OR_RETURN(const json* weights, g.Object("weights"));
  if (weights == nullptr) return g.Missing("weights");
  ConfigReader w(*weights, path, gprefix + "weights.");
  int64_t bits = 0;
  std::string type, strategy;
  bool symmetric = true;
  TESSERA_RETURN_IF_ERROR(w.Int("num_bits", true, &bits));
  TESSERA_RETURN_IF_ERROR(w.String("type", &type));
  TESSERA_RETURN_IF_ERROR(w.String("strategy", &strategy));
  TESSERA_RETURN_IF_ERROR(w.Bool("symmetric", &symmetric));
  if (bits != 8 || type != "float" || !symmetric)
    return Status(StatusCode::kUnimplemented,
                  w.Error("num_bits", "weights of " + std::to_string(bits) + "-bit " + type +
                                          (symmetric ? "" : " asymmetric") +
                                          " are not supported (only 8-bit symmetric float: FP8)")
                      .message());
  if (strategy == "channel") {
    q.weight_scale = WeightScaleKind::kChannel;
  } else if (strategy == "tensor") {
    q.weight_scale = WeightScaleKind::kTensor;
  } else if (strategy == "block") {
    q.weight_scale = WeightScaleKind::kBlock;
    const json* bs = w.Get("block_structure");
    if (bs == nullptr || !bs->is_array() || bs->size() != 2 || !(*bs)[0].is_number_integer() ||
        !(*bs)[1].is_number_integer() || (*bs)[0].get<int64_t>() <= 0 ||
        (*bs)[1].get<int64_t>() <= 0)
      return w.Error("block_structure", "expected [rows, columns], two positive integers");
    q.block_rows = (*bs)[0].get<int64_t>();
    q.block_cols = (*bs)[1].get<int64_t>();
  } else {
    return Status(StatusCode::kUnimplemented,
                  w.Error("strategy",
                          "'" + strategy + "' is not supported (supported: channel, tensor, block)")
                      .message());
  }
  TESSERA_ASSIGN_OR_RETURN(const json* input, g.Object("input_activations"));
  if (input != nullptr) {
    ConfigReader in(*input, path, gprefix + "input_activations.");
    bool dynamic = false;
    std::string in_strategy;
    TESSERA_RETURN_IF_ERROR(in.Bool("dynamic", &dynamic));
    TESSERA_RETURN_IF_ERROR(in.String("strategy", &in_strategy));
    if (!dynamic && in_strategy != "tensor")
      return Status(StatusCode::kUnimplemented,
                    in.Error("strategy", "static input scales per '" + in_strategy +
                                             "' are not supported (only per tensor)")
                        .message());
    q.static_input_scale = !dynamic;
  }
  return q;
}

}  // namespace

const char* QuantMethodName(QuantMethod method) {
  switch (method) {
    case QuantMethod::kNone:
      return "none";
    case QuantMethod::kFp8:
      return "fp8";
    case QuantMethod::kCompressedTensors:
      return "compressed-tensors";
    case QuantMethod::kOnlineFp8:
      return "online-fp8";
  }
  return "?";
}

const char* WeightScaleKindName(WeightScaleKind kind) {
  switch (kind) {
    case WeightScaleKind::kBlock:
      return "block";
    case WeightScaleKind::kChannel:
      return "channel";
    case WeightScaleKind::kTensor:
      return "tensor";
  }
  return "?";
}

std::string QuantizationConfig::ScaleName(const std::string& weight_name) const {
  const std::string suffix = method == QuantMethod::kFp8 ? "_scale_inv" : "_scale";
  return weight_name + suffix;
}

std::string QuantizationConfig::InputScaleName(const std::string& weight_name) const {
  const std::string tail = ".weight";
  std::string base = weight_name;
  if (base.size() >= tail.size() && base.compare(base.size() - tail.size(), tail.size(), tail) == 0)
    base.resize(base.size() - tail.size());
  return base + ".input_scale";
}

int64_t QuantizationConfig::ScaleBytes(int64_t rows, int64_t cols) const {
  switch (weight_scale) {
    case WeightScaleKind::kBlock:
      return 4 * ((rows + block_rows - 1) / block_rows) * ((cols + block_cols - 1) / block_cols);
    case WeightScaleKind::kChannel:
      return 4 * rows;
    case WeightScaleKind::kTensor:
      return 4;
  }
  return 0;
}

std::string QuantizationConfig::Describe() const {
  if (!quantized()) return "none";
  std::string s = std::string(QuantMethodName(method)) + " (e4m3, ";
  if (weight_scale == WeightScaleKind::kBlock)
    s += "block " + std::to_string(block_rows) + "x" + std::to_string(block_cols);
  else
    s += std::string("per-") + WeightScaleKindName(weight_scale);
  s += " weight scales, ";
  s += static_input_scale ? "static" : "dynamic";
  s += " activations";
  if (kv_cache_scales) s += ", static K/V scales";
  return s + ")";
}

QuantizationConfig OnlineFp8Quantization() {
  QuantizationConfig q;
  q.method = QuantMethod::kOnlineFp8;
  q.weight_scale = WeightScaleKind::kChannel;
  return q;
}

StatusOr<QuantizationConfig> ParseQuantizationConfig(const json& obj, const std::string& path) {
  ConfigReader r(obj, path, kPrefix);
  std::string method;
  TESSERA_RETURN_IF_ERROR(r.String("quant_method", &method));
  if (method == "fp8") return ParseHfFp8(obj, path);
  if (method == "compressed-tensors") return ParseCompressedTensors(obj, path);
  return Unsupported(r, "quant_method",
                     (method.empty() ? std::string("missing") : "'" + method + "'") +
                         " is not supported (supported: fp8, compressed-tensors)");
}

StatusOr<QuantMethod> ParseOnlineQuantization(const std::string& value) {
  if (value.empty() || value == "none") return QuantMethod::kNone;
  if (value == "fp8") return QuantMethod::kOnlineFp8;
  return InvalidArgument("model.quantization: '" + value +
                         "' is not supported (supported: none, fp8)");
}

}  // namespace tessera
