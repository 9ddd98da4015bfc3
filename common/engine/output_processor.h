// OutputProcessor: turns the token ids a Scheduler generates into what its
// requests' callbacks see, on a thread of its own: per request an
// incremental detokenizer and stop-string matching, producing the text
// deltas (on_token), the final GenerationResult (on_finish) and, when a stop
// string is hit, the finish decision, which goes back to the scheduler.
//
// RequestOutput is the per-request state machine, synchronous and usable
// alone. OutputProcessor runs one RequestOutput per request on its thread:
// the scheduler thread posts events (Register, Admitted, Token, Finish), which
// are processed in posting order, so every request sees on_admit, then its
// on_token calls in token order, then on_finish once, last; no callback of
// a request runs after its on_finish.
//
// Stop strings: when a token completes a stop string the request finishes
// there (FinishReason::kStop: text cut before the stop string, tokens up to
// and including that token) and its id is reported back (TakeStops); the
// scheduler then ends the sequence like a cancellation. Tokens the scheduler
// generated for it before it learned of the stop, and its own Finish event,
// are dropped: they never reach the callbacks or the result.
//
// Determinism: every event gets a serial number (1, 2, ...) and a stop is
// reported with the serial of the Token event that hit it, so a scheduler
// that takes the stops up to a serial it chose (after WaitProcessed of that
// serial) sees the same stops whatever the thread timing: identical
// schedulers (the stage-0 tp ranks of a pipeline) make identical decisions.
//
// Sharing: several schedulers may post to one processor (the coordinator's
// replicas, so that a request can move between them and keep its output
// state); ids then come from NextId and each scheduler takes only its own
// stops (TakeStops' filter).
//
// Thread-safety: the posting methods, NextId, posted(), WaitProcessed,
// TakeStops and pending_finishes() are thread-safe (each scheduler thread
// posts its own requests' events);
// callbacks run on the processor's thread. The destructor processes every
// event already posted, then joins the thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/base/sampled_token.h"
#include "common/base/status.h"
#include "common/engine/generation.h"
#include "common/tokenizer/tokenizer.h"

namespace tessera {

// One request's output: detokenizer, stop strings, result under construction.
class RequestOutput {
 public:
  // `tokenizer` may be null (no text; `stop` must then be empty).
  // `want_logprobs`: SamplingParams::logprobs >= 0 (result.logprobs is kept).
  RequestOutput(const Tokenizer* tokenizer, std::vector<std::string> stop, bool want_logprobs,
                int64_t prompt_tokens);

  // Appends a generated token (to result().tokens, and its SampledToken to
  // result().logprobs when wanted), decodes it unless `eos` (an EOS token
  // adds no text) and matches the stop strings. Returns the text that became
  // final: never half a UTF-8 character (the decoder holds partial ones
  // back), never part of a stop string (a suffix that may still grow into
  // one is held back). After a stop-string hit stopped() is true and the
  // text is cut before the stop string; call Finish(kStop, ...).
  std::string Push(const SampledToken& token, bool eos);
  // Ends the request: for kLength and kEos the decoder's held-back text is
  // flushed; text held back for a possible stop string is released. Returns
  // the text not returned before (possibly ""). Call once.
  std::string Finish(FinishReason reason, Status error, int preemptions);

  bool stopped() const { return stopped_; }
  bool want_logprobs() const { return want_logprobs_; }
  void set_cached_tokens(int64_t n) { result_.cached_tokens = n; }
  void set_prompt_logprobs(std::vector<SampledToken> p) { result_.prompt_logprobs = std::move(p); }
  const GenerationResult& result() const { return result_; }

 private:
  std::unique_ptr<IncrementalDecoder> decoder_;
  std::vector<std::string> stop_;
  bool want_logprobs_;
  GenerationResult result_;
  size_t emitted_ = 0;  // bytes of result_.text returned so far
  bool stopped_ = false;
};

class OutputProcessor {
 public:
  // `tokenizer` may be null (no text). `on_batch` (optional) runs on the
  // processor's thread after the callbacks of each batch of events it takes
  // from its queue (every event posted when it last looked; a scheduler
  // posts a step's events at once, so a step's tokens end one batch or
  // more): for a consumer that forwards what the callbacks produced in
  // batches (worker/daemon/replica_leader.h sends a step's tokens as soon as
  // they are text, not with the next step). It must not post to this
  // processor or wait on it. Starts the thread.
  explicit OutputProcessor(const Tokenizer* tokenizer, std::function<void()> on_batch = {});
  ~OutputProcessor();
  OutputProcessor(const OutputProcessor&) = delete;
  OutputProcessor& operator=(const OutputProcessor&) = delete;

  // Posting (each returns the event's serial). Register comes first for a
  // request id and once; Finish last and once (the entry is then dropped).
  uint64_t Register(int64_t id, RequestCallbacks callbacks, std::vector<std::string> stop,
                    bool want_logprobs, int64_t prompt_tokens);
  // Runs on_admit. `cached_tokens`: prompt tokens of this admission found in
  // the prefix cache (the result's cached_tokens; the latest admission's).
  uint64_t Admitted(int64_t id, int64_t cached_tokens = 0);
  // A generated token; `eos`: it ends the request (no text). `preemptions`:
  // the sequence's count so far (for a stop-string finish's result).
  uint64_t Token(int64_t id, SampledToken token, bool eos, int preemptions);
  // Tokens the request generated before, elsewhere (GenerationRequest::
  // resume_tokens): they go through its detokenizer and stop-string state,
  // and into its result, without reaching a callback (their text was
  // delivered where they were generated).
  uint64_t Replay(int64_t id, std::vector<int32_t> tokens);
  // The prompt's log-probabilities (GenerationResult::prompt_logprobs).
  uint64_t PromptLogprobs(int64_t id, std::vector<SampledToken> prompt);
  uint64_t Finish(int64_t id, FinishReason reason, Status error, int preemptions);

  // A fresh request id (0, 1, ...): the schedulers that share this
  // processor (coordinator replicas) draw their ids here, so an id names one
  // request across all of them.
  int64_t NextId() { return next_id_.fetch_add(1); }

  uint64_t posted() const;  // serial of the latest event posted (0: none)
  // Blocks until every event up to `serial` has been processed (its
  // callbacks returned). Only this caller is woken for it.
  void WaitProcessed(uint64_t serial);
  // Removes and returns the ids whose stop string was hit by a Token event
  // with serial <= `serial`, in hit order. With `mine` set, only the ids it
  // accepts (the caller's requests when several schedulers share the
  // processor); the others stay for their scheduler. `mine` runs under the
  // processor's lock: it must not call the processor.
  std::vector<int64_t> TakeStops(uint64_t serial,
                                 const std::function<bool(int64_t)>& mine = nullptr);
  // Finish events posted whose callbacks have not returned yet.
  size_t pending_finishes() const { return pending_finishes_.load(); }

 private:
  enum class Kind { kRegister, kAdmitted, kToken, kReplay, kPromptLogprobs, kFinish };
  struct Event {
    Kind kind = Kind::kToken;
    uint64_t serial = 0;
    int64_t id = 0;
    RequestCallbacks callbacks;                   // kRegister
    std::vector<std::string> stop;                // kRegister
    bool want_logprobs = false;                   // kRegister
    int64_t prompt_tokens = 0;                    // kRegister
    int64_t cached_tokens = 0;                    // kAdmitted
    SampledToken token;                           // kToken
    std::vector<SampledToken> prompt;             // kPromptLogprobs
    std::vector<int32_t> replay;                  // kReplay
    bool eos = false;                             // kToken
    FinishReason reason = FinishReason::kLength;  // kFinish
    Status error;                                 // kFinish
    int preemptions = 0;                          // kToken, kFinish
  };
  struct Entry {
    RequestCallbacks callbacks;
    std::unique_ptr<RequestOutput> out;
    bool done = false;  // on_finish ran (a stop string): later events are dropped
  };

  uint64_t Post(Event e);
  void Loop();
  void Process(Event& e);
  // Releases `text` (with `token`, -1 for none) through on_token.
  static void Emit(Entry& entry, const std::string& text, const SampledToken* token);

  const Tokenizer* tokenizer_;
  const std::function<void()> on_batch_;
  mutable std::mutex mu_;
  std::condition_variable work_cv_;  // events queued, or stopping
  // A thread in WaitProcessed: woken alone when processed_ reaches its
  // serial (many schedulers share the processor: a fleet's replicas must
  // not all wake for every event).
  struct Waiter {
    std::condition_variable cv;
    bool done = false;  // protected by mu_
  };
  std::multimap<uint64_t, Waiter*> waiters_;         // protected by mu_: by the serial awaited
  std::deque<Event> queue_;                          // protected by mu_
  uint64_t posted_ = 0;                              // protected by mu_
  uint64_t processed_ = 0;                           // protected by mu_
  bool stopping_ = false;                            // protected by mu_
  std::vector<std::pair<uint64_t, int64_t>> stops_;  // protected by mu_: (serial, id)
  std::atomic<size_t> pending_finishes_{0};
  std::atomic<int64_t> next_id_{0};
  std::unordered_map<int64_t, Entry> entries_;  // processor thread only
  std::thread thread_;
};

}  // namespace tessera
