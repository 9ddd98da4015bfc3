// Vocab-parallel embedding lookup (Megatron-LM, Shoeybi et al. 2019, sec. 3).
//
// A rank holds rows [vocab_begin, vocab_begin + table.dim(0)) of the embedding
// table. Token ids outside that range produce zero rows, so summing the
// outputs of all tp ranks (an all-reduce) gives the full lookup. With tp = 1
// vocab_begin is 0 and the table holds every row.
//
// Shapes: ids [tokens] I32, table [vocab_local, hidden], out [tokens,
// hidden] in the table's dtype; all on one device.
// Thread-safety: stateless.
#pragma once

#include <cstdint>
#include <vector>

#include "common/base/status.h"
#include "common/base/tensor.h"

namespace tessera::kernels {

// Errors: kInvalidArgument on shape mismatch; on the CPU kOutOfRange for a
// negative id (naming the position). The CUDA kernel cannot report ids, so
// it writes zero rows for them: callers validate ids on the host (LlamaModel
// does).
Status EmbeddingLookup(const Tensor& ids, const Tensor& table, int64_t vocab_begin, Tensor& out);

namespace cpu {
Status EmbeddingLookup(const Tensor& ids, const Tensor& table, int64_t vocab_begin, Tensor& out);
}
namespace cuda {
Status EmbeddingLookup(const Tensor& ids, const Tensor& table, int64_t vocab_begin, Tensor& out);
}

}  // namespace tessera::kernels
