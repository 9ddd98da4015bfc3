#include "worker/model/sampler.h"

#include <vector>

namespace tessera {

Sampler::Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {}

double Sampler::Uniform() { return static_cast<double>(rng_() >> 11) * (1.0 / 9007199254740992.0); }

kernels::SampleRow Sampler::NextRow() {
  kernels::SampleRow row;
  row.temperature = params_.temperature;
  row.top_k = params_.top_k;
  row.top_p = params_.top_p;
  if (!row.greedy()) row.uniform = Uniform();
  return row;
}

int32_t Sampler::Sample(const float* logits, int64_t vocab) {
  return kernels::SampleRowCpu(logits, vocab, NextRow());
}

StatusOr<std::vector<SampledToken>> SequenceSamplers::Sample(const StepBatch& batch,
                                                             const Tensor& logits) {
  for (int64_t id : batch.finished_seq_ids) samplers_.erase(id);
  std::vector<kernels::SampleRow> rows;
  std::vector<int32_t> logprobs;  // per row: SamplingParams::logprobs
  for (const SeqStep& s : batch.seqs) {
    if (!s.want_logits) continue;
    auto it = samplers_.find(s.seq_id);
    if (it == samplers_.end()) it = samplers_.emplace(s.seq_id, Sampler(s.sampling)).first;
    rows.push_back(it->second.NextRow());
    logprobs.push_back(s.sampling.logprobs);
  }
  std::vector<int32_t> tokens;
  TESSERA_RETURN_IF_ERROR(kernels::SampleTokens(logits, rows, tokens));
  std::vector<SampledToken> out(tokens.size());
  std::vector<kernels::LogprobRow> asked;
  for (size_t i = 0; i < tokens.size(); ++i) {
    out[i].token_id = tokens[i];
    // A non-finite row has no distribution: no log-probabilities.
    if (logprobs[i] >= 0 && tokens[i] != kNonFiniteLogitsToken)
      asked.push_back({static_cast<int64_t>(i), tokens[i], logprobs[i]});
  }
  if (asked.empty()) return out;
  std::vector<SampledToken> lp;
  TESSERA_RETURN_IF_ERROR(kernels::TokenLogprobs(logits, asked, lp));
  for (size_t i = 0; i < asked.size(); ++i)
    out[static_cast<size_t>(asked[i].row)] = std::move(lp[i]);
  return out;
}

}  // namespace tessera
