#include "common/engine/output_processor.h"

#include <algorithm>

namespace tessera {

namespace {

// Length of the longest suffix of `text` that is a proper prefix of a stop
// string: those bytes may still become a stop string and are held back.
size_t StopHoldback(const std::string& text, const std::vector<std::string>& stops) {
  size_t hold = 0;
  for (const std::string& s : stops) {
    for (size_t n = std::min(s.size() - 1, text.size()); n > hold; --n) {
      if (text.compare(text.size() - n, n, s, 0, n) == 0) {
        hold = n;
        break;
      }
    }
  }
  return hold;
}

}  // namespace

RequestOutput::RequestOutput(const Tokenizer* tokenizer, std::vector<std::string> stop,
                             bool want_logprobs, int64_t prompt_tokens)
    : stop_(std::move(stop)), want_logprobs_(want_logprobs) {
  TESSERA_CHECK(tokenizer != nullptr || stop_.empty());
  if (tokenizer) decoder_ = std::make_unique<IncrementalDecoder>(*tokenizer, true);
  result_.prompt_tokens = prompt_tokens;
}

std::string RequestOutput::Push(const SampledToken& token, bool eos) {
  TESSERA_CHECK(!stopped_);
  result_.tokens.push_back(token.token_id);
  if (want_logprobs_) result_.logprobs.push_back(token);
  if (!eos && decoder_) result_.text += decoder_->Push(token.token_id);
  size_t cut = std::string::npos;
  for (const std::string& s : stop_) cut = std::min(cut, result_.text.find(s));
  if (cut != std::string::npos) {
    result_.text.resize(cut);
    stopped_ = true;
  }
  const size_t ready = result_.text.size() - StopHoldback(result_.text, stop_);
  if (ready <= emitted_) return "";
  std::string delta = result_.text.substr(emitted_, ready - emitted_);
  emitted_ = ready;
  return delta;
}

std::string RequestOutput::Finish(FinishReason reason, Status error, int preemptions) {
  result_.finish_reason = reason;
  result_.error = std::move(error);
  result_.preemptions = preemptions;
  if ((reason == FinishReason::kLength || reason == FinishReason::kEos) && decoder_)
    result_.text += decoder_->Flush();
  if (result_.text.size() <= emitted_) return "";
  std::string rest = result_.text.substr(emitted_);
  emitted_ = result_.text.size();
  return rest;
}

OutputProcessor::OutputProcessor(const Tokenizer* tokenizer, std::function<void()> on_batch)
    : tokenizer_(tokenizer), on_batch_(std::move(on_batch)) {
  thread_ = std::thread([this] { Loop(); });
}

OutputProcessor::~OutputProcessor() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  work_cv_.notify_all();
  thread_.join();
}

uint64_t OutputProcessor::Post(Event e) {
  uint64_t serial;
  {
    std::lock_guard<std::mutex> lock(mu_);
    serial = ++posted_;
    e.serial = serial;
    if (e.kind == Kind::kFinish) pending_finishes_.fetch_add(1);
    queue_.push_back(std::move(e));
  }
  work_cv_.notify_one();
  return serial;
}

uint64_t OutputProcessor::Register(int64_t id, RequestCallbacks callbacks,
                                   std::vector<std::string> stop, bool want_logprobs,
                                   int64_t prompt_tokens) {
  Event e;
  e.kind = Kind::kRegister;
  e.id = id;
  e.callbacks = std::move(callbacks);
  e.stop = std::move(stop);
  e.want_logprobs = want_logprobs;
  e.prompt_tokens = prompt_tokens;
  return Post(std::move(e));
}

uint64_t OutputProcessor::Admitted(int64_t id, int64_t cached_tokens) {
  Event e;
  e.kind = Kind::kAdmitted;
  e.id = id;
  e.cached_tokens = cached_tokens;
  return Post(std::move(e));
}

uint64_t OutputProcessor::Token(int64_t id, SampledToken token, bool eos, int preemptions) {
  Event e;
  e.kind = Kind::kToken;
  e.id = id;
  e.token = std::move(token);
  e.eos = eos;
  e.preemptions = preemptions;
  return Post(std::move(e));
}

uint64_t OutputProcessor::Replay(int64_t id, std::vector<int32_t> tokens) {
  Event e;
  e.kind = Kind::kReplay;
  e.id = id;
  e.replay = std::move(tokens);
  return Post(std::move(e));
}

uint64_t OutputProcessor::PromptLogprobs(int64_t id, std::vector<SampledToken> prompt) {
  Event e;
  e.kind = Kind::kPromptLogprobs;
  e.id = id;
  e.prompt = std::move(prompt);
  return Post(std::move(e));
}

uint64_t OutputProcessor::Finish(int64_t id, FinishReason reason, Status error, int preemptions) {
  Event e;
  e.kind = Kind::kFinish;
  e.id = id;
  e.reason = reason;
  e.error = std::move(error);
  e.preemptions = preemptions;
  return Post(std::move(e));
}

uint64_t OutputProcessor::posted() const {
  std::lock_guard<std::mutex> lock(mu_);
  return posted_;
}

void OutputProcessor::WaitProcessed(uint64_t serial) {
  std::unique_lock<std::mutex> lock(mu_);
  if (processed_ >= serial) return;
  Waiter me;
  waiters_.emplace(serial, &me);
  me.cv.wait(lock, [&] { return me.done; });  // Loop erased the entry
}

std::vector<int64_t> OutputProcessor::TakeStops(uint64_t serial,
                                                const std::function<bool(int64_t)>& mine) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<int64_t> ids;
  auto keep = stops_.begin();
  for (auto it = stops_.begin(); it != stops_.end(); ++it) {
    if (it->first <= serial && (!mine || mine(it->second)))
      ids.push_back(it->second);
    else
      *keep++ = *it;
  }
  stops_.erase(keep, stops_.end());
  return ids;
}

void OutputProcessor::Loop() {
  std::deque<Event> batch;
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and every event was processed
      batch.swap(queue_);
    }
    for (Event& e : batch) {
      Process(e);
      const bool finish = e.kind == Kind::kFinish;
      if (finish) pending_finishes_.fetch_sub(1);
      std::lock_guard<std::mutex> lock(mu_);
      processed_ = e.serial;
      // Wake exactly the waiters this event satisfied (under the lock: a
      // woken waiter's stack frame may go as soon as it runs).
      while (!waiters_.empty() && waiters_.begin()->first <= processed_) {
        waiters_.begin()->second->done = true;
        waiters_.begin()->second->cv.notify_one();
        waiters_.erase(waiters_.begin());
      }
    }
    batch.clear();
    if (on_batch_) on_batch_();
  }
}

void OutputProcessor::Emit(Entry& entry, const std::string& text, const SampledToken* token) {
  if (!entry.callbacks.on_token) return;
  if (!token && text.empty()) return;
  const SampledToken* logprobs = token && entry.out->want_logprobs() ? token : nullptr;
  entry.callbacks.on_token(text, token ? token->token_id : -1, logprobs);
}

void OutputProcessor::Process(Event& e) {
  if (e.kind == Kind::kRegister) {
    Entry entry;
    entry.callbacks = std::move(e.callbacks);
    entry.out = std::make_unique<RequestOutput>(tokenizer_, std::move(e.stop), e.want_logprobs,
                                                e.prompt_tokens);
    entries_[e.id] = std::move(entry);
    return;
  }
  auto it = entries_.find(e.id);
  TESSERA_CHECK(it != entries_.end());
  Entry& entry = it->second;
  switch (e.kind) {
    case Kind::kRegister:
      break;
    case Kind::kAdmitted:
      entry.out->set_cached_tokens(e.cached_tokens);
      if (!entry.done && entry.callbacks.on_admit) entry.callbacks.on_admit();
      break;
    case Kind::kToken: {
      if (entry.done) break;  // generated after its stop string: dropped
      Emit(entry, entry.out->Push(e.token, e.eos), &e.token);
      if (!entry.out->stopped()) break;
      Emit(entry, entry.out->Finish(FinishReason::kStop, Status::Ok(), e.preemptions), nullptr);
      entry.done = true;
      if (entry.callbacks.on_finish) entry.callbacks.on_finish(entry.out->result());
      std::lock_guard<std::mutex> lock(mu_);
      stops_.emplace_back(e.serial, e.id);
      break;
    }
    case Kind::kReplay:
      for (int32_t t : e.replay) {
        SampledToken token;
        token.token_id = t;
        entry.out->Push(token, false);  // its text went out where it was generated
      }
      break;
    case Kind::kPromptLogprobs:
      if (!entry.done && entry.callbacks.on_prompt_logprobs)
        entry.callbacks.on_prompt_logprobs(e.prompt);
      entry.out->set_prompt_logprobs(std::move(e.prompt));
      break;
    case Kind::kFinish:
      if (!entry.done) {
        Emit(entry, entry.out->Finish(e.reason, std::move(e.error), e.preemptions), nullptr);
        if (entry.callbacks.on_finish) entry.callbacks.on_finish(entry.out->result());
      }
      entries_.erase(it);
      break;
  }
}

}  // namespace tessera
