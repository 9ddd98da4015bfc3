// CUDA runtime queries used by the CLI and, later, by the CUDA backend.
//
// Built in every configuration: without the CUDA backend the functions report
// that no CUDA runtime is compiled in.
// Thread-safety: safe to call from any thread.
#pragma once

#include <string>

#include "common/base/status.h"

namespace tessera::kernels {

// True when this binary was built with the CUDA backend.
bool CudaCompiledIn();
// Number of visible CUDA devices. Errors: kUnavailable when the build has no
// CUDA backend or the driver reports none/an error (the message names the
// CUDA call and its error string).
StatusOr<int> CudaDeviceCount();

}  // namespace tessera::kernels
