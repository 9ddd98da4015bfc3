// The placement planner's cost model: bytes a pipeline stage holds per GPU,
// and the time a stage, a collective and a pipeline hop take. docs/planner.md
// derives every formula; the names below follow it.
//
// Notation: L_s layers on stage s, t_s its tp, W_l bytes of one decoder
// layer, R_l the replicated part of it (the two RMSNorms, row-parallel
// biases), E = vocab x hidden x dtype bytes (embedding, and lm_head), h the
// hidden size, B_hbm the GPU's HBM bandwidth, B_link the slowest link inside
// the tp group (bytes/s per direction).
//
//  weights per GPU      w_s = L_s (R_l + (W_l - R_l - X_l)/t_s + X_l(t_s)) + [first] E/t_s
//                             (FP8 projections: W_l counts them at 1 byte +
//                             their scales, ModelSizes::fp8)
//                             + [last] (E/t_s + h x dtype)   (tied, pp = 1: E once)
//  KV per token per GPU k_s = L_s x 2 x kv_local x head_dim x kv dtype bytes,
//                             kv_local = max(1, KV / t_s)
//  activations per GPU  a_s = C x (4h + 3I/t_s + (H + 2KV) d / t_s) x 4
//                             + [last] min(C, max_batch) x V/t_s x 4   (C: prefill chunk)
//                             (3I: the fused gate|up output and its product live together)
//  all-reduce (ring)    AR(t, S) = alpha + 2(t-1) beta + 2(t-1)/t x S / (eta_link B_link)
//  all-gather (ring)    AG(t, S) = alpha + (t-1) beta + (t-1)/t x S / (eta_link B_link)
//  stage step           tau_s(n, c) = max(bytes / (eta_hbm B_hbm), flops / (eta_mm F))
//                                     + (2 L_s + [first]) AR(t_s, n h dtype)
//                                     + [last] AG(t_s, n V 4)
//     bytes = w_s + n_seq c k_s, flops = 2 n P_s + 4 n c H_local d L_s
//     MoE: X_l the routed experts of a sparse layer (N_x experts, top-k);
//     X_l(t) = X_l ceil(N_x/t)/N_x with expert parallelism (whole experts), else X_l/t;
//     a step of n tokens reads the experts its tokens route to: a fraction
//     f(n) = 1 - (1 - k/N_x)^n of them (k/N_x at batch 1, nearly all at large
//     n), so bytes counts L_s X_l(t_s) f(n) (with expert parallelism the
//     busiest rank: min(held, k n) of its held experts) and P_s the active
//     parameters, (W_l - X_l + k/N_x X_l)/t_s per layer
//  hop                  hop(S) = latency + S / (eta_link B_hop)
//  decode latency       sum_s tau_s(1 token, c = 0) + sum over the pp-1 hops of hop(h dtype)
//                       = the sum_s (w_s / B_hbm + 2 L_s AR) + (pp-1) hop
//  throughput           b D / (T_prefill + D T_decode), with m micro-batches of b/m:
//                       T = (m + pp - 1) max_s (tau_s + hop_s): a step keeps a
//                       fraction (pp-1)/(m+pp-1) of the pipeline idle (the bubble).
//
// Thread-safety: pure functions over values.
#pragma once

#include <cstdint>

#include "common/base/dtype.h"
#include "common/format/model_config.h"
#include "common/topology/gpu_specs.h"

namespace tessera {

// Calibration constants; docs/planner.md says where each default comes from.
struct CostConstants {
  double hbm_efficiency = 0.85;        // eta_hbm: achieved / datasheet HBM bandwidth
  double matmul_efficiency = 0.6;      // eta_mm: achieved / peak dense bf16 in GEMMs
  double link_efficiency = 0.7;        // eta_link: NCCL bus bandwidth / link bandwidth
  double collective_launch_s = 10e-6;  // alpha: fixed cost of one collective
  double nvlink_step_s = 1e-6;         // beta for NVLink rings
  double pcie_step_s = 3e-6;           // beta for PIX / PXB / PHB / NODE rings
  double sys_step_s = 6e-6;            // beta when a ring crosses sockets (SYS)
  double network_step_s = 8e-6;        // beta for a ring across hosts
};

// Below this many intermediate columns per rank an expert's GEMMs run
// below efficient tile widths; expert parallelism keeps them whole.
inline constexpr int64_t kMinExpertSliceColumns = 256;

// The planner's expert split at tp `tp` (auto mode): whole experts when tp
// does not divide moe_intermediate_size or a 1/tp slice would be under
// kMinExpertSliceColumns columns; slices otherwise (every rank's share of a
// batch-1 decode step stays equal whatever the routing).
bool AutoExpertParallel(int64_t moe_intermediate, int tp);

// The model's sizes at the serving dtypes.
struct ModelSizes {
  int64_t layers = 0, hidden = 0, intermediate = 0, heads = 0, kv_heads = 0, head_dim = 0,
          vocab = 0;
  bool tied = false;
  double dtype_bytes = 2;             // weights and activations exchanged between ranks
  double layer_bytes = 0;             // W_l
  double layer_replicated_bytes = 0;  // R_l
  double layer_params = 0;            // parameters of one layer
  double embed_bytes = 0;             // E
  double kv_dtype_bytes = 2;
  // The model's projections are FP8 (model.quantization or an FP8
  // checkpoint): layer_bytes counts them at 1 byte per parameter plus their
  // fp32 scales; the embedding, lm_head and norms stay at dtype_bytes.
  bool fp8 = false;
  // Mixture of experts (0 experts: dense). layer_bytes is the largest layer's
  // (a sparse one), routed experts included.
  int64_t experts = 0, top_k = 0, moe_intermediate = 0;
  double expert_layer_bytes = 0;  // X_l: every routed expert of one sparse layer
  bool expert_parallel = false;   // whole experts per rank (ParallelConfig::expert_parallel)
  // Instead of expert_parallel: AutoExpertParallel at each tp.
  bool expert_parallel_auto = false;

  // Whether a tp group of `tp` ranks holds whole experts.
  bool ExpertParallelAt(int tp) const;
  // X_l(t): routed-expert bytes one rank of a tp group holds per sparse layer.
  double ExpertBytesPerRank(int tp) const;
  // Of those, the bytes a step of `tokens` tokens reads on the busiest rank.
  double ExpertBytesReadPerRank(int tp, double tokens) const;

  // weight dtype: the checkpoint's torch_dtype unless given; kv dtype
  // likewise. keeps_fp8: an FP8 model's projections stay FP8 on the workers
  // (fp8 above); false: they are dequantized at load to weight_dtype and
  // counted at its size, as a CPU worker holds them.
  static ModelSizes From(const ModelConfig& model, DType weight_dtype, DType kv_dtype,
                         bool keeps_fp8 = true);
  // KV heads one rank of a tp group holds: KV / t, or 1 when t > KV.
  int64_t KvHeadsLocal(int tp) const { return kv_heads >= tp ? kv_heads / tp : 1; }
  // Bytes of the whole model at the weight dtype (layers + embedding + lm_head
  // unless tied + final norm).
  double TotalBytes() const;
};

// One stage as the cost model sees it.
struct StageShape {
  GpuSpec spec;
  int tp = 1;
  int layers = 1;
  bool first = false;
  bool last = false;
  bool single_stage = false;    // pp == 1 (a tied lm_head is the embedding itself)
  double link_bytes_per_s = 0;  // slowest link inside the tp group (unused at tp 1)
  double link_step_s = 0;       // beta of that link
};

struct WorkloadShape {
  int64_t prefill_chunk_tokens = 512;  // C
  int64_t max_batch = 256;
};

double WeightBytesPerGpu(const ModelSizes& m, const StageShape& s);
double KvBytesPerTokenPerGpu(const ModelSizes& m, const StageShape& s);
double ActivationBytesPerGpu(const ModelSizes& m, const StageShape& s, const WorkloadShape& w);

double AllReduceSeconds(int tp, double message_bytes, double link_bytes_per_s, double step_s,
                        const CostConstants& k);
double AllGatherSeconds(int tp, double total_bytes, double link_bytes_per_s, double step_s,
                        const CostConstants& k);
double HopSeconds(double bytes, double link_bytes_per_s, double latency_s, const CostConstants& k);

// tau_s for `tokens` new tokens of `seqs` sequences each attending to
// `context` earlier tokens (decode: tokens == seqs; prefill of p-token
// prompts: tokens = seqs x p, context = p / 2).
double StageSeconds(const ModelSizes& m, const StageShape& s, const CostConstants& k, double tokens,
                    double seqs, double context);

}  // namespace tessera
