// QuantizationConfig: how a checkpoint's linear projections are quantized, the
// typed form of config.json's `quantization_config` (or of the serving
// config's `model.quantization = "fp8"`, online quantization at load).
//
// Supported (issue #35, "FP8 on Hopper"), all float8 e4m3fn (DType::kF8E4M3):
//  - HF "fp8" (transformers' FineGrainedFP8Config; the Qwen3 and DeepSeek
//    FP8 releases): {"quant_method": "fp8", "fmt": "e4m3",
//    "activation_scheme": "dynamic", "weight_block_size": [128, 128]}.
//    Each quantized `X.weight` [out, in] (F8_E4M3) has `X.weight_scale_inv`
//    (F32 or BF16) of shape [ceil(out / block_rows), ceil(in / block_cols)];
//    the weight is W[r, c] = q[r, c] x scale_inv[r / block_rows, c / block_cols]
//    (transformers' integrations/finegrained_fp8.py dequantizes so: the
//    "inverse" scale multiplies). weight_block_size null: one scale per tensor.
//  - compressed-tensors FP8 (llm-compressor; quant_method
//    "compressed-tensors", format "float-quantized" or "naive-quantized", one
//    config group whose weights are {num_bits 8, type "float", symmetric}):
//    `X.weight` (F8_E4M3) with `X.weight_scale` of shape [out, 1] (strategy
//    "channel"), [] or [1] ("tensor") or [ceil(out/b0), ceil(in/b1)]
//    ("block", block_structure [b0, b1]); W = q x weight_scale. Input
//    activations "dynamic" (per token or tensor, computed at run time) or
//    static per tensor with `X.input_scale` ([] or [1]).
//  - online ("fp8" from model.quantization): a bf16/f16/f32 checkpoint is
//    quantized at load with one scale per output channel, s_r = max_c |W[r,c]|
//    / 448 (1 for a zero row), q = e4m3(W / s_r) (worker/model/
//    quantized_weight.h), and dynamic per-token activation scales.
//
// Which tensors are quantized is read from the checkpoint, not from the
// config's ignore lists: a projection weight stored as F8_E4M3 is quantized
// and must have its scale tensor; one stored in a float dtype (an ignored
// module, lm_head) is dense. Only the linear projections of the decoder
// layers (RoleIsQuantizable in common/model/tensor_roles.h) may be quantized.
//
// Thread-safety: plain values and pure functions.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>

#include "common/base/status.h"

namespace tessera {

enum class QuantMethod {
  kNone,               // a dense checkpoint
  kFp8,                // HF "fp8" (block-scaled)
  kCompressedTensors,  // compressed-tensors FP8
  kOnlineFp8,          // model.quantization = "fp8": per-channel at load
};
// "none", "fp8", "compressed-tensors", "online-fp8".
const char* QuantMethodName(QuantMethod method);

// How one quantized weight's scales tile it.
enum class WeightScaleKind {
  kBlock,    // [ceil(out / block_rows), ceil(in / block_cols)]
  kChannel,  // [out, 1]: one per output row
  kTensor,   // [] or [1]: one for the whole tensor
};
const char* WeightScaleKindName(WeightScaleKind kind);  // "block", "channel", "tensor"

struct QuantizationConfig {
  QuantMethod method = QuantMethod::kNone;
  WeightScaleKind weight_scale = WeightScaleKind::kBlock;
  int64_t block_rows = 128;  // kBlock: rows of W per scale
  int64_t block_cols = 128;  // kBlock: columns of W per scale
  // Static per-tensor input (activation) scales `X.input_scale`; false =
  // dynamic activation scales, computed per token at run time.
  bool static_input_scale = false;
  // compressed-tensors' kv_cache_scheme: the checkpoint carries static
  // per-tensor fp8 K/V scales per layer (`self_attn.k_scale` / `v_scale`),
  // which the fp8 KV cache uses (kv_cache.dtype = "fp8"; ignored otherwise).
  bool kv_cache_scales = false;

  bool quantized() const { return method != QuantMethod::kNone; }
  // The scale tensor of weight `weight_name` ("...q_proj.weight" ->
  // "...q_proj.weight_scale_inv" for kFp8, "...q_proj.weight_scale" for
  // compressed-tensors). Precondition: method is kFp8 or kCompressedTensors.
  std::string ScaleName(const std::string& weight_name) const;
  // "...q_proj.input_scale" (static_input_scale only).
  std::string InputScaleName(const std::string& weight_name) const;
  // Bytes of the scales of one quantized [rows, cols] weight (fp32 scales).
  int64_t ScaleBytes(int64_t rows, int64_t cols) const;
  // "fp8 (e4m3, block 128x128 weight scales, dynamic activations)".
  std::string Describe() const;
};

// The quantization an online `model.quantization = "fp8"` applies.
QuantizationConfig OnlineFp8Quantization();

// Parses config.json's `quantization_config` object (`path` names the file in
// errors). Errors: kUnimplemented naming `quantization_config.quant_method`
// and listing the supported methods ("fp8", "compressed-tensors") for any
// other method; kUnimplemented naming the key for a supported method with a
// setting Tessera does not run (fmt e5m2, static activations in "fp8", a
// format other than float-/naive-quantized, not exactly one config group,
// weights other than 8-bit symmetric float, a kv_cache_scheme other than
// static per-tensor 8-bit float, output activations); kInvalidArgument naming
// the key for a malformed value.
StatusOr<QuantizationConfig> ParseQuantizationConfig(const nlohmann::json& obj,
                                                     const std::string& path);

// model.quantization: "" or "none" -> kNone, "fp8" -> kOnlineFp8. Errors:
// kInvalidArgument naming the value and listing "none", "fp8".
StatusOr<QuantMethod> ParseOnlineQuantization(const std::string& value);

}  // namespace tessera
