// The scheduler's side of logits processing (common/base/sampling_params.h):
// stop_token_ids end a sequence like EOS (finish reason stop, no text);
// min_tokens' banned ids are the EOS ids (unless ignore_eos) and the stop
// ids; a step tells the sampling rank where the output starts and, after a
// prefix-cache hit, the tokens it skipped; out-of-vocab ids and a min_tokens
// above max_tokens are refused naming the field. The test plays the
// executor (Schedule / Apply).
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <mutex>

#include "common/engine/scheduler.h"

namespace tessera {
namespace {

struct Rig {
  explicit Rig(bool prefix_caching) : allocator(64) {
    config.vocab_size = 100;
    config.eos_token_ids = {2};
    SchedulerOptions o;
    o.prefix_caching = prefix_caching;
    scheduler = std::make_unique<Scheduler>(config, nullptr, &allocator, 4, nullptr, o);
  }
  StatusOr<int64_t> Add(GenerationRequest g) {
    RequestCallbacks cb;
    cb.on_finish = [this](const GenerationResult& r) {
      std::lock_guard<std::mutex> lock(mu);
      results.push_back(r);
    };
    return scheduler->Enqueue(std::move(g), std::move(cb));
  }
  // One iteration; every collected row "samples" `token`. Returns the plan.
  StepPlan Step(int32_t token) {
    StepPlan p = scheduler->Schedule(1);
    StepOutcome out;
    out.submitted = p.submit.size();
    std::vector<SampledToken> t(p.collect_rows.size());
    for (SampledToken& s : t) s.token_id = token;
    out.collected = t;
    EXPECT_TRUE(scheduler->Apply(p, std::move(out)).ok());
    return p;
  }
  std::vector<GenerationResult> Results() {
    scheduler->WaitForOutput();
    std::lock_guard<std::mutex> lock(mu);
    return results;
  }

  ModelConfig config;
  BlockAllocator allocator;
  std::unique_ptr<Scheduler> scheduler;
  std::mutex mu;
  std::vector<GenerationResult> results;  // guarded by mu
};

GenerationRequest Request(std::vector<int32_t> prompt, int max_tokens) {
  GenerationRequest g;
  g.prompt_ids = std::move(prompt);
  g.max_tokens = max_tokens;
  return g;
}

TEST(SchedulerSampling, StopTokenIdsFinishWithStop) {
  Rig rig(false);
  GenerationRequest g = Request({5, 6, 7}, 10);
  g.sampling.stop_token_ids = {42};
  ASSERT_TRUE(rig.Add(g).ok());
  StepPlan first = rig.Step(9);
  ASSERT_EQ(first.submit.size(), 1u);
  const SeqStep& s = first.submit[0].batch.seqs[0];
  EXPECT_TRUE(s.sampling.stop_token_ids.empty());  // not sent to workers
  EXPECT_EQ(s.output_start, 3);
  rig.Step(42);
  auto r = rig.Results();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].finish_reason, FinishReason::kStop);
  EXPECT_EQ(r[0].tokens, (std::vector<int32_t>{9, 42}));
}

TEST(SchedulerSampling, MinTokensBansEosAndStopIds) {
  Rig rig(false);
  GenerationRequest g = Request({5, 6, 7}, 10);
  g.sampling.min_tokens = 3;
  g.sampling.stop_token_ids = {42, 41};
  ASSERT_TRUE(rig.Add(g).ok());
  StepPlan p = rig.Step(9);
  ASSERT_EQ(p.submit.size(), 1u);
  EXPECT_EQ(p.submit[0].batch.seqs[0].sampling.min_tokens_blocked,
            (std::vector<int32_t>{2, 41, 42}));
  GenerationRequest h = Request({5, 6, 7}, 10);
  h.sampling.min_tokens = 3;
  h.ignore_eos = true;  // EOS does not end it: nothing to ban
  ASSERT_TRUE(rig.Add(h).ok());
  p = rig.Step(9);
  bool seen = false;
  for (const PlannedBatch& b : p.submit)
    for (const SeqStep& s : b.batch.seqs)
      if (s.start_pos == 0) {
        EXPECT_TRUE(s.sampling.min_tokens_blocked.empty());
        seen = true;
      }
  EXPECT_TRUE(seen);
}

// After a prefix-cache hit the first step starts past the cached tokens and
// carries them as history, once per admission, for sequences whose
// sampling needs it.
TEST(SchedulerSampling, HistoryFollowsAPrefixCacheHit) {
  Rig rig(true);
  const std::vector<int32_t> prompt = {10, 11, 12, 13, 14, 15, 16, 17, 18};
  ASSERT_TRUE(rig.Add(Request(prompt, 1)).ok());
  rig.Step(20);
  rig.Step(20);
  ASSERT_EQ(rig.Results().size(), 1u);
  GenerationRequest g = Request(prompt, 3);
  g.sampling.presence_penalty = 1.0f;
  ASSERT_TRUE(rig.Add(g).ok());
  StepPlan p = rig.Step(21);
  ASSERT_EQ(p.submit.size(), 1u);
  const SeqStep& s = p.submit[0].batch.seqs[0];
  EXPECT_EQ(s.start_pos, 8);
  EXPECT_EQ(s.history, std::vector<int32_t>(prompt.begin(), prompt.begin() + 8));
  EXPECT_EQ(s.output_start, 9);
  p = rig.Step(22);  // the decode step: history already sent
  ASSERT_EQ(p.submit.size(), 1u);
  EXPECT_TRUE(p.submit[0].batch.seqs[0].history.empty());
  // Without penalties no history travels.
  GenerationRequest plain = Request(prompt, 2);
  ASSERT_TRUE(rig.Add(plain).ok());
  for (int i = 0; i < 4; ++i) {
    p = rig.Step(23);
    for (const PlannedBatch& b : p.submit)
      for (const SeqStep& t : b.batch.seqs)
        if (!t.sampling.NeedsHistory()) {
          EXPECT_TRUE(t.history.empty());
        }
  }
}

// n > 1: choice 1 waits for choice 0's prefill, then holds references to
// its full prompt blocks and computes only the rest of the prompt.
TEST(SchedulerSampling, ChoicesShareThePromptBlocks) {
  Rig rig(false);  // no prefix caching: the sharing is the choices' own
  const std::vector<int32_t> prompt = {10, 11, 12, 13, 14, 15, 16, 17, 18};
  std::vector<GenerationRequest> gens = {Request(prompt, 4), Request(prompt, 2)};
  gens[1].share_prompt_of = 0;
  gens[1].sampling.seed = 1;
  std::vector<RequestCallbacks> cbs(2);
  for (auto& cb : cbs)
    cb.on_finish = [&rig](const GenerationResult& r) {
      std::lock_guard<std::mutex> lock(rig.mu);
      rig.results.push_back(r);
    };
  ASSERT_TRUE(rig.scheduler->EnqueueAll(gens, cbs).ok());
  StepPlan p = rig.Step(30);
  ASSERT_EQ(p.submit.size(), 1u);
  ASSERT_EQ(p.submit[0].batch.seqs.size(), 1u);  // choice 1 waits for the prompt's KV
  const std::vector<int32_t> parent_blocks = p.submit[0].batch.seqs[0].block_table;
  EXPECT_EQ(rig.scheduler->waiting(), 1u);
  p = rig.Step(31);
  const SeqStep* child = nullptr;
  for (const SeqStep& s : p.submit[0].batch.seqs)
    if (s.start_pos == 8) child = &s;
  ASSERT_NE(child, nullptr);
  EXPECT_EQ(child->num_tokens, 1);  // only the last prompt token
  ASSERT_GE(child->block_table.size(), 3u);
  EXPECT_EQ(child->block_table[0], parent_blocks[0]);
  EXPECT_EQ(child->block_table[1], parent_blocks[1]);
  EXPECT_NE(child->block_table[2], parent_blocks[2]);
  EXPECT_EQ(rig.allocator.ref_count(parent_blocks[0]), 2);  // both choices hold it
  for (int i = 0; i < 4; ++i) rig.Step(32);
  EXPECT_EQ(rig.Results().size(), 2u);
  EXPECT_EQ(rig.allocator.num_free(), rig.allocator.num_blocks());
  // A share of a later request, or of another prompt, is refused.
  gens[1].share_prompt_of = 1;
  auto bad = rig.scheduler->EnqueueAll(gens, std::vector<RequestCallbacks>(2));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("share_prompt_of"), std::string::npos);
}

TEST(SchedulerSampling, RefusesOutOfVocabIdsAndUnreachableMinTokens) {
  Rig rig(false);
  GenerationRequest g = Request({5}, 4);
  g.sampling.logit_bias = {{100, 1.0f}};
  auto r = rig.Add(g);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message().rfind("logit_bias: token id 100 is outside the vocab", 0), 0u)
      << r.status().ToString();
  g = Request({5}, 4);
  g.sampling.stop_token_ids = {-1};
  r = rig.Add(g);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("stop_token_ids"), std::string::npos);
  g = Request({5}, 4);
  g.sampling.min_tokens = 5;
  r = rig.Add(g);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message().rfind("min_tokens: 5 exceeds max_tokens 4", 0), 0u)
      << r.status().ToString();
  EXPECT_EQ(rig.scheduler->waiting(), 0u);
}

}  // namespace
}  // namespace tessera
