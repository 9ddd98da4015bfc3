#include "worker/model/llama_model.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>

#include "common/base/logging.h"
#include "kernels/embedding.h"
#include "kernels/geglu.h"
#include "kernels/head_rms_norm.h"
#include "kernels/linear.h"
#include "kernels/linear_fp8.h"
#include "kernels/linear_swiglu.h"
#include "kernels/paged_attention.h"
#include "kernels/rms_norm.h"
#include "kernels/rope.h"
#include "kernels/rope_write_kv.h"
#include "kernels/softcap.h"
#include "kernels/swiglu.h"
#include "kernels/tensor_ops.h"
#include "worker/model/moe_layer.h"
#include "worker/model/rope_frequencies.h"

namespace tessera {

LlamaModel::LlamaModel(const ModelConfig& config, StageWeights weights, Communicator* tp_comm,
                       kernels::Backend* backend)
    : config_(config),
      weights_(std::move(weights)),
      tp_comm_(tp_comm),
      backend_(backend ? backend : &kernels::CpuBackend()),
      dtype_(backend_->compute_dtype()) {
  TESSERA_CHECK(weights_.layout.tp == 1 || tp_comm_ != nullptr);
  // The table of a sequence within the pre-training context (longrope: the
  // short factors).
  default_inv_freq_ =
      RopeInvFreq(config_, config_.rope_scaling.type == RopeType::kLongRope
                               ? config_.rope_scaling.original_max_position_embeddings
                               : config_.max_position_embeddings);
  if (config_.local_rope_theta > 0) local_inv_freq_ = LocalRopeInvFreq(config_);
  for (const LayerWeights& l : weights_.layers) {
    if (l.sparse()) {
      moe_tokens_ = std::make_shared<MoeTokenCounts>(weights_.layout.expert_begin,
                                                     weights_.layout.expert_end);
      break;
    }
  }
  const char* env = std::getenv("TESSERA_CUDA_GRAPHS");
  decode_graphs_ = backend_->device() == Device::kCUDA && !(env && std::strcmp(env, "0") == 0);
}

StatusOr<Tensor> LlamaModel::Alloc(const std::vector<int64_t>& shape) const {
  return backend_->Allocate(shape, dtype_);
}

Status LlamaModel::Project(const Tensor& x, const Tensor& w, const kernels::Fp8Scales& scales,
                           const Tensor& bias, Tensor& y) const {
  if (w.dtype() != DType::kF8E4M3) return kernels::Linear(x, w, bias, y);
  Tensor scratch;
  const int64_t elements =
      kernels::Fp8ScratchElements(backend_->device(), dtype_, x.dim(0), w.dim(0), w.dim(1), scales);
  if (elements > 0) {
    TESSERA_ASSIGN_OR_RETURN(scratch, Alloc({elements}));
  }
  return kernels::LinearFp8(x, w, scales, bias, y, scratch);
}

StatusOr<Tensor> LlamaModel::NewHidden(int64_t tokens) const {
  return Alloc({tokens, config_.hidden_size});
}

StatusOr<Tensor> LlamaModel::UploadI32(const std::vector<int32_t>& values) const {
  Tensor host = Tensor::Empty({static_cast<int64_t>(values.size())}, DType::kI32);
  std::copy(values.begin(), values.end(), host.data<int32_t>());
  if (backend_->device() == Device::kCPU) return host;
  return backend_->Upload(host);
}

StatusOr<Tensor> LlamaModel::UploadF32(const std::vector<float>& values) const {
  Tensor host = Tensor::Empty({static_cast<int64_t>(values.size())}, DType::kF32);
  std::copy(values.begin(), values.end(), host.data<float>());
  if (backend_->device() == Device::kCPU) return host;
  return backend_->Upload(host);
}

Status LlamaModel::AllReduce(Tensor& t, const char* what, int layer) {
  if (weights_.layout.tp == 1) return Status::Ok();
  Status s;
  if (tp_comm_->device() != t.device()) {
    s = FailedPrecondition(std::string("the tp communicator ") + tp_comm_->name() + " works on " +
                           DeviceName(tp_comm_->device()) + " buffers but the model computes on " +
                           backend_->name());
  } else {
    s = tp_comm_->AllReduceSumTyped(t.raw(), static_cast<size_t>(t.numel()), t.dtype());
  }
  if (!s.ok())
    return s.WithContext(std::string(what) + " all-reduce in layer " + std::to_string(layer));
  return Status::Ok();
}

Status LlamaModel::PrepareMoeDevice() {
  const StageLayout& lay = weights_.layout;
  const int64_t held = lay.expert_end - lay.expert_begin;
  if (moe_device_.empty()) {
    if (held > 0) {
      TESSERA_ASSIGN_OR_RETURN(moe_token_totals_, backend_->Zeros({held}, DType::kI64));
    }
    moe_device_.resize(weights_.layers.size());
    for (size_t l = 0; l < weights_.layers.size(); ++l) {
      const LayerWeights& w = weights_.layers[l];
      if (!w.sparse()) continue;
      TESSERA_ASSIGN_OR_RETURN(
          moe_device_[l].table,
          MakeMoeDeviceTable(*backend_, w, lay.first_layer + static_cast<int>(l)));
      moe_device_[l].token_totals = held > 0 ? &moe_token_totals_ : nullptr;
    }
    return Status::Ok();
  }
  if (held == 0 || ++moe_steps_ < kMoePublishSteps) return Status::Ok();
  moe_steps_ = 0;
  TESSERA_ASSIGN_OR_RETURN(Tensor totals, backend_->ToHost(moe_token_totals_));
  moe_tokens_->Publish(std::span<const int64_t>(totals.data<int64_t>(), static_cast<size_t>(held)));
  return Status::Ok();
}

Status LlamaModel::UploadTables() {
  if (!default_inv_freq_dev_.defined()) {
    TESSERA_ASSIGN_OR_RETURN(default_inv_freq_dev_, UploadF32(default_inv_freq_));
  }
  if (!local_inv_freq_.empty() && !local_inv_freq_dev_.defined()) {
    TESSERA_ASSIGN_OR_RETURN(local_inv_freq_dev_, UploadF32(local_inv_freq_));
  }
  return Status::Ok();
}

Status LlamaModel::PrepareStep(const StepBatch& batch, KvCache& cache, StepInputs& in) {
  const int64_t tokens = batch.total_tokens();
  TESSERA_ASSIGN_OR_RETURN(in.positions, UploadI32(batch.Positions()));
  TESSERA_RETURN_IF_ERROR(UploadTables());
  in.local_inv_freq = local_inv_freq_dev_;
  std::vector<kernels::AttentionSeq> seqs;
  seqs.reserve(batch.seqs.size());
  int64_t begin = 0;
  for (const SeqStep& s : batch.seqs) {
    const int64_t end = begin + s.num_tokens;
    const int64_t seq_len =
        std::max<int64_t>(static_cast<int64_t>(s.start_pos) + s.num_tokens, s.prompt_len);
    // Dynamic NTK rope changes inv_freq once a sequence outgrows
    // max_position_embeddings, longrope (one other table) once it outgrows
    // original_max_position_embeddings; every other type uses the fixed table.
    Tensor inv = default_inv_freq_dev_;
    if (config_.rope_scaling.type == RopeType::kDynamic &&
        seq_len > config_.max_position_embeddings) {
      TESSERA_ASSIGN_OR_RETURN(inv, UploadF32(RopeInvFreq(config_, seq_len)));
    } else if (LongRopeSwitched(seq_len)) {
      if (!long_inv_freq_dev_.defined()) {
        TESSERA_ASSIGN_OR_RETURN(long_inv_freq_dev_, UploadF32(RopeInvFreq(config_, seq_len)));
      }
      inv = long_inv_freq_dev_;
    }
    if (!in.rope.empty() && in.rope.back().end == begin &&
        in.rope.back().inv_freq.raw() == inv.raw() && inv.raw() == default_inv_freq_dev_.raw()) {
      in.rope.back().end = end;  // consecutive sequences on the fixed table: one launch
    } else if (end > begin) {
      in.rope.push_back({begin, end, inv});
    }
    seqs.push_back({begin, s.num_tokens, s.start_pos,
                    std::span<const int32_t>(s.block_table.data(), s.block_table.size())});
    begin = end;
  }
  if (begin != tokens)
    return InvalidArgument("forward: sequences cover " + std::to_string(begin) +
                           " tokens, batch has " + std::to_string(tokens));
  const int64_t work_items =
      kernels::DecodeWorkItems(static_cast<int64_t>(seqs.size()), weights_.layout.kv_heads_local,
                               backend_->multiprocessors());
  TESSERA_ASSIGN_OR_RETURN(in.attention,
                           kernels::MakeAttentionBatch(std::move(seqs), tokens, cache.block_size(),
                                                       cache.num_blocks(), *backend_, work_items));
  return Status::Ok();
}

Status LlamaModel::Forward(const StepBatch& batch, const Tensor& hidden_in, KvCache& cache,
                           Tensor& hidden_out) {
  const StageLayout& lay = weights_.layout;
  const int64_t tokens = batch.total_tokens();
  const int64_t hidden = config_.hidden_size;
  if (hidden_out.rank() != 2 || hidden_out.dim(0) != tokens || hidden_out.dim(1) != hidden ||
      hidden_out.dtype() != dtype_ || hidden_out.device() != backend_->device())
    return InvalidArgument("forward: hidden_out " + hidden_out.Describe() + " for " +
                           std::to_string(tokens) + " tokens of " + DTypeName(dtype_) + " on " +
                           backend_->name());
  if (lay.is_first) {
    for (size_t i = 0; i < batch.token_ids.size(); ++i) {
      if (batch.token_ids[i] < 0 || batch.token_ids[i] >= config_.vocab_size)
        return OutOfRange("forward: token id " + std::to_string(batch.token_ids[i]) +
                          " at position " + std::to_string(i) + " is outside the vocab of " +
                          std::to_string(config_.vocab_size));
    }
  } else if (hidden_in.shape() != hidden_out.shape() || hidden_in.dtype() != hidden_out.dtype()) {
    return InvalidArgument("forward: hidden_in " + hidden_in.Describe() + " vs hidden_out " +
                           hidden_out.Describe());
  }
  if (moe_tokens_ != nullptr && backend_->device() != Device::kCPU)
    TESSERA_RETURN_IF_ERROR(PrepareMoeDevice());
  if (UseDecodeGraph(batch)) return GraphForward(batch, hidden_in, cache, hidden_out);
  StepInputs in;
  TESSERA_RETURN_IF_ERROR(PrepareStep(batch, cache, in));
  if (lay.is_first) {
    TESSERA_ASSIGN_OR_RETURN(in.token_ids, UploadI32(batch.token_ids));
  }
  return Run(in, hidden_in, cache, hidden_out);
}

Status LlamaModel::Run(const StepInputs& in, const Tensor& hidden_in, KvCache& cache,
                       Tensor& hidden_out) {
  const StageLayout& lay = weights_.layout;
  if (lay.is_first) {
    TESSERA_RETURN_IF_ERROR(
        kernels::EmbeddingLookup(in.token_ids, weights_.embed_tokens, lay.vocab_begin, hidden_out));
    TESSERA_RETURN_IF_ERROR(AllReduce(hidden_out, "embedding", -1));
    if (config_.embedding_multiplier != 1.0) {
      // Gemma: x * sqrt(hidden), the multiplier rounded to the dtype first.
      TESSERA_RETURN_IF_ERROR(
          kernels::ScaleInPlace(hidden_out, static_cast<float>(config_.embedding_multiplier)));
    }
  } else {
    TESSERA_RETURN_IF_ERROR(backend_->Copy(hidden_out, hidden_in));
  }
  Tensor pending;
  for (int l = 0; l < lay.num_layers(); ++l) {
    TESSERA_RETURN_IF_ERROR(Layer(l, in, cache, hidden_out, pending));
  }
  if (pending.defined())
    TESSERA_RETURN_IF_ERROR(kernels::AddInPlace(hidden_out, pending, Tensor()));
  return Status::Ok();
}

bool LlamaModel::UseDecodeGraph(const StepBatch& batch) const {
  if (!decode_graphs_ || backend_->device() != Device::kCUDA) return false;
  const int64_t tokens = batch.total_tokens();
  if (tokens == 0 || tokens > kMaxGraphBatch) return false;
  for (const SeqStep& s : batch.seqs) {
    if (s.num_tokens != 1) return false;
    const int64_t seq_len = std::max<int64_t>(static_cast<int64_t>(s.start_pos) + 1, s.prompt_len);
    if (config_.rope_scaling.type == RopeType::kDynamic &&
        seq_len > config_.max_position_embeddings)
      return false;
    if (LongRopeSwitched(seq_len)) return false;
  }
  return true;
}

// Longrope: the short-factor table while the sequence is at most
// original_max_position_embeddings long, the long one past it. A sequence
// that outgrows it is recomputed from an empty cache by the scheduler
// (common/engine/scheduler.cc, LongRopeRecompute), as transformers' Phi-3
// generate() does, so its cached keys all carry the long rotation.
bool LlamaModel::LongRopeSwitched(int64_t seq_len) const {
  return config_.rope_scaling.type == RopeType::kLongRope &&
         seq_len > config_.rope_scaling.original_max_position_embeddings;
}

Status LlamaModel::GraphForward(const StepBatch& batch, const Tensor& hidden_in, KvCache& cache,
                                Tensor& hidden_out) {
  const StageLayout& lay = weights_.layout;
  const int64_t B = batch.total_tokens();
  const int64_t block_size = cache.block_size();
  std::vector<kernels::AttentionSeq> seqs;
  seqs.reserve(batch.seqs.size());
  int64_t begin = 0;
  for (const SeqStep& s : batch.seqs) {
    seqs.push_back({begin, 1, s.start_pos,
                    std::span<const int32_t>(s.block_table.data(), s.block_table.size())});
    ++begin;
  }
  // The decode work split depends on B alone, so the graph's grid and the
  // size of its input buffer stay those of its first step.
  const int64_t work_items =
      kernels::DecodeWorkItems(B, lay.kv_heads_local, backend_->multiprocessors());
  TESSERA_ASSIGN_OR_RETURN(
      kernels::AttentionBatch ab,
      kernels::CheckAttentionBatch(std::move(seqs), B, block_size, cache.num_blocks(), work_items));
  const int64_t bucket = kernels::DecodeContextBucket(ab.max_context);
  const int64_t table_capacity = B * ((bucket + block_size - 1) / block_size);
  const std::vector<int32_t> meta = kernels::PackAttentionMeta(ab, block_size, table_capacity);
  const int64_t meta_len = static_cast<int64_t>(meta.size());
  const GraphKey key{B, bucket, cache.layer(0).k.raw()};
  auto it = graphs_.find(key);
  const bool fresh = it == graphs_.end();
  if (fresh) {
    TESSERA_RETURN_IF_ERROR(UploadTables());
    DecodeGraph g;
    TESSERA_ASSIGN_OR_RETURN(g.inputs, backend_->Zeros({B + meta_len}, DType::kI32));
    TESSERA_ASSIGN_OR_RETURN(g.hidden_out, NewHidden(B));
    if (!lay.is_first) {
      TESSERA_ASSIGN_OR_RETURN(g.hidden_in, NewHidden(B));
    }
    g.in.token_ids = g.inputs.Slice0(0, B);
    const Tensor meta_dev = g.inputs.Slice0(B, B + meta_len);
    const kernels::AttentionMetaLayout ml = kernels::MetaLayoutFor(B, B, work_items);
    g.in.positions = meta_dev.Slice0(ml.token_pos, ml.token_pos + B);
    g.in.rope.push_back({0, B, default_inv_freq_dev_});
    g.in.local_inv_freq = local_inv_freq_dev_;
    // On CUDA only the packed layout and the sizes are read; seqs gives S.
    g.in.attention.seqs.resize(static_cast<size_t>(B));
    g.in.attention.num_tokens = B;
    g.in.attention.max_seq_tokens = 1;
    g.in.attention.max_context = bucket;
    g.in.attention.decode_work_items = work_items;
    g.in.attention.device_meta = meta_dev;
    it = graphs_.emplace(key, std::move(g)).first;
  }
  DecodeGraph& g = it->second;
  std::vector<int32_t> host(batch.token_ids);  // [B]: total_tokens() is its size
  host.insert(host.end(), meta.begin(), meta.end());
  TESSERA_RETURN_IF_ERROR(
      backend_->CopyFromHost(g.inputs, host.data(), host.size() * sizeof(int32_t)));
  if (!lay.is_first) TESSERA_RETURN_IF_ERROR(backend_->Copy(g.hidden_in, hidden_in));
  if (fresh) {
    // The first step of a shape runs eagerly (its result is this step's, and
    // it sets up GEMM plans and kernel attributes), then is recorded.
    Status s = Run(g.in, g.hidden_in, cache, g.hidden_out);
    if (!s.ok()) {
      graphs_.erase(it);
      return s;
    }
    auto work = backend_->Capture([&] { return Run(g.in, g.hidden_in, cache, g.hidden_out); });
    if (!work.ok()) {
      // This step's result is in hand; later steps run eagerly.
      TESSERA_LOG_WARN("model", "decode CUDA graphs turned off: batch {}, context bucket {}: {}", B,
                       bucket, work.status().ToString());
      decode_graphs_ = false;
      Status copied = backend_->Copy(hidden_out, g.hidden_out);
      graphs_.erase(it);
      return copied;
    }
    g.work = std::move(*work);
  } else {
    TESSERA_RETURN_IF_ERROR(g.work->Replay());
    ++graph_replays_;
    if (lay.tp > 1) {
      Status s =
          tp_comm_->WatchEnqueued("decode graph of layers [" + std::to_string(lay.first_layer) +
                                  ", " + std::to_string(lay.end_layer) + ")");
      if (!s.ok()) return s;
    }
  }
  return backend_->Copy(hidden_out, g.hidden_out);
}

Status LlamaModel::Rotate(int layer, const StepInputs& in, Tensor& q3, Tensor& k3) {
  if (config_.LayerUsesLocalRope(layer)) {
    // Gemma 3's sliding layers: one fixed table for every row.
    return kernels::ApplyRopeQk(q3, k3, in.positions, in.local_inv_freq);
  }
  for (const RopeSegment& seg : in.rope) {
    Tensor qs = q3.Slice0(seg.begin, seg.end), ks = k3.Slice0(seg.begin, seg.end);
    const Tensor pos = in.positions.Slice0(seg.begin, seg.end);
    TESSERA_RETURN_IF_ERROR(kernels::ApplyRopeQk(qs, ks, pos, seg.inv_freq));
  }
  return Status::Ok();
}

Status LlamaModel::NormRotateWriteKv(int layer, const LayerWeights& w, const StepInputs& in,
                                     kernels::KvCacheLayer& cache, Tensor& q3, Tensor& k3,
                                     const Tensor& v3) {
  // Qwen3, Gemma 3: per-head RMSNorm of q and k before RoPE. Each rank normalises its own heads
  // with the whole (replicated) weight: no communication. Gemma's scale by (1 + weight).
  const kernels::QkNorms norms{w.q_norm, w.k_norm, static_cast<float>(config_.rms_norm_eps),
                               config_.rms_norm_unit_offset ? 1.0f : 0.0f};
  const Tensor* table = nullptr;
  if (config_.LayerUsesLocalRope(layer)) {
    table = &in.local_inv_freq;
  } else if (in.rope.size() == 1 && in.rope[0].begin == 0 && in.rope[0].end == q3.dim(0)) {
    table = &in.rope[0].inv_freq;
  }
  if (table != nullptr)
    return kernels::NormRopeWriteKv(q3, k3, v3, norms, in.positions, *table, cache, in.attention);
  if (norms.q_weight.defined())
    TESSERA_RETURN_IF_ERROR(
        kernels::HeadRmsNorm(q3, norms.q_weight, norms.eps, norms.weight_offset));
  if (norms.k_weight.defined())
    TESSERA_RETURN_IF_ERROR(
        kernels::HeadRmsNorm(k3, norms.k_weight, norms.eps, norms.weight_offset));
  TESSERA_RETURN_IF_ERROR(Rotate(layer, in, q3, k3));
  return kernels::WriteKv(cache, k3, v3, in.attention);
}

// x [tokens, hidden] times the fused q|k|v weight: one GEMM into [tokens,
// q + k + v]. With one token the three column ranges are contiguous, so q, k
// and v are views of that row; with more, SplitColumns copies them out (one
// kernel), as the attention, RoPE and KV-write kernels take dense rows.
Status LlamaModel::ProjectQkv(const LayerWeights& w, const Tensor& x, Tensor& q, Tensor& k,
                              Tensor& v) const {
  const StageLayout& lay = weights_.layout;
  const int64_t tokens = x.dim(0);
  const int64_t q_cols = lay.heads_local * config_.head_dim;
  const int64_t kv_cols = lay.kv_heads_local * config_.head_dim;
  TESSERA_ASSIGN_OR_RETURN(Tensor qkv, Alloc({tokens, q_cols + 2 * kv_cols}));
  TESSERA_RETURN_IF_ERROR(Project(x, w.qkv_proj, w.qkv_scales, w.qkv_bias, qkv));
  if (tokens == 1) {
    const Tensor row = qkv.Reshape({q_cols + 2 * kv_cols});
    q = row.Slice0(0, q_cols).Reshape({1, q_cols});
    k = row.Slice0(q_cols, q_cols + kv_cols).Reshape({1, kv_cols});
    v = row.Slice0(q_cols + kv_cols, q_cols + 2 * kv_cols).Reshape({1, kv_cols});
    return Status::Ok();
  }
  TESSERA_ASSIGN_OR_RETURN(q, Alloc({tokens, q_cols}));
  TESSERA_ASSIGN_OR_RETURN(k, Alloc({tokens, kv_cols}));
  TESSERA_ASSIGN_OR_RETURN(v, Alloc({tokens, kv_cols}));
  return kernels::SplitColumns(qkv, q, k, v);
}

Status LlamaModel::Layer(int local, const StepInputs& in, KvCache& cache, Tensor& h,
                         Tensor& pending) {
  const LayerWeights& w = weights_.layers[static_cast<size_t>(local)];
  const StageLayout& lay = weights_.layout;
  const int layer = lay.first_layer + local;
  const int64_t tokens = h.dim(0);
  const int64_t hidden = config_.hidden_size, head_dim = config_.head_dim;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  // Gemma's RMSNorms scale by (1 + weight).
  const float norm_offset = config_.rms_norm_unit_offset ? 1.0f : 0.0f;

  TESSERA_ASSIGN_OR_RETURN(Tensor x, Alloc({tokens, hidden}));
  if (pending.defined()) {
    // The previous layer's MLP residual, fused into this layer's input norm.
    TESSERA_RETURN_IF_ERROR(kernels::AddRmsNorm(h, pending, w.input_norm, eps, x, norm_offset));
  } else {
    TESSERA_RETURN_IF_ERROR(kernels::RmsNorm(h, w.input_norm, eps, x, norm_offset));
  }
  // One GEMM for q, k and v (the fused weight, stage_weights.h).
  Tensor q, k, v;
  TESSERA_RETURN_IF_ERROR(ProjectQkv(w, x, q, k, v));
  Tensor q3 = q.Reshape({tokens, lay.heads_local, head_dim});
  Tensor k3 = k.Reshape({tokens, lay.kv_heads_local, head_dim});
  Tensor v3 = v.Reshape({tokens, lay.kv_heads_local, head_dim});
  TESSERA_RETURN_IF_ERROR(NormRotateWriteKv(layer, w, in, cache.layer(local), q3, k3, v3));
  TESSERA_ASSIGN_OR_RETURN(Tensor attn, Alloc({tokens, lay.heads_local * head_dim}));
  // head_dim^-0.5, or Gemma's query_pre_attn_scalar^-0.5. Longrope scales cos
  // and sin of q and k by attention_factor (1 for every other type): the
  // scores by its square.
  const double mscale = config_.rope_scaling.attention_factor;
  float scale = static_cast<float>(config_.AttentionScale());
  if (mscale != 1.0) scale = static_cast<float>(scale * mscale * mscale);
  // The step's K/V rows ride along: a fresh prompt's attention may read them instead of the
  // cache's pages (FlashInfer's Hopper prefill, kernels/paged_attention.h StepKv).
  TESSERA_RETURN_IF_ERROR(kernels::PagedAttention(
      q3, cache.layer(local), in.attention, scale, attn, config_.LayerSlidingWindow(layer),
      static_cast<float>(config_.attn_logit_softcapping), kernels::StepKv{&k3, &v3}));
  TESSERA_ASSIGN_OR_RETURN(Tensor o, Alloc({tokens, hidden}));
  TESSERA_RETURN_IF_ERROR(Project(attn, w.o_proj, w.o_scales, Tensor(), o));
  TESSERA_RETURN_IF_ERROR(AllReduce(o, "attention", layer));
  // Row-parallel biases are added once, after the all-reduce.
  if (w.o_bias.defined()) TESSERA_RETURN_IF_ERROR(kernels::AddInPlace(o, Tensor(), w.o_bias));
  if (w.pre_ff_norm.defined()) {
    // Gemma: post_attention_layernorm on the attention output, the residual
    // add, then pre_feedforward_layernorm before the MLP. Every rank holds
    // the all-reduced output, so the norm needs no communication.
    TESSERA_RETURN_IF_ERROR(kernels::RmsNorm(o, w.post_norm, eps, o, norm_offset));
    TESSERA_RETURN_IF_ERROR(kernels::AddRmsNorm(h, o, w.pre_ff_norm, eps, x, norm_offset));
  } else {
    TESSERA_RETURN_IF_ERROR(kernels::AddRmsNorm(h, o, w.post_norm, eps, x, norm_offset));
  }

  if (w.sparse()) {
    // The MoE block (worker/model/moe_layer.h): this rank's experts, summed
    // over the tp group by the same all-reduce as the dense MLP's.
    TESSERA_ASSIGN_OR_RETURN(Tensor moe, Alloc({tokens, hidden}));
    const MoeDeviceLayer* device =
        moe_device_.empty() ? nullptr : &moe_device_[static_cast<size_t>(local)];
    TESSERA_RETURN_IF_ERROR(
        MoeForward(config_, w, layer, *backend_, x, moe, moe_tokens_.get(), device));
    TESSERA_RETURN_IF_ERROR(AllReduce(moe, "moe", layer));
    pending = moe;
    return Status::Ok();
  }
  TESSERA_ASSIGN_OR_RETURN(Tensor act, Alloc({tokens, lay.inter_local}));
  if (config_.hidden_activation != Activation::kGeluTanh &&
      kernels::LinearSiluMulFuses(x, w.gate_up_proj)) {
    // Decode on CUDA: the SwiGLU in the gate|up projection's epilogue, one launch
    // (kernels/linear_swiglu.h).
    TESSERA_RETURN_IF_ERROR(kernels::LinearSiluMul(x, w.gate_up_proj, w.gate_up_bias, act));
  } else {
    // One GEMM for gate and up (the fused weight), then the activation reads
    // both halves of each row of its output.
    TESSERA_ASSIGN_OR_RETURN(Tensor gate_up, Alloc({tokens, 2 * lay.inter_local}));
    TESSERA_RETURN_IF_ERROR(Project(x, w.gate_up_proj, w.gate_up_scales, w.gate_up_bias, gate_up));
    if (config_.hidden_activation == Activation::kGeluTanh) {
      TESSERA_RETURN_IF_ERROR(kernels::GeluTanhMulFused(gate_up, act));
    } else {
      TESSERA_RETURN_IF_ERROR(kernels::SiluMulFused(gate_up, act));
    }
  }  // gate_up goes back to the allocator before the down projection's output
  TESSERA_ASSIGN_OR_RETURN(Tensor down, Alloc({tokens, hidden}));
  TESSERA_RETURN_IF_ERROR(Project(act, w.down_proj, w.down_scales, Tensor(), down));
  TESSERA_RETURN_IF_ERROR(AllReduce(down, "mlp", layer));
  if (w.down_bias.defined())
    TESSERA_RETURN_IF_ERROR(kernels::AddInPlace(down, Tensor(), w.down_bias));
  // Gemma: post_feedforward_layernorm on the MLP output; the residual add is
  // fused into the next layer's input norm as for every family.
  if (w.post_ff_norm.defined())
    TESSERA_RETURN_IF_ERROR(kernels::RmsNorm(down, w.post_ff_norm, eps, down, norm_offset));
  pending = down;
  return Status::Ok();
}

Status LlamaModel::Logits(const StepBatch& batch, const Tensor& hidden, Tensor& logits) {
  const StageLayout& lay = weights_.layout;
  if (!lay.is_last) return FailedPrecondition("logits: this rank is not on the last stage");
  const int64_t hsize = config_.hidden_size;
  std::vector<int64_t> rows;
  int64_t begin = 0;
  bool leading = true;  // rows == 0, 1, ..., n-1: no gather needed
  for (const SeqStep& s : batch.seqs) {
    begin += s.num_tokens;
    if (s.want_logits) {
      leading = leading && begin - 1 == static_cast<int64_t>(rows.size());
      rows.push_back(begin - 1);
    }
  }
  // Then every position but the last of the chunks that want prompt
  // log-probabilities (StepBatch::LogitsRows).
  begin = 0;
  for (const SeqStep& s : batch.seqs) {
    if (s.want_prompt_logprobs)
      for (int64_t p = begin; p + 1 < begin + s.num_tokens; ++p) {
        leading = leading && p == static_cast<int64_t>(rows.size());
        rows.push_back(p);
      }
    begin += s.num_tokens;
  }
  const int64_t n = static_cast<int64_t>(rows.size());
  if (logits.rank() != 2 || logits.dim(0) != n || logits.dim(1) != lay.vocab_size ||
      logits.dtype() != DType::kF32)
    return InvalidArgument("logits: output " + logits.Describe() + " for " + std::to_string(n) +
                           " rows of vocab " + std::to_string(lay.vocab_size) + " (F32)");
  if (n == 0) return Status::Ok();
  Tensor picked;
  if (leading) {
    picked = hidden.Slice0(0, n);
  } else {
    TESSERA_ASSIGN_OR_RETURN(picked, Alloc({n, hsize}));
    TESSERA_RETURN_IF_ERROR(kernels::GatherRows(hidden, rows, picked));
  }
  TESSERA_ASSIGN_OR_RETURN(Tensor normed, Alloc({n, hsize}));
  TESSERA_RETURN_IF_ERROR(kernels::RmsNorm(picked, weights_.final_norm,
                                           static_cast<float>(config_.rms_norm_eps), normed,
                                           config_.rms_norm_unit_offset ? 1.0f : 0.0f));
  const bool direct = logits.device() == backend_->device();
  Tensor out = logits;
  if (!direct) {
    TESSERA_ASSIGN_OR_RETURN(out, backend_->Allocate({n, lay.vocab_size}, DType::kF32));
  }
  if (lay.tp == 1 && lay.vocab_local == lay.vocab_size) {
    TESSERA_RETURN_IF_ERROR(kernels::Linear(normed, weights_.lm_head, Tensor(), out));
  } else {
    TESSERA_ASSIGN_OR_RETURN(Tensor local, backend_->Allocate({n, lay.vocab_local}, DType::kF32));
    TESSERA_RETURN_IF_ERROR(kernels::Linear(normed, weights_.lm_head, Tensor(), local));
    if (lay.tp == 1) {
      TESSERA_RETURN_IF_ERROR(kernels::CopyColumns(local, 0, out, 0, lay.vocab_size));
    } else {
      // Vocab-parallel lm_head: gather [tp, n, vocab_local] and interleave to
      // [n, tp * vocab_local], dropping the padded tail.
      TESSERA_ASSIGN_OR_RETURN(Tensor gathered,
                               backend_->Allocate({lay.tp, n, lay.vocab_local}, DType::kF32));
      Status s = tp_comm_->device() != local.device()
                     ? FailedPrecondition(std::string("the tp communicator works on ") +
                                          DeviceName(tp_comm_->device()) + " buffers")
                     : tp_comm_->AllGatherTyped(local.raw(), static_cast<size_t>(local.numel()),
                                                DType::kF32, gathered.raw());
      if (!s.ok()) return s.WithContext("lm_head all-gather");
      for (int r = 0; r < lay.tp; ++r) {
        const int64_t col0 = r * lay.vocab_local;
        if (col0 >= lay.vocab_size) break;
        const int64_t cols = std::min(lay.vocab_local, lay.vocab_size - col0);
        const Tensor part = gathered.Slice0(r, r + 1).Reshape({n, lay.vocab_local});
        TESSERA_RETURN_IF_ERROR(kernels::CopyColumns(part, 0, out, col0, cols));
      }
    }
  }
  if (config_.final_logit_softcapping > 0) {
    // Gemma 2: cap * tanh(logits / cap), on the F32 logits.
    TESSERA_RETURN_IF_ERROR(
        kernels::SoftCap(out, static_cast<float>(config_.final_logit_softcapping)));
  }
  if (!direct) TESSERA_RETURN_IF_ERROR(backend_->Copy(logits, out));
  return Status::Ok();
}

}  // namespace tessera
