#include "common/topology/gpu_specs.h"

#include <algorithm>
#include <cctype>

namespace tessera {

const std::vector<GpuSpec>& BuiltinGpuSpecs() {
  // Vendor datasheets: HBM bandwidth and dense bf16 tensor TFLOP/s.
  static const std::vector<GpuSpec> kSpecs = {
      {"B200", 8000, 2250},
      {"B100", 8000, 1750},
      {"GH200", 4000, 989},
      {"H200", 4800, 989},
      {"H200 NVL", 4800, 835},
      {"H100", 3350, 989},  // SXM5 80GB ("NVIDIA H100 80GB HBM3")
      {"H100 PCIe", 2000, 756},
      {"H100 NVL", 3900, 835},
      {"H800", 3350, 989},
      {"A100", 1555, 312},  // 40GB
      {"A100-SXM4-80GB", 2039, 312},
      {"A100 80GB PCIe", 1935, 312},
      {"A800", 2039, 312},
      {"L40S", 864, 362},
      {"L40", 864, 181},
      {"L4", 300, 121},
      {"A10G", 600, 70},
      {"A10", 600, 125},
      {"A30", 933, 165},
      {"V100", 900, 125},
      {"RTX 6000 Ada", 960, 364},
      {"RTX 4090", 1008, 165},
  };
  return kSpecs;
}

namespace {

std::string Lower(const std::string& s) {
  std::string out = s;
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

const GpuSpec* Longest(const std::string& name, const std::vector<GpuSpec>& specs) {
  const std::string lname = Lower(name);
  const GpuSpec* best = nullptr;
  for (const GpuSpec& s : specs) {
    if (s.match.empty() || lname.find(Lower(s.match)) == std::string::npos) continue;
    if (!best || s.match.size() > best->match.size()) best = &s;
  }
  return best;
}

}  // namespace

std::optional<GpuSpec> FindGpuSpec(const std::string& gpu_name,
                                   const std::vector<GpuSpec>& overrides) {
  const GpuSpec* o = Longest(gpu_name, overrides);
  const GpuSpec* b = Longest(gpu_name, BuiltinGpuSpecs());
  if (o && (!b || o->match.size() >= b->match.size())) return *o;
  if (b) return *b;
  return std::nullopt;
}

GpuSpec FallbackGpuSpec(const std::string& gpu_name) { return {gpu_name, 1000, 100}; }

}  // namespace tessera
