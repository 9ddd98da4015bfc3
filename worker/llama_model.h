// LlamaModel: the forward pass of one pipeline stage of a Llama-family
// decoder (Llama, Mistral, Qwen2), on one tp rank.
//
// Per layer (HF LlamaDecoderLayer):
//   x = RMSNorm(h); q,k,v = x Wq^T (+bq), x Wk^T (+bk), x Wv^T (+bv)
//   RoPE(q, k); write k, v to the paged KV cache; a = causal GQA attention
//   h += AllReduce(a Wo^T) (+bo)          <- row-parallel, one all-reduce
//   x = RMSNorm(h); h += AllReduce((silu(x Wg^T) * x Wu^T) Wd^T) (+bd)
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
// Thread-safety: a LlamaModel belongs to its rank's owner thread.
#pragma once

#include <vector>

#include "common/model_config.h"
#include "common/status.h"
#include "common/step_batch.h"
#include "common/tensor.h"
#include "kernels/backend.h"
#include "kernels/paged_attention.h"
#include "worker/communicator.h"
#include "worker/kv_cache.h"
#include "worker/stage_weights.h"

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
  // sequence with want_logits. logits [num_wanted, vocab_size] F32 over the
  // full vocab (gathered across tp ranks; vocab padding dropped), on the host
  // or on the backend's device (computed there and copied if needed).
  Status Logits(const StepBatch& batch, const Tensor& hidden, Tensor& logits);

 private:
  // Rows [begin, end) of the step rotate with inv_freq (on the backend).
  struct RopeSegment {
    int64_t begin, end;
    Tensor inv_freq;
  };
  struct StepInputs {
    Tensor positions;  // I32 [tokens] on the backend
    std::vector<RopeSegment> rope;
    kernels::AttentionBatch attention;
  };

  StatusOr<Tensor> Alloc(const std::vector<int64_t>& shape) const;
  StatusOr<Tensor> UploadI32(const std::vector<int32_t>& values) const;
  StatusOr<Tensor> UploadF32(const std::vector<float>& values) const;
  Status PrepareStep(const StepBatch& batch, KvCache& cache, StepInputs& in);
  // One decoder layer. `pending` holds the previous layer's (all-reduced)
  // MLP output not yet added to h; on return it holds this layer's.
  Status Layer(int local, const StepInputs& in, KvCache& cache, Tensor& h, Tensor& pending);
  Status AllReduce(Tensor& t, const char* what, int layer);

  ModelConfig config_;
  StageWeights weights_;
  Communicator* tp_comm_;
  kernels::Backend* backend_;
  DType dtype_;
  std::vector<float> default_inv_freq_;
  Tensor default_inv_freq_dev_;  // on the backend, made on the first step
};

}  // namespace tessera
