#include "kernels/dispatch.h"

#include <string>

namespace tessera::kernels {

Status ExpectTensor(const Tensor& t, int rank, DType dtype, const char* what) {
  if (!t.defined()) return InvalidArgument(std::string(what) + ": tensor is undefined");
  if (t.rank() != rank)
    return InvalidArgument(std::string(what) + ": expected rank " + std::to_string(rank) +
                           ", got " + t.Describe());
  if (t.dtype() != dtype)
    return InvalidArgument(std::string(what) + ": expected dtype " + DTypeName(dtype) + ", got " +
                           t.Describe());
  return Status::Ok();
}

}  // namespace tessera::kernels
