#include "worker/exec/local_executor.h"

#include "worker/exec/nonfinite_check.h"

namespace tessera {

LocalExecutor::LocalExecutor(std::unique_ptr<LlamaModel> model, std::unique_ptr<KvCache> cache,
                             GrammarSource grammar)
    : model_(std::move(model)), cache_(std::move(cache)), samplers_(std::move(grammar)) {
  TESSERA_CHECK(model_->layout().is_first && model_->layout().is_last && model_->layout().tp == 1);
}

Status LocalExecutor::RunLogits(const StepBatch& batch, Tensor& logits) {
  TESSERA_ASSIGN_OR_RETURN(Tensor hidden, model_->NewHidden(batch.total_tokens()));
  TESSERA_RETURN_IF_ERROR(model_->Forward(batch, Tensor(), *cache_, hidden));
  TESSERA_RETURN_IF_ERROR(CheckHiddenFinite(*model_, hidden, "the local rank"));
  return model_->Logits(batch, hidden, logits);
}

Status LocalExecutor::Submit(const StepBatch& batch) {
  TESSERA_ASSIGN_OR_RETURN(
      Tensor logits, model_->backend().Allocate({batch.LogitsRows(), vocab_size()}, DType::kF32));
  TESSERA_RETURN_IF_ERROR(RunLogits(batch, logits));
  TESSERA_ASSIGN_OR_RETURN(std::vector<SampledToken> tokens, samplers_.Sample(batch, logits));
  LogNonFiniteLogits(*model_, batch, tokens, "the local rank");
  done_.push_back(std::move(tokens));
  return Status::Ok();
}

StatusOr<std::vector<SampledToken>> LocalExecutor::Collect() {
  if (done_.empty()) return FailedPrecondition("collect: no step in flight");
  std::vector<SampledToken> tokens = std::move(done_.front());
  done_.pop_front();
  return tokens;
}

}  // namespace tessera
