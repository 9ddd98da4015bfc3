#include "worker/local_executor.h"

namespace tessera {

LocalExecutor::LocalExecutor(std::unique_ptr<LlamaModel> model, std::unique_ptr<KvCache> cache)
    : model_(std::move(model)), cache_(std::move(cache)) {
  TESSERA_CHECK(model_->layout().is_first && model_->layout().is_last && model_->layout().tp == 1);
}

Status LocalExecutor::Run(const StepBatch& batch, Tensor& logits) {
  Tensor hidden = Tensor::Empty({batch.total_tokens(), model_->config().hidden_size});
  TESSERA_RETURN_IF_ERROR(model_->Forward(batch, Tensor(), *cache_, hidden));
  return model_->Logits(batch, hidden, logits);
}

}  // namespace tessera
