// GpuSpec: the speeds of a GPU model that the planner's cost model needs,
// looked up by the NVML device name.
//
// The built-in table holds vendor datasheet peaks (HBM bandwidth, dense
// bf16 tensor throughput without sparsity). A topology file may override or
// add entries ([gpu_specs."NAME"] in docs/topology.md). Relative speed is HBM
// bandwidth relative to the H100 SXM (3350 GB/s), since batch-1 decode reads
// every weight once per token and is bound by it.
//
// Thread-safety: the built-in table is immutable; functions are pure.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace tessera {

struct GpuSpec {
  // Case-insensitive substring of the NVML name ("H100 PCIe" matches
  // "NVIDIA H100 PCIe"). Among matching entries the longest match wins.
  std::string match;
  double hbm_gb_per_s = 0;  // HBM / GDDR bandwidth, GB/s
  double bf16_tflops = 0;   // dense bf16 (fp16 where no bf16) tensor TFLOP/s
};

// HBM bandwidth of the H100 SXM, the unit of RelativeSpeed.
inline constexpr double kReferenceHbmGbPerS = 3350.0;

const std::vector<GpuSpec>& BuiltinGpuSpecs();

// The spec for `gpu_name`: the longest matching entry of `overrides`, else of
// the built-in table (an override of equal or shorter match still wins over a
// built-in one only when it is at least as long). nullopt when nothing
// matches.
std::optional<GpuSpec> FindGpuSpec(const std::string& gpu_name,
                                   const std::vector<GpuSpec>& overrides);

// The spec used for a GPU no entry matches: 1000 GB/s, 100 TFLOP/s.
GpuSpec FallbackGpuSpec(const std::string& gpu_name);

// hbm_gb_per_s / kReferenceHbmGbPerS.
inline double RelativeSpeed(const GpuSpec& spec) { return spec.hbm_gb_per_s / kReferenceHbmGbPerS; }

}  // namespace tessera
