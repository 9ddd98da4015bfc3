// Prefix caching: BlockAllocator's references, cache and LRU eviction, block
// keys, and the Scheduler reusing cached blocks on the real CPU model
// (fixture llama_gqa_f32, fp32). Every run with the cache must give the
// tokens and log-probabilities of the same requests without it; a step
// never writes into a block another sequence holds (checked on every
// submitted batch); idle, every block is free or cached again.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "common/engine/block_allocator.h"
#include "common/engine/block_key.h"
#include "common/engine/scheduler.h"
#include "support/test_util.h"
#include "worker/exec/local_executor.h"
#include "worker/model/model_loader.h"

namespace tessera {
namespace {

TEST(BlockKey, EqualOnlyForTheSameParentModelPlanAndTokens) {
  const std::vector<int32_t> t = {1, 2, 3, 4};
  const BlockKey a = ChainBlockKey(nullptr, "m", 1, t);
  EXPECT_EQ(a, ChainBlockKey(nullptr, "m", 1, t));
  EXPECT_NE(a, ChainBlockKey(nullptr, "other", 1, t));
  EXPECT_NE(a, ChainBlockKey(nullptr, "m", 2, t));
  EXPECT_NE(a, ChainBlockKey(nullptr, "m", 1, std::vector<int32_t>{1, 2, 3, 5}));
  const BlockKey child = ChainBlockKey(&a, "m", 1, t);
  EXPECT_NE(child, a);
  const BlockKey other_parent = ChainBlockKey(nullptr, "m", 1, std::vector<int32_t>{9, 2, 3, 4});
  EXPECT_NE(child, ChainBlockKey(&other_parent, "m", 1, t));
}

BlockKey Key(int n) { return ChainBlockKey(nullptr, "test", 0, std::vector<int32_t>{n}); }

TEST(BlockAllocatorPrefixCache, ReleasedBlocksStayCachedAndAreEvictedDeepestFirst) {
  BlockAllocator a(4);
  std::vector<int32_t> t;
  ASSERT_TRUE(a.Allocate(3, t).ok());
  EXPECT_EQ(t, (std::vector<int32_t>{0, 1, 2}));
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(a.Register(t[static_cast<size_t>(i)], Key(i)));
  EXPECT_FALSE(a.Register(t[0], Key(7)));  // already has a key
  std::vector<int32_t> u;
  ASSERT_TRUE(a.Allocate(1, u).ok());
  EXPECT_FALSE(a.Register(u[0], Key(0)));  // another block holds Key(0): u stays private
  a.Free(u);
  EXPECT_EQ(a.num_free(), 1);  // u's block, unused (no key); t is referenced
  EXPECT_EQ(a.num_cached(), 0);
  a.Free(t);
  EXPECT_EQ(a.num_free(), 4);
  EXPECT_EQ(a.num_cached(), 3);
  EXPECT_EQ(a.num_registered(), 3);
  ASSERT_EQ(a.Find(Key(1)), std::optional<int32_t>(1));
  // A hit takes the cached block back.
  a.AddRef(1);
  EXPECT_EQ(a.ref_count(1), 1);
  EXPECT_EQ(a.num_cached(), 2);
  EXPECT_EQ(a.num_free(), 3);
  // Unused blocks go first (id 3), then the least recently released cached
  // block: the table's last one (2), never the referenced 1.
  std::vector<int32_t> v;
  ASSERT_TRUE(a.Allocate(2, v).ok());
  EXPECT_EQ(v, (std::vector<int32_t>{3, 2}));
  EXPECT_FALSE(a.Find(Key(2)).has_value());
  EXPECT_EQ(a.Find(Key(0)), std::optional<int32_t>(0));
  EXPECT_FALSE(a.Allocate(2, v).ok());  // 1 free (cached block 0)
  // A cleared cache keeps referenced blocks referenced, without keys.
  a.ClearCache();
  EXPECT_EQ(a.num_registered(), 0);
  EXPECT_EQ(a.num_cached(), 0);
  EXPECT_FALSE(a.Find(Key(0)).has_value());
  EXPECT_EQ(a.num_free(), 1);
  std::vector<int32_t> one = {1};
  a.Free(one);
  a.Free(v);
  EXPECT_EQ(a.num_free(), 4);
  EXPECT_EQ(a.num_cached(), 0);
  // Lowest ids first again.
  std::vector<int32_t> w;
  ASSERT_TRUE(a.Allocate(4, w).ok());
  EXPECT_EQ(w, (std::vector<int32_t>{0, 1, 2, 3}));
}

// A LocalExecutor that records every batch and checks, at each Submit, that
// every block the batch writes (positions [start_pos, start_pos +
// num_tokens)) is held by that sequence alone.
class CheckingExecutor : public StepExecutor {
 public:
  CheckingExecutor(std::unique_ptr<LocalExecutor> inner, const BlockAllocator* allocator,
                   int64_t block_size)
      : inner_(std::move(inner)), allocator_(allocator), block_size_(block_size) {}
  Status Submit(const StepBatch& batch) override {
    for (const SeqStep& s : batch.seqs) {
      for (int64_t p = s.start_pos; p < s.start_pos + s.num_tokens; ++p) {
        const int32_t b = s.block_table[static_cast<size_t>(p / block_size_)];
        EXPECT_EQ(allocator_->ref_count(b), 1)
            << "seq " << s.seq_id << " writes position " << p << " into shared block " << b;
      }
    }
    batches.push_back(batch);
    return inner_->Submit(batch);
  }
  StatusOr<std::vector<SampledToken>> Collect() override { return inner_->Collect(); }
  int max_in_flight() const override { return inner_->max_in_flight(); }
  int64_t vocab_size() const override { return inner_->vocab_size(); }

  std::vector<StepBatch> batches;

 private:
  std::unique_ptr<LocalExecutor> inner_;
  const BlockAllocator* allocator_;
  int64_t block_size_;
};

std::unique_ptr<LocalExecutor> LoadExecutor(int64_t blocks, int64_t block_size,
                                            ModelConfig* config) {
  const std::string dir = ::tessera::testing::FixturePath("models/llama_gqa_f32");
  auto par = ParallelConfig::Make(*LoadModelConfig(dir), 1, 1);
  auto loaded = LoadModel(dir, *par, 0, nullptr);
  TESSERA_CHECK(loaded.ok());
  *config = loaded->config;
  const StageLayout lay = loaded->model->layout();
  auto cache = std::make_unique<KvCache>(lay.num_layers(), blocks, block_size, lay.kv_heads_local,
                                         config->head_dim);
  return std::make_unique<LocalExecutor>(std::move(loaded->model), std::move(cache));
}

struct Rig {
  ModelConfig config;
  std::unique_ptr<BlockAllocator> allocator;
  std::unique_ptr<CheckingExecutor> executor;
  std::unique_ptr<Scheduler> scheduler;
  int64_t block_size = 4;

  Rig(int64_t blocks, int64_t bs, bool cache, int64_t chunk = 512) {
    block_size = bs;
    allocator = std::make_unique<BlockAllocator>(blocks);
    executor = std::make_unique<CheckingExecutor>(LoadExecutor(blocks, block_size, &config),
                                                  allocator.get(), block_size);
    SchedulerOptions o;
    o.prefix_caching = cache;
    o.model_id = "llama_gqa_f32";
    o.prefill_chunk_tokens = chunk;
    o.max_batch_tokens = std::max<int64_t>(chunk, 64);
    scheduler = std::make_unique<Scheduler>(config, executor.get(), allocator.get(), block_size,
                                            nullptr, o);
  }

  // Enqueues every request at once and runs until all finished; results in
  // request order.
  std::vector<GenerationResult> Run(const std::vector<GenerationRequest>& reqs) {
    std::vector<GenerationResult> out(reqs.size());
    for (size_t i = 0; i < reqs.size(); ++i) {
      RequestCallbacks cb;
      cb.on_finish = [&out, i](const GenerationResult& g) { out[i] = g; };
      TESSERA_CHECK(scheduler->Enqueue(reqs[i], std::move(cb)).ok());
    }
    for (int k = 0; k < 100000 && (scheduler->running() || scheduler->waiting()); ++k)
      TESSERA_CHECK(scheduler->RunOnce().ok());
    scheduler->WaitForOutput();
    return out;
  }
  // Idle: nothing referenced, every block free (unused or cached).
  void ExpectIdle() const {
    EXPECT_EQ(allocator->num_free(), allocator->num_blocks());
    for (int32_t b = 0; b < allocator->num_blocks(); ++b) EXPECT_EQ(allocator->ref_count(b), 0);
  }
};

GenerationRequest Req(std::vector<int32_t> prompt, int max_tokens) {
  GenerationRequest g;
  g.prompt_ids = std::move(prompt);
  g.max_tokens = max_tokens;
  g.ignore_eos = true;
  g.sampling.logprobs = 2;
  return g;
}

std::vector<int32_t> Tokens(int n, int seed) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back((seed * 131 + i * 17 + 3) % 250 + 1);
  return t;
}

std::vector<int32_t> Concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Equal greedy tokens, log-probabilities within 1e-5 (fp32 on CPU).
void ExpectSameOutputs(const std::vector<GenerationResult>& got,
                       const std::vector<GenerationResult>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    SCOPED_TRACE("request " + std::to_string(i));
    EXPECT_EQ(got[i].finish_reason, FinishReason::kLength);
    ASSERT_EQ(got[i].tokens, want[i].tokens);
    ASSERT_EQ(got[i].logprobs.size(), want[i].logprobs.size());
    for (size_t t = 0; t < got[i].logprobs.size(); ++t) {
      ASSERT_TRUE(got[i].logprobs[t].has_logprobs);
      EXPECT_NEAR(got[i].logprobs[t].logprob, want[i].logprobs[t].logprob, 1e-5) << "token " << t;
      ASSERT_EQ(got[i].logprobs[t].top.size(), want[i].logprobs[t].top.size());
      for (size_t k = 0; k < got[i].logprobs[t].top.size(); ++k) {
        EXPECT_EQ(got[i].logprobs[t].top[k].token_id, want[i].logprobs[t].top[k].token_id);
        EXPECT_NEAR(got[i].logprobs[t].top[k].logprob, want[i].logprobs[t].top[k].logprob, 1e-5);
      }
    }
  }
}

// The block table of the first step of `seq_id`.
std::vector<int32_t> FirstTable(const CheckingExecutor& e, int64_t seq_id) {
  for (const StepBatch& b : e.batches)
    for (const SeqStep& s : b.seqs)
      if (s.seq_id == seq_id) return s.block_table;
  return {};
}
// The start position of the first step of `seq_id`.
int32_t FirstStart(const CheckingExecutor& e, int64_t seq_id) {
  for (const StepBatch& b : e.batches)
    for (const SeqStep& s : b.seqs)
      if (s.seq_id == seq_id) return s.start_pos;
  return -1;
}

// Requests one after another, sharing prefixes: the later ones prefill only
// past the cached blocks and give exactly the outputs of an uncached run.
TEST(PrefixCache, SequentialRequestsReuseBlocksAndMatchAnUncachedRun) {
  const std::vector<int32_t> system = Tokens(22, 1);  // 5 full blocks of 4, and 2 tokens
  const std::vector<GenerationRequest> reqs = {
      Req(Concat(system, Tokens(5, 2)), 6), Req(Concat(system, Tokens(7, 3)), 6),
      Req(Concat(system, Tokens(5, 2)), 6),  // the first prompt again
      Req(system, 4),                        // the shared part alone
      Req(Tokens(9, 4), 5)};                 // nothing shared
  Rig off(64, 4, false), on(64, 4, true);
  std::vector<GenerationResult> want, got;
  for (const GenerationRequest& r : reqs) {
    want.push_back(off.Run({r})[0]);
    got.push_back(on.Run({r})[0]);
  }
  ExpectSameOutputs(got, want);
  EXPECT_EQ(off.scheduler->stats().prefix_cache_hit_tokens, 0);
  EXPECT_EQ(off.scheduler->stats().prefix_cache_query_tokens, 0);
  // Hits: the 5 system blocks for request 1; request 2 repeats request 0
  // (27 tokens: 6 full blocks, all cached); request 3 (22 tokens) takes 5
  // blocks, its last token is in the 6th; request 4 none.
  EXPECT_EQ(got[0].cached_tokens, 0);
  EXPECT_EQ(got[1].cached_tokens, 20);
  EXPECT_EQ(got[2].cached_tokens, 24);
  EXPECT_EQ(got[3].cached_tokens, 20);
  EXPECT_EQ(got[4].cached_tokens, 0);
  EXPECT_EQ(on.scheduler->stats().prefix_cache_hit_tokens, 20 + 24 + 20);
  EXPECT_EQ(on.scheduler->stats().prefix_cache_query_tokens, 27 + 29 + 27 + 22 + 9);
  EXPECT_EQ(FirstStart(*on.executor, 1), 20);
  EXPECT_EQ(FirstStart(*on.executor, 2), 24);
  EXPECT_EQ(FirstStart(*off.executor, 2), 0);
  on.ExpectIdle();
  off.ExpectIdle();
  EXPECT_GT(on.allocator->num_cached(), 0);
  EXPECT_EQ(off.allocator->num_cached(), 0);
}

// A prompt made only of cached blocks still computes its last token: the
// match stops one block short, so the logits come from a real step.
TEST(PrefixCache, AFullyCachedPromptStillPrefillsItsLastBlock) {
  const std::vector<int32_t> prompt = Tokens(16, 5);  // exactly 4 blocks
  Rig off(64, 4, false), on(64, 4, true);
  const std::vector<GenerationResult> want = {off.Run({Req(prompt, 5)})[0],
                                              off.Run({Req(prompt, 5)})[0]};
  const std::vector<GenerationResult> got = {on.Run({Req(prompt, 5)})[0],
                                             on.Run({Req(prompt, 5)})[0]};
  ExpectSameOutputs(got, want);
  EXPECT_EQ(got[1].cached_tokens, 12);
  EXPECT_EQ(FirstStart(*on.executor, 1), 12);
  // The second request's 4th block is its own (the first one's is cached).
  const std::vector<int32_t> t0 = FirstTable(*on.executor, 0), t1 = FirstTable(*on.executor, 1);
  ASSERT_GE(t1.size(), 4u);
  EXPECT_EQ(std::vector<int32_t>(t1.begin(), t1.begin() + 3),
            std::vector<int32_t>(t0.begin(), t0.begin() + 3));
  EXPECT_NE(t1[3], t0[3]);
}

// Prompts that differ only in the last token of block 1 share block 0 and
// nothing after it.
TEST(PrefixCache, PromptsDifferingInTheLastTokenOfABlockShareEveryBlockBeforeIt) {
  std::vector<int32_t> a = Tokens(14, 6);
  std::vector<int32_t> b = a;
  b[7] = b[7] % 250 + 1;  // block 1 holds positions 4..7
  Rig off(64, 4, false), on(64, 4, true);
  const std::vector<GenerationResult> want = {off.Run({Req(a, 5)})[0], off.Run({Req(b, 5)})[0]};
  const std::vector<GenerationResult> got = {on.Run({Req(a, 5)})[0], on.Run({Req(b, 5)})[0]};
  ExpectSameOutputs(got, want);
  EXPECT_EQ(got[1].cached_tokens, 4);
  const std::vector<int32_t> ta = FirstTable(*on.executor, 0), tb = FirstTable(*on.executor, 1);
  ASSERT_EQ(ta.size(), 4u);
  ASSERT_EQ(tb.size(), 4u);
  EXPECT_EQ(tb[0], ta[0]);
  for (size_t i = 1; i < 4; ++i)
    for (size_t j = 0; j < 4; ++j) EXPECT_NE(tb[i], ta[j]) << "block " << i;
  EXPECT_EQ(FirstStart(*on.executor, 1), 4);
}

// Chunked prefill: chunk boundaries inside blocks (chunks of 3 tokens over
// blocks of 4) and chunks spanning several blocks (10 tokens), both when
// the cached blocks are written and when a later request prefills after
// them.
TEST(PrefixCache, ChunkedPrefillBoundariesInsideAndAcrossCachedBlocks) {
  const std::vector<int32_t> shared = Tokens(19, 7);
  const std::vector<GenerationRequest> reqs = {Req(Concat(shared, Tokens(4, 8)), 5),
                                               Req(Concat(shared, Tokens(11, 9)), 5),
                                               Req(Concat(shared, Tokens(4, 8)), 5)};
  for (int64_t chunk : {3, 10}) {
    SCOPED_TRACE("prefill_chunk_tokens " + std::to_string(chunk));
    Rig off(64, 4, false, chunk), on(64, 4, true, chunk);
    std::vector<GenerationResult> want, got;
    for (const GenerationRequest& r : reqs) {
      want.push_back(off.Run({r})[0]);
      got.push_back(on.Run({r})[0]);
    }
    ExpectSameOutputs(got, want);
    EXPECT_EQ(got[1].cached_tokens, 16);
    EXPECT_EQ(got[2].cached_tokens, 20);
    // The first request was prefilled in several chunks.
    int chunks = 0;
    for (const StepBatch& b : on.executor->batches)
      for (const SeqStep& s : b.seqs)
        if (s.seq_id == 0 && s.start_pos < 23) ++chunks;
    EXPECT_EQ(chunks, chunk == 3 ? 8 : 3);
    on.ExpectIdle();
  }
}

// A pool barely larger than one sequence, 32 requests over 4 shared
// prefixes enqueued at once: sequences are admitted as blocks come back,
// hit the blocks their predecessors left cached, evict the least recently
// used ones and get preempted; the outputs equal an uncached run's, and
// idle, every block is free or cached again.
TEST(PrefixCache, StressSmallPoolManySharedPrefixesNothingLeaks) {
  std::vector<GenerationRequest> reqs;
  // Prefixes in runs of 4 requests, the four prefixes twice over: a prefix
  // comes back after its blocks were evicted.
  for (int i = 0; i < 32; ++i)
    reqs.push_back(Req(Concat(Tokens(13, 20 + (i / 4) % 4), Tokens(3 + i % 3, 40 + i)), 6));
  // Longest sequence: 13 + 5 + 6 = 24 tokens = 6 blocks; the pool has 8.
  Rig off(8, 4, false, 5);
  const std::vector<GenerationResult> want = off.Run(reqs);
  Rig on(8, 4, true, 5);
  const std::vector<GenerationResult> got = on.Run(reqs);
  ExpectSameOutputs(got, want);
  const SchedulerStats& st = on.scheduler->stats();
  EXPECT_GT(st.prefix_cache_hit_tokens, 0);
  EXPECT_GT(st.preemptions, 0);
  int64_t hits = 0;
  for (const GenerationResult& r : got) hits += r.cached_tokens;
  EXPECT_GT(hits, 0);
  on.ExpectIdle();
  EXPECT_GT(on.allocator->num_cached(), 0);
  EXPECT_LE(on.allocator->num_cached(), on.allocator->num_blocks());
  // Run again on the warm cache: the same outputs once more.
  ExpectSameOutputs(on.Run(reqs), want);
  on.ExpectIdle();
}

// A new executor (a plan change: fresh workers, empty KV caches) clears
// the cache: the next request finds nothing and reads no stale block. Had
// the cache survived, it would read the zeros of the new executor's cache.
TEST(PrefixCache, PlanChangeClearsTheCache) {
  const std::vector<int32_t> prompt = Tokens(18, 10);
  Rig on(64, 4, true);
  const GenerationResult first = on.Run({Req(prompt, 5)})[0];
  EXPECT_EQ(on.Run({Req(prompt, 5)})[0].cached_tokens, 16);
  EXPECT_GT(on.allocator->num_cached(), 0);
  ModelConfig config;
  CheckingExecutor next(LoadExecutor(64, 4, &config), on.allocator.get(), 4);
  on.scheduler->SetExecutor(&next, 2);
  EXPECT_EQ(on.allocator->num_cached(), 0);
  EXPECT_EQ(on.allocator->num_registered(), 0);
  const int64_t hits = on.scheduler->stats().prefix_cache_hit_tokens;
  const GenerationResult after = on.Run({Req(prompt, 5)})[0];
  EXPECT_EQ(after.cached_tokens, 0);
  EXPECT_EQ(on.scheduler->stats().prefix_cache_hit_tokens, hits);
  EXPECT_EQ(FirstStart(next, 2), 0);
  ExpectSameOutputs({after}, {first});
  // And the new plan's blocks are cached from then on.
  EXPECT_EQ(on.Run({Req(prompt, 5)})[0].cached_tokens, 16);
}

// An executor error clears the cache too (the workers' KV may be gone).
class FailingAt : public StepExecutor {
 public:
  FailingAt(StepExecutor* inner, int fail_at) : inner_(inner), fail_at_(fail_at) {}
  Status Submit(const StepBatch& batch) override {
    if (++submits_ == fail_at_) return Unavailable("worker lost");
    return inner_->Submit(batch);
  }
  StatusOr<std::vector<SampledToken>> Collect() override { return inner_->Collect(); }
  int max_in_flight() const override { return inner_->max_in_flight(); }
  int64_t vocab_size() const override { return inner_->vocab_size(); }

 private:
  StepExecutor* inner_;
  int fail_at_;
  int submits_ = 0;
};

TEST(PrefixCache, ExecutorErrorClearsTheCache) {
  const std::vector<int32_t> prompt = Tokens(18, 11);
  Rig on(64, 4, true);
  // Request 0 takes 3 submits (a prefill, two decodes); request 1's first fails.
  FailingAt failing(on.executor.get(), 4);
  on.scheduler->SetExecutor(&failing, 1);
  EXPECT_EQ(on.Run({Req(prompt, 3)})[0].finish_reason, FinishReason::kLength);
  EXPECT_GT(on.allocator->num_registered(), 0);
  std::vector<GenerationResult> out(1);
  RequestCallbacks cb;
  cb.on_finish = [&out](const GenerationResult& g) { out[0] = g; };
  ASSERT_TRUE(on.scheduler->Enqueue(Req(prompt, 3), std::move(cb)).ok());
  EXPECT_FALSE(on.scheduler->RunOnce().ok());
  on.scheduler->WaitForOutput();
  EXPECT_EQ(out[0].finish_reason, FinishReason::kError);
  EXPECT_EQ(on.allocator->num_registered(), 0);
  EXPECT_EQ(on.allocator->num_cached(), 0);
  on.ExpectIdle();
}

}  // namespace
}  // namespace tessera
