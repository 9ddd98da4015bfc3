// CUDA builds: device queries through the CUDA runtime API.
#include <cuda_runtime_api.h>

#include <string>

#include "kernels/cuda_runtime.h"

namespace tessera::kernels {

bool CudaCompiledIn() { return true; }

StatusOr<int> CudaDeviceCount() {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess)
    return Unavailable(std::string("cudaGetDeviceCount: ") + cudaGetErrorString(err));
  return count;
}

}  // namespace tessera::kernels
