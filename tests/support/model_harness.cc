#include "support/model_harness.h"

#include <algorithm>
#include <cmath>

#include "worker/model/kv_cache_scales.h"

namespace tessera::testing {

StatusOr<std::unique_ptr<LocalModel>> LocalModel::Load(const std::string& dir, int64_t num_blocks,
                                                       int64_t block_size,
                                                       kernels::Backend* backend,
                                                       QuantMethod online, KvCacheDType kv_dtype) {
  if (backend == nullptr) backend = &kernels::CpuBackend();
  TESSERA_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(dir));
  TESSERA_ASSIGN_OR_RETURN(ParallelConfig par, ParallelConfig::Make(config, 1, 1));
  TESSERA_ASSIGN_OR_RETURN(LoadedModel loaded,
                           LoadModel(dir, par, 0, nullptr, {}, backend, nullptr, online));
  auto m = std::make_unique<LocalModel>();
  m->config_ = loaded.config;
  m->block_size_ = block_size;
  const StageLayout lay = loaded.model->layout();
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<KvCache> cache,
                           MakeStageKvCache(*backend, dir, lay, num_blocks, block_size,
                                            loaded.config.head_dim, kv_dtype));
  m->executor_ = std::make_unique<LocalExecutor>(std::move(loaded.model), std::move(cache));
  m->allocator_ = std::make_unique<BlockAllocator>(num_blocks);
  return m;
}

StatusOr<std::vector<float>> LocalModel::LastLogits(const std::vector<int32_t>& prompt) {
  StepBatch batch;
  batch.token_ids = prompt;
  SeqStep s;
  s.num_tokens = static_cast<int32_t>(prompt.size());
  s.prompt_len = s.num_tokens;
  s.want_logits = true;
  TESSERA_RETURN_IF_ERROR(
      allocator_->Allocate(BlockAllocator::BlocksFor(s.num_tokens, block_size_), s.block_table));
  batch.seqs.push_back(s);
  Tensor logits = Tensor::Empty({1, config_.vocab_size});
  Status st = executor_->RunLogits(batch, logits);
  allocator_->Free(batch.seqs[0].block_table);
  TESSERA_RETURN_IF_ERROR(st);
  return std::vector<float>(logits.data<float>(), logits.data<float>() + config_.vocab_size);
}

StatusOr<std::vector<std::vector<int32_t>>> LocalModel::Greedy(
    const std::vector<std::vector<int32_t>>& prompts, int n, const Tokenizer* tokenizer) {
  Engine engine(config_, executor_.get(), allocator_.get(), block_size_, tokenizer);
  std::vector<GenerationRequest> reqs;
  for (const auto& p : prompts) {
    GenerationRequest r;
    r.prompt_ids = p;
    r.max_tokens = n;
    r.ignore_eos = true;
    reqs.push_back(r);
  }
  TESSERA_ASSIGN_OR_RETURN(std::vector<GenerationResult> results, engine.Generate(reqs));
  std::vector<std::vector<int32_t>> out;
  for (const auto& r : results) out.push_back(r.tokens);
  return out;
}

double RelMaxDiff(const std::vector<float>& got, const nlohmann::json& ref) {
  double max_ref = 0, max_diff = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double r = ref[i].get<double>();
    max_ref = std::max(max_ref, std::abs(r));
    max_diff = std::max(max_diff, std::abs(got[i] - r));
  }
  return max_diff / std::max(1.0, max_ref);
}

}  // namespace tessera::testing
