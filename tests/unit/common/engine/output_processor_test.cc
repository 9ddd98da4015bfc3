// The output processor: per-request incremental detokenizing and stop
// strings (RequestOutput), and the thread that runs them and the callbacks
// (OutputProcessor). Tokens come from the byte-level GPT-2 fixture
// tokenizer, where a rare character spans several tokens.
#include "common/engine/output_processor.h"

#include <gtest/gtest.h>

#include <thread>

#include "common/base/utf8.h"
#include "support/test_util.h"

namespace tessera {
namespace {

std::unique_ptr<Tokenizer> Gpt2() {
  auto tok = Tokenizer::Load(::tessera::testing::FixturePath("tokenizers/bytelevel_gpt2"));
  TESSERA_CHECK(tok.ok());
  return std::move(*tok);
}

SampledToken Tok(int32_t id) {
  SampledToken t;
  t.token_id = id;
  return t;
}

struct Streamed {
  std::vector<std::string> deltas;  // one per Push (and the Finish rest)
  std::string text;                 // their concatenation
  size_t stopped_at = 0;            // 1 + index of the token that hit a stop
};

// Pushes `ids` until a stop string is hit, then finishes (kStop, or
// `reason` when none was hit).
Streamed Stream(RequestOutput& out, const std::vector<int32_t>& ids,
                FinishReason reason = FinishReason::kLength) {
  Streamed s;
  for (size_t i = 0; i < ids.size(); ++i) {
    s.deltas.push_back(out.Push(Tok(ids[i]), false));
    if (out.stopped()) {
      s.stopped_at = i + 1;
      break;
    }
  }
  s.deltas.push_back(out.Finish(s.stopped_at ? FinishReason::kStop : reason, Status::Ok(), 0));
  for (const std::string& d : s.deltas) s.text += d;
  return s;
}

// The index of the token whose text completes byte `end` of the decoding.
size_t TokensToCover(const Tokenizer& tok, const std::vector<int32_t>& ids, size_t end) {
  for (size_t n = 1; n <= ids.size(); ++n)
    if (tok.Decode(ids.data(), n, true).size() >= end) return n;
  return ids.size();
}

// A character split over several byte tokens never comes out in halves.
TEST(RequestOutput, Utf8SplitAcrossTokensIsHeldBack) {
  auto tok = Gpt2();
  // U+1F980 (crab), 4 bytes. The fixture adds a prefix space.
  const std::vector<int32_t> ids = tok->Encode("a\xF0\x9F\xA6\x80 b", false);
  const std::string text = tok->Decode(ids, true);
  ASSERT_NE(text.find("a\xF0\x9F\xA6\x80 b"), std::string::npos);
  const std::vector<int32_t> crab = tok->Encode("\xF0\x9F\xA6\x80", false);
  ASSERT_GE(crab.size(), 2u) << "the fixture must split the character";
  RequestOutput out(tok.get(), {}, false, 3);
  Streamed s = Stream(out, ids);
  EXPECT_EQ(s.text, text);
  EXPECT_EQ(out.result().text, text);
  for (const std::string& d : s.deltas) EXPECT_TRUE(IsValidUtf8(d)) << "delta '" << d << "'";
  // Some push returned nothing while the character was incomplete.
  EXPECT_NE(std::find(s.deltas.begin(), s.deltas.end(), ""), s.deltas.end());
  EXPECT_EQ(out.result().tokens, ids);
  EXPECT_EQ(out.result().prompt_tokens, 3);
  EXPECT_EQ(out.result().finish_reason, FinishReason::kLength);
}

// A stop string spread over two tokens: the text before it comes out, held
// back while it might be a stop string, and nothing of the stop string.
TEST(RequestOutput, StopStringAcrossTokens) {
  auto tok = Gpt2();
  const std::vector<int32_t> ids = tok->Encode("Hello world, this is a test", false);
  const std::string full = tok->Decode(ids, true);
  // A stop string across the boundary between the second and third tokens.
  const size_t boundary = tok->Decode(ids.data(), 2, true).size();
  ASSERT_GE(boundary, 2u);
  const std::string stop = full.substr(boundary - 2, 4);
  const std::string want = full.substr(0, full.find(stop));
  RequestOutput out(tok.get(), {stop}, false, 0);
  Streamed s = Stream(out, ids);
  EXPECT_EQ(s.text, want) << "stop '" << stop << "'";
  EXPECT_EQ(out.result().text, want);
  EXPECT_EQ(out.result().finish_reason, FinishReason::kStop);
  const size_t hit = TokensToCover(*tok, ids, full.find(stop) + stop.size());
  EXPECT_GT(hit, 2u);
  EXPECT_EQ(s.stopped_at, hit);
  // Tokens up to and including the one that completed the stop string.
  EXPECT_EQ(out.result().tokens, std::vector<int32_t>(ids.begin(), ids.begin() + hit));
  // What came out at every step is text before the stop string.
  std::string so_far;
  for (const std::string& d : s.deltas) {
    so_far += d;
    EXPECT_EQ(want.compare(0, so_far.size(), so_far), 0) << so_far;
  }
}

TEST(RequestOutput, StopAtTheStart) {
  auto tok = Gpt2();
  const std::vector<int32_t> ids = tok->Encode("Hello world", false);
  const std::string full = tok->Decode(ids, true);
  RequestOutput out(tok.get(), {full.substr(0, 3)}, false, 0);
  Streamed s = Stream(out, ids);
  const size_t hit = TokensToCover(*tok, ids, 3);
  EXPECT_EQ(s.stopped_at, hit);
  EXPECT_EQ(s.text, "");
  for (const std::string& d : s.deltas) EXPECT_EQ(d, "");
  EXPECT_EQ(out.result().text, "");
  EXPECT_EQ(out.result().tokens, std::vector<int32_t>(ids.begin(), ids.begin() + hit));
  EXPECT_EQ(out.result().finish_reason, FinishReason::kStop);
}

// Several stop strings: the earliest in the text wins, and a suffix that
// may still become any of them is held back.
TEST(RequestOutput, MultipleStopsEarliestWins) {
  auto tok = Gpt2();
  const std::vector<int32_t> ids = tok->Encode("Hello world, this is a test", false);
  const std::string full = tok->Decode(ids, true);
  const std::string want = full.substr(0, full.find(", t"));
  ASSERT_NE(want.find("Hello world"), std::string::npos);
  RequestOutput out(tok.get(), {"never", "is", ", t"}, false, 0);
  Streamed s = Stream(out, ids);
  EXPECT_EQ(s.text, want);
  EXPECT_EQ(out.result().text, want);
  EXPECT_EQ(s.stopped_at, TokensToCover(*tok, ids, full.find(", t") + 3));
  // "," was held back (it starts ", t") until the stop string completed.
  for (const std::string& d : s.deltas) EXPECT_EQ(d.find(','), std::string::npos) << d;
}

// A stop-string prefix held back is released when the request ends any
// other way (here: cancelled).
TEST(RequestOutput, HeldBackPrefixIsReleasedAtTheFinish) {
  auto tok = Gpt2();
  const std::vector<int32_t> ids = tok->Encode("Hello", false);
  RequestOutput out(tok.get(), {"lo wor"}, false, 0);
  std::string text;
  for (int32_t id : ids) text += out.Push(Tok(id), false);
  const std::string full = tok->Decode(ids, true);  // with the prefix space
  EXPECT_EQ(text, full.substr(0, full.size() - 2));
  EXPECT_EQ(out.Finish(FinishReason::kCancelled, Status::Ok(), 2), "lo");
  EXPECT_EQ(out.result().text, full);
  EXPECT_EQ(out.result().preemptions, 2);
}

// EOS adds a token (and its logprobs) but no text.
TEST(RequestOutput, EosAddsNoTextAndLogprobsFollowTokens) {
  auto tok = Gpt2();
  const std::vector<int32_t> ids = tok->Encode("Hi", false);
  RequestOutput out(tok.get(), {}, /*want_logprobs=*/true, 0);
  std::string text;
  for (int32_t id : ids) {
    SampledToken t = Tok(id);
    t.has_logprobs = true;
    t.logprob = -0.5f;
    text += out.Push(t, false);
  }
  EXPECT_EQ(out.Push(Tok(0), /*eos=*/true), "");
  text += out.Finish(FinishReason::kEos, Status::Ok(), 0);
  EXPECT_EQ(text, tok->Decode(ids, true));
  ASSERT_EQ(out.result().logprobs.size(), ids.size() + 1);
  EXPECT_EQ(out.result().logprobs.back().token_id, 0);
  EXPECT_EQ(out.result().tokens.back(), 0);
}

// The processor thread: every callback of a request in order (on_admit,
// on_token per token, on_finish last), on its own thread.
TEST(OutputProcessor, CallbacksRunInOrderOnItsThread) {
  auto tok = Gpt2();
  const std::vector<int32_t> ids = tok->Encode("Hello world", false);
  OutputProcessor p(tok.get());
  std::vector<std::string> calls;
  std::thread::id where;
  GenerationResult result;
  RequestCallbacks cb;
  cb.on_admit = [&] { calls.push_back("admit"); };
  cb.on_token = [&](const std::string& text, int32_t token, const SampledToken* lp) {
    where = std::this_thread::get_id();
    EXPECT_NE(lp, nullptr);
    calls.push_back(std::to_string(token) + ":" + text);
  };
  cb.on_finish = [&](const GenerationResult& r) {
    calls.push_back("finish");
    result = r;
  };
  p.Register(7, std::move(cb), {}, /*want_logprobs=*/true, 2);
  p.Admitted(7);
  for (int32_t id : ids) p.Token(7, Tok(id), false, 0);
  p.Finish(7, FinishReason::kLength, Status::Ok(), 1);
  EXPECT_EQ(p.posted(), 3 + ids.size());
  p.WaitProcessed(p.posted());
  EXPECT_EQ(p.pending_finishes(), 0u);
  EXPECT_NE(where, std::this_thread::get_id());
  ASSERT_EQ(calls.size(), ids.size() + 2);
  EXPECT_EQ(calls.front(), "admit");
  EXPECT_EQ(calls.back(), "finish");
  EXPECT_EQ(calls[1], std::to_string(ids[0]) + ":" + tok->Decode(ids.data(), 1, true));
  EXPECT_EQ(result.text, tok->Decode(ids, true));
  EXPECT_EQ(result.tokens, ids);
  EXPECT_EQ(result.preemptions, 1);
  EXPECT_EQ(result.prompt_tokens, 2);
  EXPECT_TRUE(p.TakeStops(p.posted()).empty());
}

// A stop string finishes the request on the processor thread and is
// reported with the serial of the token that hit it; tokens and the
// scheduler's own Finish that come after it are dropped.
TEST(OutputProcessor, StopIsReportedWithItsTokenAndLaterTokensAreDropped) {
  auto tok = Gpt2();
  const std::vector<int32_t> ids = tok->Encode("Hello world, this is", false);
  OutputProcessor p(tok.get());
  int finishes = 0;
  std::string text;
  std::vector<int32_t> streamed;
  GenerationResult result;
  RequestCallbacks cb;
  cb.on_token = [&](const std::string& t, int32_t token, const SampledToken*) {
    EXPECT_EQ(finishes, 0);
    text += t;
    if (token >= 0) streamed.push_back(token);
  };
  cb.on_finish = [&](const GenerationResult& r) {
    ++finishes;
    result = r;
  };
  p.Register(1, std::move(cb), {" world"}, false, 0);
  std::vector<uint64_t> serials;
  for (int32_t id : ids) serials.push_back(p.Token(1, Tok(id), false, 0));
  p.Finish(1, FinishReason::kCancelled, Status::Ok(), 0);
  p.WaitProcessed(p.posted());
  EXPECT_EQ(finishes, 1);
  EXPECT_EQ(result.finish_reason, FinishReason::kStop);
  const std::string full = tok->Decode(ids, true);
  const size_t at = full.find(" world");
  EXPECT_EQ(result.text, full.substr(0, at));
  EXPECT_EQ(text, full.substr(0, at));
  const size_t hit = TokensToCover(*tok, ids, at + 6);
  ASSERT_LT(hit, ids.size());
  ASSERT_GE(hit, 2u);
  const std::vector<int32_t> kept(ids.begin(), ids.begin() + hit);
  EXPECT_EQ(result.tokens, kept);
  EXPECT_EQ(streamed, kept);
  EXPECT_TRUE(p.TakeStops(serials[hit - 2]).empty());
  EXPECT_EQ(p.TakeStops(serials[hit - 1]), std::vector<int64_t>{1});
  EXPECT_TRUE(p.TakeStops(p.posted()).empty());  // taken once
  EXPECT_EQ(p.pending_finishes(), 0u);
}

// The destructor processes what was posted before it joins.
TEST(OutputProcessor, DestructorRunsEveryPostedEvent) {
  bool finished = false;
  {
    OutputProcessor p(nullptr);
    RequestCallbacks cb;
    cb.on_finish = [&](const GenerationResult& r) {
      finished = r.finish_reason == FinishReason::kCancelled;
    };
    p.Register(3, std::move(cb), {}, false, 1);
    p.Finish(3, FinishReason::kCancelled, Status::Ok(), 0);
  }
  EXPECT_TRUE(finished);
}

}  // namespace
}  // namespace tessera
