// UploadShard (worker/model/shard_upload.h), the GPU loader's chunked path, driven through the
// synchronous UploadQueue on the CPU: for every shard of every rank at tp 1, 2 and 4 (column-
// and row-parallel, replicated, 1-D norms), with staging buffers of a few rows so each shard
// takes many chunks, the uploaded bytes equal ReadSlice's, and the checkpoint reads exactly the
// shard's bytes. The vocab-parallel shards with padding rows and a row too wide for the staging
// buffer are refused by ShardUploadApplies (the loader reads them whole).
#include "worker/model/shard_upload.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "common/format/checkpoint.h"
#include "common/format/model_config.h"
#include "common/model/parallel_config.h"
#include "common/model/shard_spec.h"
#include "kernels/backend.h"
#include "support/test_util.h"

namespace tessera {
namespace {

TEST(ShardUpload, ChunkedRowsEqualTheSliceAndReadOnlyTheShard) {
  const std::string dir = testing::FixturePath("models/llama_gqa_f32");
  auto config = LoadModelConfig(dir);
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  auto ckpt = Checkpoint::Open(dir);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().ToString();
  int uploaded = 0, row_parallel = 0;
  for (int tp : {1, 2, 4}) {
    auto par = ParallelConfig::Make(*config, tp, 1);
    ASSERT_TRUE(par.ok()) << par.status().ToString();
    for (int rank = 0; rank < tp; ++rank) {
      auto spec = ShardSpec::Make(*config, *par, rank);
      ASSERT_TRUE(spec.ok()) << spec.status().ToString();
      for (const TensorShard& t : spec->tensors()) {
        SCOPED_TRACE(t.name + " tp " + std::to_string(tp) + " rank " + std::to_string(rank));
        auto info = (*ckpt)->Find(t.name);
        ASSERT_TRUE(info.ok());
        const size_t row_bytes = static_cast<size_t>(t.local_numel() / t.local_shape[0]) * 4;
        // Three rows and a half per staging buffer: chunks of three rows and a short last one.
        kernels::UploadOptions options;
        options.staging_bytes = 3 * row_bytes + row_bytes / 2;
        auto queue = kernels::NewSyncUploadQueue(kernels::CpuBackend(), options);
        if (!ShardUploadApplies(t, *info, DType::kF32, options.staging_bytes)) {
          EXPECT_TRUE(t.split_dim == 0 && t.end - t.begin < t.local_shape[0])
              << "only zero-padded vocab rows are refused here";
          continue;
        }
        EXPECT_FALSE(ShardUploadApplies(t, *info, DType::kF32, row_bytes - 4));
        EXPECT_FALSE(ShardUploadApplies(t, *info, DType::kBF16, options.staging_bytes));
        Tensor want = Tensor::Empty(t.local_shape);
        if (t.split_dim < 0) {
          ASSERT_TRUE((*ckpt)->ReadAll(t.name, DType::kF32, want.raw()).ok());
        } else {
          ASSERT_TRUE((*ckpt)
                          ->ReadSlice(t.name, t.split_dim, t.begin, t.end, DType::kF32, want.raw())
                          .ok());
        }
        Tensor got = Tensor::Empty(t.local_shape);
        std::memset(got.raw(), 0xff, got.nbytes());
        const int64_t before = (*ckpt)->BytesRead();
        Status s = UploadShard(**ckpt, t, got, *queue);
        ASSERT_TRUE(s.ok()) << s.ToString();
        ASSERT_TRUE(queue->Finish().ok());
        EXPECT_EQ((*ckpt)->BytesRead() - before, static_cast<int64_t>(got.nbytes()));
        EXPECT_EQ(std::memcmp(got.raw(), want.raw(), got.nbytes()), 0);
        ++uploaded;
        row_parallel += t.split_dim == 1;
      }
    }
  }
  EXPECT_GT(row_parallel, 0);
  EXPECT_GT(uploaded, 40);
}

TEST(ShardUpload, ErrorsNameTheTensor) {
  const std::string dir = testing::FixturePath("models/llama_gqa_f32");
  auto config = LoadModelConfig(dir);
  ASSERT_TRUE(config.ok());
  auto ckpt = Checkpoint::Open(dir);
  ASSERT_TRUE(ckpt.ok());
  auto par = ParallelConfig::Make(*config, 2, 1);
  ASSERT_TRUE(par.ok());
  auto spec = ShardSpec::Make(*config, *par, 1);
  ASSERT_TRUE(spec.ok());
  auto o = spec->Find(TensorRole::kOProj, 1);
  ASSERT_TRUE(o.ok());
  auto queue = kernels::NewSyncUploadQueue(kernels::CpuBackend(), kernels::UploadOptions{});
  // Rows past the slice's rows.
  std::vector<float> scratch(64 * 64);
  Status rows = (*ckpt)->ReadSliceRows((*o)->name, 1, 0, 8, 60, 65, DType::kF32, scratch.data());
  EXPECT_EQ(rows.code(), StatusCode::kOutOfRange);
  EXPECT_NE(rows.message().find((*o)->name), std::string::npos) << rows.ToString();
  // A destination of the wrong size.
  Tensor small = Tensor::Empty({1, 1});
  Status s = UploadShard(**ckpt, **o, small, *queue);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find((*o)->name), std::string::npos) << s.ToString();
  // A task larger than the staging buffers, and one past the end of its destination.
  kernels::UploadOptions tiny;
  tiny.staging_bytes = 64;
  auto small_queue = kernels::NewSyncUploadQueue(kernels::CpuBackend(), tiny);
  Tensor big = Tensor::Empty({32});
  s = small_queue->Enqueue(big, 0, big.nbytes(), [](void*) { return Status::Ok(); });
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  s = small_queue->Enqueue(big, big.nbytes() - 32, 64, [](void*) { return Status::Ok(); });
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  // A failing fill is the queue's error from then on.
  Tensor one = Tensor::Empty({4});
  s = queue->Enqueue(one, 0, one.nbytes(), [](void*) { return IoError("disk gone"); });
  EXPECT_EQ(s.code(), StatusCode::kIoError);
  EXPECT_EQ(queue->Finish().code(), StatusCode::kIoError);
}

}  // namespace
}  // namespace tessera
