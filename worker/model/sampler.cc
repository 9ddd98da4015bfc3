#include "worker/model/sampler.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>
#include <vector>

namespace tessera {

Sampler::Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {}

double Sampler::Uniform() { return static_cast<double>(rng_() >> 11) * (1.0 / 9007199254740992.0); }

kernels::SampleRow Sampler::NextRow() {
  kernels::SampleRow row;
  row.temperature = params_.temperature;
  row.top_k = params_.top_k;
  row.top_p = params_.top_p;
  row.min_p = params_.min_p;
  if (!row.greedy()) row.uniform = Uniform();
  return row;
}

int32_t Sampler::Sample(const float* logits, int64_t vocab) {
  return kernels::SampleRowCpu(logits, vocab, NextRow());
}

std::vector<kernels::LogitAdjustment> LogitAdjustmentsFor(const SamplingParams& p,
                                                          const std::vector<int32_t>& tokens,
                                                          int32_t output_start, int64_t row,
                                                          int64_t vocab) {
  std::vector<kernels::LogitAdjustment> out;
  std::unordered_map<int32_t, size_t> at;  // token -> index in out
  auto entry = [&](int32_t token) -> kernels::LogitAdjustment* {
    if (token < 0 || token >= vocab) return nullptr;
    auto [it, fresh] = at.emplace(token, out.size());
    if (fresh) {
      kernels::LogitAdjustment e;
      e.row = row;
      e.token = token;
      e.presence = p.presence_penalty;
      e.frequency = p.frequency_penalty;
      e.repetition = p.repetition_penalty;
      out.push_back(e);
    }
    return &out[it->second];
  };
  const size_t start = std::min(static_cast<size_t>(std::max(output_start, 0)), tokens.size());
  const bool penalties =
      p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f || p.repetition_penalty != 1.0f;
  if (penalties) {
    if (p.repetition_penalty != 1.0f)
      for (size_t i = 0; i < start; ++i)
        if (auto* e = entry(tokens[i])) e->flags |= kernels::kLogitInPrompt;
    for (size_t i = start; i < tokens.size(); ++i)
      if (auto* e = entry(tokens[i])) ++e->output_count;
  }
  for (const auto& [token, bias] : p.logit_bias)
    if (auto* e = entry(token)) e->bias = bias;
  const int64_t generated = static_cast<int64_t>(tokens.size() - start);
  if (generated < p.min_tokens)
    for (int32_t token : p.min_tokens_blocked)
      if (auto* e = entry(token)) e->flags |= kernels::kLogitBanned;
  return out;
}

Status SequenceSamplers::UpdateHistories(const StepBatch& batch) {
  size_t offset = 0;
  for (const SeqStep& s : batch.seqs) {
    const size_t begin = offset;
    offset += static_cast<size_t>(s.num_tokens);
    if (!s.sampling.NeedsHistory()) continue;
    History& h = histories_[s.seq_id];
    if (!s.history.empty() || s.start_pos == 0) h.tokens = s.history;
    if (h.tokens.size() < static_cast<size_t>(s.start_pos))
      return InvalidArgument("sampler: seq_id " + std::to_string(s.seq_id) +
                             " starts at position " + std::to_string(s.start_pos) + " but only " +
                             std::to_string(h.tokens.size()) +
                             " of its tokens are known and the step carries no history");
    h.tokens.resize(static_cast<size_t>(s.start_pos));
    h.tokens.insert(h.tokens.end(), batch.token_ids.begin() + static_cast<long>(begin),
                    batch.token_ids.begin() + static_cast<long>(offset));
    h.output_start = s.output_start;
  }
  return Status::Ok();
}

namespace {

// Prompt log-probabilities: rows [SampledRows(), LogitsRows()) of `all`,
// each chunk's positions but its last, give the log-probability of the
// chunk's next token. A row holding a NaN or an infinity fails its sequence
// as a non-finite sampling row does (kNonFiniteLogitsToken).
Status AddPromptLogprobs(const StepBatch& batch, const Tensor& all,
                         std::vector<SampledToken>& out) {
  const int64_t wanted = batch.SampledRows(), rows = batch.LogitsRows();
  if (rows == wanted) return Status::Ok();
  std::vector<int64_t> extra;
  for (int64_t r = wanted; r < rows; ++r) extra.push_back(r);
  TESSERA_ASSIGN_OR_RETURN(Tensor host, kernels::RowsToHost(all, extra));
  const int64_t vocab = host.dim(1);
  size_t offset = 0, sampled_row = 0;
  int64_t row = 0;  // in host
  for (const SeqStep& s : batch.seqs) {
    const size_t begin = offset;
    offset += static_cast<size_t>(s.num_tokens);
    const size_t at = sampled_row;
    if (s.want_logits) ++sampled_row;
    if (!s.want_prompt_logprobs || s.num_tokens < 2) continue;
    if (!s.want_logits)
      return InvalidArgument("sampler: seq_id " + std::to_string(s.seq_id) +
                             " wants prompt log-probabilities without want_logits");
    SampledToken& token = out[at];
    const int32_t top = std::max(s.sampling.prompt_logprobs, 0);
    for (int32_t j = 0; j + 1 < s.num_tokens; ++j, ++row) {
      const float* l = host.data<float>() + row * vocab;
      if (!std::all_of(l, l + vocab, [](float v) { return std::isfinite(v); })) {
        token = SampledToken{};
        token.token_id = kNonFiniteLogitsToken;
      }
      if (IsFailedToken(token.token_id)) continue;
      token.prompt_logprobs.push_back(kernels::LogprobsRowCpu(
          l, vocab, batch.token_ids[begin + static_cast<size_t>(j) + 1], top));
    }
  }
  return Status::Ok();
}

}  // namespace

StatusOr<std::vector<SampledToken>> SequenceSamplers::Sample(const StepBatch& batch,
                                                             Tensor& all_logits) {
  for (int64_t id : batch.finished_seq_ids) {
    samplers_.erase(id);
    histories_.erase(id);
  }
  grammars_.Drop(batch.finished_seq_ids);
  TESSERA_RETURN_IF_ERROR(UpdateHistories(batch));
  const StepMasks masks = grammars_.Masks(batch, [this](int64_t seq_id) {
    std::vector<int32_t> generated;
    auto h = histories_.find(seq_id);
    if (h == histories_.end()) return generated;
    const auto& t = h->second.tokens;
    const size_t start =
        std::min(static_cast<size_t>(std::max(h->second.output_start, 0)), t.size());
    generated.assign(t.begin() + static_cast<long>(start), t.end());
    return generated;
  });
  if (all_logits.rank() != 2 || all_logits.dim(0) != batch.LogitsRows())
    return InvalidArgument("sampler: logits " + all_logits.Describe() + " for " +
                           std::to_string(batch.LogitsRows()) + " rows");
  Tensor logits = all_logits.Slice0(0, batch.SampledRows());
  const int64_t vocab = logits.rank() == 2 ? logits.dim(1) : 0;
  std::vector<kernels::SampleRow> rows;
  std::vector<int32_t> logprobs;  // per row: SamplingParams::logprobs
  std::vector<kernels::LogitAdjustment> adjust;
  for (const SeqStep& s : batch.seqs) {
    if (!s.want_logits) continue;
    auto it = samplers_.find(s.seq_id);
    if (it == samplers_.end()) it = samplers_.emplace(s.seq_id, Sampler(s.sampling)).first;
    const int64_t row = static_cast<int64_t>(rows.size());
    rows.push_back(it->second.NextRow());
    logprobs.push_back(s.sampling.logprobs);
    if (!s.sampling.AdjustsLogits()) continue;
    static const History kNone;
    auto h = histories_.find(s.seq_id);
    const History& hist = h == histories_.end() ? kNone : h->second;
    std::vector<kernels::LogitAdjustment> more =
        LogitAdjustmentsFor(s.sampling, hist.tokens, hist.output_start, row, vocab);
    adjust.insert(adjust.end(), more.begin(), more.end());
  }
  // Log-probabilities are those of the raw logits: keep the rows that ask
  // for them before processing changes them.
  Tensor raw;
  std::vector<int64_t> raw_rows;
  if (!adjust.empty() || !masks.empty()) {
    for (size_t i = 0; i < logprobs.size(); ++i)
      if (logprobs[i] >= 0) raw_rows.push_back(static_cast<int64_t>(i));
    if (!raw_rows.empty()) {
      TESSERA_ASSIGN_OR_RETURN(raw, kernels::RowsToHost(logits, raw_rows));
    }
    if (!adjust.empty()) TESSERA_RETURN_IF_ERROR(kernels::AdjustLogits(logits, adjust));
    if (!masks.empty())
      TESSERA_RETURN_IF_ERROR(
          kernels::MaskLogits(logits, masks.rows, masks.words, masks.words_per_row));
  }
  std::vector<int32_t> tokens;
  TESSERA_RETURN_IF_ERROR(kernels::SampleTokens(logits, rows, tokens));
  // A sequence whose grammar failed gets no token (the scheduler fails it alone).
  for (int64_t r : masks.failed_rows) tokens[static_cast<size_t>(r)] = kGrammarFailedToken;
  grammars_.Advance(batch, tokens);
  std::vector<SampledToken> out(tokens.size());
  std::vector<kernels::LogprobRow> asked;
  std::vector<size_t> asked_at;  // row of `out` per entry of asked
  for (size_t i = 0; i < tokens.size(); ++i) {
    out[i].token_id = tokens[i];
    // A non-finite row has no distribution: no log-probabilities.
    if (logprobs[i] < 0 || IsFailedToken(tokens[i])) continue;
    int64_t source = static_cast<int64_t>(i);
    if (raw.defined())  // the row's index in `raw`
      source = std::lower_bound(raw_rows.begin(), raw_rows.end(), source) - raw_rows.begin();
    asked.push_back({source, tokens[i], logprobs[i]});
    asked_at.push_back(i);
  }
  if (!asked.empty()) {
    std::vector<SampledToken> lp;
    TESSERA_RETURN_IF_ERROR(raw.defined() ? kernels::cpu::TokenLogprobs(raw, asked, lp)
                                          : kernels::TokenLogprobs(logits, asked, lp));
    for (size_t i = 0; i < asked.size(); ++i) out[asked_at[i]] = std::move(lp[i]);
  }
  TESSERA_RETURN_IF_ERROR(AddPromptLogprobs(batch, all_logits, out));
  return out;
}

}  // namespace tessera
