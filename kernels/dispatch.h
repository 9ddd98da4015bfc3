// The one place that routes an operation to its device implementation.
//
// Each operation is declared once in kernels/<op>.h, implemented for the CPU
// in kernels/<op>_cpu.cc (namespace tessera::kernels::cpu) and for CUDA in
// kernels/<op>_cuda.cu (namespace tessera::kernels::cuda, built only when
// TESSERA_WITH_CUDA is defined). The public function in <op>.h calls
// TESSERA_DISPATCH with the device of its first tensor argument.
#pragma once

#include "common/base/status.h"
#include "common/base/tensor.h"

// Builds without the CUDA backend answer a CUDA tensor with kUnavailable.
#ifdef TESSERA_WITH_CUDA
#define TESSERA_DISPATCH(device, fn, ...)                                         \
  ((device) == ::tessera::Device::kCPU ? ::tessera::kernels::cpu::fn(__VA_ARGS__) \
                                       : ::tessera::kernels::cuda::fn(__VA_ARGS__))
#else
#define TESSERA_DISPATCH(device, fn, ...)          \
  ((device) == ::tessera::Device::kCPU             \
       ? ::tessera::kernels::cpu::fn(__VA_ARGS__)  \
       : ::tessera::Unavailable(std::string(#fn) + \
                                ": a CUDA tensor reached a build without the CUDA backend"))
#endif

namespace tessera::kernels {

// Checks that `t` has the given rank and dtype; names `what` in the error.
Status ExpectTensor(const Tensor& t, int rank, DType dtype, const char* what);

// Checks that `t` is defined, on `device`, of the given rank and of a
// floating dtype (F32, BF16, F16); names `what` in the error.
Status ExpectFloatTensor(const Tensor& t, int rank, Device device, const char* what);
// Checks that `t` has dtype `dtype` (that of another operand, named in `of`).
Status ExpectDType(const Tensor& t, DType dtype, const char* what, const char* of);

}  // namespace tessera::kernels
