// Reuse of held weight slices across loads (worker/model/weight_loader.h,
// HeldWeights): a slice is taken from what the rank holds only when its key,
// local shape, device and the backend's compute dtype all match; anything
// else is read from the checkpoint again. Drives the real loader on the
// llama_gqa_f32 fixture with the CPU backend.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <tuple>

#include "common/format/checkpoint.h"
#include "common/format/model_config.h"
#include "common/model/parallel_config.h"
#include "common/model/shard_spec.h"
#include "support/test_util.h"
#include "worker/model/weight_loader.h"

namespace tessera {
namespace {

struct Loaded {
  ShardSpec spec;
  StageWeights weights;
};

// Rank `rank` of tp x pp=1, with `held` offered for reuse.
StatusOr<Loaded> Load(int tp, int rank, const HeldWeights* held) {
  const std::string dir = testing::FixturePath("models/llama_gqa_f32");
  TESSERA_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(dir));
  TESSERA_ASSIGN_OR_RETURN(ParallelConfig parallel, ParallelConfig::Make(config, tp, 1));
  TESSERA_ASSIGN_OR_RETURN(ShardSpec spec, ShardSpec::Make(config, parallel, rank));
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> ckpt, Checkpoint::Open(dir));
  TESSERA_ASSIGN_OR_RETURN(StageWeights w,
                           LoadStageWeights(*ckpt, config, parallel, spec, {}, nullptr, held));
  return Loaded{std::move(spec), std::move(w)};
}

TEST(HeldWeights, SameSliceOnTheSameBackendAndDtypeIsReusedNotRead) {
  StatusOr<Loaded> first_or = Load(2, 1, nullptr);
  ASSERT_TRUE(first_or.ok()) << first_or.status().ToString();
  Loaded& first = *first_or;
  EXPECT_EQ(first.weights.reused_bytes, 0);
  StatusOr<HeldWeights> held = HoldWeights(first.weights, first.spec);
  ASSERT_TRUE(held.ok()) << held.status().ToString();
  ASSERT_FALSE(held->empty());

  StatusOr<Loaded> again_or = Load(2, 1, &*held);
  ASSERT_TRUE(again_or.ok()) << again_or.status().ToString();
  Loaded& again = *again_or;
  EXPECT_EQ(again.weights.weight_bytes, first.weights.weight_bytes);
  EXPECT_EQ(again.weights.reused_bytes, again.weights.weight_bytes);
  EXPECT_EQ(again.weights.reused_tensors, static_cast<int>(held->size()));
  // The very same storage, not a copy: the fused tensors are taken whole.
  EXPECT_EQ(again.weights.layers[0].q_proj.raw(), first.weights.layers[0].q_proj.raw());
  EXPECT_EQ(again.weights.layers[0].qkv_proj.raw(), first.weights.layers[0].qkv_proj.raw());
  EXPECT_EQ(again.weights.layers[0].qkv_proj.shape(), first.weights.layers[0].qkv_proj.shape());
  EXPECT_EQ(again.weights.layers[0].gate_up_proj.raw(), first.weights.layers[0].gate_up_proj.raw());
  EXPECT_EQ(again.weights.layers[0].v_proj.raw(), first.weights.layers[0].v_proj.raw());
  EXPECT_EQ(again.weights.final_norm.raw(), first.weights.final_norm.raw());
}

TEST(HeldWeights, ADifferentDtypeIsReadAgain) {
  StatusOr<Loaded> first_or = Load(2, 0, nullptr);
  ASSERT_TRUE(first_or.ok()) << first_or.status().ToString();
  Loaded& first = *first_or;
  StatusOr<HeldWeights> held = HoldWeights(first.weights, first.spec);
  ASSERT_TRUE(held.ok()) << held.status().ToString();
  // The same slices as another backend would hold them: same keys and
  // shapes, F16 (the CPU backend computes in F32). Filled with a pattern
  // that must not show up in the loaded weights.
  HeldWeights f16;
  for (const auto& [key, t] : *held) {
    Tensor other = Tensor::Empty(t.shape(), DType::kF16);
    std::memset(other.raw(), 0x7b, other.nbytes());
    f16.emplace(key, other);
  }
  StatusOr<Loaded> again_or = Load(2, 0, &f16);
  ASSERT_TRUE(again_or.ok()) << again_or.status().ToString();
  Loaded& again = *again_or;
  EXPECT_EQ(again.weights.reused_bytes, 0);
  EXPECT_EQ(again.weights.reused_tensors, 0);
  EXPECT_EQ(again.weights.weight_bytes, first.weights.weight_bytes);
  const Tensor& a = first.weights.layers[0].q_proj;
  const Tensor& b = again.weights.layers[0].q_proj;
  ASSERT_EQ(b.dtype(), DType::kF32);
  ASSERT_EQ(a.nbytes(), b.nbytes());
  EXPECT_EQ(std::memcmp(a.raw(), b.raw(), a.nbytes()), 0);
  EXPECT_NE(a.raw(), b.raw());  // read again, not shared
}

TEST(HeldWeights, ADifferentTpSliceIsReadAgainButReplicatedNormsAreReused) {
  // Held: tp 1 (whole tensors). Loading tp 2 rank 0 needs half slices:
  // their keys (begin, end) differ, so only the replicated norms match.
  StatusOr<Loaded> whole_or = Load(1, 0, nullptr);
  ASSERT_TRUE(whole_or.ok()) << whole_or.status().ToString();
  Loaded& whole = *whole_or;
  StatusOr<HeldWeights> held = HoldWeights(whole.weights, whole.spec);
  ASSERT_TRUE(held.ok()) << held.status().ToString();
  StatusOr<Loaded> half_or = Load(2, 0, &*held);
  ASSERT_TRUE(half_or.ok()) << half_or.status().ToString();
  Loaded& half = *half_or;
  EXPECT_GT(half.weights.reused_tensors, 0);
  EXPECT_LT(half.weights.reused_bytes, half.weights.weight_bytes);
  EXPECT_EQ(half.weights.layers[0].input_norm.raw(), whole.weights.layers[0].input_norm.raw());
  EXPECT_NE(half.weights.layers[0].q_proj.raw(), whole.weights.layers[0].q_proj.raw());
}

// A held part of a fused tensor whose other parts are not held (or not in
// place) is copied into its rows of a new fused tensor and counted as
// reused; the parts not held are read from the checkpoint. The values are
// those of a fresh load.
TEST(HeldWeights, AHeldPartOfAFusedTensorIsCopiedIntoItsRows) {
  StatusOr<Loaded> first_or = Load(2, 1, nullptr);
  ASSERT_TRUE(first_or.ok()) << first_or.status().ToString();
  Loaded& first = *first_or;
  StatusOr<HeldWeights> all = HoldWeights(first.weights, first.spec);
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  // Only layer 0's k_proj.
  auto k = first.spec.Find(TensorRole::kKProj, 0);
  ASSERT_TRUE(k.ok()) << k.status().ToString();
  const auto key = std::make_tuple((*k)->name, (*k)->begin, (*k)->end);
  ASSERT_EQ(all->count(key), 1u);
  HeldWeights held;
  held.emplace(key, all->at(key));
  StatusOr<Loaded> again_or = Load(2, 1, &held);
  ASSERT_TRUE(again_or.ok()) << again_or.status().ToString();
  Loaded& again = *again_or;
  EXPECT_EQ(again.weights.reused_tensors, 1);
  EXPECT_EQ(again.weights.reused_bytes,
            static_cast<int64_t>(first.weights.layers[0].k_proj.nbytes()));
  EXPECT_EQ(again.weights.weight_bytes, first.weights.weight_bytes);
  const LayerWeights& a = first.weights.layers[0];
  const LayerWeights& b = again.weights.layers[0];
  EXPECT_NE(b.qkv_proj.raw(), a.qkv_proj.raw());  // a new fused tensor
  EXPECT_EQ(static_cast<const char*>(b.k_proj.raw()),
            static_cast<const char*>(b.qkv_proj.raw()) + b.q_proj.nbytes());
  ASSERT_EQ(a.qkv_proj.nbytes(), b.qkv_proj.nbytes());
  EXPECT_EQ(std::memcmp(a.qkv_proj.raw(), b.qkv_proj.raw(), a.qkv_proj.nbytes()), 0);
}

}  // namespace
}  // namespace tessera
