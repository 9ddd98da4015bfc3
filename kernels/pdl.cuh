// Programmatic dependent launch (PDL) for the decode step's kernels (CUDA C++ Programming Guide,
// "Programmatic Dependent Launch and Synchronization"; Hopper sm_90 and later).
//
// A decode step is 10-12 small kernels per layer. Launched plainly, each one starts only after
// the one before it has finished and its launch has gone through, so every boundary costs a
// launch gap plus the earlier grid's tail (its last, partly filled wave), about a microsecond or
// more each inside a CUDA graph. A kernel launched with LaunchWithPdl may instead become
// resident while the kernel before it on the stream is still running, and a weight GEMM may
// start streaming its weights then.
//
// The rules every kernel launched with LaunchWithPdl follows (tests/gpu Pdl.* checks a chain of
// them; on by default, TESSERA_CUDA_PDL=0 turns PDL off):
//  - PdlWait() (griddepcontrol.wait) comes before the kernel reads anything an earlier kernel of
//    the stream writes, and before it writes anything: it returns once every earlier grid has
//    completed and its memory is visible.
//  - Before PdlWait() a kernel may read only data that no kernel writes while steps run (the
//    weights, uploaded and synchronized at load).
//  - PdlLaunchDependents() (griddepcontrol.launch_dependents) comes after PdlWait(): the next
//    PDL kernel may launch once every block of this grid has called it (or exited), so a kernel's
//    early reads overlap at most the one kernel before it.
// Without the launch attribute (pre-Hopper devices, TESSERA_CUDA_PDL=0, steps of more than
// kPdlMaxTokens tokens, launches
// that do not use LaunchWithPdl) both instructions are no-ops and ordering is the stream's usual
// one.
//
// Thread-safety: PdlEnabled caches its answer per thread (one owner thread per GPU).
#pragma once

#include <cuda_runtime.h>

#include "kernels/cuda_launch.h"

namespace tessera::kernels::cuda {

__device__ __forceinline__ void PdlWait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void PdlLaunchDependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

// kernel<<<grid, block, smem, stream>>>(args...), with the programmatic stream serialization
// attribute where `pdl` and PdlEnabled(). Launchers pass `pdl` for steps of at most
// kPdlMaxTokens tokens (kernels/cuda_launch.h). Returns the launch's configuration error.
template <typename... Params, typename... Args>
cudaError_t LaunchWithPdl(bool pdl, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                          cudaStream_t stream, Args... args) {
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = attribute;
  config.numAttrs = pdl && PdlEnabled() ? 1 : 0;
  return cudaLaunchKernelEx(&config, kernel, static_cast<Params>(args)...);
}

}  // namespace tessera::kernels::cuda
