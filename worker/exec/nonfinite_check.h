// Non-finite numbers in a rank's output: the operator's side of the
// non-finite logits check (kernels/sampling.h finds them; the scheduler fails
// the sequence with kDataLoss, common/base/sampled_token.h).
//
//  - LogNonFiniteLogits: on the sampling rank, one error log line per
//    sequence whose logits held a NaN or an infinity, naming the model
//    (model_type and architecture), the sampling rank's stage, tp_rank and
//    its layers [first, end) (the layers the value went through last; it may
//    have appeared in an earlier stage).
//  - Opt-in debug mode, TESSERA_CHECK_NONFINITE=1 in a worker's (or rank's)
//    environment: after each stage's layers, CheckHiddenFinite copies the
//    output hidden state to the host and scans it; a rank whose output holds
//    a NaN or an infinity logs one line with its layer range and rank (the
//    first time only, per process). The line of the lowest stage names the
//    layer range where the overflow began. It costs a device-to-host copy of the hidden state per
//    step; leave it off in production.
//
// Thread-safety: both functions may be called from any thread.
#pragma once

#include <string>
#include <vector>

#include "common/base/sampled_token.h"
#include "common/base/tensor.h"
#include "common/wire/step_batch.h"
#include "worker/model/llama_model.h"

namespace tessera {

// "<model_type> (<architecture>)" of `model`'s config, for log lines.
std::string ModelLogName(const LlamaModel& model);

// Logs one error line per entry of `sampled` (the batch's want_logits
// sequences, in order) that is kNonFiniteLogitsToken; `rank` names the rank
// ("stage S tp_rank R"). Returns how many entries were non-finite.
int LogNonFiniteLogits(const LlamaModel& model, const StepBatch& batch,
                       const std::vector<SampledToken>& sampled, const std::string& rank);

// True when TESSERA_CHECK_NONFINITE=1 (read once).
bool NonFiniteDebugEnabled();

// Debug mode only (a no-op otherwise): scans `hidden` (this stage's output,
// F32/F16/BF16 on any device) and logs the first non-finite value's stage
// layers and rank. Errors: a failed device-to-host copy.
Status CheckHiddenFinite(const LlamaModel& model, const Tensor& hidden, const std::string& rank);

}  // namespace tessera
