#include "worker/sampler.h"

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

std::vector<int32_t> SequenceSamplers::Sample(const StepBatch& batch, const float* logits,
                                              int64_t vocab) {
  for (int64_t id : batch.finished_seq_ids) samplers_.erase(id);
  std::vector<int32_t> out;
  int64_t row = 0;
  for (const SeqStep& s : batch.seqs) {
    if (!s.want_logits) continue;
    auto it = samplers_.find(s.seq_id);
    if (it == samplers_.end()) it = samplers_.emplace(s.seq_id, Sampler(s.sampling)).first;
    out.push_back(it->second.Sample(logits + row * vocab, vocab));
    ++row;
  }
  return out;
}

}  // namespace tessera

namespace tessera {

StatusOr<std::vector<int32_t>> SequenceSamplers::Sample(const StepBatch& batch,
                                                        const Tensor& logits) {
  for (int64_t id : batch.finished_seq_ids) samplers_.erase(id);
  std::vector<kernels::SampleRow> rows;
  for (const SeqStep& s : batch.seqs) {
    if (!s.want_logits) continue;
    auto it = samplers_.find(s.seq_id);
    if (it == samplers_.end()) it = samplers_.emplace(s.seq_id, Sampler(s.sampling)).first;
    rows.push_back(it->second.NextRow());
  }
  std::vector<int32_t> tokens;
  TESSERA_RETURN_IF_ERROR(kernels::SampleTokens(logits, rows, tokens));
  return tokens;
}

}  // namespace tessera
