// Switches read once from the environment: the A/B switches of the CUDA kernels
// (TESSERA_CUDA_*=0 turns a faster path off so bench/ can measure it beside the old one;
// TESSERA_CUDA_*=1 turns on one not yet measured; docs/operations.md lists them).
//
// Thread-safety: EnvSwitchOn reads the environment on every call; callers cache the answer in a
// function-local static (initialised once, thread-safe), as
//   static const bool on = EnvSwitchOn("TESSERA_CUDA_X");
#pragma once

#include <cstdlib>
#include <cstring>

namespace tessera {

// True unless the variable `name` is set to exactly "0": a switch that is on by default.
inline bool EnvSwitchOn(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr || std::strcmp(v, "0") != 0;
}

// True only when the variable `name` is set to exactly "1": a switch that is off by default (a
// kernel not yet measured on a GPU, turned on for its A/B run).
inline bool EnvSwitchOptIn(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && std::strcmp(v, "1") == 0;
}

}  // namespace tessera
