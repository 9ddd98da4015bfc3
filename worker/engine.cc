#include "worker/engine.h"

#include <algorithm>
#include <chrono>
#include <deque>
#include <set>

namespace tessera {

const char* FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kLength: return "length";
    case FinishReason::kEos: return "eos";
    case FinishReason::kStop: return "stop";
  }
  return "?";
}

namespace {

struct SeqState {
  const GenerationRequest* req = nullptr;
  std::vector<int32_t> tokens;  // prompt + generated
  size_t prompt_len = 0;
  int32_t cached = 0;           // tokens already in the KV cache
  std::vector<int32_t> blocks;
  std::unique_ptr<Sampler> sampler;
  std::unique_ptr<IncrementalDecoder> decoder;
  size_t emitted = 0;           // bytes of result.text already streamed
  bool done = false;
  GenerationResult result;
};

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

Engine::Engine(const ModelConfig& config, StepExecutor* executor, BlockAllocator* allocator,
               int64_t block_size, const Tokenizer* tokenizer, EngineOptions options)
    : config_(config),
      executor_(executor),
      allocator_(allocator),
      block_size_(block_size),
      tokenizer_(tokenizer),
      options_(options) {}

StatusOr<std::vector<GenerationResult>> Engine::Generate(const std::vector<GenerationRequest>& requests,
                                                         const TextCallback& on_text) {
  std::set<int32_t> eos(config_.eos_token_ids.begin(), config_.eos_token_ids.end());
  if (tokenizer_ && tokenizer_->eos_id()) eos.insert(*tokenizer_->eos_id());

  std::vector<SeqState> seqs(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    const GenerationRequest& r = requests[i];
    const std::string where = "request " + std::to_string(i) + ": ";
    if (r.prompt_ids.empty()) return InvalidArgument(where + "prompt is empty");
    for (int32_t id : r.prompt_ids)
      if (id < 0 || id >= config_.vocab_size)
        return InvalidArgument(where + "prompt token id " + std::to_string(id) + " is outside [0, " +
                               std::to_string(config_.vocab_size) + ")");
    TESSERA_RETURN_IF_ERROR_CTX(r.sampling.Validate(), where + "sampling");
    if (r.max_tokens < 0) return InvalidArgument(where + "max_tokens must be >= 0");
    if (!r.stop.empty() && !tokenizer_) return InvalidArgument(where + "stop strings need a tokenizer");
    for (const std::string& s : r.stop)
      if (s.empty()) return InvalidArgument(where + "stop strings must not be empty");
    SeqState& s = seqs[i];
    s.req = &r;
    s.tokens = r.prompt_ids;
    s.prompt_len = r.prompt_ids.size();
    s.sampler = std::make_unique<Sampler>(r.sampling);
    if (tokenizer_) s.decoder = std::make_unique<IncrementalDecoder>(*tokenizer_, true);
    s.done = r.max_tokens == 0;
  }

  auto finish = [&](size_t i, FinishReason reason) {
    SeqState& s = seqs[i];
    s.done = true;
    s.result.finish_reason = reason;
    if (reason != FinishReason::kStop && s.decoder) s.result.text += s.decoder->Flush();
    allocator_->Free(s.blocks);
  };
  auto emit = [&](size_t i) {
    SeqState& s = seqs[i];
    const size_t hold = s.done ? 0 : StopHoldback(s.result.text, s.req->stop);
    const size_t ready = s.result.text.size() - hold;
    if (ready > s.emitted) {
      if (on_text) on_text(i, s.result.text.substr(s.emitted, ready - s.emitted));
      s.emitted = ready;
    }
  };

  // Sequence ids are unique over the engine's life, so per-sequence state on
  // other ranks (sampler RNGs) is never confused between calls.
  const int64_t seq_base = next_seq_id_;
  next_seq_id_ += static_cast<int64_t>(requests.size());
  struct InFlight {
    StepBatch batch;
    std::vector<size_t> members;
    bool has_decode = false;
    int64_t prefill_tokens = 0;
    int64_t decode_tokens = 0;
    std::chrono::steady_clock::time_point submitted;
  };
  std::deque<InFlight> in_flight;
  std::vector<bool> busy(seqs.size(), false);
  std::vector<int64_t> finished_ids;
  auto last_done = std::chrono::steady_clock::now();
  Status failure;
  while (failure.ok()) {
    // Keep up to max_in_flight micro-batches moving; spread the live
    // sequences over them so every pipeline stage has work.
    while (failure.ok() && static_cast<int>(in_flight.size()) < executor_->max_in_flight()) {
      // Spread the sequences that can run now over the free micro-batch
      // slots, so every stage gets work.
      size_t ready = 0;
      for (size_t i = 0; i < seqs.size(); ++i)
        ready += (!seqs[i].done && !busy[i] && static_cast<int64_t>(seqs[i].tokens.size()) > seqs[i].cached) ? 1 : 0;
      const size_t slots = static_cast<size_t>(executor_->max_in_flight()) - in_flight.size();
      const size_t per_batch = (ready + slots - 1) / slots;
      InFlight f;
      int64_t budget = options_.max_batch_tokens;
      for (size_t i = 0; i < seqs.size() && budget > 0 && f.members.size() < per_batch; ++i) {
        SeqState& s = seqs[i];
        if (s.done || busy[i]) continue;
        const int64_t pending = static_cast<int64_t>(s.tokens.size()) - s.cached;
        const int32_t n = static_cast<int32_t>(std::min(pending, budget));
        if (n <= 0) continue;
        const int64_t need = BlockAllocator::BlocksFor(s.cached + n, block_size_) -
                             static_cast<int64_t>(s.blocks.size());
        if (need > 0) {
          Status st = allocator_->Allocate(need, s.blocks);
          if (!st.ok()) {
            failure = st.WithContext("request " + std::to_string(i));
            break;
          }
        }
        SeqStep step;
        step.seq_id = seq_base + static_cast<int64_t>(i);
        step.start_pos = s.cached;
        step.num_tokens = n;
        step.prompt_len = static_cast<int32_t>(s.prompt_len);
        step.block_table = s.blocks;
        step.want_logits = s.cached + n == static_cast<int64_t>(s.tokens.size());
        step.sampling = s.req->sampling;
        f.batch.token_ids.insert(f.batch.token_ids.end(), s.tokens.begin() + s.cached,
                                 s.tokens.begin() + s.cached + n);
        f.batch.seqs.push_back(std::move(step));
        f.members.push_back(i);
        if (static_cast<size_t>(s.cached) >= s.prompt_len) {
          f.has_decode = true;
          f.decode_tokens += n;
        } else {
          f.prefill_tokens += n;
        }
        budget -= n;
      }
      if (!failure.ok() || f.members.empty()) break;
      f.batch.finished_seq_ids = std::move(finished_ids);
      finished_ids.clear();
      f.submitted = std::chrono::steady_clock::now();
      failure = executor_->Submit(f.batch);
      for (size_t i : f.members) busy[i] = true;
      in_flight.push_back(std::move(f));
      stats_.max_in_flight = std::max(stats_.max_in_flight, static_cast<int>(in_flight.size()));
    }
    if (!failure.ok() || in_flight.empty()) break;

    auto tokens = executor_->Collect();
    if (!tokens.ok()) {
      failure = tokens.status();
      break;
    }
    InFlight f = std::move(in_flight.front());
    in_flight.pop_front();
    const auto now = std::chrono::steady_clock::now();
    const double dt = std::chrono::duration<double>(now - std::max(f.submitted, last_done)).count();
    last_done = now;
    if (f.has_decode) {
      stats_.decode_seconds += dt;
    } else {
      stats_.prefill_seconds += dt;
    }
    stats_.prefill_tokens += f.prefill_tokens;
    stats_.decode_tokens += f.decode_tokens;

    size_t row = 0;
    for (size_t k = 0; k < f.members.size(); ++k) {
      const size_t i = f.members[k];
      SeqState& s = seqs[i];
      busy[i] = false;
      s.cached += f.batch.seqs[k].num_tokens;
      if (!f.batch.seqs[k].want_logits) continue;
      if (row >= tokens->size()) {
        failure = Internal("executor returned " + std::to_string(tokens->size()) + " tokens for a batch of " +
                           std::to_string(f.members.size()) + " sequences");
        break;
      }
      const int32_t token = (*tokens)[row++];
      s.tokens.push_back(token);
      s.result.tokens.push_back(token);
      if (!s.req->ignore_eos && eos.count(token)) {
        finish(i, FinishReason::kEos);
      } else {
        if (s.decoder) s.result.text += s.decoder->Push(token);
        size_t cut = std::string::npos;
        for (const std::string& stop : s.req->stop) cut = std::min(cut, s.result.text.find(stop));
        if (cut != std::string::npos) {
          s.result.text.resize(cut);
          finish(i, FinishReason::kStop);
        } else if (static_cast<int32_t>(s.result.tokens.size()) >= s.req->max_tokens) {
          finish(i, FinishReason::kLength);
        }
      }
      if (s.done) finished_ids.push_back(seq_base + static_cast<int64_t>(i));
      emit(i);
    }
  }
  // Drain whatever is still in flight so the executor's ranks stay in step.
  while (!in_flight.empty()) {
    (void)executor_->Collect();
    in_flight.pop_front();
  }
  for (SeqState& s : seqs) allocator_->Free(s.blocks);
  if (!failure.ok()) return failure;
  std::vector<GenerationResult> out;
  out.reserve(seqs.size());
  for (SeqState& s : seqs) out.push_back(std::move(s.result));
  return out;
}

}  // namespace tessera
