// Test harness: loads a model directory on one process (tp = 1, pp = 1) and
// runs prompts through the real LlamaModel / Engine path.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/base/tensor.h"
#include "common/engine/engine.h"
#include "worker/exec/local_executor.h"
#include "worker/model/kv_cache.h"
#include "worker/model/model_loader.h"

namespace tessera::testing {

class LocalModel {
 public:
  // Aborts the test on load errors (callers ASSERT on ok() of Load instead).
  // `backend` (null = CPU) holds the model and its KV cache; `online` is
  // LoadModel's (model.quantization); `kv_dtype` the KV cache's ([kv_cache]
  // dtype: fp8 reads the checkpoint's scales, MakeStageKvCache).
  static StatusOr<std::unique_ptr<LocalModel>> Load(const std::string& dir,
                                                    int64_t num_blocks = 256,
                                                    int64_t block_size = 16,
                                                    kernels::Backend* backend = nullptr,
                                                    QuantMethod online = QuantMethod::kNone,
                                                    KvCacheDType kv_dtype = KvCacheDType::kAuto);

  // Last-position logits [vocab] of `prompt`, prefilled in one step.
  StatusOr<std::vector<float>> LastLogits(const std::vector<int32_t>& prompt);
  // Greedy generation of `n` tokens per prompt (all prompts in one batch),
  // EOS ignored.
  StatusOr<std::vector<std::vector<int32_t>>> Greedy(
      const std::vector<std::vector<int32_t>>& prompts, int n,
      const Tokenizer* tokenizer = nullptr);
  const ModelConfig& config() const { return config_; }
  LocalExecutor& executor() { return *executor_; }
  BlockAllocator& allocator() { return *allocator_; }
  int64_t block_size() const { return block_size_; }

 private:
  ModelConfig config_;
  std::unique_ptr<LocalExecutor> executor_;
  std::unique_ptr<BlockAllocator> allocator_;
  int64_t block_size_ = 16;
};

// max_i |got[i] - ref[i]| / max(1, max_i |ref[i]|): logits against a
// reference (a JSON array of numbers, e.g. transformers' last_logits).
double RelMaxDiff(const std::vector<float>& got, const nlohmann::json& ref);

}  // namespace tessera::testing
