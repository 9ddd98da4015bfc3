// CPU-only builds: there is no CUDA runtime to ask.
#ifndef TESSERA_WITH_CUDA
#include "kernels/cuda_runtime.h"

namespace tessera::kernels {

bool CudaCompiledIn() { return false; }
StatusOr<int> CudaDeviceCount() { return Unavailable("this build has no CUDA backend"); }

}  // namespace tessera::kernels
#endif
