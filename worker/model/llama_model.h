// LlamaModel: the forward pass of one pipeline stage of a Llama-family
// decoder (Llama, Mistral, Qwen2, Qwen3, Phi-3, Gemma 2, Gemma 3 text), on
// one tp rank.
//
// Per layer (HF LlamaDecoderLayer):
//   x = RMSNorm(h); q,k,v = x Wq^T (+bq), x Wk^T (+bk), x Wv^T (+bv)
//   q, k = per-head RMSNorm(q, k) when the layer has q_norm/k_norm (Qwen3)
//   RoPE(q, k); write k, v to the paged KV cache; a = causal GQA attention
//   (within sliding_window positions when set: Mistral, Phi-3)
//   h += AllReduce(a Wo^T) (+bo)          <- row-parallel, one all-reduce
//   x = RMSNorm(h); h += AllReduce((silu(x Wg^T) * x Wu^T) Wd^T) (+bd)
//   (a sparse layer of an MoE model: h += AllReduce(MoE(x)), moe_layer.h)
// Gemma (HF Gemma2DecoderLayer / Gemma3DecoderLayer) differs where its
// config or tensors say so: every RMSNorm scales by (1 + weight)
// (rms_norm_unit_offset); the embedding is multiplied by sqrt(hidden)
// (embedding_multiplier); the attention output and the MLP output are each
// normalised before their residual add (post_attention_layernorm,
// post_feedforward_layernorm; the MLP input norm is pre_feedforward_layernorm);
// the activation is tanh GELU (GeGLU); the scores are scaled by
// query_pre_attn_scalar^-0.5 and (Gemma 2) soft-capped; each layer has its
// own window (sliding_layers) and, Gemma 3, sliding layers rotate with the
// local RoPE table; the final logits are soft-capped (Gemma 2). Per layer the
// window and the RoPE table follow its global index, so a pipeline stage
// applies the same ones as the whole model.
// With tp > 1 the q/k/v/gate/up projections are column-parallel and o/down
// row-parallel (Megatron-LM, Shoeybi et al. 2019), so each layer needs
// exactly two all-reduces. The embedding and lm_head are vocab-parallel.
//
// The model runs on a kernels::Backend: weights, KV cache, activations and
// temporaries live on its device in its compute dtype (F32 on the CPU; the
// checkpoint's BF16/F16 on CUDA, fp32 accumulation inside every kernel).
// Per step the token ids, positions and the attention layout are uploaded
// once and shared by every layer. The residual add after each MLP is fused
// into the next layer's input RMSNorm.
//
// Decode graphs (CUDA backend): a step in which every sequence has exactly
// one token runs the stage's layers as a CUDA graph, one per (batch size,
// context bucket, KV cache); the bucket is the smallest power of two >= 256
// holding the longest context, and fixes Tessera's attention kernel's split
// of the context (FlashInfer's split is planned per step on the host into
// DecodeWorkItems(B) work items, a number fixed per batch size, and travels
// in the input buffer). The step's token ids, positions and block tables are copied
// into the graph's fixed input buffer (one host-to-device copy), the graph
// is replayed, and the output is copied out: no host synchronisation. The
// first step of a shape runs eagerly and is then recorded. Steps with
// prefill chunks, dynamic NTK RoPE past max_position_embeddings, longrope
// past original_max_position_embeddings, more than
// kMaxGraphBatch sequences or TESSERA_CUDA_GRAPHS=0 in the environment run
// eagerly.
//
// Thread-safety: a LlamaModel belongs to its rank's owner thread.
#pragma once

#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "common/base/status.h"
#include "common/base/tensor.h"
#include "common/format/model_config.h"
#include "common/wire/step_batch.h"
#include "kernels/backend.h"
#include "kernels/paged_attention.h"
#include "worker/comm/communicator.h"
#include "worker/model/kv_cache.h"
#include "worker/model/moe_layer.h"
#include "worker/model/stage_weights.h"

namespace tessera {

class LlamaModel {
 public:
  // `tp_comm` is the stage's tp group (size == weights.layout.tp); it may be
  // null when tp == 1. It must outlive the model, and so must `backend`
  // (null = the CPU backend), which holds `weights`. With tp > 1 the
  // communicator's buffers must live where the backend computes (NCCL for
  // CUDA, Gloo for the CPU).
  LlamaModel(const ModelConfig& config, StageWeights weights, Communicator* tp_comm,
             kernels::Backend* backend = nullptr);

  const ModelConfig& config() const { return config_; }
  const StageLayout& layout() const { return weights_.layout; }
  const StageWeights& weights() const { return weights_; }
  kernels::Backend& backend() const { return *backend_; }

  // A [tokens, hidden] activation tensor on the backend, in its compute
  // dtype: what Forward takes and produces.
  StatusOr<Tensor> NewHidden(int64_t tokens) const;

  // Runs the stage's layers on one micro-batch.
  // First stage: embeds batch.token_ids and ignores hidden_in. Later stages:
  // hidden_in [total_tokens, hidden] from the previous stage.
  // hidden_in/hidden_out are NewHidden tensors (backend device, compute
  // dtype). hidden_out [total_tokens, hidden] receives the residual stream after the
  // stage's last layer (before the final norm). KV entries of every sequence
  // are written at positions [start_pos, start_pos + num_tokens).
  // Errors: shape mismatches, KV block table errors, communicator failures
  // (naming the layer).
  Status Forward(const StepBatch& batch, const Tensor& hidden_in, KvCache& cache,
                 Tensor& hidden_out);

  // Last stage only: final norm and lm_head for the last token of each
  // sequence with want_logits, then for every other token of the chunks
  // with want_prompt_logprobs (rows in StepBatch::LogitsRows order).
  // logits [batch.LogitsRows(), vocab_size] F32 over the
  // full vocab (gathered across tp ranks; vocab padding dropped), on the host
  // or on the backend's device (computed there and copied if needed).
  Status Logits(const StepBatch& batch, const Tensor& hidden, Tensor& logits);

  // MoE models: the tokens each expert this rank holds ran since the model
  // was made, over the stage's sparse layers (readable from any thread);
  // null for a stage without sparse layers. On CUDA the counts are kept on
  // the device and published here every kMoePublishSteps forward steps (the
  // copy waits for the device), so they may trail by that many steps.
  static constexpr int64_t kMoePublishSteps = 32;
  std::shared_ptr<const MoeTokenCounts> moe_token_counts() const { return moe_tokens_; }

  // Decode graphs on (default: on for a CUDA backend unless the environment
  // sets TESSERA_CUDA_GRAPHS=0; never on the CPU).
  static constexpr int64_t kMaxGraphBatch = 512;
  void set_decode_graphs(bool on) { decode_graphs_ = on; }
  bool decode_graphs() const { return decode_graphs_; }
  // Graphs recorded so far and steps that replayed one.
  int64_t decode_graphs_recorded() const { return static_cast<int64_t>(graphs_.size()); }
  int64_t decode_graph_replays() const { return graph_replays_; }

 private:
  // Rows [begin, end) of the step rotate with inv_freq (on the backend).
  struct RopeSegment {
    int64_t begin, end;
    Tensor inv_freq;
  };
  struct StepInputs {
    Tensor token_ids;  // I32 [tokens] on the backend (first stage)
    Tensor positions;  // I32 [tokens] on the backend
    std::vector<RopeSegment> rope;
    Tensor local_inv_freq;  // Gemma 3's sliding layers: every row (undefined otherwise)
    kernels::AttentionBatch attention;
  };

  StatusOr<Tensor> Alloc(const std::vector<int64_t>& shape) const;
  StatusOr<Tensor> UploadI32(const std::vector<int32_t>& values) const;
  StatusOr<Tensor> UploadF32(const std::vector<float>& values) const;
  Status PrepareStep(const StepBatch& batch, KvCache& cache, StepInputs& in);
  // The stage's layers on prepared inputs (eager, or being recorded).
  Status Run(const StepInputs& in, const Tensor& hidden_in, KvCache& cache, Tensor& hidden_out);
  bool UseDecodeGraph(const StepBatch& batch) const;
  // Longrope past original_max_position_embeddings: the long-factor table.
  bool LongRopeSwitched(int64_t seq_len) const;
  Status GraphForward(const StepBatch& batch, const Tensor& hidden_in, KvCache& cache,
                      Tensor& hidden_out);
  // One decoder layer. `pending` holds the previous layer's (all-reduced)
  // MLP output not yet added to h; on return it holds this layer's.
  Status Layer(int local, const StepInputs& in, KvCache& cache, Tensor& h, Tensor& pending);
  // The fused q|k|v projection of x [tokens, hidden]: q [tokens, heads_local
  // * head_dim], k and v [tokens, kv_heads_local * head_dim] (views of the
  // GEMM's output row for one token, copies split from it otherwise).
  Status ProjectQkv(const LayerWeights& w, const Tensor& x, Tensor& q, Tensor& k, Tensor& v) const;
  // y = x w^T (+ bias): kernels::Linear, or kernels::LinearFp8 with `scales`
  // when w is kept in FP8 (stage_weights.h), with a scratch buffer for the
  // dequantized weight where the kernel needs one.
  Status Project(const Tensor& x, const Tensor& w, const kernels::Fp8Scales& scales,
                 const Tensor& bias, Tensor& y) const;
  // q and k of one layer rotated in place with the layer's table.
  Status Rotate(int layer, const StepInputs& in, Tensor& q3, Tensor& k3);
  // The per-head q/k norms (Qwen3, Gemma 3), RoPE and the KV write of one layer: one kernel
  // (kernels/rope_write_kv.h) when every row of the step takes one RoPE table, the separate
  // calls when sequences have tables of their own (dynamic NTK).
  Status NormRotateWriteKv(int layer, const LayerWeights& w, const StepInputs& in,
                           kernels::KvCacheLayer& cache, Tensor& q3, Tensor& k3, const Tensor& v3);
  // Uploads the fixed RoPE tables on the first step.
  Status UploadTables();
  Status AllReduce(Tensor& t, const char* what, int layer);
  // CUDA MoE: the sparse layers' expert tables and the device token totals,
  // made on the first step (before any graph is recorded); then, every
  // kMoePublishSteps steps, the totals copied into moe_tokens_.
  Status PrepareMoeDevice();

  ModelConfig config_;
  StageWeights weights_;
  std::shared_ptr<MoeTokenCounts> moe_tokens_;  // null without sparse layers
  std::vector<MoeDeviceLayer> moe_device_;      // CUDA: per local layer (dense: empty)
  Tensor moe_token_totals_;                     // CUDA: I64 [held experts] on the device
  int64_t moe_steps_ = 0;                       // forward steps since the last publish
  Communicator* tp_comm_;
  kernels::Backend* backend_;
  DType dtype_;
  std::vector<float> default_inv_freq_;
  Tensor default_inv_freq_dev_;        // on the backend, made on the first step
  Tensor long_inv_freq_dev_;           // longrope's long-factor table, made when first needed
  std::vector<float> local_inv_freq_;  // Gemma 3's sliding layers (empty otherwise)
  Tensor local_inv_freq_dev_;          // on the backend, made on the first step

  // One recorded decode step: fixed input/output buffers and the graph.
  struct DecodeGraph {
    Tensor inputs;      // I32 [B + meta]: token ids, then the packed attention layout
    Tensor hidden_in;   // [B, hidden] (later stages)
    Tensor hidden_out;  // [B, hidden]
    StepInputs in;      // views of `inputs`
    std::unique_ptr<kernels::CapturedWork> work;
  };
  using GraphKey = std::tuple<int64_t, int64_t, const void*>;  // (B, context bucket, cache)
  bool decode_graphs_ = false;
  std::map<GraphKey, DecodeGraph> graphs_;
  int64_t graph_replays_ = 0;
};

}  // namespace tessera
