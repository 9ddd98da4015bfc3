#include "worker/model/weight_loader.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "worker/model/quantized_weight.h"
#include "worker/model/shard_upload.h"

namespace tessera {

namespace {

// The field of StageWeights a shard fills, by its role (and, per-layer roles,
// its layer). Errors: kInternal when the layer is outside the stage.
StatusOr<Tensor*> Slot(StageWeights& w, const TensorShard& t) {
  switch (t.role) {
    case TensorRole::kEmbedTokens:
      return &w.embed_tokens;
    case TensorRole::kFinalNorm:
      return &w.final_norm;
    case TensorRole::kLmHead:
      return &w.lm_head;
    default:
      break;
  }
  const int local = t.layer - w.layout.first_layer;
  if (local < 0 || local >= w.layout.num_layers()) {
    return Internal("weight loader: shard '" + t.role_name + "' (role " + TensorRoleName(t.role) +
                    ", layer " + std::to_string(t.layer) + ") is outside the stage's layers [" +
                    std::to_string(w.layout.first_layer) + ", " +
                    std::to_string(w.layout.end_layer) + ")");
  }
  LayerWeights& l = w.layers[static_cast<size_t>(local)];
  switch (t.role) {
    case TensorRole::kInputNorm:
      return &l.input_norm;
    case TensorRole::kQProj:
      return &l.q_proj;
    case TensorRole::kQBias:
      return &l.q_bias;
    case TensorRole::kKProj:
      return &l.k_proj;
    case TensorRole::kKBias:
      return &l.k_bias;
    case TensorRole::kVProj:
      return &l.v_proj;
    case TensorRole::kVBias:
      return &l.v_bias;
    case TensorRole::kQNorm:
      return &l.q_norm;
    case TensorRole::kKNorm:
      return &l.k_norm;
    case TensorRole::kOProj:
      return &l.o_proj;
    case TensorRole::kOBias:
      return &l.o_bias;
    case TensorRole::kPostAttentionNorm:
      return &l.post_norm;
    case TensorRole::kPreFeedforwardNorm:
      return &l.pre_ff_norm;
    case TensorRole::kGateProj:
      return &l.gate_proj;
    case TensorRole::kGateBias:
      return &l.gate_bias;
    case TensorRole::kUpProj:
      return &l.up_proj;
    case TensorRole::kUpBias:
      return &l.up_bias;
    case TensorRole::kDownProj:
      return &l.down_proj;
    case TensorRole::kDownBias:
      return &l.down_bias;
    case TensorRole::kPostFeedforwardNorm:
      return &l.post_ff_norm;
    case TensorRole::kRouter:
      return &l.router;
    case TensorRole::kSharedExpertGate:
      return &l.shared_expert_gate;
    case TensorRole::kSharedGateProj:
      return &l.shared_gate_proj;
    case TensorRole::kSharedUpProj:
      return &l.shared_up_proj;
    case TensorRole::kSharedDownProj:
      return &l.shared_down_proj;
    case TensorRole::kExpertGateProj:
    case TensorRole::kExpertUpProj:
    case TensorRole::kExpertDownProj: {
      const int64_t e = t.expert - w.layout.expert_begin;
      if (e < 0 || e >= static_cast<int64_t>(l.experts.size()))
        return Internal(
            "weight loader: shard '" + t.role_name + "' is expert " + std::to_string(t.expert) +
            ", outside the rank's experts [" + std::to_string(w.layout.expert_begin) + ", " +
            std::to_string(w.layout.expert_end) + ") of layer " + std::to_string(t.layer));
      ExpertWeights& x = l.experts[static_cast<size_t>(e)];
      if (t.role == TensorRole::kExpertGateProj) return &x.gate_proj;
      if (t.role == TensorRole::kExpertUpProj) return &x.up_proj;
      return &x.down_proj;
    }
    case TensorRole::kEmbedTokens:
    case TensorRole::kFinalNorm:
    case TensorRole::kLmHead:
      break;
  }
  return Internal("weight loader: no slot for shard role " + std::string(TensorRoleName(t.role)));
}

// Roles held as the rows of one fused tensor per layer, in row order, and
// the field of that tensor (stage_weights.h, "Fused projections").
struct FusedGroup {
  TensorRole parts[3];
  int num_parts;
  Tensor LayerWeights::*fused;
  const char* name;
  kernels::Fp8Scales LayerWeights::*scales;  // where FP8 scales go; null for biases
};
const FusedGroup kFusedGroups[] = {
    {{TensorRole::kQProj, TensorRole::kKProj, TensorRole::kVProj},
     3,
     &LayerWeights::qkv_proj,
     "qkv_proj",
     &LayerWeights::qkv_scales},
    {{TensorRole::kQBias, TensorRole::kKBias, TensorRole::kVBias},
     3,
     &LayerWeights::qkv_bias,
     "qkv_bias",
     nullptr},
    {{TensorRole::kGateProj, TensorRole::kUpProj},
     2,
     &LayerWeights::gate_up_proj,
     "gate_up_proj",
     &LayerWeights::gate_up_scales},
    {{TensorRole::kGateBias, TensorRole::kUpBias},
     2,
     &LayerWeights::gate_up_bias,
     "gate_up_bias",
     nullptr},
};

// How a projection kept in FP8 holds its scales (kernels/linear_fp8.h): 0
// scale columns = it is not kept (dense, or dequantized at load).
struct Fp8Layout {
  int64_t scale_cols = 0;
  int64_t cols_per_scale = 1;
  int64_t col_phase = 0;
};

using ShardKey = std::tuple<std::string, int64_t, int64_t>;

ShardKey KeyOf(const TensorShard& t) { return std::make_tuple(t.name, t.begin, t.end); }

// The held tensor of `t`'s slice, or null: only a slice of this shape, in
// this backend's dtype and on its device.
const Tensor* HeldSlice(const HeldWeights* held, const TensorShard& t, DType dtype, Device device) {
  if (!held) return nullptr;
  auto h = held->find(KeyOf(t));
  if (h == held->end() || h->second.shape() != t.local_shape || h->second.dtype() != dtype ||
      h->second.device() != device)
    return nullptr;
  return &h->second;
}

// Where the loader puts one part of a fused tensor: its row view, and
// whether the whole fused tensor was taken from the held weights (then the
// part is already in place).
struct PartDest {
  Tensor view;
  bool taken = false;
  Tensor scales_view;  // its rows of the fused FP8 scales, when the group is kept in FP8
};
using PartDests = std::map<std::pair<TensorRole, int>, PartDest>;

// Builds the fused tensor of `g` in global layer `layer`: taken whole from
// `held` when every part is held, matches and lies in place (one after the
// other, as a previous load fused them), else allocated on the backend.
// Binds each part's field to its row view and records it in `dests`.
// Nothing when the layer has none of the parts (an absent bias). Errors:
// kInternal when only some parts are in the spec or their shapes do not
// stack; allocation errors naming the tensor.
Status PlanFusedGroup(const FusedGroup& g, int layer, const ShardSpec& spec, StageWeights& w,
                      kernels::Backend& backend, DType dtype, const HeldWeights* held,
                      const Fp8Layout& fp8, PartDests& dests) {
  if (fp8.scale_cols > 0) {
    dtype = DType::kF8E4M3;  // held weights are in the compute dtype: none is reused
    held = nullptr;
  }
  std::vector<const TensorShard*> shards;
  for (int i = 0; i < g.num_parts; ++i) {
    auto s = spec.Find(g.parts[i], layer);
    if (s.ok()) shards.push_back(*s);
  }
  if (shards.empty()) return Status::Ok();
  const std::string where = std::string(g.name) + " of layer " + std::to_string(layer);
  if (static_cast<int>(shards.size()) != g.num_parts)
    return Internal("weight loader: the shard spec has " + std::to_string(shards.size()) + " of " +
                    std::to_string(g.num_parts) + " parts of " + where);
  std::vector<int64_t> shape = shards[0]->local_shape;
  if (shape.empty()) return Internal("weight loader: a part of " + where + " is a scalar");
  shape[0] = 0;
  for (const TensorShard* s : shards) {
    if (s->local_shape.size() != shape.size() ||
        !std::equal(shape.begin() + 1, shape.end(), s->local_shape.begin() + 1))
      return Internal("weight loader: the parts of " + where + " do not stack along rows (" +
                      s->role_name + ")");
    shape[0] += s->local_shape[0];
  }
  // Whole from `held`: every part there, one right after the other. The
  // fused tensor keeps every part's storage alive.
  Tensor fused;
  bool taken = held != nullptr;
  std::vector<Tensor> held_parts;
  const char* next = nullptr;
  for (const TensorShard* s : shards) {
    if (!taken) break;
    const Tensor* h = HeldSlice(held, *s, dtype, backend.device());
    taken = h != nullptr && (next == nullptr || static_cast<const char*>(h->raw()) == next);
    if (taken) {
      held_parts.push_back(*h);
      next = static_cast<const char*>(h->raw()) + h->nbytes();
    }
  }
  if (taken) {
    void* data = const_cast<void*>(held_parts[0].raw());
    fused = Tensor::Wrap(data, shape, dtype, backend.device(),
                         std::make_shared<std::vector<Tensor>>(std::move(held_parts)));
  } else {
    auto a = backend.Allocate(shape, dtype);
    if (!a.ok()) return a.status().WithContext("allocating the fused " + where);
    fused = std::move(*a);
  }
  LayerWeights& lw = w.layers[static_cast<size_t>(layer - w.layout.first_layer)];
  lw.*g.fused = fused;
  Tensor scales;
  if (fp8.scale_cols > 0) {
    auto a = backend.Allocate({shape[0], fp8.scale_cols}, DType::kF32);
    if (!a.ok()) return a.status().WithContext("allocating the FP8 scales of " + where);
    scales = std::move(*a);
    lw.*g.scales = kernels::Fp8Scales{scales, fp8.cols_per_scale, fp8.col_phase};
    w.weight_bytes += static_cast<int64_t>(scales.nbytes());
  }
  int64_t row = 0;
  for (const TensorShard* s : shards) {
    TESSERA_ASSIGN_OR_RETURN(Tensor * slot, Slot(w, *s));
    const int64_t end = row + s->local_shape[0];
    *slot = fused.Slice0(row, end);
    dests[{s->role, layer}] =
        PartDest{*slot, taken, scales.defined() ? scales.Slice0(row, end) : Tensor()};
    row = end;
  }
  return Status::Ok();
}

// Whether `t` is quantized, and how: kNone (dense), the checkpoint's FP8
// method (its tensor is F8_E4M3), or kOnlineFp8 (a dense projection that
// model.quantization = "fp8" quantizes). Errors: an F8_E4M3 tensor in a
// checkpoint without quantization_config, or in a role no FP8 format
// quantizes (naming the tensor).
StatusOr<QuantMethod> ShardQuantization(const TensorShard& t, const TensorInfo& info,
                                        const ModelConfig& config) {
  const QuantizationConfig& q = config.quantization;
  if (info.dtype == DType::kF8E4M3) {
    if (q.method != QuantMethod::kFp8 && q.method != QuantMethod::kCompressedTensors)
      return InvalidArgument("tensor '" + t.name + "' in " + info.file +
                             " is F8_E4M3 but config.json has no FP8 quantization_config "
                             "(quant_method fp8 or compressed-tensors)");
    if (!RoleIsQuantizable(t.role))
      return InvalidArgument("tensor '" + t.name + "' in " + info.file + " is F8_E4M3 but " +
                             TensorRoleName(t.role) +
                             " is not a linear projection (only q/k/v/o_proj and "
                             "gate/up/down_proj may be FP8)");
    return q.method;
  }
  if (q.method == QuantMethod::kOnlineFp8 && RoleIsQuantizable(t.role))
    return QuantMethod::kOnlineFp8;
  return QuantMethod::kNone;
}

// How shard `t` is held on `backend` when it stays FP8 there
// (Backend::keeps_fp8_weights): the scale layout the FP8 kernels take, or
// scale_cols 0 when it is dense or its columns do not fit those kernels
// (multiples of 16, kernels/linear_fp8.h): then it is dequantized at load.
StatusOr<Fp8Layout> KeptFp8Layout(const Checkpoint& checkpoint, const ModelConfig& config,
                                  const TensorShard& t, const kernels::Backend& backend) {
  Fp8Layout out;
  if (!backend.keeps_fp8_weights() || t.alt != AltForm::kNone || t.full_shape.size() != 2)
    return out;
  TESSERA_ASSIGN_OR_RETURN(TensorInfo info, checkpoint.Find(t.name));
  TESSERA_ASSIGN_OR_RETURN(const QuantMethod m, ShardQuantization(t, info, config));
  if (m == QuantMethod::kNone) return out;
  const QuantizationConfig& q = config.quantization;
  const int64_t c0 = t.split_dim == 1 ? t.begin : 0;
  const int64_t cols = (t.split_dim == 1 ? t.end : t.full_shape[1]) - c0;
  if (cols % 16 != 0) return out;
  if (m == QuantMethod::kOnlineFp8 || q.weight_scale != WeightScaleKind::kBlock) {
    out.scale_cols = 1;
    out.cols_per_scale = cols;
    return out;
  }
  out.col_phase = c0 % q.block_cols;
  if (q.block_cols % 16 != 0 || out.col_phase % 16 != 0) return out;
  out.cols_per_scale = q.block_cols;
  out.scale_cols = (cols + out.col_phase + q.block_cols - 1) / q.block_cols;
  return out;
}

// The FP8 scales of a projection that is not fused (o_proj, down_proj), or null.
kernels::Fp8Scales* UnfusedScalesSlot(StageWeights& w, const TensorShard& t) {
  if (t.role != TensorRole::kOProj && t.role != TensorRole::kDownProj) return nullptr;
  const int local = t.layer - w.layout.first_layer;
  if (local < 0 || local >= w.layout.num_layers()) return nullptr;
  LayerWeights& l = w.layers[static_cast<size_t>(local)];
  return t.role == TensorRole::kOProj ? &l.o_scales : &l.down_scales;
}

// Keeps the FP8 slice `q` of `t` on the backend: its values into `into` (or
// a new F8E4M3 tensor) and its per-row scales (ScalesPerRow) into
// `*scales_dst` (a view to fill, or undefined: a new tensor). Errors:
// kInternal when the slice's scale layout is not the planned one; device
// errors naming the tensor.
StatusOr<Tensor> KeepFp8(const QuantizedWeight& q, const TensorShard& t, const Fp8Layout& layout,
                         kernels::Backend& backend, const Tensor* into, Tensor* scales_dst) {
  if (ScaleColumnsPerRow(q) != layout.scale_cols || ScaleColumnPhase(q) != layout.col_phase)
    return Internal(
        "weight loader: FP8 tensor '" + t.name + "' has " + std::to_string(ScaleColumnsPerRow(q)) +
        " scale columns per row (phase " + std::to_string(ScaleColumnPhase(q)) + "), planned " +
        std::to_string(layout.scale_cols) + " (phase " + std::to_string(layout.col_phase) + ")");
  Tensor dst;
  if (into != nullptr) {
    dst = *into;
  } else {
    auto a = backend.Allocate(t.local_shape, DType::kF8E4M3);
    if (!a.ok()) return a.status().WithContext("loading FP8 tensor '" + t.name + "'");
    dst = std::move(*a);
  }
  Status s = backend.Copy(dst, q.values);
  if (!s.ok()) return s.WithContext("loading FP8 tensor '" + t.name + "'");
  Tensor host = Tensor::Empty({q.rows(), layout.scale_cols});
  ScalesPerRow(q, host.data<float>());
  if (scales_dst->defined()) {
    s = backend.Copy(*scales_dst, host);
    if (!s.ok()) return s.WithContext("loading the scales of FP8 tensor '" + t.name + "'");
  } else {
    auto up = backend.Upload(host);
    if (!up.ok()) return up.status().WithContext("loading the scales of '" + t.name + "'");
    *scales_dst = std::move(*up);
  }
  return dst;
}

// Reads `t`'s slice from the checkpoint in `dtype` onto the backend: into
// `into` (a part's row view, local_shape) when given, else into a new
// tensor. On the CPU a part is read (or converted) straight into its view.
// A quantized slice is read (or quantized) as a QuantizedWeight, whose
// bytes are added to `*quantized_bytes`, and dequantized to fp32: every
// backend computes with dense weights today (quantized_weight.h), unless
// `keep` plans it in FP8 (KeptFp8Layout): then values and scales are kept
// (KeepFp8, scales into `*scales_dst`).
// With `queue` (a device backend) a dense shard in the compute dtype is read in chunks of
// rows through it (worker/model/shard_upload.h): in place once the queue finishes.
StatusOr<Tensor> ReadShard(const Checkpoint& checkpoint, const ModelConfig& config,
                           const TensorShard& t, DType dtype, kernels::Backend& backend,
                           const Tensor* into, int64_t* quantized_bytes,
                           kernels::UploadQueue* queue, const Fp8Layout& keep = Fp8Layout{},
                           Tensor* scales_dst = nullptr) {
  // A transformers 5 checkpoint names (or stacks) some MoE tensors otherwise.
  const bool alt = t.alt != AltForm::kNone && !checkpoint.Has(t.name) && checkpoint.Has(t.alt_name);
  const std::string& source = alt ? t.alt_name : t.name;
  const std::vector<int64_t>& want_shape = alt ? t.alt_shape : t.full_shape;
  TESSERA_ASSIGN_OR_RETURN(TensorInfo info, checkpoint.Find(source));
  if (info.shape != want_shape) {
    std::string want, got;
    for (int64_t d : want_shape) want += (want.empty() ? "" : ", ") + std::to_string(d);
    for (int64_t d : info.shape) got += (got.empty() ? "" : ", ") + std::to_string(d);
    return InvalidArgument("tensor '" + source + "' in " + info.file + " has shape [" + got +
                           "] but config.json implies [" + want + "]");
  }
  TESSERA_ASSIGN_OR_RETURN(const QuantMethod quant, ShardQuantization(t, info, config));
  if (quant != QuantMethod::kNone && keep.scale_cols > 0 && scales_dst != nullptr) {
    StatusOr<QuantizedWeight> q = quant == QuantMethod::kOnlineFp8
                                      ? QuantizeShardOnline(checkpoint, t)
                                      : ReadQuantizedShard(checkpoint, t, config.quantization);
    if (!q.ok()) return q.status().WithContext("loading FP8 tensor '" + t.name + "'");
    *quantized_bytes += q->nbytes();
    return KeepFp8(*q, t, keep, backend, into, scales_dst);
  }
  if (queue != nullptr && quant == QuantMethod::kNone && !alt &&
      ShardUploadApplies(t, info, dtype, queue->staging_bytes())) {
    Tensor dst;
    if (into != nullptr) {
      dst = *into;
    } else {
      auto a = backend.Allocate(t.local_shape, dtype);
      if (!a.ok()) return a.status().WithContext("loading tensor '" + t.name + "'");
      dst = std::move(*a);
    }
    TESSERA_RETURN_IF_ERROR(UploadShard(checkpoint, t, dst, *queue));
    return dst;
  }
  const bool on_host = backend.device() == Device::kCPU;
  // Read raw when the checkpoint has the compute dtype, else through fp32.
  // Only the vocab padding rows past the slice need zeroing.
  const DType read_dtype = info.dtype == dtype && quant == QuantMethod::kNone ? dtype : DType::kF32;
  Tensor host =
      into && on_host && read_dtype == dtype ? *into : Tensor::Empty(t.local_shape, read_dtype);
  const int64_t filled_rows =
      t.split_dim == 0 ? t.end - t.begin : (t.local_shape.empty() ? 0 : t.local_shape[0]);
  if (t.split_dim == 0 && !t.local_shape.empty() && filled_rows < t.local_shape[0]) {
    const size_t row_bytes = host.nbytes() / static_cast<size_t>(t.local_shape[0]);
    std::memset(static_cast<char*>(host.raw()) + static_cast<size_t>(filled_rows) * row_bytes, 0,
                static_cast<size_t>(t.local_shape[0] - filled_rows) * row_bytes);
  }
  if (quant != QuantMethod::kNone) {
    StatusOr<QuantizedWeight> q = quant == QuantMethod::kOnlineFp8
                                      ? QuantizeShardOnline(checkpoint, t)
                                      : ReadQuantizedShard(checkpoint, t, config.quantization);
    if (!q.ok()) return q.status().WithContext("loading FP8 tensor '" + t.name + "'");
    *quantized_bytes += q->nbytes();
    DequantizeToF32(*q, host.data<float>());
  } else if (alt && t.alt != AltForm::kRenamed) {
    // Expert t.expert's matrix of the stacked tensor: its range along
    // split_dim, or all of it; gate_up_proj's up rows start at alt_row_offset.
    const int dim = t.split_dim < 0 ? 0 : t.split_dim;
    int64_t begin = t.split_dim < 0 ? 0 : t.begin, end = t.split_dim < 0 ? t.local_shape[0] : t.end;
    if (dim == 0) {
      begin += t.alt_row_offset;
      end += t.alt_row_offset;
    }
    TESSERA_RETURN_IF_ERROR(
        checkpoint.ReadSliceAt(source, t.expert, dim + 1, begin, end, read_dtype, host.raw()));
  } else if (t.split_dim < 0) {
    TESSERA_RETURN_IF_ERROR(checkpoint.ReadAll(source, read_dtype, host.raw()));
  } else if (t.end > t.begin) {
    TESSERA_RETURN_IF_ERROR(
        checkpoint.ReadSlice(source, t.split_dim, t.begin, t.end, read_dtype, host.raw()));
  }
  if (read_dtype != dtype) {
    Tensor converted = into && on_host ? *into : Tensor::Empty(t.local_shape, dtype);
    ConvertFromF32(dtype, host.data<float>(), converted.raw(), static_cast<size_t>(host.numel()));
    host = converted;
  }
  if (into) {
    Tensor dst = *into;
    Status s = backend.Copy(dst, host);  // a no-op when read in place
    if (!s.ok()) return s.WithContext("loading tensor '" + t.name + "'");
    return dst;
  }
  if (on_host) return host;
  auto up = backend.Upload(host);
  if (!up.ok()) return up.status().WithContext("loading tensor '" + t.name + "'");
  return std::move(*up);
}

}  // namespace

StatusOr<StageWeights> LoadStageWeights(const Checkpoint& checkpoint, const ModelConfig& config,
                                        const ParallelConfig& parallel, const ShardSpec& spec,
                                        const LoadProgressFn& progress,
                                        kernels::Backend* backend_ptr, const HeldWeights* held) {
  kernels::Backend& backend = backend_ptr ? *backend_ptr : kernels::CpuBackend();
  const DType dtype = backend.compute_dtype();
  StageWeights w;
  StageLayout& lay = w.layout;
  lay.first_layer = spec.first_layer();
  lay.end_layer = spec.end_layer();
  lay.is_first = spec.is_first_stage();
  lay.is_last = spec.is_last_stage();
  lay.tp = parallel.TpOfStage(spec.stage());
  lay.tp_rank = spec.tp_rank();
  lay.heads_local = spec.local_heads();
  lay.kv_heads_local = spec.local_kv_heads();
  lay.inter_local = spec.local_intermediate();
  lay.expert_begin = spec.expert_begin();
  lay.expert_end = spec.expert_end();
  lay.moe_inter_local = spec.local_moe_intermediate();
  lay.shared_inter_local = spec.local_shared_intermediate();
  lay.vocab_begin = spec.vocab_begin();
  lay.vocab_local = spec.vocab_end() - spec.vocab_begin();
  lay.vocab_size = config.vocab_size;
  w.layers.resize(static_cast<size_t>(lay.num_layers()));
  for (int layer = lay.first_layer; layer < lay.end_layer; ++layer) {
    if (!config.LayerIsSparse(layer)) continue;
    auto& experts = w.layers[static_cast<size_t>(layer - lay.first_layer)].experts;
    experts.resize(static_cast<size_t>(lay.expert_end - lay.expert_begin));
    for (size_t e = 0; e < experts.size(); ++e)
      experts[e].expert = static_cast<int>(lay.expert_begin + static_cast<int64_t>(e));
  }

  // On a device, shards stream through pinned staging buffers filled by several threads
  // (kernels/upload_queue.h); the CPU reads each shard straight into its tensor.
  // TESSERA_PINNED_LOAD=0 reads every shard through a host tensor instead (the A/B of
  // scripts/gpu-run decode).
  std::unique_ptr<kernels::UploadQueue> queue;
  const char* pinned = std::getenv("TESSERA_PINNED_LOAD");
  if (backend.device() != Device::kCPU && !(pinned != nullptr && std::strcmp(pinned, "0") == 0)) {
    auto q = backend.NewUploadQueue(kernels::UploadOptions{});
    if (!q.ok()) return q.status().WithContext("loading weights");
    queue = std::move(*q);
  }

  // The fused tensors first, so each part is read into its rows.
  // A projection group stays FP8 when every part does (KeptFp8Layout).
  PartDests parts;
  for (int layer = lay.first_layer; layer < lay.end_layer; ++layer) {
    for (const FusedGroup& g : kFusedGroups) {
      Fp8Layout fp8;
      for (int i = 0; g.scales != nullptr && i < g.num_parts; ++i) {
        auto s = spec.Find(g.parts[i], layer);
        if (!s.ok()) break;
        TESSERA_ASSIGN_OR_RETURN(const Fp8Layout part,
                                 KeptFp8Layout(checkpoint, config, **s, backend));
        if (part.scale_cols == 0 || (i > 0 && part.scale_cols != fp8.scale_cols)) {
          fp8 = Fp8Layout{};
          break;
        }
        fp8 = part;
      }
      TESSERA_RETURN_IF_ERROR(PlanFusedGroup(g, layer, spec, w, backend, dtype, held, fp8, parts));
    }
  }

  int64_t total = 0;
  for (const TensorShard& t : spec.tensors())
    total += t.local_numel() * static_cast<int64_t>(DTypeSize(dtype));
  int64_t loaded = 0;
  // The tied embedding on a single stage is one buffer with two roles.
  std::map<ShardKey, Tensor> read;
  auto count = [&](const Tensor& t, bool reused) {
    w.weight_bytes += static_cast<int64_t>(t.nbytes());
    loaded += static_cast<int64_t>(t.nbytes());
    if (reused) {
      w.reused_bytes += static_cast<int64_t>(t.nbytes());
      ++w.reused_tensors;
    }
    if (progress) progress(loaded, total);
  };
  for (const TensorShard& t : spec.tensors()) {
    TESSERA_ASSIGN_OR_RETURN(Tensor * slot, Slot(w, t));
    const ShardKey key = KeyOf(t);
    auto part = parts.find({t.role, t.layer});
    if (part != parts.end()) {
      // A part of a fused tensor: its slot is already its row view.
      const PartDest& dest = part->second;
      read.emplace(key, dest.view);
      if (dest.taken) {
        count(dest.view, true);
        continue;
      }
      const Tensor* h =
          dest.scales_view.defined() ? nullptr : HeldSlice(held, t, dtype, backend.device());
      if (h != nullptr) {
        Tensor dst = dest.view;
        Status s = backend.Copy(dst, *h);
        if (!s.ok()) return s.WithContext("reusing tensor '" + t.name + "'");
        count(dst, true);
        continue;
      }
      Tensor scales_view = dest.scales_view;
      Fp8Layout keep;
      if (scales_view.defined()) {
        TESSERA_ASSIGN_OR_RETURN(keep, KeptFp8Layout(checkpoint, config, t, backend));
      }
      TESSERA_ASSIGN_OR_RETURN(Tensor dst,
                               ReadShard(checkpoint, config, t, dtype, backend, &dest.view,
                                         &w.quantized_bytes, queue.get(), keep, &scales_view));
      count(dst, false);
      continue;
    }
    auto it = read.find(key);
    if (it != read.end()) {
      *slot = it->second;
      continue;
    }
    kernels::Fp8Scales* scales = UnfusedScalesSlot(w, t);
    Fp8Layout keep;
    if (scales != nullptr) {
      TESSERA_ASSIGN_OR_RETURN(keep, KeptFp8Layout(checkpoint, config, t, backend));
    }
    // Held weights are in the compute dtype: an FP8 projection is read again.
    const Tensor* h = keep.scale_cols > 0 ? nullptr : HeldSlice(held, t, dtype, backend.device());
    if (h != nullptr) {
      *slot = *h;
      read.emplace(key, *h);
      count(*h, true);
      continue;
    }
    TESSERA_ASSIGN_OR_RETURN(
        Tensor dst, ReadShard(checkpoint, config, t, dtype, backend, nullptr, &w.quantized_bytes,
                              queue.get(), keep, keep.scale_cols > 0 ? &scales->scales : nullptr));
    if (keep.scale_cols > 0) {
      scales->cols_per_scale = keep.cols_per_scale;
      scales->col_phase = keep.col_phase;
      w.weight_bytes += static_cast<int64_t>(scales->scales.nbytes());
    }
    *slot = dst;
    read.emplace(key, dst);
    count(dst, false);
  }
  if (queue) TESSERA_RETURN_IF_ERROR(queue->Finish());
  return w;
}

StatusOr<HeldWeights> HoldWeights(const StageWeights& weights, const ShardSpec& spec) {
  HeldWeights out;
  // Slot only reads the layout and hands out addresses; nothing is modified.
  StageWeights& w = const_cast<StageWeights&>(weights);
  for (const TensorShard& t : spec.tensors()) {
    TESSERA_ASSIGN_OR_RETURN(Tensor * slot, Slot(w, t));
    if (slot->defined()) out.emplace(std::make_tuple(t.name, t.begin, t.end), *slot);
  }
  return out;
}

}  // namespace tessera
