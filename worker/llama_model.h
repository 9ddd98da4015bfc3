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
// Thread-safety: a LlamaModel belongs to its rank's owner thread.
#pragma once

#include <vector>

#include "common/model_config.h"
#include "common/status.h"
#include "common/step_batch.h"
#include "common/tensor.h"
#include "worker/communicator.h"
#include "worker/kv_cache.h"
#include "worker/stage_weights.h"

namespace tessera {

class LlamaModel {
 public:
  // `tp_comm` is the stage's tp group (size == weights.layout.tp); it may be
  // null when tp == 1. It must outlive the model.
  LlamaModel(const ModelConfig& config, StageWeights weights, Communicator* tp_comm);

  const ModelConfig& config() const { return config_; }
  const StageLayout& layout() const { return weights_.layout; }
  const StageWeights& weights() const { return weights_; }

  // Runs the stage's layers on one micro-batch.
  // First stage: embeds batch.token_ids and ignores hidden_in. Later stages:
  // hidden_in [total_tokens, hidden] from the previous stage.
  // hidden_out [total_tokens, hidden] receives the residual stream after the
  // stage's last layer (before the final norm). KV entries of every sequence
  // are written at positions [start_pos, start_pos + num_tokens).
  // Errors: shape mismatches, KV block table errors, communicator failures
  // (naming the layer).
  Status Forward(const StepBatch& batch, const Tensor& hidden_in, KvCache& cache,
                 Tensor& hidden_out);

  // Last stage only: final norm and lm_head for the last token of each
  // sequence with want_logits. logits [num_wanted, vocab_size] F32 over the
  // full vocab (gathered across tp ranks; vocab padding dropped).
  Status Logits(const StepBatch& batch, const Tensor& hidden, Tensor& logits);

 private:
  Status Layer(int local, const StepBatch& batch, const std::vector<int32_t>& positions,
               KvCache& cache, Tensor& h);
  Status AllReduce(Tensor& t, const char* what, int layer);

  ModelConfig config_;
  StageWeights weights_;
  Communicator* tp_comm_;
  std::vector<float> default_inv_freq_;
};

}  // namespace tessera
