// The one place that routes an operation to its device implementation.
//
// Each operation is declared once in kernels/<op>.h, implemented for the CPU
// in kernels/<op>_cpu.cc (namespace tessera::kernels::cpu) and for CUDA in
// kernels/<op>_cuda.cu (namespace tessera::kernels::cuda, built only when
// TESSERA_WITH_CUDA is defined). The public function in <op>.h calls
// TESSERA_DISPATCH with the device of its first tensor argument.
#pragma once

#include "common/status.h"
#include "common/tensor.h"

// The CUDA branch routes to tessera::kernels::cuda::fn once the CUDA kernels
// land; until then a CUDA tensor gets a clear kUnimplemented.
#define TESSERA_DISPATCH(device, fn, ...)         \
  ((device) == ::tessera::Device::kCPU            \
       ? ::tessera::kernels::cpu::fn(__VA_ARGS__) \
       : ::tessera::Unimplemented(std::string(#fn) + ": no CUDA kernel for this operation yet"))

namespace tessera::kernels {

// Checks that `t` has the given rank and dtype; names `what` in the error.
Status ExpectTensor(const Tensor& t, int rank, DType dtype, const char* what);

}  // namespace tessera::kernels
