#include <cstring>
#include <span>

#include "kernels/dispatch.h"
#include "kernels/embedding.h"

namespace tessera::kernels {

Status EmbeddingLookup(const Tensor& ids, const Tensor& table, int64_t vocab_begin, Tensor& out) {
  return TESSERA_DISPATCH(table.device(), EmbeddingLookup, ids, table, vocab_begin, out);
}

namespace cpu {

Status EmbeddingLookup(const Tensor& id_tensor, const Tensor& table, int64_t vocab_begin,
                       Tensor& out) {
  TESSERA_RETURN_IF_ERROR(ExpectTensor(id_tensor, 1, DType::kI32, "embedding ids"));
  const std::span<const int32_t> ids(id_tensor.data<int32_t>(),
                                     static_cast<size_t>(id_tensor.numel()));
  TESSERA_RETURN_IF_ERROR(ExpectTensor(table, 2, DType::kF32, "embedding table"));
  TESSERA_RETURN_IF_ERROR(ExpectTensor(out, 2, DType::kF32, "embedding output"));
  const int64_t hidden = table.dim(1), rows = table.dim(0);
  if (out.dim(0) != static_cast<int64_t>(ids.size()) || out.dim(1) != hidden)
    return InvalidArgument("embedding: out " + out.Describe() + " for " +
                           std::to_string(ids.size()) + " ids and table " + table.Describe());
  for (size_t t = 0; t < ids.size(); ++t) {
    if (ids[t] < 0)
      return OutOfRange("embedding: token id " + std::to_string(ids[t]) + " at position " +
                        std::to_string(t) + " is negative");
    float* dst = out.data<float>() + static_cast<int64_t>(t) * hidden;
    const int64_t local = ids[t] - vocab_begin;
    if (local >= 0 && local < rows) {
      std::memcpy(dst, table.data<float>() + local * hidden, sizeof(float) * hidden);
    } else {
      std::memset(dst, 0, sizeof(float) * hidden);
    }
  }
  return Status::Ok();
}

}  // namespace cpu
}  // namespace tessera::kernels
