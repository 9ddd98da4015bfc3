// Non-finite logits on the GPU (issue 16 item 1): the CUDA sampling kernels
// flag a row holding a NaN or an infinity (kNonFiniteLogitsToken, written by
// the argmax kernel with the tokens: no extra host sync), and an fp16 model
// whose activations overflow ends its request with kDataLoss naming the
// cause, never with tokens. Part of tessera_gpu_test (run on the GPU
// machine by scripts/gpu-run).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "common/engine/engine.h"
#include "common/format/model_config.h"
#include "gpu/gpu_test_util.h"
#include "kernels/backend.h"
#include "kernels/sampling.h"
#include "support/scaled_model.h"
#include "support/test_util.h"
#include "worker/exec/local_executor.h"
#include "worker/exec/rank_device.h"
#include "worker/model/model_loader.h"

namespace tessera {
namespace {

TEST(NonFinite, DeviceSamplingFlagsNonFiniteRows) {
  auto dev = MakeRankDevice(RankBackend::kCuda, 0, DType::kF32);
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  kernels::Backend& g = *dev->backend;
  const int64_t rows = 8, vocab = 5000;
  Tensor host = Tensor::Empty({rows, vocab});
  std::mt19937 rng(3);
  std::normal_distribution<float> dist(0.0f, 2.0f);
  for (int64_t i = 0; i < rows * vocab; ++i) host.data<float>()[i] = dist(rng);
  const float bad[3] = {std::nanf(""), INFINITY, -INFINITY};
  // Rows 0..5: one bad value each, greedy (even rows) and sampled (odd);
  // rows 6, 7 finite.
  for (int64_t r = 0; r < 6; ++r) host.data<float>()[r * vocab + 17 * r + 3] = bad[r / 2];
  std::vector<kernels::SampleRow> params(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r)
    if (r % 2 == 1) {
      params[static_cast<size_t>(r)].temperature = 0.8f;
      params[static_cast<size_t>(r)].top_k = 40;
      params[static_cast<size_t>(r)].uniform = 0.37;
    }
  auto up = g.Upload(host);
  ASSERT_TRUE(up.ok()) << up.status().ToString();
  std::vector<int32_t> got;
  Status s = kernels::SampleTokens(*up, params, got);
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_EQ(got.size(), static_cast<size_t>(rows));
  for (int64_t r = 0; r < 6; ++r)
    EXPECT_EQ(got[static_cast<size_t>(r)], kNonFiniteLogitsToken) << r;
  for (int64_t r = 6; r < rows; ++r)
    EXPECT_EQ(got[static_cast<size_t>(r)],
              kernels::SampleRowCpu(host.data<float>() + r * vocab, vocab,
                                    params[static_cast<size_t>(r)]))
        << r;
}

// llama_gqa_f32 with layer 0's down_proj x 1e38, run in fp16 on the GPU
// (the scaled weights saturate to inf): the request fails with kDataLoss
// naming non-finite logits, for greedy and sampled requests alike.
TEST(NonFinite, Fp16OverflowingModelReportsTheErrorNeverTokens) {
  const std::string dir = ::tessera::testing::MakeTempDir("tessera-gpu-overflow") + "/overflow_f32";
  Status made = ::tessera::testing::MakeScaledModel(g_fixtures + "/models/llama_gqa_f32", dir,
                                                    "model.layers.0.mlp.down_proj.weight", 1e38f);
  ASSERT_TRUE(made.ok()) << made.ToString();
  auto config = LoadModelConfig(dir);
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  auto par = ParallelConfig::Make(*config, 1, 1);
  ASSERT_TRUE(par.ok());
  auto dev = MakeRankDevice(RankBackend::kCuda, 0, DType::kF16);
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  auto loaded = LoadModel(dir, *par, 0, nullptr, {}, dev->backend);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  const StageLayout lay = loaded->model->layout();
  auto kv = KvCache::Create(*dev->backend, lay.num_layers(), 64, 16, lay.kv_heads_local,
                            config->head_dim);
  ASSERT_TRUE(kv.ok()) << kv.status().ToString();
  LocalExecutor exec(std::move(loaded->model), std::move(*kv));
  BlockAllocator alloc(64);
  Scheduler scheduler(*config, &exec, &alloc, 16, nullptr, SchedulerOptions{});
  std::vector<GenerationResult> done;
  for (float temperature : {0.0f, 0.9f}) {
    GenerationRequest req;
    req.prompt_ids = {0, 5, 17, 42, 9};
    req.max_tokens = 8;
    req.sampling.temperature = temperature;
    req.sampling.seed = 7;
    RequestCallbacks cb;
    cb.on_token = [](const std::string&, int32_t token, const SampledToken*) {
      ADD_FAILURE() << "a token was emitted: " << token;
    };
    cb.on_finish = [&done](const GenerationResult& r) { done.push_back(r); };
    ASSERT_TRUE(scheduler.Enqueue(req, cb).ok());
  }
  for (int i = 0; i < 100 && done.size() < 2; ++i) {
    auto r = scheduler.RunOnce();
    ASSERT_TRUE(r.ok()) << r.status().ToString();
  }
  ASSERT_EQ(done.size(), 2u);
  for (const GenerationResult& r : done) {
    EXPECT_EQ(r.finish_reason, FinishReason::kError);
    EXPECT_EQ(r.error.code(), StatusCode::kDataLoss) << r.error.ToString();
    EXPECT_NE(r.error.message().find("non-finite logits (NaN or inf)"), std::string::npos)
        << r.error.ToString();
    EXPECT_TRUE(r.tokens.empty());
  }
}

}  // namespace
}  // namespace tessera
