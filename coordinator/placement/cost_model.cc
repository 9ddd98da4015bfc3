#include "coordinator/placement/cost_model.h"

#include <algorithm>
#include <cmath>

#include "common/model/tensor_roles.h"

namespace tessera {

namespace {

// FP8 projections: each quantizable role's parameters count 1 byte instead
// of dtype_bytes, plus its fp32 scales (QuantizationConfig::ScaleBytes of
// the role's whole shape). Per-channel scales of a row-parallel projection
// are held whole by every tp rank (the rank holds all of its output rows):
// they join the replicated bytes; every other scale splits with its weight.
void AddFp8LayerBytes(const ModelConfig& m, ModelSizes* s) {
  s->fp8 = true;
  for (const RoleSpec& rs : FamilyRolesOf(m.architecture).roles) {
    if (rs.place != RolePlace::kLayer || !RolePresent(rs, m) || !RoleIsQuantizable(rs.role))
      continue;
    const std::vector<int64_t> shape = RoleShape(rs, m);
    const double params = static_cast<double>(RoleNumel(rs, m));
    const double scales = static_cast<double>(m.quantization.ScaleBytes(shape[0], shape[1]));
    s->layer_bytes += params * (1.0 - s->dtype_bytes) + scales;
    if (rs.split == SplitKind::kRowParallel &&
        m.quantization.weight_scale == WeightScaleKind::kChannel)
      s->layer_replicated_bytes += scales;
  }
}

}  // namespace

ModelSizes ModelSizes::From(const ModelConfig& m, DType weight_dtype, DType kv_dtype,
                            bool keeps_fp8) {
  ModelSizes s;
  s.layers = m.num_hidden_layers;
  s.hidden = m.hidden_size;
  s.intermediate = m.intermediate_size;
  s.heads = m.num_attention_heads;
  s.kv_heads = m.num_key_value_heads;
  s.head_dim = m.head_dim;
  s.vocab = m.vocab_size;
  s.tied = m.tie_word_embeddings;
  s.dtype_bytes = static_cast<double>(DTypeSize(weight_dtype));
  s.kv_dtype_bytes = static_cast<double>(DTypeSize(kv_dtype));
  s.layer_params = static_cast<double>(LayerParameterCount(m));
  s.layer_bytes = s.layer_params * s.dtype_bytes;
  // Replicated on every tp rank: the two RMSNorm weights, and the
  // row-parallel biases (o_proj for Llama with attention_bias, down_proj with
  // mlp_bias), as the family's tensor table has them.
  s.layer_replicated_bytes = static_cast<double>(LayerReplicatedParameterCount(m)) * s.dtype_bytes;
  if (m.quantization.quantized() && keeps_fp8) AddFp8LayerBytes(m, &s);
  s.embed_bytes =
      static_cast<double>(m.vocab_size) * static_cast<double>(m.hidden_size) * s.dtype_bytes;
  s.experts = m.num_experts;
  s.top_k = m.num_experts_per_tok;
  s.moe_intermediate = m.moe_intermediate_size;
  s.expert_layer_bytes = static_cast<double>(LayerExpertParameterCount(m)) * s.dtype_bytes;
  return s;
}

bool AutoExpertParallel(int64_t moe_intermediate, int tp) {
  return tp > 1 && (moe_intermediate % tp != 0 || moe_intermediate / tp < kMinExpertSliceColumns);
}

bool ModelSizes::ExpertParallelAt(int tp) const {
  return expert_parallel_auto ? AutoExpertParallel(moe_intermediate, tp) : expert_parallel;
}

double ModelSizes::ExpertBytesPerRank(int tp) const {
  if (experts <= 0) return 0;
  if (!ExpertParallelAt(tp)) return expert_layer_bytes / tp;
  const double held = static_cast<double>((experts + tp - 1) / tp);
  return expert_layer_bytes * held / static_cast<double>(experts);
}

double ModelSizes::ExpertBytesReadPerRank(int tp, double tokens) const {
  if (experts <= 0) return 0;
  const double n = static_cast<double>(experts), k = static_cast<double>(top_k);
  if (ExpertParallelAt(tp)) {
    // The busiest rank runs every held expert a token routes to: at most
    // k per token, at most the experts it holds.
    const double held = static_cast<double>((experts + tp - 1) / tp);
    return expert_layer_bytes / n * std::min(held, k * std::max(tokens, 1.0));
  }
  const double fraction = 1.0 - std::pow(1.0 - k / n, std::max(tokens, 1.0));
  return expert_layer_bytes / tp * fraction;
}

double ModelSizes::TotalBytes() const {
  return static_cast<double>(layers) * layer_bytes + embed_bytes * (tied ? 1 : 2) +
         static_cast<double>(hidden) * dtype_bytes;
}

double WeightBytesPerGpu(const ModelSizes& m, const StageShape& s) {
  const double t = s.tp;
  double w = s.layers * (m.layer_replicated_bytes +
                         (m.layer_bytes - m.layer_replicated_bytes - m.expert_layer_bytes) / t +
                         m.ExpertBytesPerRank(s.tp));
  if (s.first) w += m.embed_bytes / t;
  if (s.last) {
    // A tied lm_head on a single stage is the embedding itself (held once).
    if (!(m.tied && s.single_stage)) w += m.embed_bytes / t;
    w += static_cast<double>(m.hidden) * m.dtype_bytes;  // final norm
  }
  return w;
}

double KvBytesPerTokenPerGpu(const ModelSizes& m, const StageShape& s) {
  return s.layers * 2.0 * static_cast<double>(m.KvHeadsLocal(s.tp) * m.head_dim) * m.kv_dtype_bytes;
}

double ActivationBytesPerGpu(const ModelSizes& m, const StageShape& s, const WorkloadShape& w) {
  const double t = s.tp;
  // 3 I / t: the MLP's fused gate|up output [C, 2 I/t] and the activated
  // product [C, I/t] are alive together (worker/model/llama_model.cc).
  const double per_token =
      4.0 * m.hidden + 3.0 * m.intermediate / t + (m.heads + 2.0 * m.kv_heads) * m.head_dim / t;
  double a = static_cast<double>(w.prefill_chunk_tokens) * per_token * 4.0;
  if (s.last)
    a += static_cast<double>(std::min(w.prefill_chunk_tokens, w.max_batch)) *
         static_cast<double>(m.vocab) / t * 4.0;
  return a;
}

double AllReduceSeconds(int tp, double message_bytes, double link_bytes_per_s, double step_s,
                        const CostConstants& k) {
  if (tp <= 1) return 0.0;
  const double t = tp;
  return k.collective_launch_s + 2.0 * (t - 1) * step_s +
         2.0 * (t - 1) / t * message_bytes / (k.link_efficiency * link_bytes_per_s);
}

double AllGatherSeconds(int tp, double total_bytes, double link_bytes_per_s, double step_s,
                        const CostConstants& k) {
  if (tp <= 1) return 0.0;
  const double t = tp;
  return k.collective_launch_s + (t - 1) * step_s +
         (t - 1) / t * total_bytes / (k.link_efficiency * link_bytes_per_s);
}

double HopSeconds(double bytes, double link_bytes_per_s, double latency_s, const CostConstants& k) {
  return latency_s + bytes / (k.link_efficiency * link_bytes_per_s);
}

double StageSeconds(const ModelSizes& m, const StageShape& s, const CostConstants& k, double tokens,
                    double seqs, double context) {
  const double t = s.tp;
  // An MoE step reads only the experts its tokens route to.
  const double unread_experts =
      s.layers * (m.ExpertBytesPerRank(s.tp) - m.ExpertBytesReadPerRank(s.tp, tokens));
  const double bytes =
      WeightBytesPerGpu(m, s) - unread_experts + seqs * context * KvBytesPerTokenPerGpu(m, s);
  double params = s.layers * m.layer_params / t;
  if (m.experts > 0)  // the active parameters: k of the experts per token
    params -= s.layers * m.expert_layer_bytes / m.dtype_bytes / t *
              (1.0 - static_cast<double>(m.top_k) / static_cast<double>(m.experts));
  if (s.last) params += static_cast<double>(m.vocab) * static_cast<double>(m.hidden) / t;
  const double heads_local = static_cast<double>(m.heads) / t;
  const double flops = 2.0 * tokens * params + 4.0 * tokens * context * heads_local *
                                                   static_cast<double>(m.head_dim) * s.layers;
  const double memory_s = bytes / (k.hbm_efficiency * s.spec.hbm_gb_per_s * 1e9);
  const double compute_s = flops / (k.matmul_efficiency * s.spec.bf16_tflops * 1e12);
  double comm = 0;
  if (s.tp > 1) {
    const double n_ar = 2.0 * s.layers + (s.first ? 1 : 0);
    comm += n_ar * AllReduceSeconds(s.tp, tokens * m.hidden * m.dtype_bytes, s.link_bytes_per_s,
                                    s.link_step_s, k);
    if (s.last)
      comm += AllGatherSeconds(s.tp, seqs * m.vocab * 4.0, s.link_bytes_per_s, s.link_step_s, k);
  }
  return std::max(memory_s, compute_s) + comm;
}

}  // namespace tessera
