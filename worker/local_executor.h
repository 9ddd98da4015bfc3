// LocalExecutor: runs a whole model (tp = 1, pp = 1) in this process.
//
// Thread-safety: single owner thread.
#pragma once

#include <memory>

#include "worker/kv_cache.h"
#include "worker/llama_model.h"
#include "worker/step_executor.h"

namespace tessera {

class LocalExecutor : public StepExecutor {
 public:
  // `model` must hold every layer, embed_tokens and lm_head (tp = 1).
  LocalExecutor(std::unique_ptr<LlamaModel> model, std::unique_ptr<KvCache> cache);

  Status Run(const StepBatch& batch, Tensor& logits) override;
  int64_t vocab_size() const override { return model_->config().vocab_size; }
  KvCache& cache() { return *cache_; }
  LlamaModel& model() { return *model_; }

 private:
  std::unique_ptr<LlamaModel> model_;
  std::unique_ptr<KvCache> cache_;
};

}  // namespace tessera
