#include "worker/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace tessera {

Sampler::Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {}

double Sampler::Uniform() { return static_cast<double>(rng_() >> 11) * (1.0 / 9007199254740992.0); }

int32_t Sampler::Sample(const float* logits, int64_t vocab) {
  if (params_.temperature == 0.0f || params_.top_k == 1) {
    return static_cast<int32_t>(std::max_element(logits, logits + vocab) - logits);
  }
  std::vector<int32_t> ids(static_cast<size_t>(vocab));
  std::iota(ids.begin(), ids.end(), 0);
  // Sort by logit descending; ties keep the lower id first.
  auto by_logit = [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  size_t keep = ids.size();
  if (params_.top_k > 0 && static_cast<size_t>(params_.top_k) < keep) {
    keep = static_cast<size_t>(params_.top_k);
    std::partial_sort(ids.begin(), ids.begin() + static_cast<long>(keep), ids.end(), by_logit);
    ids.resize(keep);
  } else {
    std::sort(ids.begin(), ids.end(), by_logit);
  }
  const double inv_t = 1.0 / params_.temperature;
  const double max_logit = logits[ids[0]] * inv_t;
  std::vector<double> probs(ids.size());
  double total = 0.0;
  for (size_t i = 0; i < ids.size(); ++i) {
    probs[i] = std::exp(logits[ids[i]] * inv_t - max_logit);
    total += probs[i];
  }
  for (double& p : probs) p /= total;
  if (params_.top_p < 1.0f) {
    double mass = 0.0;
    size_t n = 0;
    while (n < probs.size()) {
      mass += probs[n++];
      if (mass >= params_.top_p) break;
    }
    probs.resize(n);
    ids.resize(n);
    total = std::accumulate(probs.begin(), probs.end(), 0.0);
    for (double& p : probs) p /= total;
  }
  const double u = Uniform();
  double acc = 0.0;
  for (size_t i = 0; i < probs.size(); ++i) {
    acc += probs[i];
    if (u < acc) return ids[i];
  }
  return ids.back();
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
