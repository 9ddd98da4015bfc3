// StepExecutor: the seam between the generation loop (Engine) and whatever
// runs a forward step: one process holding the whole model, or a pipeline of
// ranks.
//
// The engine submits micro-batches and collects their sampled tokens (with
// log-probabilities where a sequence asked for them) in submission order. A
// pipeline keeps up to max_in_flight() micro-batches moving at once (one per
// stage), so stages overlap; a local executor runs each step inside Submit.
//
// Thread-safety: driven by one thread.
#pragma once

#include <vector>

#include "common/base/sampled_token.h"
#include "common/base/status.h"
#include "common/wire/step_batch.h"

namespace tessera {

class StepExecutor {
 public:
  virtual ~StepExecutor() = default;
  // Starts `batch`. Errors: the step's own errors (a local executor runs it
  // here) or a transport failure naming the rank.
  virtual Status Submit(const StepBatch& batch) = 0;
  // Tokens sampled for the oldest submitted batch: one per sequence with
  // want_logits, in batch order; has_logprobs where the sequence's
  // sampling.logprobs >= 0 (a PipelineExecutor with pp > 1 returns token
  // ids only). Errors: kFailedPrecondition with nothing in flight; step
  // and transport failures.
  virtual StatusOr<std::vector<SampledToken>> Collect() = 0;
  // Micro-batches the engine should keep in flight (pp for a pipeline).
  virtual int max_in_flight() const = 0;
  virtual int64_t vocab_size() const = 0;
};

}  // namespace tessera
