// Scheduling policy through Schedule/Apply with no executor: the test plays
// the executor, returning made-up tokens for the rows each plan collects.
// Checks admission order, chunked prefill, the micro-batch token budget,
// preemption choice, re-queueing, pipeline slots and error paths.
#include <gtest/gtest.h>

#include <map>
#include <tuple>
#include <vector>

#include "common/engine/scheduler.h"

namespace tessera {
namespace {

struct Rig {
  explicit Rig(int64_t blocks, int64_t block_size = 4, SchedulerOptions o = {})
      : allocator(blocks) {
    config.vocab_size = 1000;
    config.eos_token_ids = {2};
    scheduler = std::make_unique<Scheduler>(config, nullptr, &allocator, block_size, nullptr, o);
  }
  // Enqueues a request; its result lands in done[id].
  int64_t Add(std::vector<int32_t> prompt, int max_tokens, bool ignore_eos = true) {
    GenerationRequest g;
    g.prompt_ids = std::move(prompt);
    g.max_tokens = max_tokens;
    g.ignore_eos = ignore_eos;
    auto slot = std::make_shared<int64_t>(-1);
    RequestCallbacks cb;
    cb.on_finish = [this, slot](const GenerationResult& r) { done[*slot] = r; };
    auto id = scheduler->Enqueue(std::move(g), std::move(cb));
    EXPECT_TRUE(id.ok()) << id.status().ToString();
    *slot = *id;
    return *id;
  }
  // Carries `plan` out: everything submits, and the collected rows get
  // token 100 + seq_id (or `token` when >= 0).
  Status Run(const StepPlan& plan, int32_t token = -1) {
    StepOutcome out;
    out.submitted = plan.submit.size();
    std::vector<SampledToken> t;
    for (int64_t id : plan.collect_rows) {
      SampledToken s;
      s.token_id = token >= 0 ? token : static_cast<int32_t>(100 + id);
      t.push_back(s);
    }
    out.collected = t;
    Status st = scheduler->Apply(plan, std::move(out));
    scheduler->WaitForOutput();  // callbacks run on the output thread
    return st;
  }
  // Schedule + Run until every request finished (bounded).
  void Drain(int slots = 1) {
    for (int i = 0; i < 1000 && (scheduler->running() || scheduler->waiting()); ++i) {
      StepPlan p = scheduler->Schedule(slots);
      ASSERT_TRUE(Run(p).ok());
    }
  }

  ModelConfig config;
  BlockAllocator allocator;
  std::unique_ptr<Scheduler> scheduler;
  std::map<int64_t, GenerationResult> done;
};

std::vector<int64_t> SeqIds(const StepBatch& b) {
  std::vector<int64_t> ids;
  for (const SeqStep& s : b.seqs) ids.push_back(s.seq_id);
  return ids;
}

// FIFO: a request that does not fit stops admission; none overtakes it.
TEST(ScheduleApply, AdmissionIsFifoAndStopsAtTheFirstThatDoesNotFit) {
  Rig rig(4);                                                // 4 blocks of 4 tokens
  const int64_t a = rig.Add({1, 2, 3, 4, 5}, 3);             // 2 blocks
  const int64_t b = rig.Add(std::vector<int32_t>(9, 7), 3);  // 3 blocks: does not fit after a
  const int64_t c = rig.Add({9}, 3);                         // 1 block: would fit, must wait
  StepPlan p = rig.scheduler->Schedule(1);
  EXPECT_EQ(p.admitted, std::vector<int64_t>{a});
  EXPECT_EQ(rig.scheduler->waiting(), 2u);
  ASSERT_EQ(p.submit.size(), 1u);
  EXPECT_EQ(SeqIds(p.submit[0].batch), std::vector<int64_t>{a});
  EXPECT_EQ(p.submit[0].prefill_tokens, 5);
  EXPECT_EQ(p.submit[0].decode_tokens, 0);
  EXPECT_TRUE(p.collect);
  EXPECT_EQ(p.collect_rows, std::vector<int64_t>{a});
  ASSERT_TRUE(rig.Run(p).ok());
  rig.Drain();
  ASSERT_EQ(rig.done.size(), 3u);
  for (int64_t id : {a, b, c}) {
    EXPECT_EQ(rig.done[id].finish_reason, FinishReason::kLength);
    EXPECT_EQ(rig.done[id].tokens, std::vector<int32_t>(3, static_cast<int32_t>(100 + id)));
  }
  EXPECT_EQ(rig.allocator.num_free(), 4);
}

TEST(ScheduleApply, AdmissionStopsAtMaxSequences) {
  SchedulerOptions o;
  o.max_sequences = 2;
  Rig rig(64, 4, o);
  const int64_t a = rig.Add({1}, 2);
  const int64_t b = rig.Add({2}, 2);
  rig.Add({3}, 2);
  StepPlan p = rig.scheduler->Schedule(1);
  EXPECT_EQ(p.admitted, (std::vector<int64_t>{a, b}));
  EXPECT_EQ(rig.scheduler->running(), 2u);
  EXPECT_EQ(rig.scheduler->waiting(), 1u);
  ASSERT_TRUE(rig.Run(p).ok());
}

// With set_admitting(false) nothing is admitted; the queue keeps its order.
TEST(ScheduleApply, NotAdmittingKeepsRequestsQueued) {
  Rig rig(64);
  const int64_t a = rig.Add({1, 2}, 2);
  rig.scheduler->set_admitting(false);
  StepPlan p = rig.scheduler->Schedule(1);
  EXPECT_TRUE(p.admitted.empty());
  EXPECT_TRUE(p.empty());
  ASSERT_TRUE(rig.Run(p).ok());
  EXPECT_EQ(rig.scheduler->waiting(), 1u);
  rig.scheduler->set_admitting(true);
  p = rig.scheduler->Schedule(1);
  EXPECT_EQ(p.admitted, std::vector<int64_t>{a});
  ASSERT_TRUE(rig.Run(p).ok());
}

// A prompt is prefilled in chunks of prefill_chunk_tokens; only the last
// chunk samples.
TEST(ScheduleApply, ChunkedPrefillRespectsTheChunkLimit) {
  SchedulerOptions o;
  o.prefill_chunk_tokens = 4;
  Rig rig(64, 4, o);
  std::vector<int32_t> prompt = {10, 11, 12, 13, 14, 15, 16, 17, 18, 19};
  const int64_t a = rig.Add(prompt, 2);
  const std::vector<std::pair<int32_t, int32_t>> chunks = {{0, 4}, {4, 4}, {8, 2}};
  for (size_t i = 0; i < chunks.size(); ++i) {
    SCOPED_TRACE("chunk " + std::to_string(i));
    StepPlan p = rig.scheduler->Schedule(1);
    ASSERT_EQ(p.submit.size(), 1u);
    const StepBatch& b = p.submit[0].batch;
    ASSERT_EQ(b.seqs.size(), 1u);
    EXPECT_EQ(b.seqs[0].start_pos, chunks[i].first);
    EXPECT_EQ(b.seqs[0].num_tokens, chunks[i].second);
    EXPECT_EQ(b.seqs[0].prompt_len, 10);
    EXPECT_EQ(b.token_ids,
              std::vector<int32_t>(prompt.begin() + chunks[i].first,
                                   prompt.begin() + chunks[i].first + chunks[i].second));
    const bool last = i + 1 == chunks.size();
    EXPECT_EQ(b.seqs[0].want_logits, last);
    EXPECT_EQ(p.collect_rows, last ? std::vector<int64_t>{a} : std::vector<int64_t>{});
    ASSERT_TRUE(rig.Run(p).ok());
  }
  // Then one-token decode steps.
  StepPlan p = rig.scheduler->Schedule(1);
  ASSERT_EQ(p.submit.size(), 1u);
  EXPECT_EQ(p.submit[0].decode_tokens, 1);
  EXPECT_EQ(p.submit[0].batch.seqs[0].start_pos, 10);
  EXPECT_EQ(p.submit[0].batch.token_ids, std::vector<int32_t>{static_cast<int32_t>(100 + a)});
  ASSERT_TRUE(rig.Run(p).ok());
  ASSERT_EQ(rig.done.count(a), 1u);
  EXPECT_EQ(rig.done[a].tokens.size(), 2u);
}

// max_batch_tokens bounds the tokens of one micro-batch: the second prompt
// gets what is left of the budget, the third none.
TEST(ScheduleApply, MaxBatchTokensBoundsAMicroBatch) {
  SchedulerOptions o;
  o.max_batch_tokens = 6;
  Rig rig(64, 4, o);
  const int64_t a = rig.Add({1, 2, 3, 4}, 2);
  const int64_t b = rig.Add({5, 6, 7, 8}, 2);
  rig.Add({9, 9}, 2);
  StepPlan p = rig.scheduler->Schedule(1);
  EXPECT_EQ(p.admitted.size(), 3u);
  ASSERT_EQ(p.submit.size(), 1u);
  const StepBatch& batch = p.submit[0].batch;
  EXPECT_EQ(SeqIds(batch), (std::vector<int64_t>{a, b}));
  EXPECT_EQ(batch.seqs[0].num_tokens, 4);
  EXPECT_EQ(batch.seqs[1].num_tokens, 2);
  EXPECT_FALSE(batch.seqs[1].want_logits);
  EXPECT_EQ(batch.total_tokens(), 6);
  EXPECT_EQ(p.collect_rows, std::vector<int64_t>{a});
  ASSERT_TRUE(rig.Run(p).ok());
  rig.Drain();
  EXPECT_EQ(rig.done.size(), 3u);
}

// When a running sequence needs a block and none is free, the newest running
// sequence that is not in flight is preempted; it comes back first and
// recomputes prompt + generated tokens.
TEST(ScheduleApply, PreemptionPicksTheNewestRunningSequence) {
  Rig rig(4, 2);  // 4 blocks of 2 tokens
  const int64_t a = rig.Add({1, 2, 3}, 3);
  const int64_t b = rig.Add({4, 5, 6}, 3);
  StepPlan p = rig.scheduler->Schedule(1);  // both prefill (2 blocks each)
  EXPECT_EQ(p.admitted, (std::vector<int64_t>{a, b}));
  EXPECT_EQ(rig.allocator.num_free(), 0);
  ASSERT_TRUE(rig.Run(p).ok());
  p = rig.scheduler->Schedule(1);  // positions 3: still in the second block
  EXPECT_TRUE(p.preempted.empty());
  ASSERT_TRUE(rig.Run(p).ok());
  p = rig.scheduler->Schedule(1);  // position 4 needs a third block: b goes
  EXPECT_EQ(p.preempted, std::vector<int64_t>{b});
  ASSERT_EQ(p.submit.size(), 1u);
  EXPECT_EQ(SeqIds(p.submit[0].batch), std::vector<int64_t>{a});
  EXPECT_EQ(p.submit[0].batch.seqs[0].block_table.size(), 3u);
  EXPECT_EQ(rig.scheduler->waiting(), 1u);
  ASSERT_TRUE(rig.Run(p).ok());
  ASSERT_EQ(rig.done.count(a), 1u);  // a reached max_tokens 3
  // b returns with prompt + its 2 generated tokens to recompute; its first
  // block (tokens 4, 5) stayed in the prefix cache, so the recomputation
  // starts after it.
  p = rig.scheduler->Schedule(1);
  EXPECT_EQ(p.admitted, std::vector<int64_t>{b});
  ASSERT_EQ(p.submit.size(), 1u);
  const int32_t tb = static_cast<int32_t>(100 + b);
  EXPECT_EQ(p.submit[0].batch.token_ids, (std::vector<int32_t>{6, tb, tb}));
  EXPECT_EQ(p.submit[0].batch.seqs[0].start_pos, 2);
  EXPECT_EQ(rig.scheduler->stats().prefix_cache_hit_tokens, 2);
  EXPECT_EQ(p.submit[0].batch.seqs[0].prompt_len, 3);
  ASSERT_TRUE(rig.Run(p).ok());
  ASSERT_EQ(rig.done.count(b), 1u);
  EXPECT_EQ(rig.done[b].tokens, std::vector<int32_t>(3, tb));
  EXPECT_EQ(rig.done[b].preemptions, 1);
  EXPECT_EQ(rig.scheduler->stats().preemptions, 1);
  EXPECT_EQ(rig.allocator.num_free(), 4);
}

// RequeueRunning moves the running sequences back to the front of the
// queue in running order, ahead of requests that were waiting.
TEST(ScheduleApply, RequeueRunningKeepsOrderAheadOfTheQueue) {
  SchedulerOptions o;
  o.max_sequences = 2;
  Rig rig(64, 4, o);
  const int64_t a = rig.Add({1, 2}, 4);
  const int64_t b = rig.Add({3}, 4);
  const int64_t c = rig.Add({5}, 4);
  StepPlan p = rig.scheduler->Schedule(1);
  EXPECT_EQ(p.admitted, (std::vector<int64_t>{a, b}));
  ASSERT_TRUE(rig.Run(p).ok());
  EXPECT_EQ(rig.scheduler->RequeueRunning(), 2);
  EXPECT_EQ(rig.scheduler->running(), 0u);
  EXPECT_EQ(rig.scheduler->waiting(), 3u);
  EXPECT_EQ(rig.allocator.num_free(), 64);
  EXPECT_EQ(rig.scheduler->stats().requeued, 2);
  p = rig.scheduler->Schedule(1);
  EXPECT_EQ(p.admitted, (std::vector<int64_t>{a, b}));
  ASSERT_EQ(p.submit.size(), 1u);
  const int32_t ta = static_cast<int32_t>(100 + a), tb = static_cast<int32_t>(100 + b);
  EXPECT_EQ(p.submit[0].batch.token_ids, (std::vector<int32_t>{1, 2, ta, 3, tb}));
  ASSERT_TRUE(rig.Run(p).ok());
  rig.Drain();
  EXPECT_EQ(rig.done[a].tokens.size(), 4u);
  EXPECT_EQ(rig.done[a].preemptions, 1);
  EXPECT_EQ(rig.done[c].preemptions, 0);
}

// With several micro-batches in flight (a pipeline), the ready sequences are
// split over the free slots, and each plan collects the oldest micro-batch.
TEST(ScheduleApply, PipelineSlotsSplitReadySequences) {
  Rig rig(64);
  std::vector<int64_t> ids;
  for (int i = 0; i < 4; ++i) ids.push_back(rig.Add({static_cast<int32_t>(10 + i)}, 3));
  StepPlan p = rig.scheduler->Schedule(2);
  ASSERT_EQ(p.submit.size(), 2u);
  EXPECT_EQ(SeqIds(p.submit[0].batch), (std::vector<int64_t>{ids[0], ids[1]}));
  EXPECT_EQ(SeqIds(p.submit[1].batch), (std::vector<int64_t>{ids[2], ids[3]}));
  EXPECT_EQ(p.collect_rows, (std::vector<int64_t>{ids[0], ids[1]}));
  ASSERT_TRUE(rig.Run(p).ok());
  EXPECT_EQ(rig.scheduler->in_flight(), 1u);
  EXPECT_EQ(rig.scheduler->stats().max_in_flight, 2);
  // One slot is free: the collected pair decodes; the other pair is in flight.
  p = rig.scheduler->Schedule(2);
  ASSERT_EQ(p.submit.size(), 1u);
  EXPECT_EQ(SeqIds(p.submit[0].batch), (std::vector<int64_t>{ids[0], ids[1]}));
  EXPECT_EQ(p.submit[0].decode_tokens, 2);
  EXPECT_EQ(p.collect_rows, (std::vector<int64_t>{ids[2], ids[3]}));
  ASSERT_TRUE(rig.Run(p).ok());
  rig.Drain(2);
  ASSERT_EQ(rig.done.size(), 4u);
  EXPECT_EQ(rig.scheduler->in_flight(), 0u);
}

// A finished sequence's id rides on the next submitted micro-batch, so ranks
// drop its per-sequence state.
TEST(ScheduleApply, FinishedSequencesAreAnnouncedOnTheNextBatch) {
  Rig rig(64);
  const int64_t a = rig.Add({1}, 1);
  const int64_t b = rig.Add({2}, 3);
  StepPlan p = rig.scheduler->Schedule(1);
  EXPECT_TRUE(p.submit[0].batch.finished_seq_ids.empty());
  ASSERT_TRUE(rig.Run(p).ok());
  ASSERT_EQ(rig.done.count(a), 1u);
  p = rig.scheduler->Schedule(1);
  EXPECT_EQ(p.submit[0].batch.finished_seq_ids, std::vector<int64_t>{a});
  EXPECT_EQ(SeqIds(p.submit[0].batch), std::vector<int64_t>{b});
  ASSERT_TRUE(rig.Run(p).ok());
}

TEST(ScheduleApply, EosFinishesUnlessIgnored) {
  Rig rig(64);
  const int64_t a = rig.Add({1}, 5, /*ignore_eos=*/false);
  const int64_t b = rig.Add({1}, 2, /*ignore_eos=*/true);
  StepPlan p = rig.scheduler->Schedule(1);
  ASSERT_TRUE(rig.Run(p, /*token=*/2).ok());  // EOS for both
  ASSERT_EQ(rig.done.count(a), 1u);
  EXPECT_EQ(rig.done[a].finish_reason, FinishReason::kEos);
  EXPECT_EQ(rig.done[a].tokens, std::vector<int32_t>{2});
  EXPECT_EQ(rig.done.count(b), 0u);
  rig.Drain();
  EXPECT_EQ(rig.done[b].finish_reason, FinishReason::kLength);
}

// A submit error fails the failed micro-batch and everything in flight;
// sequences of later micro-batches of the plan stay runnable.
TEST(ScheduleApply, SubmitErrorFailsWhatRan) {
  Rig rig(64);
  std::vector<int64_t> ids;
  for (int i = 0; i < 3; ++i) ids.push_back(rig.Add({static_cast<int32_t>(10 + i)}, 3));
  StepPlan p = rig.scheduler->Schedule(3);
  ASSERT_EQ(p.submit.size(), 3u);
  StepOutcome out;
  out.submitted = 1;
  out.submit_error = Unavailable("worker w-1 lost");
  Status st = rig.scheduler->Apply(p, std::move(out));
  rig.scheduler->WaitForOutput();
  EXPECT_EQ(st.code(), StatusCode::kUnavailable);
  ASSERT_EQ(rig.done.size(), 2u);  // in flight (ids[0]) and the failed batch (ids[1])
  for (int64_t id : {ids[0], ids[1]}) {
    EXPECT_EQ(rig.done[id].finish_reason, FinishReason::kError);
    EXPECT_EQ(rig.done[id].error.message(), "worker w-1 lost");
  }
  EXPECT_EQ(rig.scheduler->in_flight(), 0u);
  rig.Drain();
  EXPECT_EQ(rig.done[ids[2]].finish_reason, FinishReason::kLength);
  EXPECT_EQ(rig.allocator.num_free(), 64);
}

// A collect error with requeue_on_executor_error re-queues every running
// sequence instead of failing it.
TEST(ScheduleApply, CollectErrorRequeuesWhenAsked) {
  SchedulerOptions o;
  o.requeue_on_executor_error = true;
  Rig rig(64, 4, o);
  const int64_t a = rig.Add({1, 2}, 3);
  const int64_t b = rig.Add({3}, 3);
  StepPlan p = rig.scheduler->Schedule(1);
  ASSERT_TRUE(rig.Run(p).ok());
  p = rig.scheduler->Schedule(1);
  StepOutcome out;
  out.submitted = p.submit.size();
  out.collected = Unavailable("missed heartbeats");
  EXPECT_EQ(rig.scheduler->Apply(p, std::move(out)).code(), StatusCode::kUnavailable);
  rig.scheduler->WaitForOutput();
  EXPECT_TRUE(rig.done.empty());
  EXPECT_EQ(rig.scheduler->running(), 0u);
  EXPECT_EQ(rig.scheduler->waiting(), 2u);
  EXPECT_EQ(rig.scheduler->stats().requeued, 2);
  rig.Drain();
  for (int64_t id : {a, b}) {
    EXPECT_EQ(rig.done[id].tokens.size(), 3u);
    EXPECT_EQ(rig.done[id].preemptions, 1);
  }
}

// A row error (say the sampler met non-finite logits for one sequence)
// finishes that sequence alone with kError.
TEST(ScheduleApply, RowErrorFinishesOneSequence) {
  Rig rig(64);
  const int64_t a = rig.Add({1}, 2);
  const int64_t b = rig.Add({2}, 2);
  StepPlan p = rig.scheduler->Schedule(1);
  ASSERT_EQ(p.collect_rows, (std::vector<int64_t>{a, b}));
  StepOutcome out;
  out.submitted = 1;
  SampledToken t;
  t.token_id = 7;
  out.collected = std::vector<SampledToken>{t, t};
  out.row_errors = {Status::Ok(), InvalidArgument("logits of sequence 1 are not finite")};
  ASSERT_TRUE(rig.scheduler->Apply(p, std::move(out)).ok());
  rig.scheduler->WaitForOutput();
  ASSERT_EQ(rig.done.count(b), 1u);
  EXPECT_EQ(rig.done[b].finish_reason, FinishReason::kError);
  EXPECT_EQ(rig.done[b].error.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(rig.scheduler->running(), 1u);
  rig.Drain();
  EXPECT_EQ(rig.done[a].finish_reason, FinishReason::kLength);
  EXPECT_EQ(rig.done[a].tokens.front(), 7);
  EXPECT_EQ(rig.allocator.num_free(), 64);
}

// Too few tokens for the rows is the executor's error: everything in flight fails.
TEST(ScheduleApply, WrongTokenCountFailsTheStep) {
  Rig rig(64);
  const int64_t a = rig.Add({1}, 2);
  rig.Add({2}, 2);
  StepPlan p = rig.scheduler->Schedule(1);
  StepOutcome out;
  out.submitted = 1;
  out.collected = std::vector<SampledToken>(1);
  Status st = rig.scheduler->Apply(p, std::move(out));
  rig.scheduler->WaitForOutput();
  EXPECT_EQ(st.code(), StatusCode::kInternal);
  EXPECT_EQ(rig.done.size(), 2u);
  EXPECT_EQ(rig.done[a].finish_reason, FinishReason::kError);
  EXPECT_EQ(rig.allocator.num_free(), 64);
}

// A request cancelled while its step is in flight drops that step's token.
TEST(ScheduleApply, CancelWhileInFlightDropsTheToken) {
  Rig rig(64);
  const int64_t a = rig.Add({1}, 4);
  StepPlan p = rig.scheduler->Schedule(1);
  rig.scheduler->Cancel(a);
  ASSERT_TRUE(rig.Run(p).ok());
  ASSERT_EQ(rig.done.count(a), 1u);
  EXPECT_EQ(rig.done[a].finish_reason, FinishReason::kCancelled);
  EXPECT_TRUE(rig.done[a].tokens.empty());
  EXPECT_EQ(rig.scheduler->running(), 0u);
}

}  // namespace
}  // namespace tessera

namespace tessera {
namespace {

// Longrope (Phi-3): a sequence that outgrows original_max_position_embeddings
// is recomputed from an empty cache, with prompt_len = the recomputed length
// (what makes the workers take the long factors), once; a prompt longer
// than the pre-training context is never recomputed; other RoPE types never.
TEST(ScheduleApply, LongropeRecomputesASequenceOnceWhenItOutgrowsThePretrainingContext) {
  for (bool longrope : {true, false}) {
    SCOPED_TRACE(longrope ? "longrope" : "default rope");
    Rig rig(16);
    if (longrope) {
      rig.config.rope_scaling.type = RopeType::kLongRope;
      rig.config.rope_scaling.original_max_position_embeddings = 6;
    }
    rig.scheduler = std::make_unique<Scheduler>(rig.config, nullptr, &rig.allocator, 4, nullptr,
                                                SchedulerOptions{});
    const int64_t a = rig.Add({1, 2, 3, 4}, 6);
    std::vector<std::tuple<int32_t, int32_t, int32_t>> steps;  // start_pos, num_tokens, prompt_len
    for (int i = 0; i < 20 && (rig.scheduler->running() || rig.scheduler->waiting()); ++i) {
      StepPlan p = rig.scheduler->Schedule(1);
      for (const auto& b : p.submit)
        for (const SeqStep& s : b.batch.seqs)
          steps.emplace_back(s.start_pos, s.num_tokens, s.prompt_len);
      ASSERT_TRUE(rig.Run(p).ok());
    }
    using T = std::tuple<int32_t, int32_t, int32_t>;
    if (longrope) {
      // Prefill 4, decode at 4 and 5; at length 7 > 6 the whole sequence again.
      EXPECT_EQ(steps,
                (std::vector<T>{{0, 4, 4}, {4, 1, 4}, {5, 1, 4}, {0, 7, 7}, {7, 1, 7}, {8, 1, 7}}));
      EXPECT_EQ(rig.scheduler->stats().longrope_recomputes, 1);
    } else {
      EXPECT_EQ(steps,
                (std::vector<T>{{0, 4, 4}, {4, 1, 4}, {5, 1, 4}, {6, 1, 4}, {7, 1, 4}, {8, 1, 4}}));
    }
    EXPECT_EQ(rig.done[a].tokens, std::vector<int32_t>(6, static_cast<int32_t>(100 + a)));
  }
  Rig rig(16);
  rig.config.rope_scaling.type = RopeType::kLongRope;
  rig.config.rope_scaling.original_max_position_embeddings = 6;
  rig.scheduler = std::make_unique<Scheduler>(rig.config, nullptr, &rig.allocator, 4, nullptr,
                                              SchedulerOptions{});
  rig.Add({1, 2, 3, 4, 5, 6, 7, 8}, 4);  // longer than 6 from the start
  rig.Drain();
  EXPECT_EQ(rig.scheduler->stats().longrope_recomputes, 0);
}

}  // namespace
}  // namespace tessera
