// StepExecutor: the seam between the generation loop and whatever runs a
// forward step (one process holding the whole model, or a pipeline of ranks).
//
// Thread-safety: implementations are driven by one thread.
#pragma once

#include "common/status.h"
#include "common/step_batch.h"
#include "common/tensor.h"

namespace tessera {

class StepExecutor {
 public:
  virtual ~StepExecutor() = default;
  // Runs `batch` through every stage. logits [num_wanted, vocab_size] F32
  // receives the logits of the last token of each sequence with want_logits,
  // in batch order.
  virtual Status Run(const StepBatch& batch, Tensor& logits) = 0;
  virtual int64_t vocab_size() const = 0;
};

}  // namespace tessera
