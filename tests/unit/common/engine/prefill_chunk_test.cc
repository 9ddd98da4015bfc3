// Chunked prefill by cost (common/engine/prefill_chunk.h): the context scale
// K of a model, the chunk sizes it gives, and the scheduler's chunks under
// scheduler.prefill_chunk_budget "cost" and "tokens".
#include "common/engine/prefill_chunk.h"

#include <gtest/gtest.h>

#include <vector>

#include "common/engine/scheduler.h"

namespace tessera {
namespace {

ModelConfig Llama3_8bShape() {
  ModelConfig c;
  c.hidden_size = 4096;
  c.intermediate_size = 14336;
  c.num_hidden_layers = 32;
  c.num_attention_heads = 32;
  c.num_key_value_heads = 8;
  c.head_dim = 128;
  c.vocab_size = 128256;
  return c;
}

// Per layer 4096 * 128 * (2*32 + 2*8) + 3 * 4096 * 14336 = 218,103,808 weights;
// attention 4 * 32 * 128 FLOPs per key per layer: K = 218,103,808 / 16,384 = 13,312.
TEST(PrefillChunk, ContextScaleOfTheLlama3_8bShape) {
  EXPECT_EQ(PrefillContextTokens(Llama3_8bShape()), 13312);
}

// Sliding-window layers leave the attention term: half of them sliding halves it.
TEST(PrefillChunk, SlidingLayersLeaveTheAttentionTerm) {
  ModelConfig c = Llama3_8bShape();
  c.sliding_window = 4096;
  c.sliding_layers.assign(32, false);
  for (int l = 0; l < 32; l += 2) c.sliding_layers[l] = true;
  EXPECT_EQ(PrefillContextTokens(c), 2 * 13312);
  c.sliding_layers.assign(32, true);
  EXPECT_EQ(PrefillContextTokens(c), 0);              // every layer slides: fixed chunks
  EXPECT_EQ(PrefillContextTokens(ModelConfig{}), 0);  // no dimensions
}

TEST(PrefillChunk, FirstChunksAndFixedChunksAreTheConfiguredSize) {
  EXPECT_EQ(PrefillChunkTokens(256, 13312, 0, 100000), 256);
  EXPECT_EQ(PrefillChunkTokens(256, 0, 8192, 100000), 256);  // K = 0: fixed
  EXPECT_EQ(PrefillChunkTokens(256, 13312, 0, 100), 100);    // never more than is left
}

// n + n (s + n/2) / K <= C + C^2 / (2K): at s = 8192, C = 256, K = 13312, n = 159
// (159 * (1 + 8271.5 / 13312) = 257.8 <= 258.5; 160 gives 259.4).
TEST(PrefillChunk, LaterChunksCostWhatTheFirstDid) {
  EXPECT_EQ(PrefillChunkTokens(256, 13312, 8192, 100000), 159);
  EXPECT_EQ(PrefillChunkTokens(256, 13312, 32768, 100000), 74);
  int64_t last = 256;
  for (int64_t s = 0; s < 200000; s += 997) {
    const int64_t n = PrefillChunkTokens(256, 13312, s, 1000000);
    EXPECT_LE(n, last) << "at " << s;  // never grows with the context
    EXPECT_GE(n, kMinPrefillChunkTokens) << "at " << s;
    last = n;
  }
}

TEST(PrefillChunk, AShortTailJoinsTheChunkWithinTheConfiguredSize) {
  // At s = 512 of a 1024-token prompt the cost fit is 493 (< 512): the 19 left would take a step
  // of their own, so the chunk takes all 512.
  EXPECT_EQ(PrefillChunkTokens(512, 13312, 512, 100000), 493);
  EXPECT_EQ(PrefillChunkTokens(512, 13312, 512, 512), 512);
  EXPECT_EQ(PrefillChunkTokens(512, 13312, 512, 600), 493);  // 107 > 64 would be left: no join
}

// The scheduler's chunks of one 300-token prompt (K = 64 tokens, chunks of 64).
std::vector<int32_t> Chunks(PrefillChunkBudget budget) {
  ModelConfig config = Llama3_8bShape();
  config.vocab_size = 1000;
  config.eos_token_ids = {2};
  SchedulerOptions o;
  o.prefill_chunk_tokens = 64;
  o.prefill_chunk_budget = budget;
  o.prefill_context_tokens = 64;
  BlockAllocator allocator(100);
  Scheduler sched(config, nullptr, &allocator, 16, nullptr, o);
  GenerationRequest g;
  g.prompt_ids.assign(300, 7);
  g.max_tokens = 1;
  g.ignore_eos = true;
  EXPECT_TRUE(sched.Enqueue(std::move(g), RequestCallbacks{}).ok());
  std::vector<int32_t> chunks;
  for (int i = 0; i < 100 && (sched.running() || sched.waiting()); ++i) {
    StepPlan plan = sched.Schedule(1);
    StepOutcome out;
    out.submitted = plan.submit.size();
    for (const PlannedBatch& b : plan.submit)
      for (const SeqStep& s : b.batch.seqs) chunks.push_back(s.num_tokens);
    std::vector<SampledToken> tokens(plan.collect_rows.size());
    for (SampledToken& t : tokens) t.token_id = 5;
    out.collected = std::move(tokens);
    EXPECT_TRUE(sched.Apply(plan, std::move(out)).ok());
    sched.WaitForOutput();
  }
  return chunks;
}

TEST(PrefillChunk, TheSchedulersChunksShrinkWithTheContextUnderCost) {
  EXPECT_EQ(Chunks(PrefillChunkBudget::kCost),
            (std::vector<int32_t>{64, 41, 33, 28, 25, 23, 21, 19, 18, 17, 11}));
  EXPECT_EQ(Chunks(PrefillChunkBudget::kTokens), (std::vector<int32_t>{64, 64, 64, 64, 44}));
}

}  // namespace
}  // namespace tessera
