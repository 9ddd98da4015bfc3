// PdlEnabled (kernels/pdl.cuh): compute capability 9.0 or later, unless TESSERA_CUDA_PDL=0.
#include <cstdlib>
#include <cstring>

#include "common/base/env_switch.h"
#include "kernels/pdl.cuh"

namespace tessera::kernels::cuda {

bool PdlEnabled() {
  // On by default since an H100 run checked the 8-token rule (bench/results/NOTES.md,
  // 2026-12-07, later): TESSERA_CUDA_PDL=0 turns it off.
  static const bool wanted = EnvSwitchOn("TESSERA_CUDA_PDL");
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
