#include "worker/exec/nonfinite_check.h"

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "common/base/dtype.h"
#include "common/base/logging.h"

namespace tessera {

std::string ModelLogName(const LlamaModel& model) {
  const ModelConfig& c = model.config();
  return (c.model_type.empty() ? std::string("model") : c.model_type) + " (" +
         ArchitectureName(c.architecture) + ")";
}

int LogNonFiniteLogits(const LlamaModel& model, const StepBatch& batch,
                       const std::vector<SampledToken>& sampled, const std::string& rank) {
  int bad = 0;
  size_t k = 0;
  const StageLayout& lay = model.layout();
  for (const SeqStep& s : batch.seqs) {
    if (!s.want_logits || k >= sampled.size()) continue;
    if (sampled[k++].token_id != kNonFiniteLogitsToken) continue;
    ++bad;
    TESSERA_LOG_ERROR("worker",
                      "non-finite logits (NaN or inf) for seq_id {} at position {}: model {}, "
                      "sampling rank {} holding layers [{}, {}) of {}; the value may have "
                      "appeared in an earlier stage (TESSERA_CHECK_NONFINITE=1 names the first)",
                      s.seq_id, s.start_pos + s.num_tokens, ModelLogName(model), rank,
                      lay.first_layer, lay.end_layer, model.config().num_hidden_layers);
  }
  return bad;
}

bool NonFiniteDebugEnabled() {
  static const bool on = [] {
    const char* v = std::getenv("TESSERA_CHECK_NONFINITE");
    return v != nullptr && std::strcmp(v, "1") == 0;
  }();
  return on;
}

Status CheckHiddenFinite(const LlamaModel& model, const Tensor& hidden, const std::string& rank) {
  if (!NonFiniteDebugEnabled() || hidden.numel() == 0) return Status::Ok();
  static std::atomic<bool> reported{false};
  if (reported.load()) return Status::Ok();
  TESSERA_ASSIGN_OR_RETURN(Tensor host, model.backend().ToHost(hidden));
  std::vector<float> values(static_cast<size_t>(host.numel()));
  ConvertToF32(host.dtype(), host.raw(), values.data(), values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    if (std::isfinite(values[i])) continue;
    if (reported.exchange(true)) return Status::Ok();
    const StageLayout& lay = model.layout();
    TESSERA_LOG_ERROR("worker",
                      "TESSERA_CHECK_NONFINITE: first non-finite hidden value ({}) at element {} "
                      "of {} after layers [{}, {}): model {}, rank {}",
                      values[i], i, hidden.Describe(), lay.first_layer, lay.end_layer,
                      ModelLogName(model), rank);
    return Status::Ok();
  }
  return Status::Ok();
}

}  // namespace tessera
