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

Status ExpectFloatTensor(const Tensor& t, int rank, Device device, const char* what) {
  if (!t.defined()) return InvalidArgument(std::string(what) + ": tensor is undefined");
  if (t.device() != device)
    return InvalidArgument(std::string(what) + ": expected a " + DeviceName(device) +
                           " tensor, got " + t.Describe());
  if (t.rank() != rank)
    return InvalidArgument(std::string(what) + ": expected rank " + std::to_string(rank) +
                           ", got " + t.Describe());
  if (t.dtype() != DType::kF32 && t.dtype() != DType::kBF16 && t.dtype() != DType::kF16)
    return InvalidArgument(std::string(what) + ": expected F32, BF16 or F16, got " + t.Describe());
  return Status::Ok();
}

Status ExpectDType(const Tensor& t, DType dtype, const char* what, const char* of) {
  if (t.dtype() != dtype)
    return InvalidArgument(std::string(what) + ": " + t.Describe() +
                           " does not have the dtype of " + of + " (" + DTypeName(dtype) + ")");
  return Status::Ok();
}

}  // namespace tessera::kernels
