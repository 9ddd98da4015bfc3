#include "worker/model/grammar_masks.h"

#include <algorithm>
#include <thread>

#include "common/base/logging.h"
#include "common/base/sampled_token.h"
#include "common/tokenizer/tokenizer.h"

namespace tessera {

GrammarSource ModelGrammarSource(std::string model_dir, int64_t vocab, GrammarLibraryPaths paths) {
  return [model_dir = std::move(model_dir), vocab,
          paths = std::move(paths)]() -> StatusOr<std::shared_ptr<const GrammarEngine>> {
    TESSERA_ASSIGN_OR_RETURN(
        std::shared_ptr<const LlguidanceLibrary> lib,
        LlguidanceLibrary::Load(paths.llguidance_library, paths.python_library));
    TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tokenizer, Tokenizer::Load(model_dir));
    if (!tokenizer->eos_id())
      return FailedPrecondition(model_dir +
                                ": the tokenizer has no eos_token, which a structured output "
                                "needs to end");
    const int32_t eos = *tokenizer->eos_id();
    return GrammarEngine::Create(std::move(lib),
                                 std::shared_ptr<const Tokenizer>(std::move(tokenizer)),
                                 static_cast<int32_t>(vocab), eos);
  };
}

SequenceGrammars::SequenceGrammars(GrammarSource source) : source_(std::move(source)) {}

SequenceGrammars::~SequenceGrammars() {
  for (auto& [id, state] : states_) (void)Wait(state);
  if (pool_) pool_->Stop();
}

Status SequenceGrammars::Wait(State& state) {
  if (!state.pending.valid()) return Status::Ok();
  return state.pending.get();
}

void SequenceGrammars::Drop(const std::vector<int64_t>& finished) {
  for (int64_t id : finished) {
    auto it = states_.find(id);
    if (it == states_.end()) continue;
    (void)Wait(it->second);
    states_.erase(it);
  }
}

void SequenceGrammars::SubmitMask(State& state) {
  auto task = std::make_shared<std::packaged_task<Status()>>(
      [m = state.matcher.get(), mask = &state.mask]() { return m->ComputeMask(*mask); });
  state.pending = task->get_future();
  // The pool's queue holds every live sequence's task at most once; if it is
  // full anyway, the mask is computed here.
  if (!pool_->TrySubmit([task]() { (*task)(); })) (*task)();
}

Status SequenceGrammars::Start(const SeqStep& step, const std::vector<int32_t>& generated,
                               State& state) {
  if (!loaded_) {
    loaded_ = true;
    auto engine = source_ ? source_()
                          : StatusOr<std::shared_ptr<const GrammarEngine>>(
                                FailedPrecondition("no grammar engine on this rank"));
    if (engine.ok()) {
      engine_ = *engine;
      // Mask work overlaps the forward step; two threads keep a batch's masks
      // ahead of it on a small host without taking the cores the step uses.
      const int threads =
          std::clamp(static_cast<int>(std::thread::hardware_concurrency()) / 4, 1, 4);
      pool_ = std::make_unique<WorkPool>("grammar-mask", threads, 1 << 16);
    } else {
      engine_status_ = engine.status();
      TESSERA_LOG_ERROR("sampler", "structured outputs unavailable: {}", engine_status_.message());
    }
  }
  if (!engine_)
    return FailedPrecondition("seq_id " + std::to_string(step.seq_id) +
                              " asks for a structured output: " + engine_status_.message());
  auto matcher = engine_->NewMatcher(step.sampling.grammar);
  if (!matcher.ok())
    return matcher.status().WithContext("seq_id " + std::to_string(step.seq_id) + " grammar");
  state.matcher = std::move(*matcher);
  for (int32_t token : generated)
    TESSERA_RETURN_IF_ERROR(state.matcher->Accept(token).WithContext(
        "seq_id " + std::to_string(step.seq_id) + " replaying its output"));
  SubmitMask(state);
  return Status::Ok();
}

StepMasks SequenceGrammars::Masks(const StepBatch& batch,
                                  const std::function<std::vector<int32_t>(int64_t)>& generated) {
  StepMasks out;
  int64_t row = 0;
  std::vector<std::pair<int64_t, int64_t>> wanted;  // (row, seq_id)
  for (const SeqStep& s : batch.seqs) {
    if (!s.want_logits) continue;
    const int64_t r = row++;
    if (!s.sampling.grammar.active()) continue;
    auto [it, fresh] = states_.try_emplace(s.seq_id);
    if (fresh) {
      Status st = Start(s, generated(s.seq_id), it->second);
      if (!st.ok()) {
        TESSERA_LOG_ERROR("sampler", "structured output failed: {}", st.message());
        (void)Wait(it->second);
        states_.erase(it);
        out.failed_rows.push_back(r);
        continue;
      }
    }
    wanted.emplace_back(r, s.seq_id);
  }
  for (auto& [r, seq_id] : wanted) {
    auto it = states_.find(seq_id);
    State& state = it->second;
    if (Status st = Wait(state); !st.ok()) {
      TESSERA_LOG_ERROR("sampler", "structured output of seq_id {} failed: {}", seq_id,
                        st.message());
      states_.erase(it);
      out.failed_rows.push_back(r);
      continue;
    }
    if (out.words_per_row == 0) out.words_per_row = static_cast<int64_t>(state.mask.size());
    out.rows.push_back(r);
    out.words.insert(out.words.end(), state.mask.begin(), state.mask.end());
  }
  return out;
}

void SequenceGrammars::Advance(const StepBatch& batch, std::vector<int32_t>& tokens) {
  size_t k = 0;
  for (const SeqStep& s : batch.seqs) {
    if (!s.want_logits) continue;
    int32_t& token = tokens[k++];
    if (!s.sampling.grammar.active() || token < 0) continue;  // no draw: the scheduler fails it
    auto it = states_.find(s.seq_id);
    if (it == states_.end()) continue;
    if (Status st = it->second.matcher->Accept(token); !st.ok()) {
      TESSERA_LOG_ERROR("sampler", "structured output of seq_id {} failed: {}", s.seq_id,
                        st.message());
      states_.erase(it);
      token = kGrammarFailedToken;
      continue;
    }
    if (!it->second.matcher->ended()) SubmitMask(it->second);
  }
}

}  // namespace tessera
