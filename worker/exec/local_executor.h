// LocalExecutor: runs a whole model (tp = 1, pp = 1) in this process and
// samples on it.
//
// Thread-safety: single owner thread.
#pragma once

#include <deque>
#include <memory>

#include "common/base/tensor.h"
#include "common/engine/step_executor.h"
#include "worker/model/kv_cache.h"
#include "worker/model/llama_model.h"
#include "worker/model/sampler.h"

namespace tessera {

class LocalExecutor : public StepExecutor {
 public:
  // `model` must hold every layer, embed_tokens and lm_head (tp = 1).
  // `grammar`: the structured-output engine source (SequenceSamplers).
  LocalExecutor(std::unique_ptr<LlamaModel> model, std::unique_ptr<KvCache> cache,
                GrammarSource grammar = {});

  Status Submit(const StepBatch& batch) override;
  StatusOr<std::vector<SampledToken>> Collect() override;
  int max_in_flight() const override { return 1; }
  int64_t vocab_size() const override { return model_->config().vocab_size; }

  // Runs `batch` and returns logits [num_wanted, vocab_size] F32 (host or the
  // model's device) without sampling.
  Status RunLogits(const StepBatch& batch, Tensor& logits);
  KvCache& cache() { return *cache_; }
  LlamaModel& model() { return *model_; }

 private:
  std::unique_ptr<LlamaModel> model_;
  std::unique_ptr<KvCache> cache_;
  SequenceSamplers samplers_;
  std::deque<std::vector<SampledToken>> done_;
};

}  // namespace tessera
