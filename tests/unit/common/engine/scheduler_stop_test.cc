// Stop strings through a Scheduler and its output thread, with the test
// playing the executor: each sequence "samples" the next token of a script
// (the GPT-2 fixture tokenizer's encoding of a sentence). A stop string ends
// the sequence one iteration after its token, the tokens generated
// meanwhile never reach the result or a callback, and two identical
// schedulers make identical plans whatever their output threads' timing.
#include <gtest/gtest.h>

#include <map>

#include "common/engine/scheduler.h"
#include "support/test_util.h"

namespace tessera {
namespace {

const char kText[] = "Hello world, this is a test of stop strings";

struct Rig {
  explicit Rig(const Tokenizer* tok) : tokenizer(tok), allocator(64) {
    config.vocab_size = 1000;
    scheduler =
        std::make_unique<Scheduler>(config, nullptr, &allocator, 4, tok, SchedulerOptions{});
    script = tok->Encode(kText, false);
  }
  int64_t Add(std::vector<std::string> stop, int max_tokens) {
    GenerationRequest g;
    g.prompt_ids = {5, 6, 7};
    g.max_tokens = max_tokens;
    g.stop = std::move(stop);
    g.ignore_eos = true;
    auto slot = std::make_shared<int64_t>(-1);
    RequestCallbacks cb;
    cb.on_token = [this, slot](const std::string& text, int32_t token, const SampledToken*) {
      std::lock_guard<std::mutex> lock(mu);
      EXPECT_EQ(finished.count(*slot), 0u) << "on_token after on_finish";
      streamed_text[*slot] += text;
      if (token >= 0) streamed_tokens[*slot].push_back(token);
    };
    cb.on_finish = [this, slot](const GenerationResult& r) {
      std::lock_guard<std::mutex> lock(mu);
      EXPECT_EQ(finished.count(*slot), 0u) << "on_finish twice";
      finished[*slot] = r;
    };
    auto id = scheduler->Enqueue(std::move(g), std::move(cb));
    EXPECT_TRUE(id.ok()) << id.status().ToString();
    *slot = *id;
    return *id;
  }
  // One iteration; every collected row gets its sequence's next script token.
  StepPlan Step() {
    StepPlan p = scheduler->Schedule(1);
    StepOutcome out;
    out.submitted = p.submit.size();
    std::vector<SampledToken> t;
    for (int64_t id : p.collect_rows) {
      SampledToken s;
      s.token_id = script[next[id]++ % script.size()];
      t.push_back(s);
    }
    out.collected = t;
    EXPECT_TRUE(scheduler->Apply(p, std::move(out)).ok());
    return p;
  }

  const Tokenizer* tokenizer;
  ModelConfig config;
  BlockAllocator allocator;
  std::unique_ptr<Scheduler> scheduler;
  std::vector<int32_t> script;
  std::map<int64_t, size_t> next;  // script position per sequence (owner thread)
  std::mutex mu;
  std::map<int64_t, GenerationResult> finished;             // guarded by mu
  std::map<int64_t, std::string> streamed_text;             // guarded by mu
  std::map<int64_t, std::vector<int32_t>> streamed_tokens;  // guarded by mu
};

std::unique_ptr<Tokenizer> Gpt2() {
  auto tok = Tokenizer::Load(::tessera::testing::FixturePath("tokenizers/bytelevel_gpt2"));
  TESSERA_CHECK(tok.ok());
  return std::move(*tok);
}

// Prefix length (in tokens) of `ids` whose text covers `bytes` bytes.
size_t TokensToCover(const Tokenizer& tok, const std::vector<int32_t>& ids, size_t bytes) {
  for (size_t n = 1; n <= ids.size(); ++n)
    if (tok.Decode(ids.data(), n, true).size() >= bytes) return n;
  return ids.size();
}

TEST(SchedulerStop, StopStringEndsTheSequenceAndDropsLaterTokens) {
  auto tok = Gpt2();
  Rig rig(tok.get());
  const std::string full = tok->Decode(rig.script, true);  // with the prefix space
  const int64_t a = rig.Add({" this"}, 40);
  const int64_t b = rig.Add({}, 6);  // no stop string: runs to max_tokens
  const size_t hit = TokensToCover(*tok, rig.script, full.find(" this") + 5);
  // Step until the stop token was applied, then count the iterations until
  // the scheduler lets the sequence go.
  int steps = 0;
  while (rig.next[a] < hit && steps < 100) {
    rig.Step();
    ++steps;
  }
  ASSERT_EQ(rig.next[a], hit);
  int extra = 0;
  while (rig.scheduler->running() > 0 && extra < 100) {
    const StepPlan p = rig.Step();
    bool a_ran = false;
    for (const PlannedBatch& pb : p.submit)
      for (const SeqStep& s : pb.batch.seqs) a_ran |= s.seq_id == a;
    if (a_ran) ++extra;
  }
  // The stop token's output is taken at the second Schedule after its Apply
  // (whatever the output thread's timing): exactly one more step ran for a.
  EXPECT_EQ(extra, 1);
  rig.scheduler->WaitForOutput();
  std::lock_guard<std::mutex> lock(rig.mu);
  ASSERT_EQ(rig.finished.count(a), 1u);
  const GenerationResult& r = rig.finished[a];
  EXPECT_EQ(r.finish_reason, FinishReason::kStop);
  EXPECT_EQ(r.text, full.substr(0, full.find(" this")));
  EXPECT_EQ(rig.streamed_text[a], r.text);
  const std::vector<int32_t> kept(rig.script.begin(), rig.script.begin() + hit);
  EXPECT_EQ(r.tokens, kept);  // the stop string's token included, nothing after
  EXPECT_EQ(rig.streamed_tokens[a], kept);
  ASSERT_EQ(rig.finished.count(b), 1u);
  EXPECT_EQ(rig.finished[b].finish_reason, FinishReason::kLength);
  EXPECT_EQ(rig.finished[b].tokens.size(), 6u);
  EXPECT_EQ(rig.allocator.num_free(), 64);
}

// The stage-0 tp ranks of a pipeline run identical schedulers that must
// agree on every plan: stop strings taken from their output threads must not
// depend on timing.
TEST(SchedulerStop, IdenticalSchedulersMakeIdenticalPlans) {
  auto tok = Gpt2();
  for (int round = 0; round < 5; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    Rig x(tok.get()), y(tok.get());
    for (Rig* r : {&x, &y}) {
      r->Add({" this"}, 30);
      r->Add({"is a"}, 30);
      r->Add({","}, 30);
      r->Add({"strings"}, 4);
    }
    for (int step = 0; step < 200 && (x.scheduler->running() || x.scheduler->waiting() ||
                                      y.scheduler->running() || y.scheduler->waiting());
         ++step) {
      const StepPlan px = x.Step();
      const StepPlan py = y.Step();
      ASSERT_EQ(px.submit.size(), py.submit.size()) << "step " << step;
      for (size_t k = 0; k < px.submit.size(); ++k) {
        const StepBatch& bx = px.submit[k].batch;
        const StepBatch& by = py.submit[k].batch;
        EXPECT_EQ(bx.token_ids, by.token_ids) << "step " << step;
        EXPECT_EQ(bx.finished_seq_ids, by.finished_seq_ids) << "step " << step;
        ASSERT_EQ(bx.seqs.size(), by.seqs.size()) << "step " << step;
        for (size_t i = 0; i < bx.seqs.size(); ++i) {
          EXPECT_EQ(bx.seqs[i].seq_id, by.seqs[i].seq_id);
          EXPECT_EQ(bx.seqs[i].start_pos, by.seqs[i].start_pos);
        }
      }
    }
    x.scheduler->WaitForOutput();
    y.scheduler->WaitForOutput();
    EXPECT_EQ(x.scheduler->running(), 0u);
    std::lock_guard<std::mutex> lx(x.mu), ly(y.mu);
    ASSERT_EQ(x.finished.size(), 4u);
    for (auto& [id, r] : x.finished) {
      EXPECT_EQ(r.tokens, y.finished[id].tokens) << "request " << id;
      EXPECT_EQ(r.text, y.finished[id].text) << "request " << id;
    }
    EXPECT_EQ(x.finished[3].finish_reason, FinishReason::kLength);
    EXPECT_EQ(x.finished[2].text, " Hello world");  // the fixture adds a prefix space
  }
}

}  // namespace
}  // namespace tessera
