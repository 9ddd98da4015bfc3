// PdlEnabled (kernels/pdl.cuh): compute capability 9.0 or later and TESSERA_CUDA_PDL=1.
#include <cstdlib>
#include <cstring>

#include "kernels/pdl.cuh"

namespace tessera::kernels::cuda {

bool PdlEnabled() {
  static const bool wanted = [] {
    // Opt-in until a GPU run has checked it (tests/gpu Pdl.*, gpu-run pdl).
    const char* v = std::getenv("TESSERA_CUDA_PDL");
    return v != nullptr && std::strcmp(v, "1") == 0;
  }();
  if (!wanted) return false;
  // One owner thread per GPU: the answer is cached per thread and device.
  thread_local int cached_device = -1;
  thread_local bool cached = false;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return false;
  if (device != cached_device) {
    int major = 0;
    cached =
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
        major >= 9;
    cached_device = device;
  }
  return cached;
}

}  // namespace tessera::kernels::cuda
