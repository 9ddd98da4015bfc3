#include <algorithm>
#include <cmath>
#include <numeric>

#include "kernels/dispatch.h"
#include "kernels/sampling.h"

namespace tessera::kernels {

int32_t SampleRowCpu(const float* logits, int64_t vocab, const SampleRow& row) {
  if (!std::all_of(logits, logits + vocab, [](float v) { return std::isfinite(v); }))
    return kNonFiniteLogitsToken;
  if (row.greedy()) return static_cast<int32_t>(std::max_element(logits, logits + vocab) - logits);
  std::vector<int32_t> ids(static_cast<size_t>(vocab));
  std::iota(ids.begin(), ids.end(), 0);
  // Sort by logit descending; ties keep the lower id first.
  auto by_logit = [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  size_t keep = ids.size();
  if (row.top_k > 0 && static_cast<size_t>(row.top_k) < keep) {
    keep = static_cast<size_t>(row.top_k);
    std::partial_sort(ids.begin(), ids.begin() + static_cast<long>(keep), ids.end(), by_logit);
    ids.resize(keep);
  } else {
    std::sort(ids.begin(), ids.end(), by_logit);
  }
  const double inv_t = 1.0 / row.temperature;
  const double max_logit = logits[ids[0]] * inv_t;
  std::vector<double> probs(ids.size());
  double total = 0.0;
  for (size_t i = 0; i < ids.size(); ++i) {
    probs[i] = std::exp(logits[ids[i]] * inv_t - max_logit);
    total += probs[i];
  }
  for (double& p : probs) p /= total;
  if (row.top_p < 1.0f) {
    double mass = 0.0;
    size_t n = 0;
    while (n < probs.size()) {
      mass += probs[n++];
      if (mass >= row.top_p) break;
    }
    probs.resize(n);
    ids.resize(n);
    total = std::accumulate(probs.begin(), probs.end(), 0.0);
    for (double& p : probs) p /= total;
  }
  // min_p (HF MinPLogitsWarper, after top-p: p_i < min_p * p_max dropped)
  // and tokens of probability 0 (a banned logit, kernels/logit_adjust_entry.h):
  // probabilities fall along ids, so the kept set is a prefix, at least ids[0].
  size_t kept = 1;
  while (kept < probs.size() && probs[kept] > 0.0 && probs[kept] >= row.min_p * probs[0]) ++kept;
  if (kept < probs.size()) {
    probs.resize(kept);
    ids.resize(kept);
    if (row.min_p > 0.0f) {  // zero probabilities leave the mass as it was
      total = std::accumulate(probs.begin(), probs.end(), 0.0);
      for (double& p : probs) p /= total;
    }
  }
  double acc = 0.0;
  for (size_t i = 0; i < probs.size(); ++i) {
    acc += probs[i];
    if (row.uniform < acc) return ids[i];
  }
  return ids.back();
}

Status SampleTokens(const Tensor& logits, const std::vector<SampleRow>& rows,
                    std::vector<int32_t>& tokens) {
  return TESSERA_DISPATCH(logits.device(), SampleTokens, logits, rows, tokens);
}

SampledToken LogprobsRowCpu(const float* logits, int64_t vocab, int32_t token, int32_t top) {
  SampledToken out;
  out.token_id = token;
  out.has_logprobs = true;
  const double max_logit = *std::max_element(logits, logits + vocab);
  double sum = 0.0;
  for (int64_t i = 0; i < vocab; ++i) sum += std::exp(static_cast<double>(logits[i]) - max_logit);
  const double log_z = max_logit + std::log(sum);
  auto logprob = [&](int32_t id) {
    return static_cast<float>(std::min(0.0, static_cast<double>(logits[id]) - log_z));
  };
  out.logprob = logprob(token);
  const size_t k = static_cast<size_t>(std::min<int64_t>(std::max(top, 0), vocab));
  if (k == 0) return out;
  std::vector<int32_t> ids(static_cast<size_t>(vocab));
  std::iota(ids.begin(), ids.end(), 0);
  std::partial_sort(ids.begin(), ids.begin() + static_cast<long>(k), ids.end(),
                    [&](int32_t a, int32_t b) {
                      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
                    });
  out.top.reserve(k);
  for (size_t i = 0; i < k; ++i) out.top.push_back({ids[i], logprob(ids[i])});
  return out;
}

Status CheckLogprobRows(const Tensor& logits, const std::vector<LogprobRow>& rows) {
  TESSERA_RETURN_IF_ERROR(ExpectTensor(logits, 2, DType::kF32, "logprobs logits"));
  for (size_t i = 0; i < rows.size(); ++i) {
    const LogprobRow& r = rows[i];
    if (r.row < 0 || r.row >= logits.dim(0) || r.token < 0 || r.token >= logits.dim(1) || r.top < 0)
      return InvalidArgument("logprobs: row " + std::to_string(i) + " (logits row " +
                             std::to_string(r.row) + ", token " + std::to_string(r.token) +
                             ", top " + std::to_string(r.top) + ") is outside logits " +
                             logits.Describe());
  }
  return Status::Ok();
}

Status TokenLogprobs(const Tensor& logits, const std::vector<LogprobRow>& rows,
                     std::vector<SampledToken>& out) {
  return TESSERA_DISPATCH(logits.device(), TokenLogprobs, logits, rows, out);
}

Status CheckHostRows(const Tensor& logits, const std::vector<int64_t>& rows) {
  TESSERA_RETURN_IF_ERROR(ExpectTensor(logits, 2, DType::kF32, "logits rows"));
  for (int64_t r : rows)
    if (r < 0 || r >= logits.dim(0))
      return InvalidArgument("logits row " + std::to_string(r) + " is outside " +
                             logits.Describe());
  return Status::Ok();
}

StatusOr<Tensor> RowsToHost(const Tensor& logits, const std::vector<int64_t>& rows) {
  return TESSERA_DISPATCH(logits.device(), RowsToHost, logits, rows);
}

namespace cpu {

StatusOr<Tensor> RowsToHost(const Tensor& logits, const std::vector<int64_t>& rows) {
  TESSERA_RETURN_IF_ERROR(CheckHostRows(logits, rows));
  const int64_t vocab = logits.dim(1);
  Tensor out = Tensor::Empty({static_cast<int64_t>(rows.size()), vocab});
  for (size_t i = 0; i < rows.size(); ++i)
    std::copy_n(logits.data<float>() + rows[i] * vocab, vocab,
                out.data<float>() + static_cast<int64_t>(i) * vocab);
  return out;
}

Status SampleTokens(const Tensor& logits, const std::vector<SampleRow>& rows,
                    std::vector<int32_t>& tokens) {
  TESSERA_RETURN_IF_ERROR(ExpectTensor(logits, 2, DType::kF32, "sampling logits"));
  if (logits.dim(0) != static_cast<int64_t>(rows.size()))
    return InvalidArgument("sampling: logits " + logits.Describe() + " for " +
                           std::to_string(rows.size()) + " rows");
  const int64_t vocab = logits.dim(1);
  tokens.resize(rows.size());
  for (size_t i = 0; i < rows.size(); ++i)
    tokens[i] =
        SampleRowCpu(logits.data<float>() + static_cast<int64_t>(i) * vocab, vocab, rows[i]);
  return Status::Ok();
}

Status TokenLogprobs(const Tensor& logits, const std::vector<LogprobRow>& rows,
                     std::vector<SampledToken>& out) {
  TESSERA_RETURN_IF_ERROR(CheckLogprobRows(logits, rows));
  const int64_t vocab = logits.dim(1);
  out.clear();
  out.reserve(rows.size());
  for (const LogprobRow& r : rows)
    out.push_back(LogprobsRowCpu(logits.data<float>() + r.row * vocab, vocab, r.token, r.top));
  return Status::Ok();
}

}  // namespace cpu
}  // namespace tessera::kernels
