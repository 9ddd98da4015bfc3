// Vocab-parallel embedding lookup (Megatron-LM, Shoeybi et al. 2019, sec. 3).
//
// A rank holds rows [vocab_begin, vocab_begin + table.dim(0)) of the embedding
// table. Token ids outside that range produce zero rows, so summing the
// outputs of all tp ranks (an all-reduce) gives the full lookup. With tp = 1
// vocab_begin is 0 and the table holds every row.
//
// Shapes: ids [tokens] (int32), table [vocab_local, hidden] F32,
// out [tokens, hidden] F32.
// Thread-safety: stateless.
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"
#include "common/tensor.h"

namespace tessera::kernels {

// Errors: kInvalidArgument on shape mismatch; kOutOfRange for a negative id
// (naming the position).
Status EmbeddingLookup(const std::vector<int32_t>& ids, const Tensor& table, int64_t vocab_begin,
                       Tensor& out);

namespace cpu {
Status EmbeddingLookup(const std::vector<int32_t>& ids, const Tensor& table, int64_t vocab_begin,
                       Tensor& out);
}

}  // namespace tessera::kernels
