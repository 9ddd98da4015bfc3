#include "worker/local_executor.h"

namespace tessera {

LocalExecutor::LocalExecutor(std::unique_ptr<LlamaModel> model, std::unique_ptr<KvCache> cache)
    : model_(std::move(model)), cache_(std::move(cache)) {
  TESSERA_CHECK(model_->layout().is_first && model_->layout().is_last && model_->layout().tp == 1);
}

Status LocalExecutor::RunLogits(const StepBatch& batch, Tensor& logits) {
  Tensor hidden = Tensor::Empty({batch.total_tokens(), model_->config().hidden_size});
  TESSERA_RETURN_IF_ERROR(model_->Forward(batch, Tensor(), *cache_, hidden));
  return model_->Logits(batch, hidden, logits);
}

Status LocalExecutor::Submit(const StepBatch& batch) {
  int64_t wanted = 0;
  for (const SeqStep& s : batch.seqs) wanted += s.want_logits ? 1 : 0;
  Tensor logits = Tensor::Empty({wanted, vocab_size()});
  TESSERA_RETURN_IF_ERROR(RunLogits(batch, logits));
  done_.push_back(samplers_.Sample(batch, logits.data<float>(), vocab_size()));
  return Status::Ok();
}

StatusOr<std::vector<int32_t>> LocalExecutor::Collect() {
  if (done_.empty()) return FailedPrecondition("collect: no step in flight");
  std::vector<int32_t> tokens = std::move(done_.front());
  done_.pop_front();
  return tokens;
}

}  // namespace tessera
